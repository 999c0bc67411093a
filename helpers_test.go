package ratelimit

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
)

// The in-process Caddy that caddytest starts serves its admin API on
// localhost:2999; sites in test Caddyfiles listen on :9080.
const (
	adminURL = "http://localhost:2999"
	siteURL  = "http://localhost:9080"
)

// globalOptions precede every test Caddyfile.
const globalOptions = `{
	skip_install_trust
	admin localhost:2999
	http_port 9080
	https_port 9443
	grace_period 1ns
}
`

// withGlobals returns the global options block with extra options added.
func withGlobals(extra string) string {
	return strings.Replace(globalOptions, "grace_period 1ns\n", "grace_period 1ns\n"+extra+"\n", 1)
}

// startCaddy loads caddyfile (site blocks only; the global options are
// added) into the in-process Caddy and returns a tester for it. Tests that
// use it must not run in parallel: there is one Caddy per test binary.
func startCaddy(t *testing.T, caddyfile string) *caddytest.Tester {
	t.Helper()
	return startCaddyWith(t, globalOptions+caddyfile, "caddyfile")
}

// startCaddyWith loads a whole config of the given type ("caddyfile" or
// "json") into the in-process Caddy.
func startCaddyWith(t *testing.T, config, configType string) *caddytest.Tester {
	t.Helper()
	tc := caddytest.NewTester(t)
	// Start every test with fresh counters, whatever ran before it (also
	// under -count): load a config without the rate limiter, and wait
	// until the memory store the last config used has been torn down.
	tc.InitServer(globalOptions+":9080 {\n\trespond \"between tests\"\n}\n", "caddyfile")
	for deadline := time.Now().Add(10 * time.Second); memorySweeperRunning(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the memory store outlived the configs that used it")
		}
	}
	tc.InitServer(config, configType)
	if t.Failed() {
		t.FailNow()
	}
	return tc
}

// loadConfig posts a Caddyfile to the admin API's /load, the way an
// operator reloads a running Caddy, and returns the status and body.
func loadConfig(t *testing.T, caddyfile string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, adminURL+"/load", strings.NewReader(globalOptions+caddyfile))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "text/caddyfile")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// do sends a request with the given method and headers ("Name: value") and
// returns the response with its body read.
func do(t *testing.T, tc *caddytest.Tester, method, url string, headers ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A new connection per request: a reload closes the old server's
	// connections, and a reused one would fail with EOF.
	req.Close = true
	for _, h := range headers {
		name, value, _ := strings.Cut(h, ":")
		req.Header.Set(strings.TrimSpace(name), strings.TrimSpace(value))
	}
	resp := send(t, func() (*http.Response, error) { return tc.Client.Do(req) })
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

// send runs exchange, which makes one request on a new connection, and
// tries again (at most twice) if the connection closed before any
// response. That happens under load right after a config load: Caddy
// stops the old server in the background, and a connection its last
// Accept took is closed unanswered. It says nothing about the handler,
// which answers every request it sees.
func send(t *testing.T, exchange func() (*http.Response, error)) *http.Response {
	t.Helper()
	resp, err := exchange()
	for try := 1; err != nil && try < 3 && closedUnanswered(err); try++ {
		t.Logf("connection closed unanswered (%v); trying again", err)
		time.Sleep(100 * time.Millisecond)
		resp, err = exchange()
	}
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func closedUnanswered(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}

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
