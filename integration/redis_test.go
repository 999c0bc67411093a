package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
	"github.com/d61b427a/caddy-rate-limit/internal/wait"
)

// TestRedisStoreConfig loads Redis store configs as an operator would: bad
// ones are refused by `caddy adapt` or POST /load with a message naming
// the value, and leave the running config in place; placeholders resolve
// from the environment; the JSON form documented in docs/redis.md works.
func TestRedisStoreConfig(t *testing.T) {
	s := redistest.Standalone(t)

	adapter := caddyconfig.GetAdapter("caddyfile")
	for _, c := range []struct{ store, want string }{
		{"address redis://127.0.0.1:notaport", `address "redis://127.0.0.1:notaport"`},
		{"address redis://user:hunter2@127.0.0.1:70000", `address "redis://user:xxxxx@127.0.0.1:70000"`},
		{"address mysql://127.0.0.1:1", `scheme "mysql" is not supported`},
		{"address redis://127.0.0.1:1\ncluster\nsentinel m", "cluster and sentinel exclude each other"},
		{"address redis://127.0.0.1:1\ntimeout -5ms", `timeout: want a positive duration, got "-5ms"`},
		{"address redis://127.0.0.1:1\nreplicas 2", `unknown subdirective "replicas"`},
		{"", "address: missing (want at least one"},
	} {
		_, _, err := adapter.Adapt([]byte(globalOptions+redisSite(c.store, 5, "")), nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("adapt %q: error %v, want it to contain %q", c.store, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("adapt error shows the password: %v", err)
		}
	}

	t.Setenv("RL_TEST_REDIS_URL", s.URL()+"/2")
	t.Setenv("RL_TEST_BAD_REDIS_URL", "redis://rl:hunter2@127.0.0.1:port")
	startCaddy(t, redisSite("address {env.RL_TEST_REDIS_URL}", 2, ""))
	for i, want := range []int{200, 200, 429} {
		if code := get(t, siteURL+"/", "env"); code != want {
			t.Fatalf("request %d: %d, want %d", i, code, want)
		}
	}
	keys, err := s.DoIn(2, "KEYS", "rl:{*")
	if want, _ := s.CounterIn(2, "rl:", "per_client", clientKey("env")); err != nil || keys != want {
		t.Fatalf("keys in database 2: %q %v, want %s", keys, err, want)
	}

	// Bad reloads are refused, naming the value, and change nothing.
	for _, c := range []struct{ store, want string }{
		{"address {env.RL_TEST_BAD_REDIS_URL}", `address "{env.RL_TEST_BAD_REDIS_URL}" = "redis://rl:xxxxx@127.0.0.1:port"`},
		{"address {env.RL_TEST_NOT_SET}", `address "{env.RL_TEST_NOT_SET}"`},
		{"address redis://127.0.0.1:1 redis://127.0.0.1:2", "2 addresses given (want one, or cluster or sentinel)"},
	} {
		code, body := reload(t, redisSite(c.store, 100, ""))
		var answer struct{ Error string }
		if err := json.Unmarshal([]byte(body), &answer); err == nil {
			body = answer.Error
		}
		if code != http.StatusBadRequest || !strings.Contains(body, c.want) {
			t.Errorf("load %q: %d %s, want 400 naming %q", c.store, code, body, c.want)
		}
		if strings.Contains(body, "hunter2") {
			t.Errorf("load error shows the password: %s", body)
		}
	}
	if code := get(t, siteURL+"/", "env"); code != http.StatusTooManyRequests {
		t.Fatalf("after bad reloads: %d, want the running config's 429", code)
	}

	// The JSON form from docs/redis.md.
	code, body := reload(t, fmt.Sprintf(`{
	"apps": {"http": {"http_port": `+fmt.Sprint(sitePort)+`, "servers": {"srv0": {
		"listen": ["`+siteListen+`"],
		"routes": [{"handle": [
			{
				"handler": "rate_limit",
				"store": {
					"backend": "redis",
					"addresses": ["%s"],
					"timeout": "100ms",
					"key_prefix": "json:",
					"pool_size": 4
				},
				"zones": [{"name": "per_client", "key": "{http.request.header.X-Client}", "limit": 1, "window": "1h"}]
			},
			{"handler": "static_response", "body": "ok"}
		]}]
	}}}}
}`, s.URL()))
	if code != http.StatusOK {
		t.Fatalf("JSON config: %d %s", code, body)
	}
	for i, want := range []int{200, 429} {
		if code := get(t, siteURL+"/", "json"); code != want {
			t.Fatalf("JSON config, request %d: %d, want %d", i, code, want)
		}
	}
	if name, err := s.CounterIn(0, "json:", "per_client", clientKey("json")); err != nil {
		t.Fatal(err)
	} else if n, _ := s.Do("EXISTS", name); n != "1" {
		t.Fatal("JSON config: no counter under key_prefix json:")
	}
}

// TestRedisMultiZone checks the all-or-nothing rule on Redis: a request rejected by
// one zone consumes nothing in the others.
func TestRedisMultiZone(t *testing.T) {
	s := redistest.Standalone(t)
	startCaddy(t, fmt.Sprintf(`
`+siteAddr+` {
	rate_limit {
		store redis {
			address %s
			timeout 5s
		}
		zone per_client {
			key {header.X-Client}
			limit 5
			window 1h
		}
		zone per_client_strict {
			key {header.X-Client}
			limit 2
			window 1h
			algorithm fixed_window
		}
		zone global {
			key all
			limit 100
			window 1h
		}
	}
	respond "ok"
}
`, s.URL()))
	for i, want := range []int{200, 200, 429, 429, 429} {
		if code := get(t, siteURL+"/", "multi"); code != want {
			t.Fatalf("request %d: %d, want %d", i, code, want)
		}
	}
	for key, want := range map[string]string{
		counterKey(t, s, "per_client", clientKey("multi")):        "2",
		counterKey(t, s, "per_client_strict", clientKey("multi")): "2",
		counterKey(t, s, "global", storedKey("all", "all")):       "2",
	} {
		if got, err := s.Do("HGET", key, "c"); err != nil || got != want {
			t.Errorf("%s counts %q (%v), want %s", key, got, err, want)
		}
	}
}

// TestRedisFailure takes Redis away under a running Caddy: with the
// default on_store_error allow, requests pass whether Redis is killed or
// hangs (SIGSTOP), and the time they take is logged; with deny they get
// 503; when a new Redis starts on the same port, limiting resumes without
// a reload.
func TestRedisFailure(t *testing.T) {
	s := redistest.Standalone(t)
	store := "address " + s.URL() + "\ntimeout 250ms"
	startCaddy(t, redisSite(store, 1, ""))

	outage := func(t *testing.T, client string, want int) {
		t.Helper()
		var slowest, fast []time.Duration
		for i := range 40 {
			start := time.Now()
			code := get(t, siteURL+"/", client)
			took := time.Since(start)
			if code != want {
				t.Fatalf("request %d during the outage: %d, want %d", i, code, want)
			}
			if i < 3 {
				slowest = append(slowest, took)
			} else {
				fast = append(fast, took)
			}
		}
		sort.Slice(fast, func(i, j int) bool { return fast[i] < fast[j] })
		median := fast[len(fast)/2]
		// Durations depend on the machine, so they are logged, not
		// asserted; the Redis store's TestRedisTimeoutAndBreaker shows why each
		// request failed (timeout, refused, breaker open).
		t.Logf("first 3 requests took %v; then median %v (breaker open)", slowest, median)
	}
	// recovered waits for limiting to resume: the breaker's cooldown
	// passes and a probe finds Redis back. How long that took is logged.
	recovered := func(t *testing.T, client string) {
		t.Helper()
		start := time.Now()
		wait.For(t, "limiting to resume", func() bool { return get(t, siteURL+"/", client) == http.StatusTooManyRequests })
		t.Logf("limiting resumed after %v", time.Since(start))
	}

	// Limiting works before the outage. A busy machine may let a request
	// time out (and through, uncounted), so this waits for the 429
	// rather than expecting it of the second request.
	if code := get(t, siteURL+"/", "a"); code != 200 {
		t.Fatal(code)
	}
	wait.For(t, "key a to be limited", func() bool { return get(t, siteURL+"/", "a") == http.StatusTooManyRequests })

	t.Run("killed", func(t *testing.T) {
		s.Kill()
		outage(t, "b", http.StatusOK)
		// Let through without an answer from Redis: no counts to claim.
		resp, _ := do(t, http.MethodGet, siteURL+"/", "X-Client: b")
		if h := resp.Header.Get("X-RateLimit-Limit") + resp.Header.Get("X-RateLimit-Remaining"); h != "" {
			t.Fatalf("failed-open response claims counts: %v", resp.Header)
		}
		if err := s.Restart(); err != nil {
			t.Fatal(err)
		}
		recovered(t, "c")
	})

	t.Run("paused", func(t *testing.T) {
		if err := s.Pause(); err != nil {
			t.Fatal(err)
		}
		outage(t, "d", http.StatusOK)
		if err := s.Resume(); err != nil {
			t.Fatal(err)
		}
		recovered(t, "e")
	})

	t.Run("errors logged with a count, not per request", func(t *testing.T) {
		logFile := filepath.Join(t.TempDir(), "caddy.log")
		mustReload(t, withGlobals(jsonLog(logFile, "INFO"))+redisSite(store, 1, ""))
		s.Kill()
		const requests = 200
		for range requests {
			if code := get(t, siteURL+"/", "log"); code != http.StatusOK {
				t.Fatalf("status %d during the outage", code)
			}
		}
		var lines, counted int
		for _, e := range logEntries(logLines(logFile)) {
			if e["msg"] == "rate limit store error" {
				lines++
				n, _ := e["errors_since_last_log"].(float64)
				counted += int(n)
			}
		}
		t.Logf("%d requests during the outage: %d log lines counting %d errors", requests, lines, counted)
		// At most a line a second (handler_test's TestStoreErrorLog
		// shows the clock's part), each counting the errors since the
		// last; the errors after the last line wait for the next one.
		if lines < 1 || lines >= requests || counted < lines || counted > requests {
			t.Errorf("%d store error lines counting %d errors for %d requests; want fewer lines than requests, with counts", lines, counted, requests)
		}
		if err := s.Restart(); err != nil {
			t.Fatal(err)
		}
		recovered(t, "log2")
	})

	t.Run("deny", func(t *testing.T) {
		if code, body := reload(t, redisSite(store, 1, "on_store_error deny")); code != 200 {
			t.Fatal(code, body)
		}
		s.Kill()
		outage(t, "f", http.StatusServiceUnavailable)
		if err := s.Restart(); err != nil {
			t.Fatal(err)
		}
		recovered(t, "g")
	})
}

// TestRedisClientsGoingAway sends 3,000 requests for one key through Caddy
// with the Redis store, 32 at a time, and gives up a third of them after a
// random 0 to 3 ms, as clients going away under load do. They give up
// while queued for a shared script call, while it is in flight and after
// it answered. Caddy must stay up (a request's arguments are read by its
// call until it answers; see the Redis store's
// TestRedisSentRequestHeldUntilAnswered), every request answered 200 must be counted, and no more than
// were sent.
func TestRedisClientsGoingAway(t *testing.T) {
	s := redistest.Standalone(t)
	startCaddy(t, redisSite("address "+s.URL(), 1000000, ""))
	const sent = 3000
	served := sendGivingUp([]string{siteURL + "/"}, sent, "X-Client: away")
	if code := get(t, siteURL+"/", "after"); code != http.StatusOK {
		t.Fatalf("after the clients went away: %d, want 200", code)
	}
	// The window is an hour: if it rolled during the test, p holds what
	// was counted before.
	var counted int64
	for _, f := range []string{"c", "p"} {
		v, err := s.Do("HGET", counterKey(t, s, "per_client", clientKey("away")), f)
		if err != nil {
			t.Fatal(err)
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		counted += n
	}
	if counted < served || counted > sent {
		t.Fatalf("Redis counted %d requests; %d were answered 200 and %d sent", counted, served, sent)
	}
	t.Logf("%d sent, %d answered 200, %d counted", sent, served, counted)
}

// TestRedisOutageDenyLogIsBounded: with on_store_error deny, every request
// during an outage is answered 503 with Retry-After, while the log gets
// only the rate-limited store error line, not one line per request. With
// handle_errors configured, the 503 is still the operator's to shape.
func TestRedisOutageDenyLogIsBounded(t *testing.T) {
	s := redistest.Standalone(t)
	store := "address " + s.URL() + "\ntimeout 50ms"
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	globals := withGlobals(jsonLog(logFile, "INFO"))
	startCaddy(t, globals+redisSite(store, 1, "on_store_error deny"))
	storeErrors := `caddy_http_rate_limit_store_errors_total{store="redis"}`
	errorsBefore := metricCount(t, adminURL, storeErrors)
	s.Kill()

	l := startLoad(t, 8, "outage")
	l.progress(t, 1000)
	byStatus, failed, lastErr := l.end()
	if failed != 0 || len(byStatus) != 1 || byStatus[http.StatusServiceUnavailable] == 0 {
		t.Fatalf("answers during the outage by status %v, %d without an answer (%v): want only 503", byStatus, failed, lastErr)
	}
	if n := metricCount(t, adminURL, storeErrors) - errorsBefore; n != byStatus[http.StatusServiceUnavailable] {
		t.Errorf("store errors metric grew by %d for %d × 503", n, byStatus[http.StatusServiceUnavailable])
	}
	resp, _ := do(t, http.MethodGet, siteURL+"/", "X-Client: outage")
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("during the outage: %d, Retry-After %q; want 503 with Retry-After 1", resp.StatusCode, resp.Header.Get("Retry-After"))
	}

	var storeLines, errorLines int
	for _, e := range logEntries(logLines(logFile)) {
		if e["msg"] == "rate limit store error" {
			storeLines++
			if e["level"] != "warn" {
				t.Errorf("store error logged at %v, want warn", e["level"])
			}
		}
		if e["level"] == "error" {
			errorLines++
		}
	}
	t.Logf("%d requests during the outage: %d store error lines, %d error lines", byStatus[503], storeLines, errorLines)
	// A line a second at most (TestStoreErrorLog shows the clock's part):
	// far fewer lines than requests.
	if storeLines < 1 || storeLines*10 > byStatus[503] {
		t.Errorf("%d store error lines for %d requests: want a line a second, not one per request", storeLines, byStatus[503])
	}
	if errorLines != 0 {
		t.Errorf("%d lines at error level for %d rejected requests: the log grows with the traffic", errorLines, byStatus[503])
	}

	t.Run("handle_errors shapes the 503", func(t *testing.T) {
		mustReload(t, globals+strings.Replace(redisSite(store, 1, "on_store_error deny"), "\trespond \"ok\"\n", `	respond "ok"
	handle_errors 503 {
		respond "store down: {err.status_code}"
	}
`, 1))
		resp, body := do(t, http.MethodGet, siteURL+"/", "X-Client: shaped")
		if resp.StatusCode != http.StatusServiceUnavailable || body != "store down: 503" || resp.Header.Get("Retry-After") != "1" {
			t.Fatalf("%d %q, Retry-After %q; want the error route's 503 with Retry-After 1", resp.StatusCode, body, resp.Header.Get("Retry-After"))
		}
	})
}

// TestClientGoneIsNotAStoreError: a client that gives up while its request
// waits for Redis cancels the request. Whatever the store then says (here
// its timeout: go-redis does not break off a read when a context is
// cancelled), that is the client's doing, not a store failure: the
// request is logged as 499 and nothing as a store error.
func TestClientGoneIsNotAStoreError(t *testing.T) {
	s := redistest.Standalone(t)
	store := "address " + s.URL() + "\ntimeout 1s"
	dir := t.TempDir()
	logFile, accessLog := filepath.Join(dir, "caddy.log"), filepath.Join(dir, "access.log")
	site := strings.Replace(redisSite(store, 5, "on_store_error deny"), "\trespond \"ok\"\n",
		"\trespond \"ok\"\n\tlog {\n\t\toutput file "+accessLog+"\n\t\tformat json\n\t}\n", 1)
	startCaddy(t, withGlobals(jsonLog(logFile, "INFO"))+site)
	if code := get(t, siteURL+"/", "gone"); code != http.StatusOK {
		t.Fatalf("before the pause: %d", code)
	}

	storeErrors := `caddy_http_rate_limit_store_errors_total{store="redis"}`
	errorsBefore := metricCount(t, adminURL, storeErrors)
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	defer s.Resume()
	// The request waits for the paused Redis until its client gives up.
	if r := giveUp(t, siteURL+"/", 300*time.Millisecond, "X-Client: gone"); r.err == nil {
		t.Fatalf("answered %+v while Redis is paused", r)
	}
	waitForLog(t, accessLog, 1, `"status":499`)
	if n := len(logLines(logFile, "rate limit store error")); n != 0 {
		b, _ := os.ReadFile(logFile)
		t.Fatalf("a client that went away was logged as a store error:\n%s", b)
	}
	if n := metricCount(t, adminURL, storeErrors) - errorsBefore; n != 0 {
		t.Fatalf("a client that went away counted %d store errors", n)
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	if code := get(t, siteURL+"/", "gone"); code != http.StatusOK {
		t.Fatalf("after the pause: %d", code)
	}
}

// TestRedisServerVersion: a config whose Redis is recent enough loads,
// and the store logs the server's version; a reload whose Redis answers
// with a version older than the scripts need (4.0.14, from a stand-in:
// no such server can be installed here) is refused, naming the version
// found and the one needed, and leaves the running config in place.
func TestRedisServerVersion(t *testing.T) {
	s := redistest.Standalone(t)
	version, err := s.Info("server", "redis_version")
	if err != nil {
		t.Fatal(err)
	}
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	startCaddy(t, withGlobals(jsonLog(logFile, "INFO"))+redisSite("address "+s.URL(), 1, ""))
	waitForLog(t, logFile, 1, `"msg":"Redis server version"`, `"server":"`+s.Addr+`"`, `"version":"`+version+`"`)
	wantStatuses(t, statuses(t, 2, "v"), 200, 429)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	redistest.ServeOld(t, l, "4.0.14")
	code, body := reload(t, withGlobals(jsonLog(logFile, "INFO"))+redisSite("address redis://"+l.Addr().String(), 100, ""))
	if code != http.StatusBadRequest || !strings.Contains(body, "version 4.0.14") || !strings.Contains(body, "needs Redis 5.0 or later") {
		t.Fatalf("load with a Redis 4.0.14: %d %s, want 400 naming 4.0.14 and 5.0", code, body)
	}
	wantStatuses(t, statuses(t, 1, "v"), 429)
}
