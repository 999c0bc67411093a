package integration

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/internal/wait"
)

func concurrencySite(upstream, extra string) string {
	return fmt.Sprintf(`
`+siteAddr+` {
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
// requests at once get exactly 2 through; the units are released after the
// responses and after clients give up.
func TestConcurrencyThroughCaddy(t *testing.T) {
	g := newGate(t)
	startCaddy(t, concurrencySite(g.url, ""))

	answers := sendAll(context.Background(), []string{siteURL}, 6, "X-Client: c1")
	g.waitArrivals(t, 2)
	for range 4 {
		r := receive(t, "an answer", answers)
		if r.err != nil || r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") != "1" || r.header.Get("X-RateLimit-Limit") != "" {
			t.Fatalf("rejection: %+v, want 429 with Retry-After 1 and no window headers", r)
		}
	}
	if got := keyState(t, adminURL, "expensive", "c1").Used; got != 2 {
		t.Fatalf("%d units held while 2 requests run", got)
	}
	g.open(2)
	for range 2 {
		if r := receive(t, "an answer", answers); r.err != nil || r.status != http.StatusOK {
			t.Fatalf("served: %+v", r)
		}
	}
	if n := g.arrived.Load(); n != 2 {
		t.Fatalf("%d requests reached the upstream, want 2", n)
	}
	waitUsed(t, adminURL, "expensive", "c1", 0)

	// Clients that give up while the upstream works release their units.
	ctx, cancel := context.WithCancel(context.Background())
	gone := sendAll(ctx, []string{siteURL}, 2, "X-Client: c1")
	g.waitArrivals(t, 4)
	cancel()
	for range 2 {
		if r := receive(t, "an answer", gone); r.err == nil {
			t.Fatalf("a cancelled request was answered: %+v", r)
		}
	}
	waitUsed(t, adminURL, "expensive", "c1", 0)
	g.open(1)
	if r := receive(t, "an answer", sendAll(context.Background(), []string{siteURL}, 1, "X-Client: c1")); r.status != http.StatusOK {
		t.Fatalf("after the aborts: %+v", r)
	}
}

// TestConcurrencyMaxDelay: with max_delay a request over the limit waits
// for units and is served when one is released, not rejected.
func TestConcurrencyMaxDelay(t *testing.T) {
	g := newGate(t)
	startCaddy(t, concurrencySite(g.url, "\t\t\tmax_delay 20s"))
	first := sendAll(context.Background(), []string{siteURL}, 2, "X-Client: d")
	g.waitArrivals(t, 2)
	late := sendAll(context.Background(), []string{siteURL}, 1, "X-Client: d")
	// The late request waits in the handler; each token lets one request
	// finish, and the late one then takes the freed unit.
	g.open(1)
	if r := receive(t, "an answer", first); r.status != http.StatusOK {
		t.Fatalf("first: %+v", r)
	}
	g.waitArrivals(t, 3)
	g.open(2)
	if r := receive(t, "an answer", late); r.status != http.StatusOK {
		t.Fatalf("late: %+v, want 200 after waiting", r)
	}
	if r := receive(t, "an answer", first); r.status != http.StatusOK {
		t.Fatalf("second: %+v", r)
	}
	waitUsed(t, adminURL, "expensive", "d", 0)
}

// TestConcurrencyLeaksNothing: no unit is left held after a storm of
// requests, a third of them given up by their clients.
func TestConcurrencyLeaksNothing(t *testing.T) {
	j := newJittery(t)
	startCaddy(t, concurrencySite(j.url, ""))
	leakCheck(t, j, []string{siteURL}, adminURL, "expensive", "leak", nil)
}

// TestGCRAThroughCaddy: the first steps of the documented GCRA vector
// (limit 10 per 1s, burst 3) through Caddy: a burst of 3 at once, then
// one per 100 ms, with the headers and Retry-After of a token bucket.
func TestGCRAThroughCaddy(t *testing.T) {
	a := newApp(t)
	startCaddy(t, fmt.Sprintf(`
`+siteAddr+` {
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
		resp, _ := do(t, http.MethodGet, siteURL, "X-Client: g")
		status(t, resp, http.StatusOK)
		if got := resp.Header.Get("X-RateLimit-Remaining"); got != want || resp.Header.Get("X-RateLimit-Limit") != "10" {
			t.Fatalf("request %d: remaining %q limit %q, want %s of 10", i, got, resp.Header.Get("X-RateLimit-Limit"), want)
		}
	}
	resp, _ := do(t, http.MethodGet, siteURL, "X-Client: g")
	status(t, resp, http.StatusTooManyRequests)
	if got := resp.Header.Get("Retry-After"); got != "1" {
		t.Fatalf("Retry-After %q, want 1 (100 ms rounded up)", got)
	}
	if n := a.hits.Load(); n != 3 {
		t.Fatalf("the app saw %d requests, want 3", n)
	}
	// A token comes back every 100 ms: one more passes once it has.
	wait.For(t, "a token to come back", func() bool { return get(t, siteURL, "g") == http.StatusOK })
}

// TestConcurrencyEveryWayOutThroughCaddy: a concurrency zone's units come
// back however Caddy ends the request: a response, a handler error (the
// error directive, and reverse_proxy to an upstream that is down), a
// panic (abort, which panics with http.ErrAbortHandler) and a rejection by
// another zone. Each request admitted by the zone is counted allowed, and
// the access log shows, for each one that ends with a response, the units
// left when it was admitted: one was held (3 - 1 = 2) while Caddy served
// it. (An aborted request's log line has no fields from log_append, which
// the panic skips.)
func TestConcurrencyEveryWayOutThroughCaddy(t *testing.T) {
	accessLog := filepath.Join(t.TempDir(), "access.log")
	startCaddy(t, fmt.Sprintf(`
`+siteAddr+` {
	log {
		output file %s
		format json
	}
	log_append remaining {http.rate_limit.remaining}
	log_append zone {http.rate_limit.zone}
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
		reverse_proxy %s
	}
	handle /abort {
		abort
	}
	respond "ok"
}
`, accessLog, onLoopback(freePort())))
	for i, c := range []struct {
		method, path string
		status       int // 0: the connection is closed unanswered
		zone         string
		remaining    string // as admitted: 2 while one unit is held
	}{
		{http.MethodGet, "/", http.StatusOK, "expensive", "2"},
		{http.MethodGet, "/error", http.StatusInternalServerError, "expensive", "2"},
		{http.MethodGet, "/down", http.StatusBadGateway, "expensive", "2"},
		{http.MethodGet, "/abort", 0, "", ""},
		// With posts matched too, the placeholders describe posts: a zone
		// with a window is preferred to a concurrency zone.
		{http.MethodPost, "/", http.StatusOK, "posts", "0"},
		{http.MethodPost, "/", http.StatusTooManyRequests, "posts", "0"}, // rejected by posts
	} {
		allowed := `caddy_http_rate_limit_requests_total{result="allowed",zone="expensive"}`
		before := metricCount(t, adminURL, allowed)
		req, _ := http.NewRequest(c.method, siteURL+c.path, nil)
		req.Header.Set("X-Client", "ways")
		req.Header.Set("X-Request", fmt.Sprint(i))
		resp, err := client.Do(req)
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
		admitted := 1
		if c.status == http.StatusTooManyRequests {
			admitted = 0
		}
		if n := metricCount(t, adminURL, allowed) - before; n != admitted {
			t.Fatalf("%s %s: allowed by the zone %d times, want %d", c.method, c.path, n, admitted)
		}
		var entry map[string]any
		wait.For(t, fmt.Sprintf("the access log line of %s %s", c.method, c.path), func() bool {
			for _, e := range logEntries(logLines(accessLog)) {
				if r, _ := e["request"].(map[string]any); r != nil && fmt.Sprint(r["headers"].(map[string]any)["X-Request"]) == fmt.Sprintf("[%d]", i) {
					entry = e
					return true
				}
			}
			return false
		})
		if got := fmt.Sprint(entry["zone"], " ", entry["remaining"]); c.zone != "" && got != c.zone+" "+c.remaining {
			t.Fatalf("%s %s: zone and remaining as admitted %q, want %q", c.method, c.path, got, c.zone+" "+c.remaining)
		}
		waitUsed(t, adminURL, "expensive", "ways", 0)
	}
}

// TestGCRAOptionsThroughCaddy: gcra works with the options the other
// algorithms have: both header sets (remaining and reset as a token bucket
// has them: the units left in the bucket, and when it is full again), the
// placeholders, max_delay (a request over the burst is held until its
// token comes back) and dry_run.
func TestGCRAOptionsThroughCaddy(t *testing.T) {
	startCaddy(t, `
`+siteAddr+` {
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
	resp, body := do(t, http.MethodGet, siteURL+"/delay", "X-Client: o")
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
	delayedBefore := metricCount(t, adminURL, delayed)
	resp, _ = do(t, http.MethodGet, siteURL+"/delay", "X-Client: o")
	status(t, resp, http.StatusOK)
	if n := metricCount(t, adminURL, delayed) - delayedBefore; n != 1 {
		t.Fatalf("%d requests delayed, want 1", n)
	}

	// dry_run: the third request in an hour is over the burst of 2, and
	// passes with exceeded true.
	dryRun := `caddy_http_rate_limit_requests_total{result="dry_run",zone="smooth_dry"}`
	dryRunBefore := metricCount(t, adminURL, dryRun)
	for i, want := range []string{"smooth_dry 1 false", "smooth_dry 0 false", "smooth_dry 0 true"} {
		resp, body := do(t, http.MethodGet, siteURL+"/dry", "X-Client: o")
		status(t, resp, http.StatusOK)
		if body != want {
			t.Fatalf("dry run request %d: %q, want %q", i+1, body, want)
		}
	}
	if n := metricCount(t, adminURL, dryRun) - dryRunBefore; n != 1 {
		t.Fatalf("%d dry-run rejections counted, want 1", n)
	}
}

// TestSlidingWindowOptionsThroughCaddy: sliding_window works with the
// options the other algorithms have: the placeholders, max_delay (a
// request over the limit is held until its sub-window comes), dry_run,
// and through the admin API a per-key override and a zone's dial.
func TestSlidingWindowOptionsThroughCaddy(t *testing.T) {
	startCaddy(t, `
`+siteAddr+` {
	rate_limit {
		zone sw_delay {
			match {
				path /delay
			}
			key {header.X-Client}
			limit 1
			window 2s
			algorithm sliding_window
			buckets 2
			max_delay 5s
		}
		zone sw_dry {
			match {
				path /dry
			}
			key {header.X-Client}
			limit 2
			window 1h
			algorithm sliding_window
			dry_run
		}
		zone sw_admin {
			match {
				path /admin
			}
			key {header.X-Client}
			limit 1
			window 1h
			algorithm sliding_window
		}
	}
	respond "{http.rate_limit.zone} {http.rate_limit.remaining} {http.rate_limit.exceeded}"
}
`)
	get := func(path, want string, code int) {
		t.Helper()
		resp, body := do(t, http.MethodGet, siteURL+path, "X-Client: o")
		status(t, resp, code)
		if want != "" && body != want {
			t.Fatalf("GET %s: %q, want %q", path, body, want)
		}
	}

	// max_delay: the second request in the window waits for the first
	// one's sub-window to leave instead of being rejected.
	get("/delay", "sw_delay 0 false", http.StatusOK)
	delayed := `caddy_http_rate_limit_requests_total{result="delayed",zone="sw_delay"}`
	delayedBefore := metricCount(t, adminURL, delayed)
	get("/delay", "", http.StatusOK)
	if n := metricCount(t, adminURL, delayed) - delayedBefore; n != 1 {
		t.Fatalf("%d requests delayed, want 1", n)
	}

	// dry_run: the third request in an hour is over the limit of 2, and
	// passes with exceeded true.
	for _, want := range []string{"sw_dry 1 false", "sw_dry 0 false", "sw_dry 0 true"} {
		get("/dry", want, http.StatusOK)
	}

	// An override gives the key room; a dial in dry_run lets it past.
	get("/admin", "sw_admin 0 false", http.StatusOK)
	get("/admin", "", http.StatusTooManyRequests)
	if code, body := adminJSON(t, adminURL, http.MethodPut, "/rate_limit/zones/sw_admin/keys/o/limit", `{"limit": 3}`); code != http.StatusOK {
		t.Fatalf("override: %d %s", code, body)
	}
	get("/admin", "sw_admin 1 false", http.StatusOK)
	get("/admin", "sw_admin 0 false", http.StatusOK)
	get("/admin", "", http.StatusTooManyRequests)
	if code, body := adminJSON(t, adminURL, http.MethodPut, "/rate_limit/zones/sw_admin/dial", `{"mode": "dry_run"}`); code != http.StatusOK {
		t.Fatalf("dial: %d %s", code, body)
	}
	get("/admin", "sw_admin 0 true", http.StatusOK)
}

// TestSlidingWindowThroughCaddy: a sliding_window zone (3 per 3 s in six
// buckets of 500 ms) through Caddy: three pass with the headers counting
// down, the fourth is refused with Retry-After, the admin API shows the
// ring's counts, and the key passes again once its oldest sub-window has
// left.
func TestSlidingWindowThroughCaddy(t *testing.T) {
	a := newApp(t)
	startCaddy(t, fmt.Sprintf(`
`+siteAddr+` {
	rate_limit {
		zone exact {
			key {header.X-Client}
			limit 3
			window 3s
			algorithm sliding_window
			buckets 6
		}
	}
	reverse_proxy %s
}
`, a.url))
	for i, want := range []string{"2", "1", "0"} {
		resp, _ := do(t, http.MethodGet, siteURL, "X-Client: s")
		status(t, resp, http.StatusOK)
		if got := resp.Header.Get("X-RateLimit-Remaining"); got != want || resp.Header.Get("X-RateLimit-Limit") != "3" {
			t.Fatalf("request %d: remaining %q limit %q, want %s of 3", i, got, resp.Header.Get("X-RateLimit-Limit"), want)
		}
	}
	resp, _ := do(t, http.MethodGet, siteURL, "X-Client: s")
	status(t, resp, http.StatusTooManyRequests)
	if got, _ := strconv.Atoi(resp.Header.Get("Retry-After")); got < 1 || got > 4 {
		t.Fatalf("Retry-After %q, want up to the window and a bucket (3.5 s), rounded up", resp.Header.Get("Retry-After"))
	}
	if n := a.hits.Load(); n != 3 {
		t.Fatalf("the app saw %d requests, want 3", n)
	}
	info := keyState(t, adminURL, "exact", "s")
	if info.Used != 3 || info.Current+info.Previous != 3 {
		t.Fatalf("admin key state %+v, want 3 used", info)
	}
	_, body := adminJSON(t, adminURL, http.MethodGet, "/rate_limit/zones", "")
	if !strings.Contains(body, `"algorithm":"sliding_window"`) || !strings.Contains(body, `"buckets":6`) {
		t.Fatalf("zones %s, want the sliding window with its buckets", body)
	}
	wait.For(t, "the oldest sub-window to leave", func() bool { return get(t, siteURL, "s") == http.StatusOK })
}
