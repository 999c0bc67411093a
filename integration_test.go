package ratelimit

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

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
