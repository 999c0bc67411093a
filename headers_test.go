package ratelimit

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/d61b427a/caddy-rate-limit/internal/names"
	"github.com/dunglas/httpsfv"
)

// TestSFStringEveryPrintableByte: every name checkName accepts is written
// as an RFC 8941 String that an RFC 8941 parser reads back unchanged, one
// character of each printable ASCII byte at a time and all of them at once.
func TestSFStringEveryPrintableByte(t *testing.T) {
	var all []byte
	for c := byte(0x20); c <= 0x7e; c++ {
		all = append(all, c)
		name := "a" + string(c) + "z"
		if err := names.Check(name); err != nil {
			t.Fatalf("%q refused: %v", name, err)
		}
		assertSFString(t, name)
	}
	assertSFString(t, string(all))
	for _, bad := range []string{"zöne", "a\tb", "a\nb", "a\x00", "\x7f", strings.Repeat("n", names.MaxLen+1)} {
		if names.Check(bad) == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	// A byte the check refuses cannot be written in a String at all.
	for _, bad := range []string{"zöne", "a\tb", "a\x00", "\x7f"} {
		if field, err := sfString(bad); err == nil {
			t.Errorf("%q written as %s", bad, field)
		}
	}
}

func assertSFString(t *testing.T, name string) {
	t.Helper()
	field, err := sfString(name)
	if err != nil {
		t.Fatalf("%q: %v", name, err)
	}
	item, err := httpsfv.UnmarshalItem([]string{field})
	if err != nil {
		t.Fatalf("%s: not an RFC 8941 Item: %v", field, err)
	}
	if got, ok := item.Value.(string); !ok || got != name {
		t.Fatalf("%s reads as %#v, want %q", field, item.Value, name)
	}
}

// TestRateLimitHeadersCarryTheNameAsAString: a zone's name is sent in
// RateLimit-Policy and RateLimit as an RFC 8941 String, whatever
// printable characters it holds: an RFC 8941 parser reads each header as
// one Item, the name as it is, with the zone's own parameters and no
// other, though the name holds quotes, backslashes, or the ; , and =
// that would open parameters or list members of their own outside a
// String. On allowed and on rejected answers.
func TestRateLimitHeadersCarryTheNameAsAString(t *testing.T) {
	for i, name := range []string{
		`unit_sf_semicolon;q=1000000;w=1`,
		`unit_sf_comma, "other";q=1000000`,
		`unit_sf_quote";q=1000000;w="1`,
		`unit_sf_backslash\";q=1000000`,
		`unit_sf_equals=x q=y`,
		`unit_sf_all !"#$%&'()*+,-./:;<=>?@[\]^_{|}~`,
	} {
		config, err := json.Marshal(map[string]any{"headers": "ietf", "zones": []any{map[string]any{"name": name, "limit": 1, "window": "1m"}}})
		if err != nil {
			t.Fatal(err)
		}
		h := provisionHandler(t, string(config))
		ip := fmt.Sprintf("192.0.2.%d", i+1)
		for _, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
			got := serve(t, h, context.Background(), http.MethodGet, ip)
			if got.status != want {
				t.Fatalf("%s: status %d, want %d", name, got.status, want)
			}
			assertSFItem(t, got.header.Values("RateLimit-Policy"), name, "q", "w")
			assertSFItem(t, got.header.Values("RateLimit"), name, "r", "t")
			if q := sfParam(t, got.header.Values("RateLimit-Policy"), "q"); q != 1 {
				t.Errorf("%s: RateLimit-Policy %q: q=%d, want the zone's limit 1", name, got.header.Values("RateLimit-Policy"), q)
			}
		}
	}
}

// assertSFItem checks that values parse as an RFC 8941 List of one Item,
// the String name, whose parameters are params, each an integer.
func assertSFItem(t *testing.T, values []string, name string, params ...string) {
	t.Helper()
	list, err := httpsfv.UnmarshalList(values)
	if err != nil {
		t.Fatalf("%q: not an RFC 8941 List: %v", values, err)
	}
	item, ok := list[0].(httpsfv.Item)
	if len(list) != 1 || !ok {
		t.Fatalf("%q: %d members, want one Item", values, len(list))
	}
	if got, ok := item.Value.(string); !ok || got != name {
		t.Fatalf("%q: value %#v, want the String %q", values, item.Value, name)
	}
	if got := item.Params.Names(); !slices.Equal(got, params) {
		t.Fatalf("%q: parameters %q, want %q", values, got, params)
	}
	for _, p := range params {
		sfParam(t, values, p)
	}
}

// sfParam returns the integer parameter p of the one Item values hold.
func sfParam(t *testing.T, values []string, p string) int64 {
	t.Helper()
	list, err := httpsfv.UnmarshalList(values)
	if err != nil || len(list) == 0 {
		t.Fatalf("%q: not an RFC 8941 List: %v", values, err)
	}
	v, ok := list[0].(httpsfv.Item).Params.Get(p)
	n, isInt := v.(int64)
	if !ok || !isInt {
		t.Fatalf("%q: parameter %s is %#v, want an integer", values, p, v)
	}
	return n
}

// TestJitterKeepsTheTrueInstant: with the largest jitter drawn, Retry-After
// says twice the wait, but the key is allowed again at the true instant,
// as the counters hold it, and X-RateLimit-Reset says so.
func TestJitterKeepsTheTrueInstant(t *testing.T) {
	h := provisionHandler(t, `{"jitter":1,"zones":[{"name":"unit_jitter_instant","key":"k","limit":1,"window":"2s","algorithm":"fixed_window"}]}`)
	h.random = func() float64 { return 1 }
	clock := withClock(t, h, time.Unix(1_000_000, 200_000_000)) // 200 ms into a 2 s window
	if got := serve(t, h, context.Background(), http.MethodGet, "192.0.2.1"); got.status != http.StatusOK {
		t.Fatalf("first request: %d", got.status)
	}
	got := serve(t, h, context.Background(), http.MethodGet, "192.0.2.1")
	if got.status != http.StatusTooManyRequests {
		t.Fatalf("second request: %d, want 429", got.status)
	}
	// The window ends 1.8 s on: Retry-After is twice that, rounded up.
	if reset, ra := got.header.Get("X-RateLimit-Reset"), got.header.Get("Retry-After"); reset != "1000002" || ra != "4" {
		t.Fatalf("X-RateLimit-Reset %s, Retry-After %s; want the window's end 1000002 and 4 (2 × 1.8 s, rounded up)", reset, ra)
	}
	clock.Set(time.Unix(1_000_001, 999_000_000))
	if got := serve(t, h, context.Background(), http.MethodGet, "192.0.2.1"); got.status != http.StatusTooManyRequests {
		t.Fatalf("a millisecond before the window's end: %d, want 429", got.status)
	}
	clock.Set(time.Unix(1_000_002, 0))
	if got := serve(t, h, context.Background(), http.MethodGet, "192.0.2.1"); got.status != http.StatusOK {
		t.Fatalf("at the true instant, 2 s before Retry-After: %d, want allowed", got.status)
	}
}

func TestRetryAfterJitterBounds(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, c := range []struct {
		jitter, draw float64
		wait         time.Duration
		want         int64
	}{
		{0, 0.99, 10 * time.Second, 10},
		{0.5, 0, 10 * time.Second, 10},
		{0.5, 0.5, 10 * time.Second, 13}, // 12.5 s, rounded up
		{0.5, 0.999999, 10 * time.Second, 15},
		{1, 0.999999, 1500 * time.Millisecond, 3},
		{1, 0.5, 0, 1},                  // still at least 1
		{1, 0.5, -time.Second, 1},       // an instant already past
		{0.2, 0.5, time.Millisecond, 1}, // never 0
	} {
		h := &Handler{Jitter: c.jitter, random: func() float64 { return c.draw }}
		if got := h.retryAfter(now.Add(c.wait), now); got != c.want {
			t.Errorf("jitter %v, draw %v, wait %s: Retry-After %d, want %d", c.jitter, c.draw, c.wait, got, c.want)
		}
	}
}

func TestRetryAfterAndReset(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, c := range []struct {
		at   time.Time
		want int64
	}{
		{now, 1},
		{now.Add(-time.Hour), 1},
		{now.Add(time.Millisecond), 1},
		{now.Add(time.Second), 1},
		{now.Add(time.Second + time.Millisecond), 2},
		{now.Add(time.Hour), 3600},
	} {
		if got := retryAfterSeconds(c.at, now); got != c.want {
			t.Errorf("retryAfterSeconds(now+%v) = %d, want %d", c.at.Sub(now), got, c.want)
		}
	}
	for _, c := range []struct {
		t    time.Time
		want int64
	}{
		{time.Unix(1000, 0), 1000},
		{time.Unix(1000, 1), 1001},
		{time.Unix(1000, 999_999_999), 1001},
	} {
		if got := ceilUnix(c.t); got != c.want {
			t.Errorf("ceilUnix(%v) = %d, want %d", c.t, got, c.want)
		}
	}
}

// TestPlaceholdersFollowTheLastHandler: two rate_limit handlers on one
// request report through one set of placeholders, and, as with the
// headers, the second handler's report is what later handlers see.
func TestPlaceholdersFollowTheLastHandler(t *testing.T) {
	first := provisionHandler(t, `{"zones":[{"name":"unit_first","limit":10,"window":"1h"}]}`)
	second := provisionHandler(t, `{"zones":[{"name":"unit_second","limit":20,"window":"1h"}]}`)
	r, repl := testRequest(context.Background(), http.MethodGet, "192.0.2.1")
	w := httptest.NewRecorder()
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		return second.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil }))
	})
	if err := first.ServeHTTP(w, r, next); err != nil {
		t.Fatal(err)
	}
	if z, l := placeholder(repl, "zone"), placeholder(repl, "limit"); z != "unit_second" || l != "20" {
		t.Fatalf("placeholders say zone %q limit %q, want the second handler's", z, l)
	}
	if got := w.Header().Get("X-RateLimit-Limit"); got != "20" {
		t.Fatalf("X-RateLimit-Limit %q, want the second handler's", got)
	}
	if v, _ := repl.GetString("http.vars." + placeholdersVar); strings.Contains(v, "unit_") {
		t.Fatalf("the placeholder state shows through {http.vars.*}: %q", v)
	}
}
