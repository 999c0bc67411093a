package ratelimit

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// gate is an upstream whose requests wait, each until a token lets it
// answer or its request is cancelled. It counts the requests that reached
// it, so a test can see that rejected ones never did.
type gate struct {
	url     string // host:port
	tokens  chan struct{}
	arrived atomic.Int64
	arrival chan struct{} // one send per arrival, never blocking
}

func newGate(t *testing.T) *gate {
	t.Helper()
	g := &gate{tokens: make(chan struct{}, 10000), arrival: make(chan struct{}, 10000)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.arrived.Add(1)
		g.arrival <- struct{}{}
		select {
		case <-g.tokens:
			_, _ = io.WriteString(w, "app")
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(g.tokens) }) // lets waiting handlers return before the server closes
	g.url = strings.TrimPrefix(srv.URL, "http://")
	return g
}

// open lets n waiting (or future) requests answer.
func (g *gate) open(n int) {
	for range n {
		g.tokens <- struct{}{}
	}
}

// waitArrivals waits until n requests in all have reached the gate.
func (g *gate) waitArrivals(t *testing.T, n int64) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for g.arrived.Load() < n {
		select {
		case <-g.arrival:
		case <-deadline:
			t.Fatalf("%d requests reached the upstream, want %d", g.arrived.Load(), n)
		}
	}
}

// result is one answer of a concurrent request, or its error.
type result struct {
	status     int
	retryAfter string
	limitHdr   string
	err        error
}

// sendAll sends n concurrent GETs to url with X-Client: client, and
// returns a channel that gets each one's result.
func sendAll(ctx context.Context, urls []string, client string, n int) <-chan result {
	out := make(chan result, n)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n, DisableKeepAlives: true}, Timeout: 60 * time.Second}
	for i := range n {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, urls[i%len(urls)], nil)
			req.Header.Set("X-Client", client)
			resp, err := hc.Do(req)
			if err != nil {
				out <- result{err: err}
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			out <- result{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), limitHdr: resp.Header.Get("X-RateLimit-Limit")}
		}()
	}
	return out
}

// keyUsed reads a key's use through an admin API.
func keyUsed(t *testing.T, admin, zone, key string) int64 {
	t.Helper()
	resp, err := http.Get(admin + "/rate_limit/zones/" + zone + "/keys/" + key)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var info struct{ Used int64 }
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil {
		t.Fatal(err)
	}
	return info.Used
}

// waitUsed waits until the key's use reads want: units are released when
// Caddy is done with a request, a moment after its client has the answer.
func waitUsed(t *testing.T, admin, zone, key string, want int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := keyUsed(t, admin, zone, key)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("zone %s key %s: %d units held, want %d", zone, key, got, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func concurrencySite(upstream, extra string) string {
	return fmt.Sprintf(`
:9080 {
	rate_limit {
		zone expensive {
			key {header.X-Client}
			limit 2
			algorithm concurrency
%s
		}
	}
	reverse_proxy %s
}
`, extra, upstream)
}

// TestConcurrencyThroughCaddy: with limit 2 and a slow upstream, 6
// requests at once get exactly 2 through; the units come back after the
// responses and after clients give up.
func TestConcurrencyThroughCaddy(t *testing.T) {
	g := newGate(t)
	startCaddy(t, concurrencySite(g.url, ""))

	answers := sendAll(context.Background(), []string{siteURL}, "c1", 6)
	g.waitArrivals(t, 2)
	for range 4 {
		r := <-answers
		if r.err != nil || r.status != http.StatusTooManyRequests || r.retryAfter != "1" || r.limitHdr != "" {
			t.Fatalf("rejection: %+v, want 429 with Retry-After 1 and no window headers", r)
		}
	}
	if got := keyUsed(t, adminURL, "expensive", "c1"); got != 2 {
		t.Fatalf("%d units held while 2 requests run", got)
	}
	g.open(2)
	for range 2 {
		if r := <-answers; r.err != nil || r.status != http.StatusOK {
			t.Fatalf("served: %+v", r)
		}
	}
	if n := g.arrived.Load(); n != 2 {
		t.Fatalf("%d requests reached the upstream, want 2", n)
	}
	waitUsed(t, adminURL, "expensive", "c1", 0)

	// Clients that give up while the upstream works release their units.
	ctx, cancel := context.WithCancel(context.Background())
	gone := sendAll(ctx, []string{siteURL}, "c1", 2)
	g.waitArrivals(t, 4)
	cancel()
	for range 2 {
		if r := <-gone; r.err == nil {
			t.Fatalf("a cancelled request was answered: %+v", r)
		}
	}
	waitUsed(t, adminURL, "expensive", "c1", 0)
	g.open(1)
	if r := <-sendAll(context.Background(), []string{siteURL}, "c1", 1); r.status != http.StatusOK {
		t.Fatalf("after the aborts: %+v", r)
	}
}

// TestConcurrencyMaxDelay: with max_delay a request over the limit waits
// for units and is served when one comes back, not rejected.
func TestConcurrencyMaxDelay(t *testing.T) {
	g := newGate(t)
	startCaddy(t, concurrencySite(g.url, "\t\t\tmax_delay 20s"))
	first := sendAll(context.Background(), []string{siteURL}, "d", 2)
	g.waitArrivals(t, 2)
	late := sendAll(context.Background(), []string{siteURL}, "d", 1)
	// The late request waits in the handler; each token lets one request
	// finish, and the late one then takes the freed unit.
	g.open(1)
	if r := <-first; r.status != http.StatusOK {
		t.Fatalf("first: %+v", r)
	}
	g.waitArrivals(t, 3)
	g.open(2)
	if r := <-late; r.status != http.StatusOK {
		t.Fatalf("late: %+v, want 200 after waiting", r)
	}
	if r := <-first; r.status != http.StatusOK {
		t.Fatalf("second: %+v", r)
	}
	waitUsed(t, adminURL, "expensive", "d", 0)
}

// leakCheck sends 1,000 requests, a third of them given up by their
// clients at a random moment (sendGivingUp), with the upstream answering
// each after a random short wait; afterwards no units are held.
func leakCheck(t *testing.T, urls []string, admin, client string) {
	t.Helper()
	sendGivingUp(urls, client, 1000)
	waitUsed(t, admin, "expensive", client, 0)
}

// sendGivingUp sends n GET requests with X-Client: client to urls in
// turn, 32 at a time, and gives up a third of them after a random 0 to
// 3 ms, as clients going away under load do. It returns how many were
// answered 200.
func sendGivingUp(urls []string, client string, n int64) int64 {
	var served, next atomic.Int64
	var wg sync.WaitGroup
	hc := &http.Client{Timeout: 60 * time.Second}
	for w := range 32 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := next.Add(1); i <= n; i = next.Add(1) {
				ctx, cancel := context.WithCancel(context.Background())
				if rng.IntN(3) == 0 {
					ctx, cancel = context.WithTimeout(context.Background(), time.Duration(rng.IntN(3000))*time.Microsecond)
				}
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, urls[int(i)%len(urls)], nil)
				req.Header.Set("X-Client", client)
				if resp, err := hc.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						served.Add(1)
					}
				}
				cancel()
			}
		})
	}
	wg.Wait()
	return served.Load()
}

// jittery answers each request after a random wait of up to 2 ms.
func jittery(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(time.Duration(rand.IntN(2000)) * time.Microsecond):
			_, _ = io.WriteString(w, "app")
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func TestConcurrencyLeaksNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("sends 1,000 requests")
	}
	startCaddy(t, concurrencySite(jittery(t), ""))
	leakCheck(t, []string{siteURL}, adminURL, "leak")
}

// TestGCRAThroughCaddy: the SPEC §5 vector's first steps through Caddy:
// a burst of 3 at once, then one per 100 ms, with the headers and
// Retry-After of a token bucket.
func TestGCRAThroughCaddy(t *testing.T) {
	a := newApp(t)
	tc := startCaddy(t, fmt.Sprintf(`
:9080 {
	rate_limit {
		zone smooth {
			key {header.X-Client}
			limit 10
			window 1s
			algorithm gcra
			burst 3
		}
	}
	reverse_proxy %s
}
`, a.url))
	for i, want := range []string{"2", "1", "0"} {
		resp, _ := do(t, tc, http.MethodGet, siteURL, "X-Client: g")
		status(t, resp, http.StatusOK)
		if got := resp.Header.Get("X-RateLimit-Remaining"); got != want || resp.Header.Get("X-RateLimit-Limit") != "10" {
			t.Fatalf("request %d: remaining %q limit %q, want %s of 10", i, got, resp.Header.Get("X-RateLimit-Limit"), want)
		}
	}
	resp, _ := do(t, tc, http.MethodGet, siteURL, "X-Client: g")
	status(t, resp, http.StatusTooManyRequests)
	if got := resp.Header.Get("Retry-After"); got != "1" {
		t.Fatalf("Retry-After %q, want 1 (100 ms rounded up)", got)
	}
	if n := a.hits.Load(); n != 3 {
		t.Fatalf("the app saw %d requests, want 3", n)
	}
	// A token comes back every 100 ms: one more passes once it has.
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, _ := do(t, tc, http.MethodGet, siteURL, "X-Client: g")
		if resp.StatusCode == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no token came back")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestConcurrencyEveryWayOutThroughCaddy: a concurrency zone's units come
// back however Caddy ends the request: a response, a handler error (the
// error directive, and reverse_proxy to an upstream that is down), a
// panic (abort, which panics with http.ErrAbortHandler) and a rejection by
// another zone.
func TestConcurrencyEveryWayOutThroughCaddy(t *testing.T) {
	tc := startCaddy(t, fmt.Sprintf(`
:9080 {
	rate_limit {
		zone expensive {
			key {header.X-Client}
			limit 3
			algorithm concurrency
		}
		zone posts {
			match {
				method POST
			}
			key {header.X-Client}
			limit 1
			window 1h
		}
	}
	handle /error {
		error 500
	}
	handle /down {
		reverse_proxy 127.0.0.1:%d
	}
	handle /abort {
		abort
	}
	respond "ok"
}
`, freeLoopbackPort(t)))
	for _, c := range []struct {
		method, path string
		status       int // 0: the connection is closed unanswered
	}{
		{http.MethodGet, "/", http.StatusOK},
		{http.MethodGet, "/error", http.StatusInternalServerError},
		{http.MethodGet, "/down", http.StatusBadGateway},
		{http.MethodGet, "/abort", 0},
		{http.MethodPost, "/", http.StatusOK},
		{http.MethodPost, "/", http.StatusTooManyRequests}, // rejected by posts
	} {
		req, _ := http.NewRequest(c.method, siteURL+c.path, nil)
		req.Header.Set("X-Client", "ways")
		resp, err := tc.Client.Do(req)
		switch {
		case c.status == 0 && err == nil:
			resp.Body.Close()
			t.Fatalf("%s %s answered %d, want the connection closed", c.method, c.path, resp.StatusCode)
		case c.status != 0 && err != nil:
			t.Fatalf("%s %s: %v", c.method, c.path, err)
		case c.status != 0:
			resp.Body.Close()
			if resp.StatusCode != c.status {
				t.Fatalf("%s %s answered %d, want %d", c.method, c.path, resp.StatusCode, c.status)
			}
		}
		waitUsed(t, adminURL, "expensive", "ways", 0)
	}
}

// TestGCRAOptionsThroughCaddy: gcra works with the options the other
// algorithms have: both header sets (remaining and reset as SPEC §5
// defines them for gcra), the placeholders, max_delay (a request over the
// burst is held until its token comes back) and dry_run.
func TestGCRAOptionsThroughCaddy(t *testing.T) {
	tc := startCaddy(t, `
:9080 {
	rate_limit {
		headers both
		zone smooth_delay {
			match {
				path /delay
			}
			key {header.X-Client}
			limit 1
			window 2s
			algorithm gcra
			burst 1
			max_delay 5s
		}
		zone smooth_dry {
			match {
				path /dry
			}
			key {header.X-Client}
			limit 1
			window 1h
			algorithm gcra
			burst 2
			dry_run
		}
	}
	respond "{http.rate_limit.zone} {http.rate_limit.remaining} {http.rate_limit.exceeded}"
}
`)
	before := time.Now()
	resp, body := do(t, tc, http.MethodGet, siteURL+"/delay", "X-Client: o")
	status(t, resp, http.StatusOK)
	if body != "smooth_delay 0 false" {
		t.Fatalf("placeholders %q", body)
	}
	h := resp.Header
	if h.Get("X-RateLimit-Limit") != "1" || h.Get("X-RateLimit-Remaining") != "0" || h.Get("X-RateLimit-Used") != "1" {
		t.Fatalf("headers %v, want limit 1, remaining 0, used 1", h)
	}
	// Reset is the TAT: when the bucket is full again, 2 s after the
	// request, in Unix seconds rounded up.
	var reset int64
	fmt.Sscan(h.Get("X-RateLimit-Reset"), &reset)
	if reset < before.Add(2*time.Second).Unix() || reset > time.Now().Add(3*time.Second).Unix() {
		t.Fatalf("X-RateLimit-Reset %d, want about %d", reset, before.Add(2*time.Second).Unix())
	}
	if p := h.Get("RateLimit-Policy"); p != `"smooth_delay";q=1;w=2` {
		t.Fatalf("RateLimit-Policy %q", p)
	}
	if r := h.Get("RateLimit"); r != `"smooth_delay";r=0;t=2` && r != `"smooth_delay";r=0;t=1` {
		t.Fatalf("RateLimit %q, want r=0 and t the seconds to the reset", r)
	}
	// The bucket is empty: the next request waits about 2 s for its
	// token instead of being rejected. (The counters are the process's,
	// so they are read before and after.)
	delayed := `caddy_http_rate_limit_requests_total{result="delayed",zone="smooth_delay"}`
	delayedBefore := metricCount(t, delayed)
	resp, _ = do(t, tc, http.MethodGet, siteURL+"/delay", "X-Client: o")
	status(t, resp, http.StatusOK)
	if n := metricCount(t, delayed) - delayedBefore; n != 1 {
		t.Fatalf("%d requests delayed, want 1", n)
	}

	// dry_run: the third request in an hour is over the burst of 2, and
	// passes with exceeded true.
	dryRun := `caddy_http_rate_limit_requests_total{result="dry_run",zone="smooth_dry"}`
	dryRunBefore := metricCount(t, dryRun)
	for i, want := range []string{"smooth_dry 1 false", "smooth_dry 0 false", "smooth_dry 0 true"} {
		resp, body := do(t, tc, http.MethodGet, siteURL+"/dry", "X-Client: o")
		status(t, resp, http.StatusOK)
		if body != want {
			t.Fatalf("dry run request %d: %q, want %q", i+1, body, want)
		}
	}
	if n := metricCount(t, dryRun) - dryRunBefore; n != 1 {
		t.Fatalf("%d dry-run rejections counted, want 1", n)
	}
}
