package integration

import (
	"fmt"
	"math"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
	"github.com/d61b427a/caddy-rate-limit/internal/wait"
)

// TestLogKeyPutsTheKeyInTheRejectionLog: mholt's log_key logs the key of
// a rejected request, as log_keys on does.
func TestLogKeyPutsTheKeyInTheRejectionLog(t *testing.T) {
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	startCaddy(t, withGlobals(fmt.Sprintf(`log {
		output file %s
		level DEBUG
	}`, logFile))+`
`+siteAddr+` {
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
`)
	resp, _ := do(t, http.MethodGet, siteURL+"/", "X-Client: client-7")
	status(t, resp, http.StatusOK)
	resp, _ = do(t, http.MethodGet, siteURL+"/", "X-Client: client-7")
	status(t, resp, http.StatusTooManyRequests)
	waitForLog(t, logFile, 1, "rate limit exceeded", `"zone":"log_key_zone"`, `"key":"client-7"`)
}

// TestDisableMetricsLeavesNoSeries: a handler with disable_metrics adds no
// series for its zone, however its requests go (allowed, rejected, a
// window rolled over), while a handler beside it without the option is
// counted as usual.
func TestDisableMetricsLeavesNoSeries(t *testing.T) {
	startCaddy(t, `
`+siteAddr+` {
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
			do(t, http.MethodGet, siteURL+path)
		}
		// Into the next window, which rolls the key over and reports its
		// usage.
		first, _ := do(t, http.MethodGet, siteURL+path)
		wait.For(t, "the next window", func() bool {
			resp, _ := do(t, http.MethodGet, siteURL+path)
			return resp.Header.Get("X-RateLimit-Reset") != first.Header.Get("X-RateLimit-Reset")
		})
	}
	_, metrics := adminJSON(t, adminURL, http.MethodGet, "/metrics", "")
	if quiet := linesWith(metrics, `zone="quiet_zone"`); len(quiet) != 0 {
		t.Fatalf("series for quiet_zone despite disable_metrics:\n%s", strings.Join(quiet, ""))
	}
	for _, series := range []string{
		`caddy_http_rate_limit_requests_total{result="allowed",zone="loud_zone"}`,
		`caddy_http_rate_limit_requests_total{result="rejected",zone="loud_zone"}`,
		`caddy_http_rate_limit_period_usage_ratio_count{zone="loud_zone"}`,
	} {
		if metricCount(t, adminURL, series) < 1 {
			t.Fatalf("%s absent or 0 for the handler without disable_metrics", series)
		}
	}
}

// TestDisableMetricsReachesTheStore: disable_metrics also turns off the
// series a store adds of its own: a Redis store's leases count in no
// lease_units_total series for a handler with it, while a handler beside
// it, leasing from the same server, is counted as usual.
func TestDisableMetricsReachesTheStore(t *testing.T) {
	s := redistest.Standalone(t)
	store := redisStore("address " + s.URL() + "\nlease on")
	startCaddy(t, fmt.Sprintf(`
`+siteAddr+` {
	route /quiet {
		rate_limit {
			disable_metrics
			%[1]s
			zone quiet_leases {
				key hot
				limit 1000000
				window 1h
			}
		}
		respond "quiet"
	}
	route /loud {
		rate_limit {
			%[1]s
			zone loud_leases {
				key hot
				limit 1000000
				window 1h
			}
		}
		respond "loud"
	}
}
`, store))
	for range 200 {
		for _, path := range []string{"/quiet", "/loud"} {
			resp, _ := do(t, http.MethodGet, siteURL+path)
			status(t, resp, http.StatusOK)
		}
	}
	_, metrics := adminJSON(t, adminURL, http.MethodGet, "/metrics", "")
	leases := linesWith(metrics, "caddy_http_rate_limit_lease_units_total{")
	if quiet := linesWith(strings.Join(leases, ""), `zone="quiet_leases"`); len(quiet) != 0 {
		t.Fatalf("lease series for quiet_leases despite disable_metrics:\n%s", strings.Join(quiet, ""))
	}
	if loud := linesWith(strings.Join(leases, ""), `zone="loud_leases"`); len(loud) == 0 {
		t.Fatalf("no lease series for loud_leases, the handler without disable_metrics:\n%s", strings.Join(leases, ""))
	}
}

// TestMetrics: requests are counted by zone and result in Caddy's
// registry, and the counts survive reloads without a duplicate
// registration error.
func TestMetrics(t *testing.T) {
	site := func(limit int) string {
		return fmt.Sprintf(`
`+siteAddr+` {
	rate_limit {
		zone metrics_enforce {
			key {header.X-Client}
			limit %d
			window 1h
		}
		zone metrics_trial {
			key {header.X-Client}
			limit 1
			window 1h
			dry_run
		}
	}
	respond "ok"
}
`, limit)
	}
	startCaddy(t, site(2))
	// Counters live as long as the process: compare with where they were.
	count := func(series string) int { return metricCount(t, adminURL, series) }
	allowed := `caddy_http_rate_limit_requests_total{result="allowed",zone="metrics_enforce"}`
	before := map[string]int{}
	for _, series := range []string{allowed,
		`caddy_http_rate_limit_requests_total{result="rejected",zone="metrics_enforce"}`,
		`caddy_http_rate_limit_requests_total{result="allowed",zone="metrics_trial"}`,
		`caddy_http_rate_limit_requests_total{result="dry_run",zone="metrics_trial"}`} {
		before[series] = count(series)
	}
	for range 3 {
		do(t, http.MethodGet, siteURL+"/", "X-Client: m")
	}
	want := map[string]int{
		allowed: 2,
		`caddy_http_rate_limit_requests_total{result="rejected",zone="metrics_enforce"}`: 1,
		`caddy_http_rate_limit_requests_total{result="allowed",zone="metrics_trial"}`:    1,
		`caddy_http_rate_limit_requests_total{result="dry_run",zone="metrics_trial"}`:    1,
	}
	for series, n := range want {
		if got := count(series) - before[series]; got != n {
			t.Errorf("%s grew by %d, want %d", series, got, n)
		}
	}
	for i := range 3 {
		if code, body := reload(t, site(3+i)); code != http.StatusOK {
			t.Fatalf("reload %d: %d %s", i, code, body)
		}
	}
	do(t, http.MethodGet, siteURL+"/", "X-Client: m")
	if got := count(allowed) - before[allowed]; got != 3 {
		t.Fatalf("allowed grew by %d after reloads, want 3: counts survive reloads", got)
	}
	if _, body := adminJSON(t, adminURL, http.MethodGet, "/metrics", ""); strings.Contains(body, "m\"") && strings.Contains(body, `key="`) {
		t.Fatal("a series is labelled with a key")
	}
}

// TestPeriodUsage: once a key's window has finished, the take that moves
// it into the next window observes the share of the limit it used, with
// either store.
func TestPeriodUsage(t *testing.T) {
	t.Run("memory", func(t *testing.T) { testPeriodUsage(t, "usage_memory", "") })
	t.Run("redis", func(t *testing.T) {
		s := redistest.Standalone(t)
		testPeriodUsage(t, "usage_redis", redisStore("address "+s.URL()))
	})
}

func testPeriodUsage(t *testing.T, zone, store string) {
	startCaddy(t, fmt.Sprintf(`
`+siteAddr+` {
	rate_limit {
		%s
		zone %s {
			key {header.X-Client}
			limit 100
			window 1s
			algorithm fixed_window
		}
	}
	respond "ok"
}
`, store, zone))
	count := `caddy_http_rate_limit_period_usage_ratio_count{zone="` + zone + `"}`
	sum := `caddy_http_rate_limit_period_usage_ratio_sum{zone="` + zone + `"}`
	before := metricCount(t, adminURL, count)
	var sumBefore float64
	fmt.Sscan(metricValue(t, adminURL, sum), &sumBefore)

	// Requests until one lands in a later window (told by its reset
	// instant): that one rolls the key, and reports the share of the
	// limit the requests before it used.
	resp, _ := do(t, http.MethodGet, siteURL+"/", "X-Client: u")
	reset := resp.Header.Get("X-RateLimit-Reset")
	used := 1
	wait.For(t, "a request in the next window", func() bool {
		if metricCount(t, adminURL, count) != before {
			t.Fatal("usage observed before the window was rolled")
		}
		resp, _ := do(t, http.MethodGet, siteURL+"/", "X-Client: u")
		if resp.Header.Get("X-RateLimit-Reset") != reset {
			return true
		}
		if resp.StatusCode == http.StatusOK {
			used++ // a rejected request uses nothing
		}
		return false
	})
	var sumAfter float64
	fmt.Sscan(metricValue(t, adminURL, sum), &sumAfter)
	if n, share := metricCount(t, adminURL, count)-before, sumAfter-sumBefore; n != 1 || math.Abs(share-float64(used)/100) > 1e-9 {
		t.Fatalf("%d observations adding %v, want one of %v (%d of 100)", n, share, float64(used)/100, used)
	}
}

// TestKeysHiddenByDefault: keys are often credentials. By default the
// rejection, dry-run and ban log lines, the rate_limit_exceeded event,
// the zone's top keys and the admin API's answer about the key show it
// as one hash, and the key is nowhere in Caddy's log; with log_keys on
// they show the key itself.
func TestKeysHiddenByDefault(t *testing.T) {
	const secret, shown = "sk_live_4f9a2c71", "sk_live_shown"
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	startCaddy(t, withEvents(t, withGlobals(jsonLog(logFile, "DEBUG"))+`
`+siteAddr+` {
	rate_limit {
		zone keys_hidden {
			key {header.X-Api-Key}
			limit 1
			window 1h
			ban 1h
		}
		zone keys_hidden_dry {
			key {header.X-Api-Key}
			limit 1
			window 1h
			dry_run
		}
	}
	respond "ok"
}
`+site2Addr+` {
	rate_limit {
		log_keys on
		zone keys_shown {
			key {header.X-Api-Key}
			limit 1
			window 1h
			ban 1h
		}
	}
	respond "ok"
}
`))
	for _, c := range []struct{ url, key string }{{siteURL + "/", secret}, {site2URL + "/", shown}} {
		resp, _ := do(t, http.MethodGet, c.url, "X-Api-Key: "+c.key)
		status(t, resp, http.StatusOK)
		resp, _ = do(t, http.MethodGet, c.url, "X-Api-Key: "+c.key)
		status(t, resp, http.StatusTooManyRequests)
	}

	// The hash that stands for the key is the one its rejection's log
	// line shows; every other place must show it too. (It is read from
	// the log, not asked of the admin API, whose log line of the request
	// would hold the key.)
	waitForLog(t, logFile, 1, "rate limit exceeded", `"zone":"keys_hidden"`)
	hash, _ := logEntries(logLines(logFile, "rate limit exceeded", `"zone":"keys_hidden"`))[0]["key"].(string)
	if !hashForm.MatchString(hash) {
		t.Fatalf("keys_hidden's rejection logs the key as %q, want # and 16 hex digits", hash)
	}
	for _, c := range []struct{ msg, zone, key string }{
		{"rate limit exceeded", "keys_hidden", hash},
		{"rate limit ban", "keys_hidden", hash},
		{"rate limit would be exceeded (dry run)", "keys_hidden_dry", hash},
		{"rate limit exceeded", "keys_shown", shown},
		{"rate limit ban", "keys_shown", shown},
	} {
		waitForLog(t, logFile, 1, c.msg, `"zone":"`+c.zone+`"`, `"key":"`+c.key+`"`, `"from":"{http.request.header.X-Api-Key}"`)
	}
	if lines := logLines(logFile, secret); len(lines) != 0 {
		t.Fatalf("the key is in the log:\n%s", strings.Join(lines, ""))
	}

	events := map[string]any{}
	for _, e := range recordedEvents() {
		events[e.Data["zone"].(string)] = e.Data["key"]
	}
	if events["keys_hidden"] != hash || events["keys_shown"] != shown {
		t.Fatalf("the events' keys by zone: %v, want keys_hidden's as the hash %s and keys_shown's as %s", events, hash, shown)
	}

	for _, c := range []struct{ zone, key string }{{"keys_hidden", hash}, {"keys_shown", shown}} {
		code, body := adminJSON(t, adminURL, http.MethodGet, "/rate_limit/zones/"+c.zone+"/top", "")
		if code != http.StatusOK || !strings.Contains(body, `"key":"`+c.key+`"`) || strings.Contains(body, secret) {
			t.Fatalf("top keys of %s: %d %s, want the key shown as %s", c.zone, code, body, c.key)
		}
	}

	// The key the operator asks about is echoed, with the hash that
	// stands for it elsewhere.
	for _, c := range []struct{ zone, key, hash string }{{"keys_hidden", secret, hash}, {"keys_shown", shown, ""}} {
		if k := keyState(t, adminURL, c.zone, c.key); k.Key != c.key || k.Hash != c.hash {
			t.Fatalf("GET key %s of %s: %+v, want the key and the hash %q", c.key, c.zone, k, c.hash)
		}
	}
}
