package ratelimit

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
)

// redisSite is a site on :9080 limited by one zone in Redis: limit requests
// per minute for each X-Client header value, answered "ok".
func redisSite(store string, limit int, extra string) string {
	return fmt.Sprintf(`
:9080 {
	rate_limit {
		store redis {
%s
		}
		%s
		zone per_client {
			key {header.X-Client}
			limit %d
			window 1h
		}
	}
	respond "ok"
}
`, store, extra, limit)
}

// redisHTTP opens a connection per request, so that no request lands on a
// connection that a config reload is closing.
var redisHTTP = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}

// redisGet sends GET / with X-Client: client to the in-process Caddy and
// returns the status and how long the answer took.
func redisGet(t *testing.T, client string) (int, time.Duration) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, siteURL+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Client", client)
	start := time.Now()
	resp := send(t, func() (*http.Response, error) { return redisHTTP.Do(req) })
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, time.Since(start)
}

// postJSON loads a JSON config through the admin API.
func postJSON(t *testing.T, config string) (int, string) {
	t.Helper()
	resp, err := http.Post(adminURL+"/load", "application/json", strings.NewReader(config))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestRedisStoreConfig loads Redis store configs as an operator would: bad
// ones are refused by `caddy adapt` or POST /load with a message naming
// the value, and leave the running config in place; placeholders resolve
// from the environment; the JSON form documented in the README works.
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
		if code, _ := redisGet(t, "env"); code != want {
			t.Fatalf("request %d: %d, want %d", i, code, want)
		}
	}
	keys, err := s.DoIn(2, "KEYS", "rl:*")
	if err != nil || keys != "rl:{env}:per_client" {
		t.Fatalf("keys in database 2: %q %v", keys, err)
	}

	// Bad reloads are refused, naming the value, and change nothing.
	for _, c := range []struct{ store, want string }{
		{"address {env.RL_TEST_BAD_REDIS_URL}", `address "{env.RL_TEST_BAD_REDIS_URL}" = "redis://rl:xxxxx@127.0.0.1:port"`},
		{"address {env.RL_TEST_NOT_SET}", `address "{env.RL_TEST_NOT_SET}"`},
		{"address redis://127.0.0.1:1 redis://127.0.0.1:2", "2 addresses given (want one, or cluster or sentinel)"},
	} {
		code, body := loadConfig(t, redisSite(c.store, 100, ""))
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
	if code, _ := redisGet(t, "env"); code != http.StatusTooManyRequests {
		t.Fatalf("after bad reloads: %d, want the running config's 429", code)
	}

	// The JSON form from the README.
	code, body := postJSON(t, fmt.Sprintf(`{
	"admin": {"listen": "localhost:2999"},
	"apps": {"http": {"http_port": 9080, "servers": {"srv0": {
		"listen": [":9080"],
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
		if code, _ := redisGet(t, "json"); code != want {
			t.Fatalf("JSON config, request %d: %d, want %d", i, code, want)
		}
	}
	if n, _ := s.Do("EXISTS", "json:{json}:per_client"); n != "1" {
		t.Fatal("JSON config: no counter under key_prefix json:")
	}
}

// TestRedisMultiZone checks the SPEC rule on Redis: a request rejected by
// one zone consumes nothing in the others.
func TestRedisMultiZone(t *testing.T) {
	s := redistest.Standalone(t)
	startCaddy(t, fmt.Sprintf(`
:9080 {
	rate_limit {
		store redis {
			address %s
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
		if code, _ := redisGet(t, "multi"); code != want {
			t.Fatalf("request %d: %d, want %d", i, code, want)
		}
	}
	for key, want := range map[string]string{
		"rl:{multi}:per_client":        "2",
		"rl:{multi}:per_client_strict": "2",
		"rl:{all}:global":              "2",
	} {
		if got, err := s.Do("HGET", key, "c"); err != nil || got != want {
			t.Errorf("%s counts %q (%v), want %s", key, got, err, want)
		}
	}
}

// TestRedisFailure takes Redis away under a running Caddy: with the
// default on_store_error allow, requests pass whether Redis is killed or
// hangs (SIGSTOP), and the time they take is logged; with deny they get 503; when a new Redis starts on the same
// port, limiting resumes within 5 s without a reload.
func TestRedisFailure(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the circuit breaker")
	}
	s := redistest.Standalone(t)
	store := "address " + s.URL() + "\ntimeout 50ms"
	startCaddy(t, redisSite(store, 1, ""))

	outage := func(t *testing.T, client string, want int) {
		t.Helper()
		var slowest, fast []time.Duration
		for i := range 40 {
			code, took := redisGet(t, client)
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
		// asserted; storage's TestRedisTimeoutAndBreaker shows why each
		// request failed (timeout, refused, breaker open).
		t.Logf("first 3 requests took %v; then median %v (breaker open)", slowest, median)
	}
	recovered := func(t *testing.T, client string) {
		t.Helper()
		start := time.Now()
		for {
			code, _ := redisGet(t, client)
			if code == http.StatusTooManyRequests {
				t.Logf("limiting resumed after %v", time.Since(start))
				return
			}
			if time.Since(start) > 5*time.Second {
				t.Fatal("limiting did not resume within 5s")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	if code, _ := redisGet(t, "a"); code != 200 {
		t.Fatal(code)
	}
	if code, _ := redisGet(t, "a"); code != 429 {
		t.Fatal(code)
	}

	t.Run("killed", func(t *testing.T) {
		s.Kill()
		outage(t, "b", http.StatusOK)
		// Let through without an answer from Redis: no counts to claim.
		req, _ := http.NewRequest(http.MethodGet, siteURL+"/", nil)
		req.Header.Set("X-Client", "b")
		resp, err := redisHTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
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

	t.Run("errors logged at most once per second", func(t *testing.T) {
		logFile := filepath.Join(t.TempDir(), "caddy.log")
		caddyfile := withGlobals("log {\n\toutput file "+logFile+"\n\tformat json\n}") + redisSite(store, 1, "")
		config, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
		if err != nil {
			t.Fatal(err)
		}
		if code, body := postJSON(t, string(config)); code != 200 {
			t.Fatal(code, body)
		}
		s.Kill()
		requests := 0
		start := time.Now()
		for ; time.Since(start) < 2500*time.Millisecond; requests++ {
			if code, _ := redisGet(t, "log"); code != http.StatusOK {
				t.Fatalf("status %d during the outage", code)
			}
			time.Sleep(5 * time.Millisecond)
		}
		elapsed := time.Since(start)
		text, err := os.ReadFile(logFile)
		if err != nil {
			t.Fatal(err)
		}
		var lines, counted int
		for _, line := range strings.Split(string(text), "\n") {
			var entry struct {
				Msg   string
				Count int `json:"errors_since_last_log"`
			}
			if json.Unmarshal([]byte(line), &entry) == nil && entry.Msg == "rate limit store error" {
				lines++
				counted += entry.Count
			}
		}
		t.Logf("%d requests in %v of outage: %d log lines counting %d errors", requests, elapsed, lines, counted)
		// A line at most each second, each counting the errors since the
		// last; the errors after the last line wait for the next one.
		if lines < 2 || lines > int(elapsed/time.Second)+1 || counted <= lines || counted > requests {
			t.Errorf("%d store error lines counting %d errors for %d requests over %v; want one line a second, with counts", lines, counted, requests, elapsed)
		}
		if err := s.Restart(); err != nil {
			t.Fatal(err)
		}
		recovered(t, "log2")
	})

	t.Run("deny", func(t *testing.T) {
		if code, body := loadConfig(t, redisSite(store, 1, "on_store_error deny")); code != 200 {
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

// TestRedisReloads reloads the config 100 times through the admin API (the
// issue asks for 50, SPEC §4 for 100) and checks that the Redis connections
// and the goroutines are where they started: configs share one client, and
// the last one to go closes it.
func TestRedisReloads(t *testing.T) {
	s := redistest.Standalone(t)
	other := redistest.Standalone(t)
	store := "address " + s.URL()
	startCaddy(t, redisSite(store, 1000, ""))
	redisGet(t, "warm")

	clients := func(s *redistest.Server) int {
		n, err := s.Clients("caddy-rate-limit")
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	settled := func(want func() bool) bool {
		for range 100 {
			if want() {
				return true
			}
			time.Sleep(50 * time.Millisecond)
		}
		return false
	}
	baseClients := clients(s)
	baseGoroutines := runtime.NumGoroutine()
	if baseClients < 1 {
		t.Fatalf("%d Redis clients before reloading", baseClients)
	}

	const reloads = 100
	for i := range reloads {
		if code, body := loadConfig(t, redisSite(store, 1000+i, "")); code != 200 {
			t.Fatalf("reload %d: %d %s", i, code, body)
		}
		if code, _ := redisGet(t, "reload"); code != 200 {
			t.Fatalf("request after reload %d: %d", i, code)
		}
	}
	if c, err := s.Do("HGET", "rl:{reload}:per_client", "c"); err != nil || c != strconv.Itoa(reloads) {
		t.Fatalf("counter after %d reloads: %q %v, want %d: counts survive reloads", reloads, c, err, reloads)
	}
	var nc, ng int
	if !settled(func() bool {
		nc, ng = clients(s), runtime.NumGoroutine()
		return nc <= baseClients && ng <= baseGoroutines+2
	}) {
		t.Fatalf("after %d reloads: %d Redis clients (started with %d), %d goroutines (started with %d)", reloads, nc, baseClients, ng, baseGoroutines)
	}
	t.Logf("after %d reloads: %d Redis clients (started with %d), %d goroutines (started with %d)", reloads, nc, baseClients, ng, baseGoroutines)

	// Moving to another Redis closes the old connections; moving away
	// from Redis closes the rest.
	if code, body := loadConfig(t, redisSite("address "+other.URL(), 1000, "")); code != 200 {
		t.Fatal(code, body)
	}
	redisGet(t, "moved")
	if !settled(func() bool { return clients(s) == 0 && clients(other) >= 1 }) {
		t.Fatalf("after moving: %d clients on the old Redis, %d on the new", clients(s), clients(other))
	}
	if code, body := loadConfig(t, `
:9080 {
	respond "ok"
}
`); code != 200 {
		t.Fatal(code, body)
	}
	if !settled(func() bool { return clients(other) == 0 }) {
		t.Fatalf("%d clients left after Redis went out of the config", clients(other))
	}
}

// startFleet runs n Caddy processes built from ./cmd/caddy, each with its
// own admin and site port, all limiting one zone (limit per minute per
// X-Client) in the Redis store configured by store. A store error answers
// 503, so that no failure passes for an allowed request, and the timeout
// is generous, so that a loaded 2-core machine causes none. It returns the
// sites' URLs; the processes are killed when t ends.
func startFleet(t *testing.T, n int, store string, limit int) []string {
	t.Helper()
	sites, _ := startFleetWithAdmin(t, n, store, limit)
	return sites
}

// startFleetWithAdmin is startFleet that also returns each instance's admin
// endpoint URL.
func startFleetWithAdmin(t *testing.T, n int, store string, limit int) (sites, admins []string) {
	t.Helper()
	var urls []string
	for range n {
		site, admin := freeLoopbackPort(t), freeLoopbackPort(t)
		url := fmt.Sprintf("http://127.0.0.1:%d/", site)
		startProcess(t, processGlobals(t, admin, site)+fmt.Sprintf(`http://127.0.0.1:%d {
	rate_limit {
		store redis {
%s
			timeout 5s
		}
		on_store_error deny
		zone fleet {
			key {header.X-Client}
			limit %d
			window 1h
		}
	}
	respond "ok"
}
`, site, store, limit), url)
		urls = append(urls, url)
		admins = append(admins, fmt.Sprintf("http://127.0.0.1:%d", admin))
	}
	return urls, admins
}

// burst sends n concurrent requests for client, spread over urls, and
// counts the answers by status.
func burst(t *testing.T, urls []string, client string, n int) map[int]int {
	t.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	codes := map[int]int{}
	start := make(chan struct{})
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}, Timeout: 30 * time.Second}
	defer hc.CloseIdleConnections()
	for i := range n {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodGet, urls[i%len(urls)], nil)
			req.Header.Set("X-Client", client)
			<-start
			resp, err := hc.Do(req)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				codes[-1]++
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes[resp.StatusCode]++
		})
	}
	close(start)
	wg.Wait()
	return codes
}

// TestRedisFleetExact runs 3 Caddy processes on one Redis, on a 3-master
// Redis Cluster and behind a Sentinel, and sends 150 concurrent requests
// for one key with limit 30: exactly 30 pass.
func TestRedisFleetExact(t *testing.T) {
	if testing.Short() {
		t.Skip("builds Caddy and runs a fleet")
	}
	exact := func(t *testing.T, urls []string, client string) {
		t.Helper()
		codes := burst(t, urls, client, 150)
		if codes[200] != 30 || codes[429] != 120 {
			t.Fatalf("client %s: answers by status %v, want exactly 30 × 200 and 120 × 429", client, codes)
		}
	}

	t.Run("standalone", func(t *testing.T) {
		s := redistest.Standalone(t)
		urls := startFleet(t, 3, "address "+s.URL(), 30)
		if _, err := s.Do("CONFIG", "RESETSTAT"); err != nil {
			t.Fatal(err)
		}
		exact(t, urls, "one")
		stats, err := s.CommandStats()
		if err != nil {
			t.Fatal(err)
		}
		total := 0
		for _, n := range stats {
			total += n
		}
		scripts := stats["evalsha"] + stats["eval"]
		t.Logf("150 requests, 30 allowed: %d scripts run (%d EVALSHA), %d commands in all (%v)", scripts, stats["evalsha"], total-stats["config"], stats)
		if scripts > 150 {
			t.Errorf("%d scripts for 150 requests: more than one per request", scripts)
		}
	})

	t.Run("cluster", func(t *testing.T) {
		c := redistest.NewCluster(t, 3)
		urls := startFleet(t, 3, "address "+strings.Join(c.URLs(), " ")+"\ncluster", 30)
		// One key on each node, all three bursts at once.
		byNode := map[int]string{}
		for i := 0; len(byNode) < len(c.Nodes); i++ {
			key := "client-" + strconv.Itoa(i)
			node, err := c.NodeFor(key)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := byNode[node]; !ok {
				byNode[node] = key
			}
		}
		var wg sync.WaitGroup
		for _, key := range byNode {
			wg.Go(func() { exact(t, urls, key) })
		}
		wg.Wait()
		for node, key := range byNode {
			if n, err := c.Nodes[node].Do("HGET", "rl:{"+key+"}:fleet", "c"); err != nil || n != "30" {
				t.Errorf("node %d holds %q for %s (%v), want 30", node, n, key, err)
			}
		}
	})

	t.Run("sentinel", func(t *testing.T) {
		s := redistest.NewSentinel(t, "fleet")
		urls := startFleet(t, 3, "address "+s.Sentinel.URL()+"\nsentinel fleet", 30)
		exact(t, urls, "one")
		if n, err := s.Master.Do("HGET", "rl:{one}:fleet", "c"); err != nil || n != "30" {
			t.Fatalf("master holds %q (%v), want 30", n, err)
		}
	})
}

// TestRedisClientsGoingAway sends 3,000 requests for one key through Caddy
// with the Redis store, 32 at a time, and gives up a third of them after a
// random 0 to 3 ms, as clients going away under load do. They give up
// while queued for a shared script call, while it is in flight and after
// it answered. Caddy must stay up (a request's arguments are read by its
// call until it answers; see TestRedisSentRequestHeldUntilAnswered in
// storage), every request answered 200 must be counted, and no more than
// were sent.
func TestRedisClientsGoingAway(t *testing.T) {
	if testing.Short() {
		t.Skip("sends 3,000 requests")
	}
	s := redistest.Standalone(t)
	startCaddy(t, redisSite("address "+s.URL(), 1000000, ""))
	const sent = 3000
	served := sendGivingUp([]string{siteURL + "/"}, "away", sent)
	if code, _ := redisGet(t, "after"); code != http.StatusOK {
		t.Fatalf("after the clients went away: %d, want 200", code)
	}
	// The window is an hour: if it rolled during the test, p holds what
	// was counted before.
	var counted int64
	for _, f := range []string{"c", "p"} {
		v, err := s.Do("HGET", "rl:{away}:per_client", f)
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
