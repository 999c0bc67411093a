package ratelimit

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// app is the application behind Caddy: it counts the requests that reach it.
type app struct {
	hits atomic.Int64
	url  string
}

func newApp(t *testing.T) *app {
	t.Helper()
	a := new(app)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.hits.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "app")
	}))
	t.Cleanup(srv.Close)
	a.url = strings.TrimPrefix(srv.URL, "http://")
	return a
}

func status(t *testing.T, resp *http.Response, want int) {
	t.Helper()
	if resp.StatusCode != want {
		t.Fatalf("%s %s: status %d, want %d", resp.Request.Method, resp.Request.URL, resp.StatusCode, want)
	}
}

func TestRejectsOverLimitBeforeTheApp(t *testing.T) {
	a := newApp(t)
	tc := startCaddy(t, fmt.Sprintf(`
:9080 {
	rate_limit {
		zone per_ip {
			limit 2
			window 1h
		}
	}
	reverse_proxy %s
}
`, a.url))
	for i := 0; i < 2; i++ {
		resp, body := do(t, tc, http.MethodGet, siteURL+"/")
		status(t, resp, http.StatusOK)
		if body != "app" {
			t.Fatalf("body %q", body)
		}
	}
	for i := 0; i < 3; i++ {
		resp, _ := do(t, tc, http.MethodGet, siteURL+"/")
		status(t, resp, http.StatusTooManyRequests)
		ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
		if err != nil || ra < 1 || ra > 2*3600 {
			t.Fatalf("Retry-After %q", resp.Header.Get("Retry-After"))
		}
	}
	if n := a.hits.Load(); n != 2 {
		t.Fatalf("app saw %d requests, want 2", n)
	}
}

func TestRejectedBodyIsNeverRead(t *testing.T) {
	a := newApp(t)
	tc := startCaddy(t, fmt.Sprintf(`
:9080 {
	rate_limit {
		zone uploads {
			limit 1
			window 1h
		}
	}
	reverse_proxy %s
}
`, a.url))
	resp, _ := do(t, tc, http.MethodPost, siteURL+"/upload")
	status(t, resp, http.StatusOK)

	// Promise a megabyte and send none of it: a handler that read the body
	// would wait until the deadline, so an answer proves the body was
	// never read.
	resp = send(t, func() (*http.Response, error) {
		conn, err := net.Dial("tcp", "127.0.0.1:9080")
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
		fmt.Fprintf(conn, "POST /upload HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n", 1<<20)
		return http.ReadResponse(bufio.NewReader(conn), nil)
	})
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429", resp.StatusCode)
	}
	if n := a.hits.Load(); n != 1 {
		t.Fatalf("app saw %d requests, want 1", n)
	}
}

func TestHandleErrorsShapesTheRejection(t *testing.T) {
	tc := startCaddy(t, `
:9080 {
	rate_limit {
		zone z {
			limit 1
			window 1h
		}
	}
	respond "ok"
	handle_errors 429 {
		respond "slow down, retry in {http.response.header.Retry-After}s ({http.rate_limit.zone})" 429
	}
}
`)
	do(t, tc, http.MethodGet, siteURL+"/")
	resp, body := do(t, tc, http.MethodGet, siteURL+"/")
	status(t, resp, http.StatusTooManyRequests)
	want := fmt.Sprintf("slow down, retry in %ss (z)", resp.Header.Get("Retry-After"))
	if body != want {
		t.Fatalf("body %q, want %q", body, want)
	}
	if resp.Header.Get("X-RateLimit-Remaining") != "0" {
		t.Fatalf("headers lost in handle_errors: %v", resp.Header)
	}
}

func TestCostPerMethod(t *testing.T) {
	tc := startCaddy(t, `
:9080 {
	rate_limit {
		zone api {
			limit 10
			window 1h
			cost POST 4
			cost OPTIONS 0
			cost * 2
		}
	}
	respond "ok"
}
`)
	steps := []struct {
		method    string
		status    int
		remaining string
	}{
		{http.MethodPost, 200, "6"},
		{http.MethodOptions, 200, "6"},
		{http.MethodGet, 200, "4"},
		{http.MethodPost, 200, "0"},
		{http.MethodOptions, 200, "0"}, // free even when the budget is spent
		{http.MethodGet, 429, "0"},
	}
	for i, s := range steps {
		resp, _ := do(t, tc, s.method, siteURL+"/")
		if resp.StatusCode != s.status || resp.Header.Get("X-RateLimit-Remaining") != s.remaining {
			t.Fatalf("step %d %s: %d remaining %q, want %d %q", i, s.method, resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"), s.status, s.remaining)
		}
	}
}

func TestKeysAlternativesAndMatchers(t *testing.T) {
	tc := startCaddy(t, `
:9080 {
	rate_limit {
		zone by_api_key {
			match {
				path /api/*
			}
			key apikey:{header.X-Api-Key} ip:{client_ip}
			limit 2
			window 1h
		}
	}
	respond "{http.rate_limit.key}"
}
`)
	// Each API key has its own budget.
	for _, key := range []string{"alice", "bob"} {
		for i := 0; i < 2; i++ {
			resp, body := do(t, tc, http.MethodGet, siteURL+"/api/x", "X-Api-Key: "+key)
			status(t, resp, http.StatusOK)
			if body != "apikey:"+key {
				t.Fatalf("key %q, want apikey:%s", body, key)
			}
		}
		resp, _ := do(t, tc, http.MethodGet, siteURL+"/api/x", "X-Api-Key: "+key)
		status(t, resp, http.StatusTooManyRequests)
	}
	// Without the header the key falls back to the client IP.
	resp, body := do(t, tc, http.MethodGet, siteURL+"/api/x")
	status(t, resp, http.StatusOK)
	if !strings.HasPrefix(body, "ip:127.0.0.1") && !strings.HasPrefix(body, "ip:::1") {
		t.Fatalf("fallback key %q", body)
	}
	// Paths outside the matcher are not limited.
	for i := 0; i < 5; i++ {
		resp, _ := do(t, tc, http.MethodGet, siteURL+"/public", "X-Api-Key: alice")
		status(t, resp, http.StatusOK)
		if resp.Header.Get("X-RateLimit-Limit") != "" {
			t.Fatal("unmatched request got rate limit headers")
		}
	}
}

func TestHugeKeyIsHashed(t *testing.T) {
	tc := startCaddy(t, `
:9080 {
	rate_limit {
		zone z {
			key {header.X-Api-Key}
			limit 1
			window 1h
		}
	}
	respond "{http.rate_limit.key}"
}
`)
	huge := strings.Repeat("k", 16<<10)
	resp, body := do(t, tc, http.MethodGet, siteURL+"/", "X-Api-Key: "+huge)
	status(t, resp, http.StatusOK)
	if !strings.HasPrefix(body, "#") || len(body) != 1+32 {
		t.Fatalf("key %q", body)
	}
	resp, _ = do(t, tc, http.MethodGet, siteURL+"/", "X-Api-Key: "+huge)
	status(t, resp, http.StatusTooManyRequests)
}

func TestIPPrefixGroupsANetwork(t *testing.T) {
	tc := startCaddy(t, `
:9080 {
	rate_limit {
		zone nets {
			key {header.X-Client}
			limit 2
			window 1h
			ipv4_prefix 24
			ipv6_prefix 64
		}
	}
	respond "{http.rate_limit.key}"
}
`)
	cases := []struct{ a, b, net string }{
		{"203.0.113.7", "203.0.113.200", "203.0.113.0/24"},
		{"2001:db8:1:2::1", "2001:db8:1:2:ffff::9", "2001:db8:1:2::/64"},
	}
	for _, c := range cases {
		resp, body := do(t, tc, http.MethodGet, siteURL+"/", "X-Client: "+c.a)
		status(t, resp, http.StatusOK)
		if body != c.net {
			t.Fatalf("key %q, want %q", body, c.net)
		}
		do(t, tc, http.MethodGet, siteURL+"/", "X-Client: "+c.b)
		resp, _ = do(t, tc, http.MethodGet, siteURL+"/", "X-Client: "+c.a)
		status(t, resp, http.StatusTooManyRequests)
	}
}

func TestLimitAlternatives(t *testing.T) {
	tc := startCaddy(t, `
:9080 {
	rate_limit {
		zone quota {
			key {header.X-User}
			limit {header.X-Quota} 2
			window 1h
		}
	}
	respond "{http.rate_limit.limit}"
}
`)
	cases := []struct{ user, quota, want string }{
		{"a", "5", "5"},
		{"b", "", "2"},
		{"c", "0", "2"},
		{"d", "-3", "2"},
		{"e", "abc", "2"},
		{"f", "99999999999", "2"}, // above 2^31-1: ignored
	}
	for _, c := range cases {
		h := []string{"X-User: " + c.user}
		if c.quota != "" {
			h = append(h, "X-Quota: "+c.quota)
		}
		_, body := do(t, tc, http.MethodGet, siteURL+"/", h...)
		if body != c.want {
			t.Errorf("quota %q: limit %q, want %q", c.quota, body, c.want)
		}
	}
}

func TestMultipleZones(t *testing.T) {
	a := newApp(t)
	tc := startCaddy(t, fmt.Sprintf(`
:9080 {
	rate_limit {
		zone wide {
			limit 10
			window 1h
		}
		zone narrow {
			match {
				path /narrow
			}
			limit 1
			window 1h
		}
	}
	reverse_proxy %s
}
`, a.url))
	resp, _ := do(t, tc, http.MethodGet, siteURL+"/narrow")
	status(t, resp, http.StatusOK)
	if resp.Header.Get("X-RateLimit-Limit") != "1" {
		t.Fatalf("headers describe limit %s, want the zone with least remaining (1)", resp.Header.Get("X-RateLimit-Limit"))
	}
	// Rejected by narrow: consumes nothing in wide.
	for i := 0; i < 5; i++ {
		resp, _ := do(t, tc, http.MethodGet, siteURL+"/narrow")
		status(t, resp, http.StatusTooManyRequests)
	}
	resp, _ = do(t, tc, http.MethodGet, siteURL+"/other")
	status(t, resp, http.StatusOK)
	if got := resp.Header.Get("X-RateLimit-Used"); got != "2" {
		t.Fatalf("wide zone used %s, want 2: rejected requests were charged", got)
	}
	if a.hits.Load() != 2 {
		t.Fatalf("app saw %d", a.hits.Load())
	}
}

func TestZonesWithTheSameNameShareCounters(t *testing.T) {
	tc := startCaddy(t, `
:9080 {
	route /a {
		rate_limit {
			zone shared {
				limit 3
				window 1h
			}
		}
		respond "a"
	}
	route /b {
		rate_limit {
			zone shared {
				limit 3
				window 1h
			}
		}
		respond "b"
	}
}
`)
	for _, p := range []string{"/a", "/b", "/a"} {
		resp, _ := do(t, tc, http.MethodGet, siteURL+p)
		status(t, resp, http.StatusOK)
	}
	resp, _ := do(t, tc, http.MethodGet, siteURL+"/b")
	status(t, resp, http.StatusTooManyRequests)
}

func TestHeaders(t *testing.T) {
	for _, mode := range []string{"x-ratelimit", "ietf", "both", "off"} {
		t.Run(mode, func(t *testing.T) {
			tc := startCaddy(t, fmt.Sprintf(`
:9080 {
	rate_limit {
		headers %s
		zone z_%s {
			limit 5
			window 30s
		}
	}
	respond "ok"
}
`, mode, strings.ReplaceAll(mode, "-", "_")))
			before := time.Now()
			resp, _ := do(t, tc, http.MethodGet, siteURL+"/")
			status(t, resp, http.StatusOK)
			x := resp.Header.Get("X-RateLimit-Limit") != ""
			ietf := resp.Header.Get("RateLimit") != ""
			if x != (mode == "x-ratelimit" || mode == "both") || ietf != (mode == "ietf" || mode == "both") {
				t.Fatalf("headers %v", resp.Header)
			}
			if x {
				if resp.Header.Get("X-RateLimit-Limit") != "5" || resp.Header.Get("X-RateLimit-Remaining") != "4" || resp.Header.Get("X-RateLimit-Used") != "1" {
					t.Fatalf("headers %v", resp.Header)
				}
				reset, _ := strconv.ParseInt(resp.Header.Get("X-RateLimit-Reset"), 10, 64)
				windowEnd := (before.Unix()/30 + 1) * 30
				if reset != windowEnd && reset != windowEnd+30 {
					t.Fatalf("X-RateLimit-Reset %d, want the window end %d", reset, windowEnd)
				}
			}
			if ietf {
				zone := "z_" + strings.ReplaceAll(mode, "-", "_")
				if got, want := resp.Header.Get("RateLimit-Policy"), fmt.Sprintf(`"%s";q=5;w=30`, zone); got != want {
					t.Fatalf("RateLimit-Policy %q, want %q", got, want)
				}
				got := resp.Header.Get("RateLimit")
				prefix := fmt.Sprintf(`"%s";r=4;t=`, zone)
				if !strings.HasPrefix(got, prefix) {
					t.Fatalf("RateLimit %q", got)
				}
				if secs, err := strconv.Atoi(strings.TrimPrefix(got, prefix)); err != nil || secs < 1 || secs > 30 {
					t.Fatalf("RateLimit %q: t out of range", got)
				}
			}
		})
	}

	// Windows that are not whole seconds round up: the policy's window,
	// and the reset, which a client may wait for, is never early.
	t.Run("sub-second windows round up", func(t *testing.T) {
		tc := startCaddy(t, `
:9080 {
	rate_limit {
		headers both
		zone z_fraction {
			limit 5
			window 1500ms
		}
	}
	respond "ok"
}
`)
		before := time.Now().UnixMilli()
		resp, _ := do(t, tc, http.MethodGet, siteURL+"/")
		after := time.Now().UnixMilli()
		status(t, resp, http.StatusOK)
		if got := resp.Header.Get("RateLimit-Policy"); got != `"z_fraction";q=5;w=2` {
			t.Fatalf("RateLimit-Policy %q, want w=2 for a 1.5 s window", got)
		}
		reset, _ := strconv.ParseInt(resp.Header.Get("X-RateLimit-Reset"), 10, 64)
		ok := false
		for _, at := range []int64{before, after} {
			end := (at/1500 + 1) * 1500 // ms
			ok = ok || reset == (end+999)/1000
		}
		if !ok {
			t.Fatalf("X-RateLimit-Reset %d, want the window end (between %d and %d ms) rounded up to seconds", reset, before, after)
		}
	})
}

func TestPlaceholders(t *testing.T) {
	tc := startCaddy(t, `
:9080 {
	rate_limit {
		zone z {
			key user:{header.X-User}
			limit 1
			window 1h
		}
	}
	respond "{http.rate_limit.zone} {http.rate_limit.key} {http.rate_limit.limit} {http.rate_limit.remaining} {http.rate_limit.exceeded}"
	handle_errors {
		respond "{http.rate_limit.zone} {http.rate_limit.key} {http.rate_limit.limit} {http.rate_limit.remaining} {http.rate_limit.exceeded}" 429
	}
}
`)
	_, body := do(t, tc, http.MethodGet, siteURL+"/", "X-User: u1")
	if body != "z user:u1 1 0 false" {
		t.Fatalf("allowed: %q", body)
	}
	_, body = do(t, tc, http.MethodGet, siteURL+"/", "X-User: u1")
	if body != "z user:u1 1 0 true" {
		t.Fatalf("rejected: %q", body)
	}
}

func TestDryRunNeverRejects(t *testing.T) {
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	a := newApp(t)
	tc := startCaddyWith(t, withGlobals(fmt.Sprintf(`log {
		output file %s
		level INFO
	}`, logFile))+fmt.Sprintf(`
:9080 {
	rate_limit {
		zone trial {
			limit 2
			window 1h
			dry_run
		}
	}
	header >X-Exceeded {http.rate_limit.exceeded}
	reverse_proxy %s
}
`, a.url), "caddyfile")
	var exceeded []string
	for i := 0; i < 4; i++ {
		resp, _ := do(t, tc, http.MethodGet, siteURL+"/")
		status(t, resp, http.StatusOK)
		exceeded = append(exceeded, resp.Header.Get("X-Exceeded"))
	}
	if strings.Join(exceeded, ",") != "false,false,true,true" {
		t.Fatalf("exceeded: %v", exceeded)
	}
	if a.hits.Load() != 4 {
		t.Fatalf("app saw %d of 4", a.hits.Load())
	}
	waitForLog(t, logFile, 2, "would be exceeded (dry run)", `"zone":"trial"`)
}

// waitForLog waits until at least n lines of the log file contain all of
// parts, and fails the test if that takes more than 10 s.
func waitForLog(t *testing.T, logFile string, n int, parts ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		found := logLines(logFile, parts...)
		if found >= n {
			return
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logFile)
			t.Fatalf("%d of %d log lines with %q:\n%s", found, n, parts, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// logLines counts the lines of the log file that contain all of parts.
func logLines(logFile string, parts ...string) int {
	b, _ := os.ReadFile(logFile)
	found := 0
	for line := range strings.Lines(string(b)) {
		if !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(line, p) }) {
			found++
		}
	}
	return found
}

func TestMaxDelay(t *testing.T) {
	a := newApp(t)
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	tc := startCaddyWith(t, withGlobals(fmt.Sprintf(`log {
		output file %s
		format json
		level DEBUG
	}`, logFile))+fmt.Sprintf(`
:9080 {
	rate_limit {
		zone throttle {
			match {
				not path /bounded /strict /pair /costly
			}
			key throttle
			limit 1
			window 1s
			algorithm fixed_window
			max_delay 3s
			max_waiting 1
		}
		zone bounded {
			match {
				path /bounded
			}
			key bounded
			limit 1
			window 1h
			algorithm fixed_window
			max_delay 2h
			max_waiting 1
		}
		zone strict {
			match {
				path /strict
			}
			key strict
			limit 1
			window 1h
			max_delay 100ms
		}
		zone pair_short {
			match {
				path /pair
			}
			key pair
			limit 1
			window 1s
			algorithm fixed_window
			max_delay 2s
		}
		zone pair_long {
			match {
				path /pair
			}
			key pair
			limit 1
			window 1h
			max_delay 2h
		}
		zone costly {
			match {
				path /costly
			}
			key costly
			limit 2
			window 1h
			cost POST 5
			max_delay 2h
		}
	}
	reverse_proxy %s
}
`, a.url), "caddyfile")
	t.Run("waits_until_allowed", func(t *testing.T) {
		resp, _ := do(t, tc, http.MethodGet, siteURL+"/")
		status(t, resp, http.StatusOK)
		reset, _ := strconv.ParseInt(resp.Header.Get("X-RateLimit-Reset"), 10, 64)
		resp, _ = do(t, tc, http.MethodGet, siteURL+"/")
		status(t, resp, http.StatusOK)
		if now := time.Now(); now.Before(time.Unix(reset, 0)) {
			t.Fatalf("delayed request answered at %s, before its window ended at %s", now, time.Unix(reset, 0))
		}
	})
	t.Run("rejects_at_once_beyond_max_delay", func(t *testing.T) {
		resp, _ := do(t, tc, http.MethodGet, siteURL+"/strict")
		status(t, resp, http.StatusOK)
		// A wait of minutes is beyond max_delay: rejected, and told when
		// to come back.
		resp, _ = do(t, tc, http.MethodGet, siteURL+"/strict")
		status(t, resp, http.StatusTooManyRequests)
		if after, _ := strconv.Atoi(resp.Header.Get("Retry-After")); after < 60 {
			t.Fatalf("Retry-After %q, want minutes", resp.Header.Get("Retry-After"))
		}
	})
	t.Run("held_only_as_long_as_every_zone_allows", func(t *testing.T) {
		// pair_short would hold a request for up to 2 s, pair_long for up
		// to 2 h. Once both are spent, the request would have to wait for
		// pair_long's hour, which is beyond pair_short's max_delay.
		resp, _ := do(t, tc, http.MethodGet, siteURL+"/pair")
		status(t, resp, http.StatusOK)
		resp, _ = do(t, tc, http.MethodGet, siteURL+"/pair")
		status(t, resp, http.StatusTooManyRequests)
		if n := logLines(logFile, "delaying request", `"key":"pair"`); n != 0 {
			t.Fatalf("the request was held (%d log lines) before its rejection", n)
		}
	})
	t.Run("never_holds_what_can_never_pass", func(t *testing.T) {
		// A POST costs 5 against a limit of 2: no wait can let it pass.
		resp, _ := do(t, tc, http.MethodPost, siteURL+"/costly")
		status(t, resp, http.StatusTooManyRequests)
		if n := logLines(logFile, "delaying request", `"key":"costly"`); n != 0 {
			t.Fatalf("the request was held (%d log lines) before its rejection", n)
		}
	})
	t.Run("disconnect_releases_and_consumes_nothing", func(t *testing.T) {
		// Spend this window, then park one request and walk away.
		time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
		resp, _ := do(t, tc, http.MethodGet, siteURL+"/")
		status(t, resp, http.StatusOK)
		hits := a.hits.Load()
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, siteURL+"/", nil)
		if _, err := tc.Client.Do(req); err == nil {
			t.Fatal("parked request answered before its client gave up")
		}
		cancel()
		// max_waiting is 1: while the walked-away request holds its slot,
		// the next is rejected at once (which charges nothing). Once the
		// server has noticed the disconnect, the slot is free again and a
		// request waits for the next window.
		deadline := time.Now().Add(10 * time.Second)
		for {
			resp, _ = do(t, tc, http.MethodGet, siteURL+"/")
			if resp.StatusCode != http.StatusTooManyRequests || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		status(t, resp, http.StatusOK)
		if got := a.hits.Load() - hits; got != 1 {
			t.Fatalf("app saw %d requests after the disconnect, want 1", got)
		}
		// The abandoned request consumed nothing: the one that waited got
		// the next window's only slot and reports it spent exactly once.
		if used := resp.Header.Get("X-RateLimit-Used"); used != "1" {
			t.Fatalf("used %s in the new window, want 1", used)
		}
	})
	t.Run("waiting_is_bounded", func(t *testing.T) {
		// An hour-long window keeps the parked request parked for as long
		// as the test needs it.
		resp, _ := do(t, tc, http.MethodGet, siteURL+"/bounded")
		status(t, resp, http.StatusOK)
		parked := make(chan error, 1)
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, siteURL+"/bounded", nil)
			resp, err := tc.Client.Do(req)
			if err == nil {
				resp.Body.Close()
				err = fmt.Errorf("parked request answered %d", resp.StatusCode)
			}
			parked <- err
		}()
		waitForLog(t, logFile, 1, "delaying request", `"zone":"bounded"`)
		// max_waiting is 1 and one request waits: the next is turned away.
		resp, _ = do(t, tc, http.MethodGet, siteURL+"/bounded")
		status(t, resp, http.StatusTooManyRequests)
		cancel()
		if err := <-parked; !errors.Is(err, context.Canceled) {
			t.Fatalf("parked request: %v", err)
		}
		// Its slot is free again once the server has noticed the client
		// went away: then a request waits (until its client gives up)
		// instead of being turned away.
		deadline := time.Now().Add(10 * time.Second)
		for {
			waitCtx, waitCancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			req, _ := http.NewRequestWithContext(waitCtx, http.MethodGet, siteURL+"/bounded", nil)
			resp, err := tc.Client.Do(req)
			waitCancel()
			if err != nil {
				break // it waited: the slot was free
			}
			resp.Body.Close()
			if time.Now().After(deadline) {
				t.Fatalf("still answered %d: the disconnected request kept its slot", resp.StatusCode)
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}

func TestJSONConfig(t *testing.T) {
	tc := startCaddyWith(t, `{
	"admin": {"listen": "localhost:2999"},
	"apps": {"http": {"http_port": 9080, "servers": {"srv": {
		"listen": [":9080"],
		"routes": [{"handle": [
			{
				"handler": "rate_limit",
				"headers": "both",
				"store": {"backend": "memory", "max_keys": 1000},
				"zones": [{
					"name": "json_zone",
					"match": [{"path": ["/limited"]}],
					"key": "{http.request.header.X-Api-Key}",
					"limit": [ "{http.request.header.X-Quota}", 2 ],
					"window": "1h",
					"algorithm": "fixed_window",
					"cost": {"POST": 2}
				}]
			},
			{"handler": "static_response", "body": "ok"}
		]}]
	}}}}
}`, "json")
	resp, _ := do(t, tc, http.MethodPost, siteURL+"/limited", "X-Api-Key: k")
	status(t, resp, http.StatusOK)
	if resp.Header.Get("RateLimit-Policy") != `"json_zone";q=2;w=3600` {
		t.Fatalf("headers %v", resp.Header)
	}
	resp, _ = do(t, tc, http.MethodGet, siteURL+"/limited", "X-Api-Key: k")
	status(t, resp, http.StatusTooManyRequests)
	resp, _ = do(t, tc, http.MethodGet, siteURL+"/other", "X-Api-Key: k")
	status(t, resp, http.StatusOK)
}

func TestReloadKeepsCounters(t *testing.T) {
	site := `
:9080 {
	rate_limit {
		zone reload {
			limit 3
			window 1h
		}
	}
	respond "%s"
}
`
	tc := startCaddy(t, fmt.Sprintf(site, "v1"))
	for i := 0; i < 2; i++ {
		resp, _ := do(t, tc, http.MethodGet, siteURL+"/")
		status(t, resp, http.StatusOK)
	}
	if code, body := loadConfig(t, fmt.Sprintf(site, "v2")); code != http.StatusOK {
		t.Fatalf("reload: %d %s", code, body)
	}
	resp, body := do(t, tc, http.MethodGet, siteURL+"/")
	status(t, resp, http.StatusOK)
	if body != "v2" {
		t.Fatalf("new config not serving: %q", body)
	}
	resp, _ = do(t, tc, http.MethodGet, siteURL+"/")
	status(t, resp, http.StatusTooManyRequests)
}

// TestClientIPHonoursTrustedProxies: behind a trusted proxy the default key
// is the client's address from X-Forwarded-For, not the proxy's, so clients
// sharing one proxy do not share one counter.
func TestClientIPHonoursTrustedProxies(t *testing.T) {
	tc := startCaddyWith(t, withGlobals(`servers {
		trusted_proxies static 127.0.0.0/8 ::1
	}`)+`
:9080 {
	rate_limit {
		zone behind_proxy {
			limit 1
			window 1h
		}
	}
	respond "{http.rate_limit.key}"
}
`, "caddyfile")
	for _, client := range []string{"198.51.100.1", "198.51.100.2"} {
		resp, body := do(t, tc, http.MethodGet, siteURL+"/", "X-Forwarded-For: "+client)
		status(t, resp, http.StatusOK)
		if body != client {
			t.Fatalf("key %q, want %q", body, client)
		}
	}
	resp, _ := do(t, tc, http.MethodGet, siteURL+"/", "X-Forwarded-For: 198.51.100.1")
	status(t, resp, http.StatusTooManyRequests)
}

// TestMholtZoneRunsUnchanged: a zone written for mholt/caddy-ratelimit
// (match, key, events, window) works as written.
func TestMholtZoneRunsUnchanged(t *testing.T) {
	tc := startCaddy(t, `
:9080 {
	rate_limit {
		zone dynamic_example {
			match {
				method GET
			}
			key    {remote_host}
			events 2
			window 1h
		}
	}
	respond "ok"
}
`)
	for i, want := range []int{200, 200, 429} {
		resp, _ := do(t, tc, http.MethodGet, siteURL+"/")
		if resp.StatusCode != want {
			t.Fatalf("GET %d: %d, want %d", i, resp.StatusCode, want)
		}
	}
	resp, _ := do(t, tc, http.MethodPost, siteURL+"/")
	status(t, resp, http.StatusOK) // not matched by the zone
}

// memorySweeperRunning reports whether the memory store's background sweep
// goroutine exists in this process.
func memorySweeperRunning() bool {
	buf := make([]byte, 1<<20)
	return strings.Contains(string(buf[:runtime.Stack(buf, true)]), "storage.(*memoryCounters).sweepLoop")
}

// TestMemoryStoreStopsWhenUnused: the memory store's sweeper runs while a
// config uses the store, survives a reload to another such config, and stops
// once a reload leaves no config using it.
func TestMemoryStoreStopsWhenUnused(t *testing.T) {
	limited := `
:9080 {
	rate_limit {
		zone sweeper {
			limit 5
			window 1h
		}
	}
	respond "%s"
}
`
	startCaddy(t, fmt.Sprintf(limited, "v1"))
	if !memorySweeperRunning() {
		t.Fatal("no sweeper while a config uses the memory store")
	}
	if code, body := loadConfig(t, fmt.Sprintf(limited, "v2")); code != http.StatusOK {
		t.Fatalf("reload: %d %s", code, body)
	}
	if !memorySweeperRunning() {
		t.Fatal("sweeper stopped across a reload that still uses the store")
	}
	if code, body := loadConfig(t, ":9080 {\n\trespond \"plain\"\n}\n"); code != http.StatusOK {
		t.Fatalf("reload: %d %s", code, body)
	}
	deadline := time.Now().Add(10 * time.Second)
	for memorySweeperRunning() {
		if time.Now().After(deadline) {
			t.Fatal("sweeper still running with no config using the memory store")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
