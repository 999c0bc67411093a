package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/algorithms/vectors"
	"github.com/d61b427a/caddy-rate-limit/internal/wait"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// serveWith sends one request from ip through h to next and returns the
// recorded response and the handler's error.
func serveWith(h *Handler, ctx context.Context, ip string, next caddyhttp.HandlerFunc) (*httptest.ResponseRecorder, error) {
	r, _ := testRequest(ctx, http.MethodPost, ip)
	w := httptest.NewRecorder()
	return w, h.ServeHTTP(w, r, next)
}

// used returns what the key uses of its limit in zone, as the admin API
// would show it.
func used(t *testing.T, h *Handler, zone, key string) int64 {
	t.Helper()
	st, err := h.store.(storage.Admin).KeyState(context.Background(), zone, key, algorithms.Rate{Window: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return st.Counts.Windows().Current
}

// TestCountStatusReleases: a count_status zone keeps the cost of a
// request only if the response's status is listed, however the response
// ends: written, carried by a handler error (basic_auth's 401), a panic
// (Caddy's 500), or a client gone (499).
func TestCountStatusReleases(t *testing.T) {
	h := provisionHandler(t, `{"zones":[{"name":"cs_ends","limit":[100],"window":"1h","algorithm":"fixed_window","count_status":["401","5xx"]}]}`)
	withClock(t, h, vectors.Start)
	cases := []struct {
		name string
		end  func(w http.ResponseWriter, r *http.Request) error
		kept int64
	}{
		{"200 written", func(w http.ResponseWriter, _ *http.Request) error { w.WriteHeader(200); return nil }, 0},
		{"body only", func(w http.ResponseWriter, _ *http.Request) error { _, err := w.Write([]byte("ok")); return err }, 0},
		{"nothing written", func(http.ResponseWriter, *http.Request) error { return nil }, 0},
		{"body copied", func(w http.ResponseWriter, _ *http.Request) error {
			_, err := w.(io.ReaderFrom).ReadFrom(strings.NewReader("ok"))
			return err
		}, 0},
		{"401 written", func(w http.ResponseWriter, _ *http.Request) error { w.WriteHeader(401); return nil }, 1},
		{"403 written", func(w http.ResponseWriter, _ *http.Request) error { w.WriteHeader(403); return nil }, 0},
		{"100 then 204", func(w http.ResponseWriter, _ *http.Request) error { w.WriteHeader(100); w.WriteHeader(204); return nil }, 0},
		{"100 then 401", func(w http.ResponseWriter, _ *http.Request) error { w.WriteHeader(100); w.WriteHeader(401); return nil }, 1},
		{"401 handler error", func(http.ResponseWriter, *http.Request) error {
			return caddyhttp.Error(http.StatusUnauthorized, errors.New("invalid credentials"))
		}, 1},
		{"404 handler error", func(http.ResponseWriter, *http.Request) error {
			return caddyhttp.Error(http.StatusNotFound, errors.New("no file"))
		}, 0},
		{"plain error", func(http.ResponseWriter, *http.Request) error { return errors.New("broken") }, 1},
		{"written status wins over the error", func(w http.ResponseWriter, _ *http.Request) error {
			w.WriteHeader(200)
			return caddyhttp.Error(http.StatusBadGateway, errors.New("after the header"))
		}, 0},
		{"panic", func(http.ResponseWriter, *http.Request) error { panic("next handler panicked") }, 1},
		{"client gone", func(_ http.ResponseWriter, r *http.Request) error { <-r.Context().Done(); return nil }, 0},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ip := fmt.Sprint("192.0.2.", 10+i)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			func() {
				defer func() { _ = recover() }()
				_, _ = serveWith(h, ctx, ip, func(w http.ResponseWriter, r *http.Request) error {
					if n := used(t, h, "cs_ends", ip); n != 1 {
						t.Errorf("%d used while served, want 1: the cost is taken on admission", n)
					}
					if c.name == "client gone" {
						cancel()
					}
					return c.end(w, r)
				})
			}()
			if n := used(t, h, "cs_ends", ip); n != c.kept {
				t.Fatalf("%d used after the response, want %d", n, c.kept)
			}
		})
	}
}

// TestCountStatusConcurrentAttempts: attempts in flight at once take
// their cost on admission, so no more than the limit reach the next
// handler, whatever their responses turn out to be.
func TestCountStatusConcurrentAttempts(t *testing.T) {
	h := provisionHandler(t, `{"zones":[{"name":"cs_conc","limit":[5],"window":"1h","count_status":["401"]}]}`)
	withClock(t, h, vectors.Start)
	release := make(chan struct{})
	var mu sync.Mutex
	reached, refused := 0, 0
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			_, err := serveWith(h, context.Background(), "192.0.2.50", func(http.ResponseWriter, *http.Request) error {
				mu.Lock()
				reached++
				mu.Unlock()
				<-release
				return caddyhttp.Error(http.StatusUnauthorized, errors.New("wrong password"))
			})
			var he caddyhttp.HandlerError
			if errors.As(err, &he) && he.StatusCode == http.StatusTooManyRequests {
				mu.Lock()
				refused++
				mu.Unlock()
			}
		})
	}
	// The 45 refusals need no next handler: they come while the 5 that
	// reached it are held.
	wait.Seen(t, "45 refusals", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return refused == 45, fmt.Sprintf("%d refused, %d reached the next handler", refused, reached)
	})
	close(release)
	wg.Wait()
	if reached != 5 {
		t.Fatalf("%d attempts reached the next handler, want 5", reached)
	}
	if n := used(t, h, "cs_conc", "192.0.2.50"); n != 5 {
		t.Fatalf("%d used after five 401s, want 5", n)
	}
}

// TestBan: with count_status 401, limit 5 and ban 1h, right passwords
// use nothing; five wrong ones are answered 401; the sixth attempt, right
// or wrong, is refused for the hour, past the end of the window; the
// admin API shows the ban and a reset lifts it.
func TestBan(t *testing.T) {
	h := provisionHandler(t, `{"zones":[{"name":"ban_login","limit":[5],"window":"15m","count_status":["401"],"ban":"1h"}]}`)
	clock := withClock(t, h, vectors.Start)
	core, logs := observer.New(zapcore.InfoLevel)
	h.logger = zap.New(core)
	const ip = "192.0.2.66"
	login := func(password string) (*httptest.ResponseRecorder, int) {
		t.Helper()
		w, err := serveWith(h, context.Background(), ip, func(w http.ResponseWriter, _ *http.Request) error {
			if password != "right" {
				return caddyhttp.Error(http.StatusUnauthorized, errors.New("wrong password"))
			}
			w.WriteHeader(http.StatusOK)
			return nil
		})
		var he caddyhttp.HandlerError
		switch {
		case errors.As(err, &he):
			return w, he.StatusCode
		case err != nil:
			t.Fatal(err)
		}
		return w, w.Code
	}
	for i := range 100 {
		if _, code := login("right"); code != http.StatusOK {
			t.Fatalf("right password %d: %d", i, code)
		}
	}
	if n := used(t, h, "ban_login", ip); n != 0 {
		t.Fatalf("100 right passwords used %d, want 0", n)
	}
	for i := range 5 {
		if _, code := login("wrong"); code != http.StatusUnauthorized {
			t.Fatalf("wrong password %d: %d, want 401", i, code)
		}
	}
	for _, password := range []string{"wrong", "right"} {
		w, code := login(password)
		if code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "3600" {
			t.Fatalf("%s password after five wrong ones: %d, Retry-After %q; want 429, 3600", password, code, w.Header().Get("Retry-After"))
		}
	}
	if n := logs.FilterMessage("rate limit ban").Len(); n != 1 {
		t.Errorf("%d ban log lines, want 1", n)
	}
	// The window ends; the ban does not.
	clock.Add(45 * time.Minute)
	if w, code := login("right"); code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "900" {
		t.Fatalf("45 minutes into the ban: %d, Retry-After %q; want 429, 900", code, w.Header().Get("Retry-After"))
	}
	st, err := h.store.(storage.Admin).KeyState(context.Background(), "ban_login", ip, algorithms.Rate{Window: time.Minute})
	if err != nil || !st.BanEnds.Equal(vectors.Start.Add(time.Hour)) {
		t.Fatalf("key state %+v (%v), want a ban ending an hour after the sixth attempt", st, err)
	}
	if err := h.store.(storage.Admin).ResetKey(context.Background(), "ban_login", ip); err != nil {
		t.Fatal(err)
	}
	if _, code := login("right"); code != http.StatusOK {
		t.Fatalf("after a reset: %d, want 200", code)
	}
	// A ban also ends by itself.
	for range 6 {
		login("wrong")
	}
	clock.Add(time.Hour)
	if _, code := login("right"); code != http.StatusOK {
		t.Fatalf("after the ban ended: %d, want 200", code)
	}
}

// TestBanDryRun: a dry-run zone never bans, and a dial to dry_run stops
// a ban from being honoured.
func TestBanDryRun(t *testing.T) {
	h := provisionHandler(t, `{"zones":[{"name":"ban_dry","limit":[1],"window":"1h","ban":"1h","dry_run":true}]}`)
	withClock(t, h, vectors.Start)
	ok := func(http.ResponseWriter, *http.Request) error { return nil }
	for i := range 5 {
		if _, err := serveWith(h, context.Background(), "192.0.2.77", ok); err != nil {
			t.Fatalf("dry-run request %d: %v", i, err)
		}
	}
	st, err := h.store.(storage.Admin).KeyState(context.Background(), "ban_dry", "192.0.2.77", algorithms.Rate{Window: time.Minute})
	if err != nil || !st.BanEnds.IsZero() {
		t.Fatalf("a dry-run zone banned: %+v (%v)", st, err)
	}
}

// TestStatusSet: codes and classes, and nothing else.
func TestStatusSet(t *testing.T) {
	s, err := newStatusSet([]string{"401", "5xx", "101"})
	if err != nil {
		t.Fatal(err)
	}
	for code, want := range map[int]bool{401: true, 500: true, 599: true, 101: true, 400: false, 499: false, 200: false, 0: false, -1: false, 600: false, 1000: false} {
		if s.has(code) != want {
			t.Errorf("has(%d) = %v, want %v", code, !want, want)
		}
	}
	var js Statuses
	if err := js.UnmarshalJSON([]byte(`[401, "4xx"]`)); err != nil || len(js) != 2 || js[0] != "401" || js[1] != "4xx" {
		t.Fatalf("%q (%v), want 401 and 4xx", js, err)
	}
}
