package integration

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/d61b427a/caddy-rate-limit/admin"
	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
	"github.com/d61b427a/caddy-rate-limit/internal/wait"
)

// This file holds what the integration tests share: the suite's address
// and ports, the Caddy that runs in this process and the configs it
// loads, requests, the admin API and metrics, waits, logs, and the apps
// and traffic behind and in front of Caddy. The built Caddy's processes
// are in process_test.go.

// loopback is this suite's own loopback address, drawn at random from
// 127.0.0.0/8, all of which Linux answers on: the in-process Caddy's
// admin endpoint and sites, and the built Caddy's processes, listen there
// on ports free when they were picked. Caddy binds with SO_REUSEPORT, so
// two suites on one address (two clones, or two go test at once) could
// both bind a port each found free and share it unawares; on addresses of
// their own they never meet. Where only 127.0.0.1 answers, it is that.
var loopback = func() string {
	addr := fmt.Sprintf("127.%d.%d.%d", 1+rand.IntN(254), rand.IntN(256), 1+rand.IntN(254))
	l, err := net.Listen("tcp", addr+":0")
	if err != nil {
		return "127.0.0.1"
	}
	l.Close()
	return addr
}()

// freePort returns a TCP port that is free on the suite's loopback
// address now, and that it has not returned before: the kernel may hand
// out a port again once it is closed, and a Caddyfile whose HTTP port is
// also its HTTPS port is refused.
func freePort() int {
	portsGiven.Lock()
	defer portsGiven.Unlock()
	for {
		l, err := net.Listen("tcp", net.JoinHostPort(loopback, "0"))
		if err != nil {
			panic(fmt.Sprintf("no free port on %s: %v", loopback, err))
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !portsGiven.m[port] {
			portsGiven.m[port] = true
			return port
		}
	}
}

var portsGiven = struct {
	sync.Mutex
	m map[int]bool
}{m: map[int]bool{}}

// onLoopback is host:port of port on the suite's loopback address.
func onLoopback(port int) string {
	return net.JoinHostPort(loopback, strconv.Itoa(port))
}

// The in-process Caddy serves its admin API and the sites of test
// Caddyfiles on ports that were free when the test binary started. Test
// Caddyfiles write their sites as siteAddr (and site2Addr for a second
// site), which the global option default_bind puts on the suite's
// address; JSON configs listen on siteListen.
var (
	adminAddr = onLoopback(freePort())
	adminURL  = "http://" + adminAddr

	sitePort   = freePort()
	siteAddr   = fmt.Sprintf(":%d", sitePort)
	siteListen = onLoopback(sitePort)
	siteURL    = "http://" + siteListen

	site2Port   = freePort()
	site2Addr   = fmt.Sprintf(":%d", site2Port)
	site2Listen = onLoopback(site2Port)
	site2URL    = "http://" + site2Listen

	httpsPort = freePort()
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

// adminOption is the admin global option of a test Caddy: its endpoint
// at addr, accepting requests addressed to addr (for an endpoint on a
// loopback address Caddy otherwise accepts only localhost, ::1 and
// 127.0.0.1 as the Host) and from the other origins given.
func adminOption(addr string, origins ...string) string {
	return fmt.Sprintf("admin %s {\n\t\torigins %s\n\t}", addr, strings.Join(append([]string{addr}, origins...), " "))
}

// caddyGlobals is the global options block of a test Caddy: admin (an
// adminOption, or "admin off"), its sites bound to the suite's loopback
// address with httpPort as the HTTP port and httpsPort as the (unused)
// HTTPS port, nothing installed or saved, and extra options.
func caddyGlobals(admin string, httpPort, httpsPort int, extra string) string {
	return fmt.Sprintf(`{
	%s
	default_bind %s
	http_port %d
	https_port %d
	skip_install_trust
	persist_config off
	%s
}
`, admin, loopback, httpPort, httpsPort, extra)
}

// withGlobals returns the in-process Caddy's global options block with
// extra options added: its storage, no grace period, and its log in
// caddyLog, unless an extra sets Caddy's log itself (a test that reads
// the log).
func withGlobals(extra string) string {
	if !strings.Contains(extra, "log {") {
		extra = fmt.Sprintf("log {\n\t\toutput file %s\n\t}\n\t%s", caddyLog, extra)
	}
	return caddyGlobals(adminOption(adminAddr), sitePort, httpsPort,
		fmt.Sprintf("storage file_system %s\n\tgrace_period 1ns\n\t%s", caddyStorage, extra))
}

// globalOptions precede the site blocks that tests load.
var globalOptions = withGlobals("")

// wholeCaddyfile returns config, a Caddyfile, with globalOptions added
// unless it opens with global options of its own (withGlobals).
func wholeCaddyfile(config string) string {
	if strings.HasPrefix(strings.TrimSpace(config), "{") {
		return config
	}
	return globalOptions + config
}

// startCaddy loads config into the in-process Caddy, as reload does, with
// fresh counters and no recorded events whatever ran before (also under
// -count): it first loads a config with no site, which cleans up the last
// config's modules before the load returns (the memory store's counters
// go with the last config that uses them), and waits until the last
// config's sites have stopped listening, which Caddy does in the
// background, so that no request of the test reaches them. It starts the
// in-process Caddy the first time. Tests that use it must not run in
// parallel: there is one Caddy per test binary.
func startCaddy(t *testing.T, config string) {
	t.Helper()
	integration(t)
	if err := caddyStarted(); err != nil {
		t.Fatalf("starting the in-process Caddy: %v", err)
	}
	mustReload(t, globalOptions)
	wait.For(t, "the last test's sites to stop listening", func() bool {
		return !listening(siteListen) && !listening(site2Listen)
	})
	recorded.Lock()
	recorded.events, recorded.total = nil, 0
	recorded.Unlock()
	mustReload(t, config)
}

// listening reports whether a server accepts connections on addr.
func listening(addr string) bool {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		conn.Close()
	}
	return err == nil
}

// caddyStarted starts the in-process Caddy once, with its admin endpoint
// at adminAddr and nothing else, as `caddy run` with no config would.
var caddyStarted = sync.OnceValue(func() error {
	cfg, err := ownJSON("{}")
	if err != nil {
		return err
	}
	return caddy.Load([]byte(cfg), true)
})

// reload posts config to the in-process Caddy's /load, as an operator's
// reload does, and returns the status and body. config is a JSON config,
// to which ownJSON adds the in-process Caddy's settings, or a Caddyfile:
// site blocks, to which globalOptions are added, or a whole Caddyfile
// opening with withGlobals.
func reload(t *testing.T, config string) (int, string) {
	t.Helper()
	contentType := "text/caddyfile"
	if json.Valid([]byte(config)) {
		var err error
		if config, err = ownJSON(config); err != nil {
			t.Fatal(err)
		}
		contentType = "application/json"
	} else {
		config = wholeCaddyfile(config)
	}
	resp, body := request(t, client, http.MethodPost, adminURL+"/load", config, "Content-Type: "+contentType)
	return resp.StatusCode, body
}

// mustReload is reload that fails the test if the config is refused.
func mustReload(t *testing.T, config string) {
	t.Helper()
	if code, body := reload(t, config); code != http.StatusOK {
		t.Fatalf("config refused: %d %s", code, body)
	}
}

// ownJSON returns the JSON config with what withGlobals gives a
// Caddyfile: the admin endpoint at adminAddr, no autosave, Caddy's log
// sent to caddyLog (unless the config sets its own) and its storage in
// caddyStorage.
func ownJSON(config string) (string, error) {
	var cfg map[string]any
	if err := json.Unmarshal([]byte(config), &cfg); err != nil {
		return "", err
	}
	cfg["admin"] = map[string]any{"listen": adminAddr, "origins": []string{adminAddr}, "config": map[string]any{"persist": false}}
	if _, ok := cfg["logging"]; !ok {
		cfg["logging"] = map[string]any{"logs": map[string]any{"default": map[string]any{
			"writer": map[string]any{"output": "file", "filename": caddyLog},
		}}}
	}
	cfg["storage"] = map[string]any{"module": "file_system", "root": caddyStorage}
	out, err := json.Marshal(cfg)
	return string(out), err
}

func init() {
	caddy.RegisterModule(eventRecorder{})
}

// eventRecorder is an event handler that keeps what it is handed, so a
// test can see the events a config's rate limiter emitted.
type eventRecorder struct{}

func (eventRecorder) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "events.handlers.rate_limit_test_recorder",
		New: func() caddy.Module { return new(eventRecorder) },
	}
}

// recorded holds the first maxRecorded events handed to eventRecorder
// since startCaddy, and counts all of them in total: a flood test's
// million events are counted, not kept.
var recorded struct {
	sync.Mutex
	events []caddy.Event
	total  int
}

const maxRecorded = 10_000

func (eventRecorder) Handle(_ context.Context, e caddy.Event) error {
	recorded.Lock()
	defer recorded.Unlock()
	recorded.total++
	if len(recorded.events) < maxRecorded {
		recorded.events = append(recorded.events, e)
	}
	return nil
}

// recordedEvents returns the rate_limit_exceeded events recorded so far.
func recordedEvents() []caddy.Event {
	recorded.Lock()
	defer recorded.Unlock()
	var out []caddy.Event
	for _, e := range recorded.events {
		if e.Name() == "rate_limit_exceeded" {
			out = append(out, e)
		}
	}
	return out
}

// withEvents returns config, a Caddyfile as reload takes it, as JSON with
// an events app that hands every rate_limit_exceeded event to
// eventRecorder.
func withEvents(t *testing.T, config string) string {
	t.Helper()
	adapted, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(wholeCaddyfile(config)), nil)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(adapted, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["apps"].(map[string]any)["events"] = map[string]any{
		"subscriptions": []any{map[string]any{
			"events":   []string{"rate_limit_exceeded"},
			"handlers": []any{map[string]any{"handler": "rate_limit_test_recorder"}},
		}},
	}
	out, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// jsonLog is the global option that writes Caddy's log to logFile as
// JSON, at level.
func jsonLog(logFile, level string) string {
	return fmt.Sprintf("log {\n\t\toutput file %s\n\t\tformat json\n\t\tlevel %s\n\t}", logFile, level)
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

// redisStore is a store redis block with body store. Unless store sets its
// own, the timeout is generous: on a busy machine (the race detector, two
// suites at once) a script call can take longer than the default 50ms,
// and a test that is not about timeouts must not fail for that.
func redisStore(store string) string {
	if !strings.Contains(store, "timeout") {
		store += "\ntimeout 5s"
	}
	return "store redis {\n" + store + "\n}"
}

// redisSite is clientSite's zone per_client in the Redis store configured
// by store (the store block's body), with extra handler options.
func redisSite(store string, limit int, extra string) string {
	return clientSite("per_client", limit, redisStore(store)+"\n"+extra)
}

// counterKey returns the name of the hash that holds the counters of key
// in zone on s, for a store with the default key_prefix (see
// redistest.Server.Counter).
func counterKey(t testing.TB, s *redistest.Server, zone, key string) string {
	t.Helper()
	name, err := s.Counter(zone, key)
	if err != nil {
		t.Fatal(err)
	}
	return name
}

// clusterCounterKey is counterKey on cluster c: the hash's name and the
// index in c.Nodes of the node that holds it.
func clusterCounterKey(t testing.TB, c *redistest.Cluster, zone, key string) (string, int) {
	t.Helper()
	name, err := c.Counter(zone, key)
	if err != nil {
		t.Fatal(err)
	}
	node, err := c.NodeFor(name)
	if err != nil {
		t.Fatal(err)
	}
	return name, node
}

// client sends the tests' requests: a new connection for each (a reload
// closes the old server's connections, and a reused one would fail with
// EOF), and no redirect followed (a test sees a redirect itself).
var client = &http.Client{
	Transport:     &http.Transport{DisableKeepAlives: true},
	Timeout:       30 * time.Second,
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// request sends one request through hc, with body (none if "") and
// headers ("Name: value"), and returns the response with its body read.
// It fails the test if no answer comes (send).
func request(t testing.TB, hc *http.Client, method, url, body string, headers ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	setHeaders(req, headers)
	resp := send(t, func() (*http.Response, error) {
		req.Body = io.NopCloser(strings.NewReader(body))
		return hc.Do(req)
	})
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// do sends a request with the given method and headers through client,
// what most tests send.
func do(t testing.TB, method, url string, headers ...string) (*http.Response, string) {
	t.Helper()
	return request(t, client, method, url, "", headers...)
}

// setHeaders sets headers, each "Name: value", on req; a Host header
// names the host the request is for.
func setHeaders(req *http.Request, headers []string) {
	for _, h := range headers {
		name, value, _ := strings.Cut(h, ":")
		name, value = strings.TrimSpace(name), strings.TrimSpace(value)
		if strings.EqualFold(name, "Host") {
			req.Host = value
			continue
		}
		req.Header.Set(name, value)
	}
}

// send runs exchange, which makes one request on a new connection, and
// tries again, until wait.Budget has passed, while the connection closes
// before any response. That happens right after a config load: Caddy
// stops the old server in the background, and each connection its
// Accept takes meanwhile is closed unanswered (on a busy machine, several
// in a row). It says nothing about the handler, which answers every
// request it sees.
func send(t testing.TB, exchange func() (*http.Response, error)) *http.Response {
	t.Helper()
	resp, err := exchange()
	if err != nil && closedUnanswered(err) {
		t.Logf("connection closed unanswered (%v); trying again", err)
		wait.Within(wait.Budget, func() bool {
			resp, err = exchange()
			return err == nil || !closedUnanswered(err)
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func closedUnanswered(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}

// basicAuth is the Authorization header that logs in as user.
func basicAuth(user, password string) string {
	req := http.Request{Header: http.Header{}}
	req.SetBasicAuth(user, password)
	return "Authorization: " + req.Header.Get("Authorization")
}

// get sends GET to url with X-Client: key, the key of the zones most
// tests configure, and returns the status.
func get(t *testing.T, url, key string) int {
	t.Helper()
	resp, _ := do(t, http.MethodGet, url, "X-Client: "+key)
	return resp.StatusCode
}

// statuses sends n requests with X-Client: key to the test site and
// returns their statuses.
func statuses(t *testing.T, n int, key string) []int {
	t.Helper()
	var out []int
	for range n {
		out = append(out, get(t, siteURL+"/", key))
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

// adminJSON sends one admin API request, with a JSON body or none, to
// base (an admin endpoint's URL) and returns the status and body.
func adminJSON(t testing.TB, base, method, path, body string) (int, string) {
	t.Helper()
	resp, answer := request(t, client, method, base+path, body, "Content-Type: application/json")
	return resp.StatusCode, answer
}

// readAdmin reads an admin API route of the endpoint at base, failing
// the test unless it answers 200 with JSON for a T.
func readAdmin[T any](t testing.TB, base, path string) T {
	t.Helper()
	var v T
	code, body := adminJSON(t, base, http.MethodGet, path, "")
	if err := json.Unmarshal([]byte(body), &v); code != http.StatusOK || err != nil {
		t.Fatalf("GET %s: %d %s", path, code, body)
	}
	return v
}

// zones reads the zones of the admin endpoint at base.
func zones(t testing.TB, base string) []admin.ZoneInfo {
	t.Helper()
	return readAdmin[[]admin.ZoneInfo](t, base, "/rate_limit/zones")
}

// zoneState reads the zone called name from the admin endpoint at base;
// ok is false if the running config has no such zone.
func zoneState(t testing.TB, base, name string) (z admin.ZoneInfo, ok bool) {
	t.Helper()
	all := zones(t, base)
	if i := slices.IndexFunc(all, func(z admin.ZoneInfo) bool { return z.Name == name }); i >= 0 {
		return all[i], true
	}
	return admin.ZoneInfo{}, false
}

// keyState reads a key's state through the admin endpoint at base.
func keyState(t testing.TB, base, zone, key string) admin.KeyInfo {
	t.Helper()
	return readAdmin[admin.KeyInfo](t, base, "/rate_limit/zones/"+zone+"/keys/"+url.PathEscape(key))
}

// storedKey is value as a store keeps it from the key alternative
// template: behind the alternative's tag, 8 hex digits of the SHA-256 of
// its text and '|', so that the alternatives of a zone's key never share
// a counter.
func storedKey(template, value string) string {
	sum := sha256.Sum256([]byte(template))
	return hex.EncodeToString(sum[:4]) + "|" + value
}

// clientKey is how a store keeps an X-Client, the key of most tests'
// zones.
func clientKey(value string) string {
	return storedKey("{http.request.header.X-Client}", value)
}

// hashForm is how a key is shown where log_keys does not show it.
var hashForm = regexp.MustCompile(`^#[0-9a-f]{16}$`)

// keyHash returns how Caddy shows key where log_keys does not show it (in
// logs, events and top keys), as the admin endpoint at base answers for
// zone, whose log_keys must be off: a keyed hash, the same in every zone
// of the process.
func keyHash(t *testing.T, base, zone, key string) string {
	t.Helper()
	h := keyState(t, base, zone, key).Hash
	if !hashForm.MatchString(h) {
		t.Fatalf("zone %s shows key %q as %q, want # and 16 hex digits", zone, key, h)
	}
	return h
}

// topAnswer is GET /rate_limit/zones/<zone>/top's answer.
type topAnswer struct {
	Zone  string `json:"zone"`
	Units bool   `json:"units"`
	Keys  []struct {
		Key      string `json:"key"`
		From     string `json:"from"`
		Requests int64  `json:"requests"`
		Units    int64  `json:"units"`
		Rejected int64  `json:"rejected"`
	} `json:"keys"`
	Error int64 `json:"error"`
}

// topKeys reads the in-process Caddy's top keys of zone, with query
// ("?n=3", or "").
func topKeys(t *testing.T, zone, query string) topAnswer {
	t.Helper()
	return readAdmin[topAnswer](t, adminURL, "/rate_limit/zones/"+zone+"/top"+query)
}

// waitUsed waits until the key's use reads want: units are released when
// Caddy is done with a request, a moment after its client has the answer.
func waitUsed(t *testing.T, base, zone, key string, want int64) {
	t.Helper()
	wait.For(t, fmt.Sprintf("zone %s key %s to hold %d units", zone, key, want), func() bool { return keyState(t, base, zone, key).Used == want })
}

// metricValue reads one series from the /metrics of the admin endpoint at
// base, "" if it is absent.
func metricValue(t testing.TB, base, series string) string {
	t.Helper()
	_, body := adminJSON(t, base, http.MethodGet, "/metrics", "")
	for line := range strings.Lines(body) {
		if name, value, ok := strings.Cut(strings.TrimSpace(line), " "); ok && name == series {
			return value
		}
	}
	return ""
}

// metricCount reads a counter from /metrics; 0 if it is absent.
func metricCount(t testing.TB, base, series string) int {
	t.Helper()
	n := 0
	fmt.Sscan(metricValue(t, base, series), &n)
	return n
}

// receive waits, as wait.For does, for a value from ch.
func receive[T any](t testing.TB, what string, ch <-chan T) T {
	t.Helper()
	var v T
	wait.For(t, what, func() bool {
		select {
		case v = <-ch:
			return true
		default:
			return false
		}
	})
	return v
}

// roomInWindow waits, if need be, until the current window of the given
// length (windows are aligned to the epoch) has at least room left, so
// that a few requests all land in one window: across a boundary, a sliding
// tail lets a little of the last window's count fade.
func roomInWindow(window, room time.Duration) {
	left := window - time.Duration(time.Now().UnixNano())%window
	if left < room {
		time.Sleep(left + 10*time.Millisecond)
	}
}

// linesWith returns the lines of text that contain all of parts.
func linesWith(text string, parts ...string) []string {
	var out []string
	for line := range strings.Lines(text) {
		if !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(line, p) }) {
			out = append(out, line)
		}
	}
	return out
}

// logLines returns the lines of the log file that contain all of parts.
func logLines(logFile string, parts ...string) []string {
	b, _ := os.ReadFile(logFile)
	return linesWith(string(b), parts...)
}

// waitForLog waits until at least n lines of the log file contain all of
// parts.
func waitForLog(t *testing.T, logFile string, n int, parts ...string) {
	t.Helper()
	wait.For(t, fmt.Sprintf("%d log lines with %q", n, parts), func() bool { return len(logLines(logFile, parts...)) >= n })
}

// logEntries decodes the JSON log lines among lines (from logLines).
func logEntries(lines []string) []map[string]any {
	var out []map[string]any
	for _, line := range lines {
		var e map[string]any
		if json.Unmarshal([]byte(line), &e) == nil {
			out = append(out, e)
		}
	}
	return out
}

// app is the application behind Caddy: it counts the requests that reach it.
type app struct {
	hits atomic.Int64
	url  string // host:port
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

// gate is an upstream whose requests wait, each until a token lets it
// answer, releaseAll lets every one answer, or its request is cancelled.
// It counts the requests that reached it, so a test can see which are in
// flight and that rejected ones never came.
type gate struct {
	url      string // host:port
	tokens   chan struct{}
	released chan struct{}
	release  sync.Once
	arrived  atomic.Int64
}

func newGate(t *testing.T) *gate {
	t.Helper()
	g := &gate{tokens: make(chan struct{}, 10000), released: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.arrived.Add(1)
		select {
		case <-g.tokens:
		case <-g.released:
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, "app")
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(g.releaseAll) // lets waiting handlers return before the server closes
	g.url = strings.TrimPrefix(srv.URL, "http://")
	return g
}

// open lets n waiting (or future) requests answer.
func (g *gate) open(n int) {
	for range n {
		g.tokens <- struct{}{}
	}
}

// releaseAll lets every request, waiting or future, answer.
func (g *gate) releaseAll() { g.release.Do(func() { close(g.released) }) }

// waitArrivals waits until n requests in all have reached the gate.
func (g *gate) waitArrivals(t *testing.T, n int64) {
	t.Helper()
	wait.For(t, fmt.Sprintf("%d requests to reach the upstream", n), func() bool { return g.arrived.Load() >= n })
}

// jittery is an upstream that answers each request after a random wait
// of up to 2 ms, and counts the requests that reached it. It holds the
// first request until released, so that a test can see it counted while
// Caddy serves it.
type jittery struct {
	url     string // host:port
	arrived atomic.Int64
	// firstIn is closed when the first request arrives; it waits until
	// firstOut is closed.
	firstIn, firstOut chan struct{}
}

func newJittery(t *testing.T) *jittery {
	t.Helper()
	j := &jittery{firstIn: make(chan struct{}), firstOut: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if j.arrived.Add(1) == 1 {
			close(j.firstIn)
			select {
			case <-j.firstOut:
			case <-r.Context().Done():
				return
			}
		}
		select {
		case <-time.After(time.Duration(rand.IntN(2000)) * time.Microsecond):
			_, _ = io.WriteString(w, "app")
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(j.releaseFirst) // before srv.Close, which waits for it
	j.url = strings.TrimPrefix(srv.URL, "http://")
	return j
}

func (j *jittery) releaseFirst() {
	select {
	case <-j.firstOut:
	default:
		close(j.firstOut)
	}
}

// leakCheck checks that a concurrency zone (named zone) lets no unit of
// key leak: one request is held in j, the upstream, until the zone shows
// its unit held; then 1,000 requests go, a third of them given up by
// their clients at a random moment (sendGivingUp); at least some must be
// served by j, and afterwards the zone holds no unit. whileHeld, if set,
// runs while the first request holds its unit.
func leakCheck(t *testing.T, j *jittery, urls []string, admin, zone, key string, whileHeld func()) {
	t.Helper()
	first := sendAll(context.Background(), urls[:1], 1, "X-Client: "+key)
	wait.For(t, "the first request to reach the upstream", func() bool {
		select {
		case <-j.firstIn:
			return true
		case r := <-first:
			t.Fatalf("the first request was answered before reaching the upstream: %+v", r)
		default:
		}
		return false
	})
	if used := keyState(t, admin, zone, key).Used; used != 1 {
		t.Fatalf("%d units held while one request is served, want 1", used)
	}
	if whileHeld != nil {
		whileHeld()
	}
	j.releaseFirst()
	if r := receive(t, "the first request's answer", first); r.status != http.StatusOK {
		t.Fatalf("the first request: %+v, want 200", r)
	}
	served := sendGivingUp(urls, 1000, "X-Client: "+key)
	if arrived := j.arrived.Load(); served == 0 || arrived < served+1 {
		t.Fatalf("%d of 1,000 requests served, %d reached the upstream: want some served, each after reaching it", served, arrived)
	}
	t.Logf("%d of 1,000 requests served", served)
	waitUsed(t, admin, zone, key, 0)
}

// result is one answer of a concurrent request, or its error.
type result struct {
	status int
	header http.Header
	body   string
	err    error
}

// sendAll sends n concurrent GETs with headers ("Name: value"), spread
// over urls, and returns a channel that gets each one's result.
func sendAll(ctx context.Context, urls []string, n int, headers ...string) <-chan result {
	out := make(chan result, n)
	for i := range n {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, urls[i%len(urls)], nil)
			setHeaders(req, headers)
			resp, err := client.Do(req)
			if err != nil {
				out <- result{err: err}
				return
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			out <- result{status: resp.StatusCode, header: resp.Header, body: string(body)}
		}()
	}
	return out
}

// giveUp sends GET url with headers and gives the request up after wait,
// as a client that goes away does, and returns its result: err is set if
// no answer came before.
func giveUp(t testing.TB, url string, wait time.Duration, headers ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	return receive(t, "the request given up", sendAll(ctx, []string{url}, 1, headers...))
}

// burst sends n concurrent GETs with headers, spread over urls, and counts
// the answers by status (-1 for a request that got none).
func burst(urls []string, n int, headers ...string) map[int]int {
	codes := map[int]int{}
	answers := sendAll(context.Background(), urls, n, headers...)
	for range n {
		r := <-answers
		if r.err != nil {
			r.status = -1
		}
		codes[r.status]++
	}
	return codes
}

// sendGivingUp sends n GETs with headers to urls in turn, 32 at a time,
// and gives up a third of them after a random 0 to 3 ms, as clients
// going away under load do. It returns how many were answered 200.
func sendGivingUp(urls []string, n int64, headers ...string) int64 {
	var served, next atomic.Int64
	var wg sync.WaitGroup
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}, Timeout: 60 * time.Second}
	defer hc.CloseIdleConnections()
	for w := range 32 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := next.Add(1); i <= n; i = next.Add(1) {
				ctx, cancel := context.WithCancel(context.Background())
				if rng.IntN(3) == 0 {
					ctx, cancel = context.WithTimeout(context.Background(), time.Duration(rng.IntN(3000))*time.Microsecond)
				}
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, urls[int(i)%len(urls)], nil)
				setHeaders(req, headers)
				if resp, err := hc.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						served.Add(1)
					}
				}
				cancel()
			}
		})
	}
	wg.Wait()
	return served.Load()
}

// load sends GET / to the test site with one X-Client from several
// goroutines over keep-alive connections, as wrk does, until it is
// stopped.
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

func startLoad(t *testing.T, workers int, key string) *load {
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
				req, _ := http.NewRequest(http.MethodGet, siteURL+"/", nil)
				req.Header.Set("X-Client", key)
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
	wait.For(t, fmt.Sprintf("%d answers to the load", want), func() bool { return l.answered.Load() >= want })
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

// memoryAndRedis returns a zone's store lines for the memory store (none)
// and for s, named for a subtest each.
func memoryAndRedis(s *redistest.Server) []struct{ name, block string } {
	return []struct{ name, block string }{
		{"memory", ""},
		{"redis", "store redis {\n\t\t\taddress " + s.URL() + "\n\t\t\ttimeout 5s\n\t\t}"},
	}
}
