package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/internal/names"
	"github.com/dunglas/httpsfv"
)

func TestRejectsOverLimitBeforeTheApp(t *testing.T) {
	a := newApp(t)
	startCaddy(t, fmt.Sprintf(`
`+siteAddr+` {
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
		resp, body := do(t, http.MethodGet, siteURL+"/")
		status(t, resp, http.StatusOK)
		if body != "app" {
			t.Fatalf("body %q", body)
		}
	}
	for i := 0; i < 3; i++ {
		resp, _ := do(t, http.MethodGet, siteURL+"/")
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
	startCaddy(t, fmt.Sprintf(`
`+siteAddr+` {
	rate_limit {
		zone uploads {
			limit 1
			window 1h
		}
	}
	reverse_proxy %s
}
`, a.url))
	resp, _ := do(t, http.MethodPost, siteURL+"/upload")
	status(t, resp, http.StatusOK)

	// Promise a megabyte and send none of it: a handler that read the body
	// would wait until the deadline, so an answer proves the body was
	// never read.
	resp = send(t, func() (*http.Response, error) {
		conn, err := net.Dial("tcp", siteListen)
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
	startCaddy(t, `
`+siteAddr+` {
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
	do(t, http.MethodGet, siteURL+"/")
	resp, body := do(t, http.MethodGet, siteURL+"/")
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
	startCaddy(t, `
`+siteAddr+` {
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
		{http.MethodOptions, 200, "0"}, // free even when the budget is all taken
		{http.MethodGet, 429, "0"},
	}
	for i, s := range steps {
		resp, _ := do(t, s.method, siteURL+"/")
		if resp.StatusCode != s.status || resp.Header.Get("X-RateLimit-Remaining") != s.remaining {
			t.Fatalf("step %d %s: %d remaining %q, want %d %q", i, s.method, resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"), s.status, s.remaining)
		}
	}
}

func TestKeysAlternativesAndMatchers(t *testing.T) {
	startCaddy(t, `
`+siteAddr+` {
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
			resp, body := do(t, http.MethodGet, siteURL+"/api/x", "X-Api-Key: "+key)
			status(t, resp, http.StatusOK)
			if body != "apikey:"+key {
				t.Fatalf("key %q, want apikey:%s", body, key)
			}
		}
		resp, _ := do(t, http.MethodGet, siteURL+"/api/x", "X-Api-Key: "+key)
		status(t, resp, http.StatusTooManyRequests)
	}
	// Without the header the key falls back to the client IP.
	resp, body := do(t, http.MethodGet, siteURL+"/api/x")
	status(t, resp, http.StatusOK)
	if !strings.HasPrefix(body, "ip:127.0.0.1") && !strings.HasPrefix(body, "ip:::1") {
		t.Fatalf("fallback key %q", body)
	}
	// Paths outside the matcher are not limited.
	for i := 0; i < 5; i++ {
		resp, _ := do(t, http.MethodGet, siteURL+"/public", "X-Api-Key: alice")
		status(t, resp, http.StatusOK)
		if resp.Header.Get("X-RateLimit-Limit") != "" {
			t.Fatal("unmatched request got rate limit headers")
		}
	}
}

func TestHugeKeyIsHashed(t *testing.T) {
	startCaddy(t, `
`+siteAddr+` {
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
	resp, body := do(t, http.MethodGet, siteURL+"/", "X-Api-Key: "+huge)
	status(t, resp, http.StatusOK)
	if !strings.HasPrefix(body, "#") || len(body) != 1+32 {
		t.Fatalf("key %q", body)
	}
	resp, _ = do(t, http.MethodGet, siteURL+"/", "X-Api-Key: "+huge)
	status(t, resp, http.StatusTooManyRequests)
}

func TestIPPrefixGroupsANetwork(t *testing.T) {
	startCaddy(t, `
`+siteAddr+` {
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
		resp, body := do(t, http.MethodGet, siteURL+"/", "X-Client: "+c.a)
		status(t, resp, http.StatusOK)
		if body != c.net {
			t.Fatalf("key %q, want %q", body, c.net)
		}
		do(t, http.MethodGet, siteURL+"/", "X-Client: "+c.b)
		resp, _ = do(t, http.MethodGet, siteURL+"/", "X-Client: "+c.a)
		status(t, resp, http.StatusTooManyRequests)
	}
}

func TestLimitAlternatives(t *testing.T) {
	startCaddy(t, `
`+siteAddr+` {
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
		_, body := do(t, http.MethodGet, siteURL+"/", h...)
		if body != c.want {
			t.Errorf("quota %q: limit %q, want %q", c.quota, body, c.want)
		}
	}
}

func TestMultipleZones(t *testing.T) {
	a := newApp(t)
	startCaddy(t, fmt.Sprintf(`
`+siteAddr+` {
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
	resp, _ := do(t, http.MethodGet, siteURL+"/narrow")
	status(t, resp, http.StatusOK)
	if resp.Header.Get("X-RateLimit-Limit") != "1" {
		t.Fatalf("headers describe limit %s, want the zone with least remaining (1)", resp.Header.Get("X-RateLimit-Limit"))
	}
	// Rejected by narrow: consumes nothing in wide.
	for i := 0; i < 5; i++ {
		resp, _ := do(t, http.MethodGet, siteURL+"/narrow")
		status(t, resp, http.StatusTooManyRequests)
	}
	resp, _ = do(t, http.MethodGet, siteURL+"/other")
	status(t, resp, http.StatusOK)
	if got := resp.Header.Get("X-RateLimit-Used"); got != "2" {
		t.Fatalf("wide zone used %s, want 2: rejected requests were taken", got)
	}
	if a.hits.Load() != 2 {
		t.Fatalf("app saw %d", a.hits.Load())
	}
}

func TestZonesWithTheSameNameShareCounters(t *testing.T) {
	startCaddy(t, `
`+siteAddr+` {
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
		resp, _ := do(t, http.MethodGet, siteURL+p)
		status(t, resp, http.StatusOK)
	}
	resp, _ := do(t, http.MethodGet, siteURL+"/b")
	status(t, resp, http.StatusTooManyRequests)
}

func TestHeaders(t *testing.T) {
	for _, mode := range []string{"x-ratelimit", "ietf", "both", "off"} {
		t.Run(mode, func(t *testing.T) {
			startCaddy(t, fmt.Sprintf(`
`+siteAddr+` {
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
			resp, _ := do(t, http.MethodGet, siteURL+"/")
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
		startCaddy(t, `
`+siteAddr+` {
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
		resp, _ := do(t, http.MethodGet, siteURL+"/")
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
	startCaddy(t, `
`+siteAddr+` {
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
	_, body := do(t, http.MethodGet, siteURL+"/", "X-User: u1")
	if body != "z user:u1 1 0 false" {
		t.Fatalf("allowed: %q", body)
	}
	_, body = do(t, http.MethodGet, siteURL+"/", "X-User: u1")
	if body != "z user:u1 1 0 true" {
		t.Fatalf("rejected: %q", body)
	}
}

func TestDryRunNeverRejects(t *testing.T) {
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	a := newApp(t)
	startCaddy(t, withGlobals(fmt.Sprintf(`log {
		output file %s
		level INFO
	}`, logFile))+fmt.Sprintf(`
`+siteAddr+` {
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
`, a.url))
	var exceeded []string
	for i := 0; i < 4; i++ {
		resp, _ := do(t, http.MethodGet, siteURL+"/")
		status(t, resp, http.StatusOK)
		exceeded = append(exceeded, resp.Header.Get("X-Exceeded"))
	}
	if strings.Join(exceeded, ",") != "false,false,true,true" {
		t.Fatalf("exceeded: %v", exceeded)
	}
	if a.hits.Load() != 4 {
		t.Fatalf("app saw %d of 4", a.hits.Load())
	}
	// Would-be rejections are logged at info, a line a second at most,
	// each counting those since the last: 50 more make no more than a
	// line for each second they took.
	start := time.Now()
	for range 50 {
		do(t, http.MethodGet, siteURL+"/")
	}
	most := 2 + int(time.Since(start).Seconds())
	waitForLog(t, logFile, 1, "would be exceeded (dry run)", `"zone":"trial"`)
	if n := len(logLines(logFile, "would be exceeded (dry run)")); n > most {
		t.Fatalf("%d dry-run lines for 52 would-be rejections, want at most %d (one a second)", n, most)
	}
}

// TestClientIPHonoursTrustedProxies: behind a trusted proxy the default key
// is the client's address from X-Forwarded-For, not the proxy's, so clients
// sharing one proxy do not share one counter.
func TestClientIPHonoursTrustedProxies(t *testing.T) {
	startCaddy(t, withGlobals(`servers {
		trusted_proxies static 127.0.0.0/8 ::1
	}`)+`
`+siteAddr+` {
	rate_limit {
		zone behind_proxy {
			limit 1
			window 1h
		}
	}
	respond "{http.rate_limit.key}"
}
`)
	for _, client := range []string{"198.51.100.1", "198.51.100.2"} {
		resp, body := do(t, http.MethodGet, siteURL+"/", "X-Forwarded-For: "+client)
		status(t, resp, http.StatusOK)
		if body != client {
			t.Fatalf("key %q, want %q", body, client)
		}
	}
	resp, _ := do(t, http.MethodGet, siteURL+"/", "X-Forwarded-For: 198.51.100.1")
	status(t, resp, http.StatusTooManyRequests)
}

// TestMholtZoneRunsUnchanged: a zone written for mholt/caddy-ratelimit
// (match, key, events, window) works as written.
func TestMholtZoneRunsUnchanged(t *testing.T) {
	startCaddy(t, `
`+siteAddr+` {
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
		resp, _ := do(t, http.MethodGet, siteURL+"/")
		if resp.StatusCode != want {
			t.Fatalf("GET %d: %d, want %d", i, resp.StatusCode, want)
		}
	}
	resp, _ := do(t, http.MethodPost, siteURL+"/")
	status(t, resp, http.StatusOK) // not matched by the zone
}

// sfNames are zone names that Go's %q would have written as invalid
// RFC 8941 strings, or that test its escapes, names that would add
// parameters or list members of their own were they not in a String,
// and the longest allowed.
var sfNames = []string{
	"with space",
	`quo"te`,
	`back\slash`,
	`"\ both \"`,
	`semi;q=1000000;w=1`,
	`comma, "other";q=1000000`,
	`quote";q=1000000;w="1`,
	strings.Repeat(`a"\ `, names.MaxLen/4),
}

// TestRateLimitHeadersAreStructuredFields: RateLimit and RateLimit-Policy
// parse as RFC 8941 Lists of one Item, the zone's name as a String with
// its parameters, for names with spaces, quotes, backslashes, the ; , and
// = of parameters and list members, and the longest allowed, on allowed
// and rejected responses.
func TestRateLimitHeadersAreStructuredFields(t *testing.T) {
	if len(sfNames[len(sfNames)-1]) != names.MaxLen {
		t.Fatalf("the longest name is %d long, want %d", len(sfNames[len(sfNames)-1]), names.MaxLen)
	}
	var routes []any
	for i, name := range sfNames {
		routes = append(routes, map[string]any{
			"match": []any{map[string]any{"path": []string{fmt.Sprintf("/%d", i)}}},
			"handle": []any{
				map[string]any{"handler": "rate_limit", "headers": "ietf",
					"zones": []any{map[string]any{"name": name, "limit": 1, "window": "1h"}}},
				map[string]any{"handler": "static_response", "body": "ok"},
			},
		})
	}
	config, err := json.Marshal(map[string]any{
		"apps": map[string]any{"http": map[string]any{"http_port": sitePort, "servers": map[string]any{
			"srv": map[string]any{"listen": []string{siteListen}, "routes": routes},
		}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	startCaddy(t, string(config))
	for i, name := range sfNames {
		for _, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
			resp, _ := do(t, http.MethodGet, fmt.Sprintf("%s/%d", siteURL, i))
			status(t, resp, want)
			assertSFItem(t, resp.Header.Values("RateLimit-Policy"), name, map[string]int64{"q": 1, "w": 3600})
			assertSFItem(t, resp.Header.Values("RateLimit"), name, map[string]int64{"r": 0, "t": -1})
		}
	}

	// The same names from a Caddyfile (quotes escaped as the Caddyfile
	// lexer wants, backslashes as they are).
	startCaddy(t, `
`+siteAddr+` {
	rate_limit {
		headers ietf
		zone "with \"space\"; q=9, and \ " {
			limit 5
			window 1m
		}
	}
	respond "ok"
}
`)
	resp, _ := do(t, http.MethodGet, siteURL+"/")
	status(t, resp, http.StatusOK)
	assertSFItem(t, resp.Header.Values("RateLimit-Policy"), `with "space"; q=9, and \ `, map[string]int64{"q": 5, "w": 60})
	assertSFItem(t, resp.Header.Values("RateLimit"), `with "space"; q=9, and \ `, map[string]int64{"r": 4, "t": -1})
}

// assertSFItem parses values as an RFC 8941 List and checks that it holds
// one Item: the String name, with integer parameters as in params (-1:
// any positive integer).
func assertSFItem(t *testing.T, values []string, name string, params map[string]int64) {
	t.Helper()
	list, err := httpsfv.UnmarshalList(values)
	if err != nil {
		t.Fatalf("%q: not an RFC 8941 List: %v", values, err)
	}
	if len(list) != 1 {
		t.Fatalf("%q: %d members, want 1", values, len(list))
	}
	item, ok := list[0].(httpsfv.Item)
	if !ok {
		t.Fatalf("%q: an inner list, want an Item", values)
	}
	if got, ok := item.Value.(string); !ok || got != name {
		t.Fatalf("%q: value %#v, want the String %q", values, item.Value, name)
	}
	if item.Params.Names() == nil || len(item.Params.Names()) != len(params) {
		t.Fatalf("%q: parameters %v, want %v", values, item.Params.Names(), params)
	}
	for key, want := range params {
		v, ok := item.Params.Get(key)
		n, isInt := v.(int64)
		if !ok || !isInt || (want >= 0 && n != want) || (want < 0 && n < 1) {
			t.Fatalf("%q: %s=%#v, want %d", values, key, v, want)
		}
	}
}

// TestJitterSpreadsRetryAfter sends 200 requests over a limit through
// Caddy. With jitter 0.5 their Retry-After spreads uniformly over the wait
// W to 1.5 W, rounded up; without jitter every one is W, rounded up.
// Either way the reset the headers report, and so the counters, keep the
// true instant.
func TestJitterSpreadsRetryAfter(t *testing.T) {
	// A fixed window whose end is a long way off, so the waits are
	// hundreds of seconds and spread over hundreds of values. Windows are
	// aligned to the epoch, so pick a length whose current window has
	// more than half of it left.
	window := int64(1000)
	for now := time.Now().Unix(); window-now%window < window*6/10; window++ {
	}
	for _, jitter := range []float64{0, 0.5} {
		t.Run(fmt.Sprintf("jitter %v", jitter), func(t *testing.T) {
			option := ""
			if jitter > 0 {
				option = fmt.Sprintf("jitter %v", jitter)
			}
			zone := fmt.Sprintf("jitter_%d", int(jitter*10))
			startCaddy(t, fmt.Sprintf(`
`+siteAddr+` {
	rate_limit {
		%s
		zone %s {
			key static
			limit 1
			window %ds
			algorithm fixed_window
		}
	}
	respond "ok"
}
`, option, zone, window))
			resp, _ := do(t, http.MethodGet, siteURL+"/")
			status(t, resp, http.StatusOK)
			reset, _ := strconv.ParseInt(resp.Header.Get("X-RateLimit-Reset"), 10, 64)
			end := time.Unix(reset, 0) // the window's end: when the key may next be allowed

			var shares []float64 // where each Retry-After fell in [W, (1+jitter) W]
			values := map[int64]bool{}
			for range 200 {
				before := time.Now()
				resp, _ := do(t, http.MethodGet, siteURL+"/")
				after := time.Now()
				status(t, resp, http.StatusTooManyRequests)
				if got := resp.Header.Get("X-RateLimit-Reset"); got != strconv.FormatInt(reset, 10) {
					t.Fatalf("X-RateLimit-Reset %s on a rejection, want the true instant %d", got, reset)
				}
				ra, err := strconv.ParseInt(resp.Header.Get("Retry-After"), 10, 64)
				if err != nil || ra < 1 {
					t.Fatalf("Retry-After %q, want an integer >= 1", resp.Header.Get("Retry-After"))
				}
				// The handler measured the wait between before and after.
				most, least := end.Sub(before).Seconds(), end.Sub(after).Seconds()
				if lo, hi := math.Ceil(least), math.Ceil(most*(1+jitter)); float64(ra) < lo || float64(ra) > hi {
					t.Fatalf("Retry-After %d, want %v to %v (wait %.1f s, jitter %v)", ra, lo, hi, most, jitter)
				}
				values[ra] = true
				if jitter > 0 {
					shares = append(shares, (float64(ra)-least)/(most*jitter))
				}
			}
			if jitter == 0 {
				if len(values) > 2 {
					t.Fatalf("without jitter, %d different Retry-After values, want the same wait (give or take the second it may cross)", len(values))
				}
				return
			}
			// Uniform over the range: each quarter of it gets about 50 of
			// the 200 (fewer than 20 in any quarter has odds of about 1e-7),
			// and both ends of the range are reached (missing the last
			// tenth at one end: 0.9^200, about 1e-9).
			var quarters [4]int
			lowest, highest := 1.0, 0.0
			for _, s := range shares {
				quarters[min(max(int(s*4), 0), 3)]++
				lowest, highest = min(lowest, s), max(highest, s)
			}
			t.Logf("window %ds, %d distinct values, quarters %v, shares %.3f to %.3f", window, len(values), quarters, lowest, highest)
			for q, n := range quarters {
				if n < 20 {
					t.Fatalf("quarter %d of the jitter range got %d of 200 (%v), want about 50", q, n, quarters)
				}
			}
			if lowest > 0.1 || highest < 0.9 {
				t.Fatalf("Retry-After spread over %.2f to %.2f of the jitter range, want nearly all of it", lowest, highest)
			}
		})
	}
}

// TestZoneStatus: a zone's rejections answer with its status (default
// 429), with Retry-After and the limit headers, whatever the algorithm;
// handle_errors shapes them as it does a 429; the app never sees them.
func TestZoneStatus(t *testing.T) {
	a := newApp(t)
	startCaddy(t, fmt.Sprintf(`
`+siteAddr+` {
	rate_limit /fixed* {
		zone status_fixed {
			key {header.X-Client}
			limit 1
			window 1h
			algorithm fixed_window
			status 503
		}
	}
	rate_limit /sliding* {
		zone status_sliding {
			key {header.X-Client}
			limit 1
			window 1h
			algorithm sliding_tail
			status 418
		}
	}
	rate_limit /default* {
		zone status_default {
			key {header.X-Client}
			limit 1
			window 1h
		}
	}
	reverse_proxy %s
	handle_errors 503 418 {
		respond "shaped {http.error.status_code} ({http.rate_limit.zone}), retry in {http.response.header.Retry-After}s" {http.error.status_code}
	}
}
`, a.url))
	for _, c := range []struct {
		path, zone string
		status     int
		shaped     bool
	}{
		{"/fixed", "status_fixed", http.StatusServiceUnavailable, true},
		{"/sliding", "status_sliding", http.StatusTeapot, true},
		{"/default", "status_default", http.StatusTooManyRequests, false},
	} {
		t.Run(c.zone, func(t *testing.T) {
			resp, body := do(t, http.MethodGet, siteURL+c.path, "X-Client: c")
			status(t, resp, http.StatusOK)
			if body != "app" {
				t.Fatalf("first request: %q", body)
			}
			hits := a.hits.Load()
			resp, body = do(t, http.MethodGet, siteURL+c.path, "X-Client: c")
			status(t, resp, c.status)
			ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
			if err != nil || ra < 1 {
				t.Fatalf("Retry-After %q", resp.Header.Get("Retry-After"))
			}
			if resp.Header.Get("X-RateLimit-Remaining") != "0" {
				t.Fatalf("limit headers lost: %v", resp.Header)
			}
			if c.shaped {
				if want := fmt.Sprintf("shaped %d (%s), retry in %ds", c.status, c.zone, ra); body != want {
					t.Fatalf("body %q, want %q", body, want)
				}
			}
			if a.hits.Load() != hits {
				t.Fatal("the app saw a rejected request")
			}
		})
	}
}
