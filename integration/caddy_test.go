package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
)

// This file holds what the integration tests share to drive the Caddy that
// caddytest starts in this process: configs, requests, the app behind
// Caddy, logs, metrics and the admin API.

// The in-process Caddy serves its admin API and the sites of test
// Caddyfiles on ports that were free when the test binary started, so two
// suites can run on one machine at once. Test Caddyfiles write their sites
// as siteAddr (and site2Addr for a second site).
var (
	adminPort = freePort("127.0.0.1:0")
	adminAddr = fmt.Sprintf("localhost:%d", adminPort)
	sitePort  = freePort(":0")
	siteAddr  = fmt.Sprintf(":%d", sitePort)
	site2Addr = fmt.Sprintf(":%d", freePort(":0"))

	adminURL     = "http://" + adminAddr
	siteURL      = "http://localhost" + siteAddr
	site2URL     = "http://localhost" + site2Addr
	siteHostPort = "127.0.0.1" + siteAddr
	httpsPort    = freePort(":0")
)

// caddyLog is where the in-process Caddy writes its log, unless a test
// sends it elsewhere: a passing test prints nothing, and TestMain names the
// file when a test failed.
var caddyLog = filepath.Join(os.TempDir(), fmt.Sprintf("caddy-rate-limit-test-%d.log", os.Getpid()))

// caddyStorage is the in-process Caddy's storage (certificates, locks):
// a directory of this run's own, so two suites never share one. Nor do
// they share an autosaved config: the test configs turn it off.
var caddyStorage = func() string {
	dir, err := os.MkdirTemp("", "caddy-rate-limit-test-storage-")
	if err != nil {
		panic(err)
	}
	return dir
}()

// quietStdLog sends the standard library's logger to caddyLog once Caddy
// has started.
var quietStdLog sync.Once

// globalOptions precede every test Caddyfile.
var globalOptions = withGlobals("")

// freePort returns a TCP port that is free on addr's host now.
func freePort(addr string) int {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		panic(fmt.Sprintf("no free port: %v", err))
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// withGlobals returns the global options block with extra options added.
// An extra that sets Caddy's log itself (a test that reads the log) takes
// the place of caddyLog.
func withGlobals(extra string) string {
	log := fmt.Sprintf("log {\n\t\toutput file %s\n\t}", caddyLog)
	if strings.Contains(extra, "log {") {
		log = ""
	}
	return fmt.Sprintf(`{
	skip_install_trust
	persist_config off
	storage file_system %s
	admin %s
	http_port %d
	https_port %d
	grace_period 1ns
	%s
	%s
}
`, caddyStorage, adminAddr, sitePort, httpsPort, log, extra)
}

// clientSite is a site on siteAddr that answers "ok" and limits each
// X-Client to limit requests per hour in zone, with options (a store
// block, on_store_error, ...) in its rate_limit block.
func clientSite(zone string, limit int, options string) string {
	return fmt.Sprintf(`
`+siteAddr+` {
	rate_limit {
		%s
		zone %s {
			key {header.X-Client}
			limit %d
			window 1h
		}
	}
	respond "ok"
}
`, options, zone, limit)
}

// startCaddy loads sites (site blocks only; the global options are added)
// into the in-process Caddy. Tests that use it must not run in parallel:
// there is one Caddy per test binary.
func startCaddy(t *testing.T, sites string) {
	t.Helper()
	startCaddyWith(t, globalOptions+sites, "caddyfile")
}

// startCaddyWith loads a whole config of the given type ("caddyfile" or
// "json") into the in-process Caddy.
func startCaddyWith(t *testing.T, config, configType string) {
	t.Helper()
	integration(t)
	tc := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort})
	// Start every test with fresh counters, whatever ran before it (also
	// under -count): load a config without the rate limiter, and wait
	// until the memory store the last config used has been torn down.
	tc.InitServer(globalOptions+siteAddr+" {\n\trespond \"between tests\"\n}\n", "caddyfile")
	waitFor(t, "the memory store of the last test to go", func() bool { return goroutines("storage.(*memoryCounters).sweepLoop") == 0 })
	if configType == "json" {
		config = ownJSON(t, config)
	}
	tc.InitServer(config, configType)
	quietStdLog.Do(func() {
		// Caddy points the standard library's logger at its first
		// default logger, stderr, where caddytest times every load.
		if f, err := os.OpenFile(caddyLog, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600); err == nil {
			log.SetOutput(f)
		}
	})
	if t.Failed() {
		t.FailNow()
	}
}

// ownJSON returns the JSON config with what withGlobals gives a Caddyfile:
// Caddy's log sent to caddyLog (unless the config sets its own), its
// storage in caddyStorage and no autosave. A config that is not JSON (one
// a test expects refused) is returned as it is.
func ownJSON(t *testing.T, config string) string {
	t.Helper()
	var cfg map[string]any
	if json.Unmarshal([]byte(config), &cfg) != nil {
		return config
	}
	if _, ok := cfg["logging"]; !ok {
		cfg["logging"] = map[string]any{"logs": map[string]any{"default": map[string]any{
			"writer": map[string]any{"output": "file", "filename": caddyLog},
		}}}
	}
	cfg["storage"] = map[string]any{"module": "file_system", "root": caddyStorage}
	if admin, ok := cfg["admin"].(map[string]any); ok {
		admin["config"] = map[string]any{"persist": false}
	}
	out, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// loadConfig posts a whole config of the given type ("caddyfile" or
// "json") to the admin API's /load, the way an operator reloads a running
// Caddy, and returns the status and body.
func loadConfig(t *testing.T, config, configType string) (int, string) {
	t.Helper()
	contentType := "application/json"
	if configType == "caddyfile" {
		contentType = "text/caddyfile"
	} else {
		config = ownJSON(t, config)
	}
	return adminDo(t, adminURL, http.MethodPost, "/load", contentType, config)
}

// mustLoad posts a whole Caddyfile to /load, as an operator's reload
// would, and fails the test if it is refused.
func mustLoad(t *testing.T, caddyfile string) {
	t.Helper()
	if code, body := loadConfig(t, caddyfile, "caddyfile"); code != http.StatusOK {
		t.Fatalf("reload refused: %d %s", code, body)
	}
}

// reload posts sites (site blocks only; the global options are added) to
// the admin API's /load.
func reload(t *testing.T, sites string) (int, string) {
	t.Helper()
	return loadConfig(t, globalOptions+sites, "caddyfile")
}

// adminDo sends one admin API request to base (an admin endpoint's URL)
// and returns the status and body; a body is sent as contentType.
func adminDo(t *testing.T, base, method, path, contentType, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", contentType)
	}
	// A new connection each time: a load restarts the admin endpoint,
	// and closes the connections it had.
	resp := send(t, func() (*http.Response, error) {
		req.Body = io.NopCloser(strings.NewReader(body))
		return client.Do(req)
	})
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// adminJSON sends an admin API request with a JSON body (or none).
func adminJSON(t *testing.T, base, method, path, body string) (int, string) {
	t.Helper()
	return adminDo(t, base, method, path, "application/json", body)
}

// client opens a connection per request: a reload closes the old
// server's connections, and a reused one would fail with EOF.
var client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}

// do sends a request with the given method and headers ("Name: value") on
// a new connection and returns the response with its body read.
func do(t *testing.T, method, url string, headers ...string) (*http.Response, string) {
	t.Helper()
	return doWith(t, client, method, url, headers...)
}

// doFrom sends a GET from the loopback address from, on a new connection.
func doFrom(t *testing.T, from, url string) (*http.Response, string) {
	t.Helper()
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	hc := &http.Client{Transport: &http.Transport{DialContext: dialer.DialContext, DisableKeepAlives: true}, Timeout: 10 * time.Second}
	return doWith(t, hc, http.MethodGet, url)
}

// get sends GET to the test site with X-Client: key, the key of the zones
// most tests configure, and returns the status.
func get(t *testing.T, key string) int {
	t.Helper()
	return getURL(t, siteURL+"/", key)
}

// getURL sends GET to url with X-Client: key and returns the status.
func getURL(t *testing.T, url, key string) int {
	t.Helper()
	resp, _ := do(t, http.MethodGet, url, "X-Client: "+key)
	return resp.StatusCode
}

// doWith sends a request through hc and returns the response with its
// body read.
func doWith(t *testing.T, hc *http.Client, method, url string, headers ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range headers {
		name, value, _ := strings.Cut(h, ":")
		req.Header.Set(strings.TrimSpace(name), strings.TrimSpace(value))
	}
	resp := send(t, func() (*http.Response, error) { return hc.Do(req) })
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

// statuses sends n requests with X-Client: key to the test site and
// returns their statuses.
func statuses(t *testing.T, n int, key string) []int {
	t.Helper()
	var out []int
	for range n {
		out = append(out, get(t, key))
	}
	return out
}

func wantStatuses(t *testing.T, got []int, want ...int) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("statuses %v, want %v", got, want)
	}
}

func status(t *testing.T, resp *http.Response, want int) {
	t.Helper()
	if resp.StatusCode != want {
		t.Fatalf("%s %s: status %d, want %d", resp.Request.Method, resp.Request.URL, resp.StatusCode, want)
	}
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

// waitFor polls cond until it holds: the tests wait for events, however
// long a busy machine makes them take. It fails the test if that takes
// more than 30 s, which only a broken build does.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// receive waits for a value from ch, and fails the test if none comes
// within waitFor's deadline.
func receive[T any](t testing.TB, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// goroutines counts the goroutines of this process whose stack holds fn,
// such as "storage.(*memoryCounters).sweepLoop".
func goroutines(fn string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), fn+"(")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// logLines returns the lines of the log file that contain all of parts.
func logLines(logFile string, parts ...string) []string {
	b, _ := os.ReadFile(logFile)
	var out []string
	for line := range strings.Lines(string(b)) {
		if !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(line, p) }) {
			out = append(out, line)
		}
	}
	return out
}

// waitForLog waits until at least n lines of the log file contain all of
// parts.
func waitForLog(t *testing.T, logFile string, n int, parts ...string) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d log lines with %q", n, parts), func() bool { return len(logLines(logFile, parts...)) >= n })
}

// logEntries reads a JSON log file.
func logEntries(t *testing.T, logFile string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range logLines(logFile) {
		var e map[string]any
		if json.Unmarshal([]byte(line), &e) == nil {
			out = append(out, e)
		}
	}
	return out
}

// jsonLog is the global option that writes Caddy's log to logFile as
// JSON, at level.
func jsonLog(logFile, level string) string {
	return fmt.Sprintf("log {\n\t\toutput file %s\n\t\tformat json\n\t\tlevel %s\n\t}", logFile, level)
}

// metrics reads the admin endpoint's /metrics.
func metrics(t *testing.T) string {
	t.Helper()
	_, body := adminDo(t, adminURL, http.MethodGet, "/metrics", "", "")
	return body
}

// metricValue reads one series from /metrics, "" if it is absent.
func metricValue(t *testing.T, series string) string {
	t.Helper()
	for line := range strings.Lines(metrics(t)) {
		if name, value, ok := strings.Cut(strings.TrimSpace(line), " "); ok && name == series {
			return value
		}
	}
	return ""
}

// metricCount reads a counter from /metrics; 0 if it is absent.
func metricCount(t *testing.T, series string) int {
	t.Helper()
	n := 0
	fmt.Sscan(metricValue(t, series), &n)
	return n
}

// keyInfo is a key as the admin API's GET /rate_limit/zones/<zone>/keys/<key>
// shows it.
type keyInfo struct {
	Zone             string    `json:"zone"`
	Key              string    `json:"key"`
	Hash             string    `json:"hash"`
	Used             int64     `json:"used"`
	Current          int64     `json:"current"`
	Previous         int64     `json:"previous"`
	PreviousWeighted int64     `json:"previous_weighted"`
	Reset            time.Time `json:"reset"`
	Override         *struct {
		Limit   int64     `json:"limit"`
		Expires time.Time `json:"expires"`
	} `json:"override"`
	BanEnds time.Time `json:"ban_ends"`
}

// keyState reads a key's state through the admin endpoint at base.
func keyState(t *testing.T, base, zone, k string) keyInfo {
	t.Helper()
	code, body := adminJSON(t, base, http.MethodGet, "/rate_limit/zones/"+zone+"/keys/"+k, "")
	var info keyInfo
	if err := json.Unmarshal([]byte(body), &info); code != http.StatusOK || err != nil {
		t.Fatalf("GET key %s in zone %s: %d %s", k, zone, code, body)
	}
	return info
}

// hashForm is how a key is shown where log_keys does not show it.
var hashForm = regexp.MustCompile(`^#[0-9a-f]{16}$`)

// keyHash returns how Caddy shows key where log_keys does not show it (in
// logs, events and top keys), as the admin endpoint at base answers for
// zone, whose log_keys must be off: a keyed hash, the same in every zone
// of the process.
func keyHash(t *testing.T, base, zone, key string) string {
	t.Helper()
	h := keyState(t, base, zone, url.PathEscape(key)).Hash
	if !hashForm.MatchString(h) {
		t.Fatalf("zone %s shows key %q as %q, want # and 16 hex digits", zone, key, h)
	}
	return h
}

// waitUsed waits until the key's use reads want: units are released when
// Caddy is done with a request, a moment after its client has the answer.
func waitUsed(t *testing.T, base, zone, k string, want int64) {
	t.Helper()
	waitFor(t, fmt.Sprintf("zone %s key %s to hold %d units", zone, k, want), func() bool { return keyState(t, base, zone, k).Used == want })
}
