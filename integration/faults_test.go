//go:build faults

package integration

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/internal/faultproxy"
	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
	"github.com/d61b427a/caddy-rate-limit/internal/wait"
)

// The fault run: three Caddy instances share a Redis store while a load
// runs, a fault is injected and taken away, and the run measures what
// the fleet admitted and what clients saw, for every fault and every
// setting of on_store_error (allow, deny, local) and lease (on, off).
// It is a tier of its own, run by bench/faults.sh:
//
//	go test -tags faults -run TestFaults -v -timeout 60m ./integration/
//
// FAULTS_DEBUG=1 prints every answer after the fault's end that was not
// an exact decision.
// The load asks faultRate requests a second, spread over the instances
// in turn, each for the key of the current period: the key changes
// every faultPeriod, and the zone's window is an hour, so a period's key
// is counted in one window only, and what the fleet admitted for it,
// divided by faultLimit, is the admitted ÷ limit of that window, with no
// guess about clocks. The load asks twice the limit in each period.
//
// Each run checks the fleet's promises and fails if one breaks: no
// request slower than the store's timeout plus 50 ms, no 5xx unless
// on_store_error deny, no window admitted over the limit except where a
// fault's bound says it may (printed with the figure), a bounded number
// of log lines, and exact decisions back within a bounded time.

const (
	faultInstances = 3
	faultLimit     = 40
	faultPeriod    = time.Second
	faultRate      = 2 * faultLimit // requests a second, over the fleet
	faultTimeout   = 50 * time.Millisecond
	// faultLength is how long a fault that the run ends lasts.
	faultLength = 3 * time.Second
	// faultSlack is what a request may take past the store's timeout.
	faultSlack = 50 * time.Millisecond
)

// faultEnv is one fault on a fresh Redis: the store block's body that
// reaches it, how the fault starts, and how it ends.
type faultEnv struct {
	store string
	// start begins the fault; it returns at once.
	start func() error
	// end returns when the fault is over: it ends it (after faultLength)
	// or waits until Redis has healed itself (a failover).
	end func() error
	// loses tells that the fault can lose counts Redis had taken (an
	// empty restart, a failover to a replica behind): a window it touched
	// may then admit up to one limit more.
	loses bool
	// healsItself: Redis ends the fault on its own (a failover); the run
	// shows how long that took.
	healsItself bool
	// backWithin bounds the time from the fault's end to exact
	// decisions again.
	backWithin time.Duration
	// counted returns, for a fault that loses counts, what Redis counts
	// for a key of zone fleet once the fault is over.
	counted func(t *testing.T, key string) int64
}

// faultCase names a fault and sets it up for one run.
type faultCase struct {
	name  string
	setup func(t *testing.T) faultEnv
}

// ended ends a fault that the run ends, after faultLength.
func ended(stop func() error) func() error {
	return func() error {
		time.Sleep(faultLength)
		return stop()
	}
}

var faultCases = []faultCase{
	{"redis killed", func(t *testing.T) faultEnv {
		s := redistest.Standalone(t)
		return faultEnv{
			store: "address " + s.URL(),
			start: func() error { s.Kill(); return nil },
			end:   ended(s.Restart),
			// A Redis without persistence comes back empty.
			loses:   true,
			counted: func(t *testing.T, key string) int64 { return hashCount(t, s, counterKey(t, s, "fleet", key)) },
		}
	}},
	{"redis hung", func(t *testing.T) faultEnv {
		s := redistest.Standalone(t)
		return faultEnv{
			store: "address " + s.URL(),
			start: s.Pause,
			end:   ended(s.Resume),
		}
	}},
	// Each way: 200 ms more a round trip, past the timeout.
	{"latency 100ms", latency(100 * time.Millisecond)},
	// 30 ms more a round trip: within the timeout.
	{"latency 15ms", latency(15 * time.Millisecond)},
	{"connection resets", func(t *testing.T) faultEnv {
		s := redistest.Standalone(t)
		p := startProxy(t, s)
		stop := make(chan struct{})
		done := make(chan struct{})
		return faultEnv{
			store: "address " + p.URL(),
			start: func() error {
				go func() {
					defer close(done)
					tick := time.NewTicker(100 * time.Millisecond)
					defer tick.Stop()
					for {
						p.Reset()
						select {
						case <-stop:
							return
						case <-tick.C:
						}
					}
				}()
				return nil
			},
			end: ended(func() error { close(stop); <-done; return nil }),
		}
	}},
	{"sentinel failover", func(t *testing.T) faultEnv {
		g := redistest.NewSentinelGroup(t, "faults")
		took := make(chan error, 1)
		return faultEnv{
			store: "address " + g.Sentinel.URL() + "\nsentinel faults",
			start: func() error {
				go func() {
					_, err := g.Failover(30 * time.Second)
					took <- err
				}()
				return nil
			},
			end:         func() error { return <-took },
			healsItself: true,
			// A replica promoted before the master's last writes reached it.
			loses: true,
			counted: func(t *testing.T, key string) int64 {
				return hashCount(t, g.Replica, counterKey(t, g.Replica, "fleet", key))
			},
		}
	}},
	{"cluster master killed", func(t *testing.T) faultEnv {
		c := redistest.NewClusterWithReplicas(t, 3)
		urls := c.URLs()
		for _, r := range c.Replicas {
			urls = append(urls, r.URL())
		}
		took := make(chan error, 1)
		return faultEnv{
			store: "address " + strings.Join(urls, " ") + "\ncluster",
			start: func() error {
				go func() {
					_, err := c.FailMaster(0, 30*time.Second)
					took <- err
				}()
				return nil
			},
			end:         func() error { return <-took },
			healsItself: true,
			// A replica promoted before the master's last writes reached it.
			loses: true,
			counted: func(t *testing.T, key string) int64 {
				name, err := c.Counter("fleet", key)
				if err != nil {
					t.Fatal(err)
				}
				// The live node that serves the key's slot answers; the
				// others answer MOVED.
				for _, n := range append(c.Nodes[1:], c.Replicas...) {
					if v, err := n.Do("HGET", name, "c"); err == nil {
						count, _ := strconv.ParseInt(v, 10, 64)
						return count
					}
				}
				t.Fatalf("no live node serves %s", key)
				return 0
			},
		}
	}},
}

// latency is the fault of d more each way between the instances and
// Redis.
func latency(d time.Duration) func(t *testing.T) faultEnv {
	return func(t *testing.T) faultEnv {
		s := redistest.Standalone(t)
		p := startProxy(t, s)
		return faultEnv{
			store: "address " + p.URL(),
			start: func() error { p.SetLatency(d); return nil },
			end:   ended(func() error { p.SetLatency(0); return nil }),
		}
	}
}

func startProxy(t *testing.T, s *redistest.Server) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.Start(s.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// faultSetting is one combination of on_store_error and lease.
type faultSetting struct {
	onError string
	lease   bool
}

func (s faultSetting) String() string {
	l := "off"
	if s.lease {
		l = "on"
	}
	return s.onError + ", lease " + l
}

var faultSettings = func() []faultSetting {
	var out []faultSetting
	for _, e := range []string{"allow", "deny", "local"} {
		for _, l := range []bool{false, true} {
			out = append(out, faultSetting{e, l})
		}
	}
	return out
}()

// TestFaults runs every fault with every setting and prints the table
// of what each cost; FAULTS_OUT names a file to append the table's rows
// to, as Markdown.
func TestFaults(t *testing.T) {
	integration(t)
	var rows []faultRow
	for _, fc := range faultCases {
		for _, s := range faultSettings {
			t.Run(fc.name+"/"+s.String(), func(t *testing.T) {
				env := fc.setup(t)
				env.backWithin = 1500 * time.Millisecond
				r := runFault(t, fc.name, env, s)
				rows = append(rows, r)
				t.Log(r.String())
				t.Logf("errors logged: %q", r.errors)
				r.check(t, env, s)
			})
		}
	}
	t.Run("instance killed", func(t *testing.T) {
		for _, s := range faultSettings {
			t.Run(s.String(), func(t *testing.T) {
				r := runInstanceKilled(t, s)
				rows = append(rows, r)
				t.Log(r.String())
				// The dead instance's concurrency units are back when
				// their hold ends.
				r.check(t, faultEnv{backWithin: instanceHold + time.Second}, s)
			})
		}
	})
	writeFaultRows(t, rows)
}

// faultRow is what one run measured.
type faultRow struct {
	fault   string
	setting faultSetting
	// ratios are admitted ÷ limit in each window the fault touched, in
	// order; before are those of the windows before it (the baseline).
	ratios, before []float64
	// slowest is the slowest answer, baseline the slowest before the
	// fault.
	slowest, baseline time.Duration
	served            int // requests answered
	status5xx         int
	failed            int // requests with no answer (a killed instance's)
	logLines          int // log lines written during the run, over the fleet
	seconds           float64
	// back is the time from the fault's end (or, when Redis heals itself,
	// its start) to the last answer that was not Redis's exact decision;
	// healed, for a failover, how long the promotion took.
	back, healed time.Duration
	// lost is, for a killed instance, the units its leases and
	// concurrency holds took with it, and how long the holds stayed.
	lost     string
	notExact int
	// errors are the distinct errors the log lines named.
	errors []string
}

func (r faultRow) String() string {
	return fmt.Sprintf("%s | %s | windows %s (before %s) | slowest %v (before %v) | 5xx %d of %d | unanswered %d | log lines %d in %.0fs | exact again after %v%s%s",
		r.fault, r.setting, ratioList(r.ratios), ratioList(r.before), r.slowest.Round(time.Millisecond), r.baseline.Round(time.Millisecond),
		r.status5xx, r.served, r.failed, r.logLines, r.seconds, r.back.Round(10*time.Millisecond),
		cond(r.healed > 0, fmt.Sprintf(" | promoted after %v", r.healed.Round(10*time.Millisecond))),
		cond(r.lost != "", " | lost "+r.lost))
}

func cond(ok bool, s string) string {
	if ok {
		return s
	}
	return ""
}

func ratioList(rs []float64) string {
	var parts []string
	for _, r := range rs {
		parts = append(parts, strconv.FormatFloat(r, 'f', 2, 64))
	}
	return strings.Join(parts, " ")
}

// check fails t if a promise broke.
func (r faultRow) check(t *testing.T, env faultEnv, s faultSetting) {
	t.Helper()
	if most := faultTimeout + faultSlack; r.slowest > most && r.baseline <= most {
		t.Errorf("the slowest request took %v, over the timeout and %v (%v before the fault)", r.slowest, faultSlack, r.baseline)
	}
	if s.onError != "deny" && r.status5xx > 0 {
		t.Errorf("%d answers were 5xx with on_store_error %s", r.status5xx, s.onError)
	}
	if s.onError != "allow" {
		// deny never admits over the limit. Nor does local at an
		// outage's start (each instance begins from the share it spent
		// through Redis), nor once every instance has caught Redis
		// up with what it admitted alone. In the window an outage ends in,
		// while some instances decide in Redis again and others still
		// alone, Redis does not yet count what the others admit: at
		// most their shares, (N-1)/N of the limit, and what Redis
		// decides in the round trip before an instance's own catch-up
		// lands (a tenth of the limit leaves room for 4 requests). A
		// fault that loses Redis's counts lets a window count afresh.
		bound := 1.0
		if s.onError == "local" {
			bound += float64(faultInstances-1)/faultInstances + 0.1
		}
		if env.loses {
			bound++
		}
		for i, ratio := range r.ratios {
			if ratio > bound+1e-9 {
				t.Errorf("window %d the fault touched admitted %.2f of the limit, over its bound %.2f", i, ratio, bound)
			}
		}
	}
	for i, ratio := range r.before {
		if ratio > 1 {
			t.Errorf("window %d before the fault admitted %.2f of the limit", i, ratio)
		}
	}
	// A line a second an instance, at most, for the store's errors, and
	// a few for each instance's own events (a start, a stop).
	if most := 3 * (int(r.seconds) + 5); r.logLines > most {
		t.Errorf("%d log lines in %.0f s over 3 instances, want at most %d", r.logLines, r.seconds, most)
	}
	// Once Redis answers again: the breaker's cooldown (a second), then
	// the next call is exact.
	if most := env.backWithin; r.back > most {
		t.Errorf("exact decisions came back %v after the fault ended, want within %v", r.back, most)
	}
}

// answer is one request of the load.
type answer struct {
	sent   time.Time
	took   time.Duration
	period int
	inst   int
	status int    // 0: no answer
	limit  string // X-RateLimit-Limit
}

// exact reports whether Redis decided a, telling the fleet's limit.
func (a answer) exact() bool {
	return (a.status == http.StatusOK || a.status == http.StatusTooManyRequests) && a.limit == strconv.Itoa(faultLimit)
}

// faultLoad sends the run's requests until stopped, to the instances that
// live says are up.
type faultLoad struct {
	urls  []string
	live  []atomic.Bool
	start time.Time
	hc    *http.Client

	mu      sync.Mutex
	answers []answer
	// lastNotExact is when the last answer that was not an exact
	// decision was sent.
	lastNotExact time.Time

	stop chan struct{}
	done sync.WaitGroup
}

func startFaultLoad(fleet []instance) *faultLoad {
	l := &faultLoad{
		urls:  urls(fleet),
		live:  make([]atomic.Bool, len(fleet)),
		start: time.Now(),
		hc: &http.Client{
			Transport: &http.Transport{MaxIdleConnsPerHost: 64},
			Timeout:   10 * time.Second,
		},
		stop: make(chan struct{}),
	}
	for i := range l.live {
		l.live[i].Store(true)
	}
	l.done.Add(1)
	go l.run()
	return l
}

func (l *faultLoad) run() {
	defer l.done.Done()
	tick := time.NewTicker(time.Second / faultRate)
	defer tick.Stop()
	next := 0
	for {
		select {
		case <-l.stop:
			return
		case <-tick.C:
		}
		inst := -1
		for range l.urls {
			next = (next + 1) % len(l.urls)
			if l.live[next].Load() {
				inst = next
				break
			}
		}
		if inst < 0 {
			continue
		}
		sent := time.Now()
		period := int(sent.Sub(l.start) / faultPeriod)
		l.done.Add(1)
		go func() {
			defer l.done.Done()
			a := answer{sent: sent, period: period, inst: inst}
			req, _ := http.NewRequest(http.MethodGet, l.urls[inst], nil)
			req.Header.Set("X-Client", "p"+strconv.Itoa(period))
			resp, err := l.hc.Do(req)
			a.took = time.Since(sent)
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				a.status, a.limit = resp.StatusCode, resp.Header.Get("X-RateLimit-Limit")
			}
			l.mu.Lock()
			defer l.mu.Unlock()
			l.answers = append(l.answers, a)
			if !a.exact() && a.status != 0 && sent.After(l.lastNotExact) {
				l.lastNotExact = sent
			}
		}()
	}
}

// lastNotExactAt is when the last answer that was not exact was sent.
func (l *faultLoad) lastNotExactAt() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastNotExact
}

func (l *faultLoad) end() []answer {
	close(l.stop)
	l.done.Wait()
	l.hc.CloseIdleConnections()
	return l.answers
}

// periodStart is when period p of the load began.
func (l *faultLoad) periodStart(p int) time.Time { return l.start.Add(time.Duration(p) * faultPeriod) }

// faultFleet starts faultInstances instances for setting s, with the store block
// body store and, for the instance-killed run, extra zones and an
// upstream.
func faultFleet(t *testing.T, store string, s faultSetting, extraZones, upstream string) []instance {
	t.Helper()
	store += fmt.Sprintf("\ntimeout %v", faultTimeout)
	if s.lease {
		store += "\nlease on"
	}
	serve := `respond "ok"`
	if upstream != "" {
		serve = "reverse_proxy " + upstream
	}
	var fleet []instance
	for range faultInstances {
		fleet = append(fleet, startInstance(t, fmt.Sprintf(`	rate_limit {
		%s
		on_store_error %s
		zone fleet {
			match {
				path /work
			}
			key {header.X-Client}
			limit %d
			window 1h
		}
%s
	}
	%s
`, redisStore(store), s.onError, faultLimit, extraZones, serve), "/work"))
	}
	waitForFleet(t, fleet)
	return fleet
}

// runFault runs one fault for setting s and measures it.
func runFault(t *testing.T, name string, env faultEnv, s faultSetting) faultRow {
	fleet := faultFleet(t, env.store, s, "", "")
	l := startFaultLoad(fleet)

	// Two whole periods before the fault, then the fault from the middle
	// of a period.
	time.Sleep(time.Until(l.periodStart(2).Add(faultPeriod / 2)))
	injected := time.Now()
	if err := env.start(); err != nil {
		l.end()
		t.Fatal(err)
	}
	if err := env.end(); err != nil {
		l.end()
		t.Fatal(err)
	}
	healed := time.Now()
	// The fault is over once two whole periods have gone by with every
	// answer an exact decision.
	deadline := healed.Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if last := l.lastNotExactAt(); time.Since(last) > 2*faultPeriod && time.Since(healed) > 2*faultPeriod {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	answers := l.end()
	r := measure(name, s, l, answers, fleet, injected, healed)
	if env.healsItself {
		r.healed = healed.Sub(injected)
	}
	if env.counted != nil {
		// What Redis counted for the key of the period the fault began
		// in, against what it had admitted for it before the fault: the
		// difference is what the fault lost (the key is not asked for
		// again after its period).
		period := int(injected.Sub(l.start) / faultPeriod)
		before := 0
		for _, a := range answers {
			if a.period == period && a.exact() && a.status == http.StatusOK && a.sent.Add(a.took).Before(injected) {
				before++
			}
		}
		counted := env.counted(t, clientKey("p"+strconv.Itoa(period)))
		r.lost = fmt.Sprintf("%d of the %d units counted before the fault", max(0, int64(before)-counted), before)
	}
	return r
}

// measure turns a run's answers into its row: the fault lasted from
// injected to healed.
func measure(name string, s faultSetting, l *faultLoad, answers []answer, fleet []instance, injected, healed time.Time) faultRow {
	r := faultRow{fault: name, setting: s}
	admitted := map[int]int{}
	last := 0
	var lastNotExact time.Time
	for _, a := range answers {
		r.slowest = max(r.slowest, a.took)
		if a.sent.Add(a.took).Before(injected) {
			r.baseline = max(r.baseline, a.took)
		}
		switch {
		case a.status == 0:
			r.failed++
			continue
		case a.status >= 500:
			r.status5xx++
		case a.status < 300:
			admitted[a.period]++
		}
		r.served++
		last = max(last, a.period)
		if !a.exact() && a.sent.After(lastNotExact) {
			lastNotExact = a.sent
		}
	}
	// Windows touched: from the one the fault began in to the one of the
	// last answer that was not exact (or the one it ended in).
	end := healed
	if lastNotExact.After(end) {
		end = lastNotExact
	}
	for p := 0; p < last; p++ { // the last period is cut short by the end of the load
		ratio := float64(admitted[p]) / faultLimit
		switch {
		case !l.periodStart(p + 1).After(injected):
			r.before = append(r.before, ratio)
		case !l.periodStart(p).After(end):
			r.ratios = append(r.ratios, ratio)
		}
	}
	if lastNotExact.After(healed) {
		r.back = lastNotExact.Sub(healed)
	}
	if os.Getenv("FAULTS_DEBUG") != "" {
		for _, a := range answers {
			if a.status != 0 && !a.exact() && a.sent.After(healed) {
				fmt.Printf("DEBUG +%v inst %d status %d limit %q took %v\n", a.sent.Sub(healed).Round(time.Millisecond), a.inst, a.status, a.limit, a.took.Round(time.Millisecond))
			}
		}
	}
	r.notExact = 0
	for _, a := range answers {
		if a.status != 0 && !a.exact() {
			r.notExact++
		}
	}
	r.seconds = time.Since(l.start).Seconds()
	for _, in := range fleet {
		n, errs := linesSince(in.log, l.start)
		r.logLines += n
		for _, e := range errs {
			if !slices.Contains(r.errors, e) {
				r.errors = append(r.errors, e)
			}
		}
	}
	return r
}

// linesSince counts the lines of a JSON log file written at or after
// since, and returns the errors they name.
func linesSince(path string, since time.Time) (int, []string) {
	n := 0
	var errs []string
	for _, e := range logEntries(logLines(path)) {
		ts, _ := e["ts"].(float64)
		sec, frac := math.Modf(ts)
		if time.Unix(int64(sec), int64(frac*1e9)).Before(since) {
			continue
		}
		n++
		if msg, _ := e["msg"].(string); e["error"] != nil {
			if line := fmt.Sprintf("%s: %v", msg, e["error"]); !slices.Contains(errs, line) {
				errs = append(errs, line)
			}
		}
	}
	return n, errs
}

// instanceHold is the hold of the instance-killed run's concurrency zone.
const instanceHold = 3 * time.Second

// runInstanceKilled kills the first instance (SIGKILL) while it holds
// leases (lease on) and every unit of a concurrency zone, and measures
// what the fleet lost with it: units its leases had counted in Redis
// that nobody admitted, and how long its concurrency holds kept the
// other instances out (until their hold ends and Redis reaps them).
func runInstanceKilled(t *testing.T, s faultSetting) faultRow {
	const held, hold = 4, instanceHold
	rs := redistest.Standalone(t)
	// The upstream answers at once, except requests to /held?hold=1,
	// which it keeps until the test ends.
	var arrived atomic.Int64
	holding := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("hold") != "" {
			arrived.Add(1)
			select {
			case <-holding:
			case <-r.Context().Done():
			}
		}
		io.WriteString(w, "ok")
	}))
	t.Cleanup(up.Close)
	t.Cleanup(func() { close(holding) })
	zones := fmt.Sprintf(`		zone held {
			match {
				path /held
			}
			key {header.X-Held}
			algorithm concurrency
			limit %d
			hold %v
		}`, held, hold)
	fleet := faultFleet(t, "address "+rs.URL(), s, zones, strings.TrimPrefix(up.URL, "http://"))
	heldURL := func(in instance) string { return strings.TrimSuffix(in.url, "/work") + "/held" }

	l := startFaultLoad(fleet)
	time.Sleep(time.Until(l.periodStart(2).Add(faultPeriod / 5)))
	// The first instance holds every unit of the concurrency zone.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sendAll(ctx, []string{heldURL(fleet[0]) + "?hold=1"}, held, "X-Held: h")
	wait.For(t, "the first instance to hold every unit", func() bool { return arrived.Load() == held })

	l.live[0].Store(false)
	if err := fleet[0].proc.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	period := int(killed.Sub(l.start) / faultPeriod)
	// How long the dead instance's units keep the others out.
	wait.For(t, "the dead instance's concurrency units to be reaped", func() bool {
		resp, _ := do(t, http.MethodGet, heldURL(fleet[1]), "X-Held: h")
		return resp.StatusCode == http.StatusOK
	})
	reaped := time.Since(killed)
	time.Sleep(time.Until(l.periodStart(period + 3)))
	answers := l.end()

	r := measure("instance killed", s, l, answers, fleet[1:], killed, killed)
	r.back = reaped
	admitted := 0
	for _, a := range answers {
		if a.period == period && a.status == http.StatusOK {
			admitted++
		}
	}
	// The period's key is no longer asked for: the live instances have
	// given back what they leased, and what Redis still counts over
	// what was admitted went with the dead instance.
	counted := hashCount(t, rs, counterKey(t, rs, "fleet", clientKey("p"+strconv.Itoa(period))))
	r.lost = fmt.Sprintf("%d of the window's %d units with its leases; %d concurrency units for %v",
		counted-int64(admitted), faultLimit, held, reaped.Round(10*time.Millisecond))
	return r
}

// writeFaultRows appends the rows, as a Markdown table, to the file
// FAULTS_OUT names, if any.
func writeFaultRows(t *testing.T, rows []faultRow) {
	path := os.Getenv("FAULTS_OUT")
	if path == "" {
		return
	}
	var b strings.Builder
	b.WriteString("| fault | on_store_error | lease | admitted ÷ limit, windows touched | before | slowest (before) | 5xx | unanswered | log lines | exact again after | promoted after | lost |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		lease := "off"
		if r.setting.lease {
			lease = "on"
		}
		healed := "-"
		if r.healed > 0 {
			healed = r.healed.Round(10 * time.Millisecond).String()
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %v (%v) | %d / %d | %d | %d in %.0f s | %v | %s | %s |\n",
			r.fault, r.setting.onError, lease, ratioList(r.ratios), ratioList(r.before),
			r.slowest.Round(time.Millisecond), r.baseline.Round(time.Millisecond),
			r.status5xx, r.served, r.failed, r.logLines, r.seconds, r.back.Round(10*time.Millisecond),
			healed, cmp.Or(r.lost, "-"))
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(b.String()); err != nil {
		t.Fatal(err)
	}
}
