package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// This file runs the Caddy that users build, ./cmd/caddy compiled once per
// test binary, as processes of their own, alone or as a fleet sharing a
// Redis store, and sends them concurrent traffic.

// caddyBinary builds ./cmd/caddy once per test binary, in binaryDir,
// which TestMain removes.
var caddyBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "rate-limit-caddy-")
	if err != nil {
		return "", err
	}
	binaryDir = dir
	bin := filepath.Join(dir, "caddy")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/d61b427a/caddy-rate-limit/cmd/caddy").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build ./cmd/caddy: %w\n%s", err, out)
	}
	return bin, nil
})

var binaryDir string

// caddyCommand returns the built Caddy with args, killed if ctx ends, its
// home and data directories in a temporary directory so it leaves nothing
// behind.
func caddyCommand(ctx context.Context, t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	integration(t)
	bin, err := caddyBinary()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	return cmd
}

// freeLoopbackPort returns a port that is free on 127.0.0.1 now.
func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// processGlobals is the global options block of a Caddy run as a
// process of its own: its admin API and its HTTP port on loopback, an
// unused HTTPS port, and nothing installed or saved.
func processGlobals(t *testing.T, admin, site int) string {
	return fmt.Sprintf(`{
	admin 127.0.0.1:%d
	http_port %d
	https_port %d
	skip_install_trust
	persist_config off
}
`, admin, site, freeLoopbackPort(t))
}

// startProcess runs the built Caddy with caddyfile and waits until it
// answers readyURL. The process is killed when t ends, if it still runs;
// its output is logged if t failed.
func startProcess(t *testing.T, caddyfile, readyURL string) *exec.Cmd {
	t.Helper()
	path := filepath.Join(t.TempDir(), "Caddyfile")
	if err := os.WriteFile(path, []byte(caddyfile), 0o644); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	cmd := caddyCommand(context.Background(), t, "run", "--config", path, "--adapter", "caddyfile")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("caddy output:\n%s", logs.String())
		}
	})
	waitFor(t, "caddy to serve "+readyURL, func() bool {
		select {
		case <-done:
			t.Fatalf("caddy exited: %v\n%s", cmd.ProcessState, logs.String())
		default:
		}
		resp, err := http.Get(readyURL)
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
	return cmd
}

// instance is one Caddy process of a fleet.
type instance struct {
	url   string // the zone's site: http://127.0.0.1:<port>/work
	admin string // the admin endpoint: http://127.0.0.1:<port>
	log   string // its log file, JSON at INFO
	proc  *exec.Cmd
}

// fleetSpec is what the instances of a fleet run: a rate_limit handler on
// /work with a Redis store and a zone named fleet.
type fleetSpec struct {
	// store is the store redis block's body; a generous timeout is
	// added, so that a loaded 2-core machine causes no store error.
	store string
	// options are the handler's other lines; default on_store_error
	// deny, so that no store error passes for an allowed request.
	options string
	// zone is the zone block's body.
	zone string
	// upstream is the app (host:port), or "" for Caddy to answer "ok".
	upstream string
}

// startFleet starts n Caddy processes as spec says, each answering /ready
// itself. The processes are killed when t ends.
func startFleet(t *testing.T, n int, spec fleetSpec) []instance {
	t.Helper()
	serve := "respond \"ok\""
	if spec.upstream != "" {
		serve = "reverse_proxy " + spec.upstream
	}
	if spec.options == "" {
		spec.options = "on_store_error deny"
	}
	if !strings.Contains(spec.store, "timeout") {
		spec.store += "\ntimeout 5s"
	}
	var fleet []instance
	for range n {
		fleet = append(fleet, startInstance(t, fmt.Sprintf(`	rate_limit {
		store redis {
%s
		}
		%s
		zone fleet {
%s
		}
	}
	%s
`, spec.store, spec.options, spec.zone, serve), "/work"))
	}
	return fleet
}

// startInstance starts one Caddy process, logging JSON to a file of its
// own, whose site on a free loopback port answers /ready itself and holds
// body (site block lines) for everything else; the instance's url names
// path on the site.
func startInstance(t *testing.T, body, path string) instance {
	t.Helper()
	site, admin := freeLoopbackPort(t), freeLoopbackPort(t)
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	globals := strings.Replace(processGlobals(t, admin, site), "}\n", "\tlog {\n\t\toutput file "+logFile+"\n\t\tformat json\n\t}\n}\n", 1)
	proc := startProcess(t, globals+fmt.Sprintf("http://127.0.0.1:%d {\n\thandle /ready {\n\t\trespond \"ok\"\n\t}\n%s}\n", site, body),
		fmt.Sprintf("http://127.0.0.1:%d/ready", site))
	return instance{
		url:   fmt.Sprintf("http://127.0.0.1:%d%s", site, path),
		admin: fmt.Sprintf("http://127.0.0.1:%d", admin),
		log:   logFile,
		proc:  proc,
	}
}

// urls are the fleet's zone sites.
func urls(fleet []instance) []string {
	var out []string
	for _, in := range fleet {
		out = append(out, in.url)
	}
	return out
}

// perClient is a zone body for startFleet: limit requests per hour per
// X-Client.
func perClient(limit int) string {
	return fmt.Sprintf("\t\t\tkey {header.X-Client}\n\t\t\tlimit %d\n\t\t\twindow 1h", limit)
}

// result is one answer of a concurrent request, or its error.
type result struct {
	status     int
	retryAfter string
	limitHdr   string
	err        error
}

// sendAll sends n concurrent GETs with X-Client: key, spread over urls, and
// returns a channel that gets each one's result.
func sendAll(ctx context.Context, urls []string, key string, n int) <-chan result {
	out := make(chan result, n)
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 60 * time.Second}
	for i := range n {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, urls[i%len(urls)], nil)
			req.Header.Set("X-Client", key)
			resp, err := hc.Do(req)
			if err != nil {
				out <- result{err: err}
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			out <- result{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), limitHdr: resp.Header.Get("X-RateLimit-Limit")}
		}()
	}
	return out
}

// burst sends n concurrent requests for key, spread over urls, and counts
// the answers by status (-1 for a request that got none).
func burst(urls []string, key string, n int) map[int]int {
	codes := map[int]int{}
	answers := sendAll(context.Background(), urls, key, n)
	for range n {
		r := <-answers
		if r.err != nil {
			r.status = -1
		}
		codes[r.status]++
	}
	return codes
}

// gate is an upstream whose requests wait, each until a token lets it
// answer or its request is cancelled. It counts the requests that reached
// it, so a test can see that rejected ones never did.
type gate struct {
	url     string // host:port
	tokens  chan struct{}
	arrived atomic.Int64
	arrival chan struct{} // one send per arrival, never blocking
}

func newGate(t *testing.T) *gate {
	t.Helper()
	g := &gate{tokens: make(chan struct{}, 10000), arrival: make(chan struct{}, 10000)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.arrived.Add(1)
		g.arrival <- struct{}{}
		select {
		case <-g.tokens:
			_, _ = io.WriteString(w, "app")
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(g.tokens) }) // lets waiting handlers return before the server closes
	g.url = strings.TrimPrefix(srv.URL, "http://")
	return g
}

// open lets n waiting (or future) requests answer.
func (g *gate) open(n int) {
	for range n {
		g.tokens <- struct{}{}
	}
}

// waitArrivals waits until n requests in all have reached the gate.
func (g *gate) waitArrivals(t *testing.T, n int64) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for g.arrived.Load() < n {
		select {
		case <-g.arrival:
		case <-deadline:
			t.Fatalf("%d requests reached the upstream, want %d", g.arrived.Load(), n)
		}
	}
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
	first := sendAll(context.Background(), urls[:1], key, 1)
	select {
	case <-j.firstIn:
	case r := <-first:
		t.Fatalf("the first request was answered before reaching the upstream: %+v", r)
	}
	if used := keyState(t, admin, zone, key).Used; used != 1 {
		t.Fatalf("%d units held while one request is served, want 1", used)
	}
	if whileHeld != nil {
		whileHeld()
	}
	j.releaseFirst()
	if r := <-first; r.status != http.StatusOK {
		t.Fatalf("the first request: %+v, want 200", r)
	}
	served := sendGivingUp(urls, key, 1000)
	if arrived := j.arrived.Load(); served == 0 || arrived < served+1 {
		t.Fatalf("%d of 1,000 requests served, %d reached the upstream: want some served, each after reaching it", served, arrived)
	}
	t.Logf("%d of 1,000 requests served", served)
	waitUsed(t, admin, zone, key, 0)
}

// sendGivingUp sends n GET requests with X-Client: key to urls in turn,
// 32 at a time, and gives up a third of them after a random 0 to 3 ms, as
// clients going away under load do. It returns how many were answered
// 200.
func sendGivingUp(urls []string, key string, n int64) int64 {
	var served, next atomic.Int64
	var wg sync.WaitGroup
	hc := &http.Client{Timeout: 60 * time.Second}
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
				req.Header.Set("X-Client", key)
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
				req, _ := http.NewRequest(http.MethodGet, siteURL+"/", nil)
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
	waitFor(t, fmt.Sprintf("%d answers to the load", want), func() bool { return l.answered.Load() >= want })
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
