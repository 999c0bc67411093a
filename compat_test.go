package ratelimit

import (
	"github.com/d61b427a/caddy-rate-limit/internal/names"

	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
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
		assertSFString(t, sfString(name), name)
	}
	assertSFString(t, sfString(string(all)), string(all))
	for _, bad := range []string{"zöne", "a\tb", "a\nb", "a\x00", "\x7f", strings.Repeat("n", names.MaxLen+1)} {
		if names.Check(bad) == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func assertSFString(t *testing.T, field, want string) {
	t.Helper()
	item, err := httpsfv.UnmarshalItem([]string{field})
	if err != nil {
		t.Fatalf("%s: not an RFC 8941 Item: %v", field, err)
	}
	if got, ok := item.Value.(string); !ok || got != want {
		t.Fatalf("%s reads as %#v, want %q", field, item.Value, want)
	}
}

// sfNames are zone names that Go's %q would have written as invalid
// RFC 8941 strings, or that test its escapes, and the longest allowed.
var sfNames = []string{
	"with space",
	`quo"te`,
	`back\slash`,
	`"\ both \"`,
	strings.Repeat(`a"\ `, names.MaxLen/4),
}

// TestRateLimitHeadersAreStructuredFields: RateLimit and RateLimit-Policy
// parse as RFC 8941 Lists of one Item, the zone's name as a String with
// its parameters, for names with spaces, quotes, backslashes and the
// longest allowed, on allowed and rejected responses.
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
		"admin": map[string]any{"listen": "localhost:2999"},
		"apps": map[string]any{"http": map[string]any{"http_port": 9080, "servers": map[string]any{
			"srv": map[string]any{"listen": []string{":9080"}, "routes": routes},
		}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	tc := startCaddyWith(t, string(config), "json")
	for i, name := range sfNames {
		for _, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
			resp, _ := do(t, tc, http.MethodGet, fmt.Sprintf("%s/%d", siteURL, i))
			status(t, resp, want)
			assertSFItem(t, resp.Header.Values("RateLimit-Policy"), name, map[string]int64{"q": 1, "w": 3600})
			assertSFItem(t, resp.Header.Values("RateLimit"), name, map[string]int64{"r": 0, "t": -1})
		}
	}

	// The same names from a Caddyfile (quotes escaped as the Caddyfile
	// lexer wants, backslashes as they are).
	tc = startCaddy(t, `
:9080 {
	rate_limit {
		headers ietf
		zone "with \"space\" and \ " {
			limit 5
			window 1m
		}
	}
	respond "ok"
}
`)
	resp, _ := do(t, tc, http.MethodGet, siteURL+"/")
	status(t, resp, http.StatusOK)
	assertSFItem(t, resp.Header.Values("RateLimit-Policy"), `with "space" and \ `, map[string]int64{"q": 5, "w": 60})
	assertSFItem(t, resp.Header.Values("RateLimit"), `with "space" and \ `, map[string]int64{"r": 4, "t": -1})
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
			tc := startCaddy(t, fmt.Sprintf(`
:9080 {
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
			resp, _ := do(t, tc, http.MethodGet, siteURL+"/")
			status(t, resp, http.StatusOK)
			reset, _ := strconv.ParseInt(resp.Header.Get("X-RateLimit-Reset"), 10, 64)
			end := time.Unix(reset, 0) // the window's end: when the key may next be allowed

			var shares []float64 // where each Retry-After fell in [W, (1+jitter) W]
			values := map[int64]bool{}
			for range 200 {
				before := time.Now()
				resp, _ := do(t, tc, http.MethodGet, siteURL+"/")
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

// TestJitterKeepsTheTrueInstant: with the largest jitter drawn, Retry-After
// says twice the wait, but the key is allowed again at the true instant,
// as the counters hold it.
func TestJitterKeepsTheTrueInstant(t *testing.T) {
	h := provisionHandler(t, `{"jitter":1,"zones":[{"name":"unit_jitter_instant","key":"k","limit":1,"window":"2s","algorithm":"fixed_window"}]}`)
	h.random = func() float64 { return 1 }
	// Start early in a window, so the wait is over a second and doubling
	// it shows.
	if ms := time.Now().UnixMilli() % 2000; ms > 500 {
		time.Sleep(time.Duration(2000-ms+20) * time.Millisecond)
	}
	if got := serve(t, h, context.Background(), http.MethodGet, "192.0.2.1"); got.status != http.StatusOK {
		t.Fatalf("first request: %d", got.status)
	}
	now := time.Now()
	got := serve(t, h, context.Background(), http.MethodGet, "192.0.2.1")
	if got.status != http.StatusTooManyRequests {
		t.Fatalf("second request: %d, want 429", got.status)
	}
	reset, _ := strconv.ParseInt(got.header.Get("X-RateLimit-Reset"), 10, 64)
	end := time.Unix(reset, 0)
	wait := end.Sub(now)
	ra, _ := strconv.ParseInt(got.header.Get("Retry-After"), 10, 64)
	if want := int64(math.Ceil((2 * wait).Seconds())); ra < want-1 || ra > want {
		t.Fatalf("Retry-After %d with the largest jitter, want twice the %s wait, %d", ra, wait, want)
	}
	time.Sleep(time.Until(end) + 20*time.Millisecond)
	if got := serve(t, h, context.Background(), http.MethodGet, "192.0.2.1"); got.status != http.StatusOK {
		t.Fatalf("at the true instant (%ds before Retry-After): %d, want allowed", ra-int64(wait.Seconds()), got.status)
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

// TestSweepIntervalReclaimsExpiredKeys: through Caddy, sweep_interval
// reaches the memory store. With it at 50ms an expired key's slot is
// emptied within moments of its counts ceasing to matter; with the default
// (10 s) the slot is still held then.
func TestSweepIntervalReclaimsExpiredKeys(t *testing.T) {
	for _, option := range []string{"sweep_interval 50ms", ""} {
		t.Run(fmt.Sprintf("%q", option), func(t *testing.T) {
			tc := startCaddy(t, fmt.Sprintf(`
:9080 {
	rate_limit {
		%s
		zone sweep_zone {
			key static
			limit 5
			window 100ms
		}
	}
	respond "ok"
}
`, option))
			started := time.Now() // a new store: its first default sweep is 10 s on
			held := func() bool {
				z := runningZone("sweep_zone")
				if z == nil || z.admin == nil {
					t.Fatal("sweep_zone is not running")
				}
				counts, _, err := z.admin.KeyState(context.Background(), "sweep_zone", "static")
				if err != nil {
					t.Fatal(err)
				}
				return counts.Window != 0 // the counts as stored; zero once the slot is empty
			}
			resp, _ := do(t, tc, http.MethodGet, siteURL+"/")
			status(t, resp, http.StatusOK)
			if !held() {
				t.Fatal("no slot for the key after a request")
			}
			// Counts are kept to the end of the next window, in whole
			// seconds: 2.3 s on at the latest they no longer matter.
			expired := time.Now().Add(2300 * time.Millisecond)
			time.Sleep(time.Until(expired))
			if option == "" {
				if time.Since(started) >= 9*time.Second {
					t.Skip("too slow to tell the default sweep from none")
				}
				if !held() {
					t.Fatal("the expired key's slot was emptied before the first default sweep")
				}
				return
			}
			for held() {
				if time.Since(expired) > 2*time.Second {
					t.Fatal("the expired key still holds its slot 2 s after it expired, with sweep_interval 50ms")
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// TestLogKeyPutsTheKeyInTheRejectionLog: mholt's log_key logs the key of
// a rejected request, as log_keys on does.
func TestLogKeyPutsTheKeyInTheRejectionLog(t *testing.T) {
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	tc := startCaddyWith(t, withGlobals(fmt.Sprintf(`log {
		output file %s
		level DEBUG
	}`, logFile))+`
:9080 {
	rate_limit {
		log_key
		zone log_key_zone {
			key {header.X-Client}
			events 1
			window 1h
		}
	}
	respond "ok"
}
`, "caddyfile")
	resp, _ := do(t, tc, http.MethodGet, siteURL+"/", "X-Client: client-7")
	status(t, resp, http.StatusOK)
	resp, _ = do(t, tc, http.MethodGet, siteURL+"/", "X-Client: client-7")
	status(t, resp, http.StatusTooManyRequests)
	waitForLog(t, logFile, 1, "rate limit exceeded", `"zone":"log_key_zone"`, `"key":"client-7"`)
}

// TestDisableMetricsLeavesNoSeries: a handler with disable_metrics adds no
// series for its zone, however its requests go (allowed, rejected, a
// window rolled over), while a handler beside it without the option is
// counted as usual.
func TestDisableMetricsLeavesNoSeries(t *testing.T) {
	tc := startCaddy(t, `
:9080 {
	route /quiet {
		rate_limit {
			disable_metrics
			zone quiet_zone {
				limit 2
				window 1s
				algorithm fixed_window
			}
		}
		respond "quiet"
	}
	route /loud {
		rate_limit {
			zone loud_zone {
				limit 2
				window 1s
				algorithm fixed_window
			}
		}
		respond "loud"
	}
}
`)
	for _, path := range []string{"/quiet", "/loud"} {
		for range 3 { // two allowed, one rejected
			do(t, tc, http.MethodGet, siteURL+path)
		}
		// Into the next window, which rolls the key over and reports its
		// usage.
		first, _ := do(t, tc, http.MethodGet, siteURL+path)
		for {
			time.Sleep(50 * time.Millisecond)
			resp, _ := do(t, tc, http.MethodGet, siteURL+path)
			if resp.Header.Get("X-RateLimit-Reset") != first.Header.Get("X-RateLimit-Reset") {
				break
			}
		}
	}
	resp, err := http.Get(adminURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	metrics := string(raw)
	if strings.Contains(metrics, `zone="quiet_zone"`) {
		t.Fatalf("series for quiet_zone despite disable_metrics:\n%s", grepLines(metrics, "quiet_zone"))
	}
	for _, series := range []string{
		`caddy_http_rate_limit_requests_total{result="allowed",zone="loud_zone"}`,
		`caddy_http_rate_limit_requests_total{result="rejected",zone="loud_zone"}`,
		`caddy_http_rate_limit_period_usage_ratio_count{zone="loud_zone"}`,
	} {
		if metricCount(t, series) < 1 {
			t.Fatalf("%s absent or 0 for the handler without disable_metrics", series)
		}
	}
}

func grepLines(s, part string) string {
	var out []string
	for line := range strings.Lines(s) {
		if strings.Contains(line, part) {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return strings.Join(out, "\n")
}

// TestMholtOptionsInJSON: the handler options go under the same names in
// JSON, and the Caddyfile adapts to them. (TestBadJSONRefused refuses
// distributed and storage in JSON, with what to write instead.)
func TestMholtOptionsInJSON(t *testing.T) {
	h := provisionHandler(t, `{"jitter":0.2,"sweep_interval":"1m","log_key":true,"disable_metrics":true,
		"zones":[{"name":"unit_json_options","limit":1,"window":"1h"}]}`)
	if h.Jitter != 0.2 || h.SweepInterval != caddy.Duration(time.Minute) || !h.LogKey || !h.DisableMetrics || h.random == nil {
		t.Fatalf("options not read: %+v", h)
	}
	if got := h.keyField("k"); got.String != "k" {
		t.Fatalf("log_key: key logged as %q", got.String)
	}
	adapted, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(globalOptions+`
:9080 {
	rate_limit {
		jitter 0.2
		sweep_interval 1m
		log_key
		disable_metrics
		zone z {
			events 1
			window 1h
		}
	}
}
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"jitter":0.2`, `"sweep_interval":60000000000`, `"log_key":true`, `"disable_metrics":true`} {
		if !strings.Contains(string(adapted), want) {
			t.Fatalf("adapted JSON lacks %s:\n%s", want, adapted)
		}
	}
}
