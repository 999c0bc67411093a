package ratelimit

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
)

// load sends GET / with one X-Client from several goroutines over
// keep-alive connections, as wrk does, until it is stopped.
type load struct {
	answered atomic.Int64
	stop     chan struct{}
	wg       sync.WaitGroup

	mu       sync.Mutex
	byStatus map[int]int
	failed   int
	lastErr  error

	closeIdle func()
}

func startLoad(t *testing.T, workers int, client string) *load {
	t.Helper()
	l := &load{stop: make(chan struct{}), byStatus: map[int]int{}}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers}, Timeout: 30 * time.Second}
	for range workers {
		l.wg.Go(func() {
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				req, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1:9080/", nil)
				req.Header.Set("X-Client", client)
				resp, err := hc.Do(req)
				l.mu.Lock()
				if err != nil {
					l.failed++
					l.lastErr = err
				} else {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					l.byStatus[resp.StatusCode]++
				}
				l.mu.Unlock()
				l.answered.Add(1)
			}
		})
	}
	l.closeIdle = hc.CloseIdleConnections
	t.Cleanup(func() { l.end() })
	return l
}

// progress waits until n more requests have been answered, so that each
// step of a test runs under load.
func (l *load) progress(t *testing.T, n int64) {
	t.Helper()
	want := l.answered.Load() + n
	for deadline := time.Now().Add(10 * time.Second); l.answered.Load() < want; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("load stalled at %d answers", l.answered.Load())
		}
	}
}

// end stops the load and returns the answers by status and the number of
// requests that got none.
func (l *load) end() (map[int]int, int, error) {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
	l.closeIdle()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.byStatus, l.failed, l.lastErr
}

// TestRedisReloadsUnderLoad reloads, under load, between two configs that
// differ only in the Redis store's timeout, so each reload moves to
// another shared client and lets go of the old one. Requests of the old
// config still running must finish on open connections: no store error
// (no 503 with on_store_error deny, no uncounted request with allow),
// and afterwards as many Redis connections and goroutines as before.
func TestRedisReloadsUnderLoad(t *testing.T) {
	const reloads = 30
	for _, mode := range []string{"deny", "allow"} {
		t.Run(mode, func(t *testing.T) {
			s := redistest.Standalone(t)
			site := func(timeout string) string {
				return redisSite("address "+s.URL()+"\ntimeout "+timeout, 1_000_000, "on_store_error "+mode)
			}
			// The timeouts are generous so that a busy machine causes no
			// store error; the reloads change them, and so the client.
			startCaddy(t, site("5s"))
			redisGet(t, "warm")
			baseClients, err := s.Clients("caddy-rate-limit")
			if err != nil {
				t.Fatal(err)
			}
			baseGoroutines := runtime.NumGoroutine()

			l := startLoad(t, 16, "load")
			l.progress(t, 200)
			for i := range reloads {
				timeout := "5s"
				if i%2 == 0 {
					timeout = "6s"
				}
				if code, body := loadConfig(t, site(timeout)); code != 200 {
					t.Fatalf("reload %d: %d %s", i, code, body)
				}
				l.progress(t, 50)
			}
			byStatus, failed, lastErr := l.end()
			counted, err := s.Do("HGET", "rl:{load}:per_client", "c")
			if err != nil {
				t.Fatal(err)
			}
			n, _ := strconv.Atoi(counted)
			t.Logf("%d reloads under load: answers by status %v, %d without an answer (last: %v), %d counted in Redis", reloads, byStatus, failed, lastErr, n)
			if byStatus[http.StatusServiceUnavailable] != 0 {
				t.Errorf("%d × 503: store errors during reloads", byStatus[http.StatusServiceUnavailable])
			}
			// A request that got no answer may or may not have been counted.
			if ok := byStatus[http.StatusOK]; n < ok || n > ok+failed {
				t.Errorf("Redis counted %d requests; %d were answered 200 and %d got no answer: every allowed request must be counted once", n, ok, failed)
			}

			// A config with a client of its own, used by one request at a
			// time: every client before it must be closed.
			if code, body := loadConfig(t, site("7s")); code != 200 {
				t.Fatal(code, body)
			}
			redisGet(t, "settle")
			var nc, ng int
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				nc, _ = s.Clients("caddy-rate-limit")
				ng = runtime.NumGoroutine()
				if nc <= baseClients && ng <= baseGoroutines+2 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("after %d reloads: %d Redis connections (started with %d), %d goroutines (started with %d)", reloads, nc, baseClients, ng, baseGoroutines)
				}
			}
		})
	}
}

// loadWithGlobals loads sites with extra global options through the admin
// API, as an operator's reload would.
func loadWithGlobals(t *testing.T, extraGlobals, sites string) {
	t.Helper()
	config, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(withGlobals(extraGlobals)+sites), nil)
	if err != nil {
		t.Fatal(err)
	}
	if code, body := postJSON(t, string(config)); code != 200 {
		t.Fatal(code, body)
	}
}

// logEntries reads a JSON log file.
func logEntries(t *testing.T, logFile string) []map[string]any {
	t.Helper()
	text, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for line := range strings.Lines(string(text)) {
		var e map[string]any
		if json.Unmarshal([]byte(line), &e) == nil {
			out = append(out, e)
		}
	}
	return out
}

// TestRedisOutageDenyLogIsBounded: with on_store_error deny, every request
// during an outage is answered 503 with Retry-After, while the log gets
// only the rate-limited store error line, not one line per request. With
// handle_errors configured, the 503 is still the operator's to shape.
func TestRedisOutageDenyLogIsBounded(t *testing.T) {
	s := redistest.Standalone(t)
	store := "address " + s.URL() + "\ntimeout 50ms"
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	globals := "log {\n\toutput file " + logFile + "\n\tformat json\n}"
	startCaddy(t, redisSite(store, 1, "on_store_error deny"))
	loadWithGlobals(t, globals, redisSite(store, 1, "on_store_error deny"))
	storeErrors := `caddy_http_rate_limit_store_errors_total{store="redis"}`
	errorsBefore := metricCount(t, storeErrors)
	s.Kill()

	start := time.Now()
	l := startLoad(t, 8, "outage")
	for time.Since(start) < 2500*time.Millisecond {
		l.progress(t, 100)
	}
	byStatus, failed, lastErr := l.end()
	elapsed := time.Since(start)
	if failed != 0 || len(byStatus) != 1 || byStatus[http.StatusServiceUnavailable] == 0 {
		t.Fatalf("answers during the outage by status %v, %d without an answer (%v): want only 503", byStatus, failed, lastErr)
	}
	if n := metricCount(t, storeErrors) - errorsBefore; n != byStatus[http.StatusServiceUnavailable] {
		t.Errorf("store errors metric grew by %d for %d × 503", n, byStatus[http.StatusServiceUnavailable])
	}
	resp, _ := redisGetResponse(t, "outage")
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("during the outage: %d, Retry-After %q; want 503 with Retry-After 1", resp.StatusCode, resp.Header.Get("Retry-After"))
	}

	var storeLines, errorLines int
	for _, e := range logEntries(t, logFile) {
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
	t.Logf("%d requests in %v of outage: %d store error lines, %d error lines", byStatus[503], elapsed, storeLines, errorLines)
	if storeLines < 1 || storeLines > int(elapsed/time.Second)+2 {
		t.Errorf("%d store error lines over %v: want one a second at most", storeLines, elapsed)
	}
	if errorLines != 0 {
		t.Errorf("%d lines at error level for %d rejected requests: the log grows with the traffic", errorLines, byStatus[503])
	}

	t.Run("handle_errors shapes the 503", func(t *testing.T) {
		loadWithGlobals(t, globals, strings.Replace(redisSite(store, 1, "on_store_error deny"), "\trespond \"ok\"\n", `	respond "ok"
	handle_errors 503 {
		respond "store down: {err.status_code}"
	}
`, 1))
		resp, body := redisGetResponse(t, "shaped")
		if resp.StatusCode != http.StatusServiceUnavailable || body != "store down: 503" || resp.Header.Get("Retry-After") != "1" {
			t.Fatalf("%d %q, Retry-After %q; want the error route's 503 with Retry-After 1", resp.StatusCode, body, resp.Header.Get("Retry-After"))
		}
	})
}

// redisGetResponse sends GET / with X-Client: client and returns the
// response with its body read.
func redisGetResponse(t *testing.T, client string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, siteURL+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Client", client)
	resp := send(t, func() (*http.Response, error) { return redisHTTP.Do(req) })
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
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
	startCaddy(t, redisSite(store, 5, "on_store_error deny"))
	site := strings.Replace(redisSite(store, 5, "on_store_error deny"), "\trespond \"ok\"\n",
		"\trespond \"ok\"\n\tlog {\n\t\toutput file "+accessLog+"\n\t\tformat json\n\t}\n", 1)
	loadWithGlobals(t, "log {\n\toutput file "+logFile+"\n\tformat json\n}", site)
	if code, _ := redisGet(t, "gone"); code != http.StatusOK {
		t.Fatalf("before the pause: %d", code)
	}

	storeErrors := `caddy_http_rate_limit_store_errors_total{store="redis"}`
	errorsBefore := metricCount(t, storeErrors)
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	defer s.Resume()
	// The request waits for the paused Redis until its client gives up.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, siteURL+"/", nil)
	req.Header.Set("X-Client", "gone")
	if resp, err := redisHTTP.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("answered %d while Redis is paused", resp.StatusCode)
	}
	waitForLog(t, accessLog, 1, `"status":499`)
	if n := logLines(logFile, "rate limit store error"); n != 0 {
		b, _ := os.ReadFile(logFile)
		t.Fatalf("a client that went away was logged as a store error:\n%s", b)
	}
	if n := metricCount(t, storeErrors) - errorsBefore; n != 0 {
		t.Fatalf("a client that went away counted %d store errors", n)
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	if code, _ := redisGet(t, "gone"); code != http.StatusOK {
		t.Fatalf("after the pause: %d", code)
	}
}
