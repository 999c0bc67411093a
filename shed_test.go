package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// specParams are the settings of SPEC §8's vector: good 0.7, bad 0.8,
// after 2s, full 4s.
var specParams = shedParams{good: 0.7, bad: 0.8, after: 2 * time.Second, full: 4 * time.Second}

// chances are the drop chances of classes critical, normal and low.
func chances(a float64) [3]float64 {
	return [3]float64{dropChance(a, 3, 0), dropChance(a, 3, 1), dropChance(a, 3, 2)}
}

// TestShedVector is SPEC §8's vector, second by second: capacity 4,
// classes critical normal low, u held at 1 until 6 s, then at 0. Made-up
// times, no clock: the amount moves once a second by shedStep.
func TestShedVector(t *testing.T) {
	steps := []struct {
		second  int
		u       float64 // utilization over the second that ends here
		a       float64
		chances [3]float64 // critical, normal, low
		spec    string
	}{
		{1, 1, -0.25, [3]float64{0, 0, 0}, ""},
		{2, 1, 0, [3]float64{0, 0, 0}, "0 at 2 s (nothing shed yet)"},
		{3, 1, 0.25, [3]float64{0, 0, 0.5}, "0.25 at 3 s (low dropped with probability 0.5)"},
		{4, 1, 0.5, [3]float64{0, 0, 1}, "0.5 at 4 s (low always, normal never)"},
		{5, 1, 0.75, [3]float64{0, 0.5, 1}, ""},
		{6, 1, 1, [3]float64{0, 1, 1}, "1 at 6 s (low and normal always, critical never)"},
		{7, 0, 0.75, [3]float64{0, 0.5, 1}, ""},
		{8, 0, 0.5, [3]float64{0, 0, 1}, "0.5 at 8 s (normal back)"},
		{9, 0, 0.25, [3]float64{0, 0, 0.5}, ""},
		{10, 0, 0, [3]float64{0, 0, 0}, "0 at 10 s (low back)"},
		{11, 0, -0.25, [3]float64{0, 0, 0}, ""},
		{12, 0, -0.5, [3]float64{0, 0, 0}, "-0.5 at 12 s"},
		{13, 0, -0.5, [3]float64{0, 0, 0}, "held at the floor"},
	}
	a := specParams.floor()
	if a != -0.5 || chances(a) != [3]float64{} {
		t.Fatalf("A starts at %v with chances %v, want -0.5 and none", a, chances(a))
	}
	for _, s := range steps {
		a = shedStep(specParams, a, s.u, time.Second)
		if a != s.a || chances(a) != s.chances {
			t.Fatalf("at %d s: A = %v, chances %v; want %v, %v (%s)", s.second, a, chances(a), s.a, s.chances, s.spec)
		}
	}
}

// TestShedStepEdges: the cases around the formula's corners, one step
// each.
func TestShedStepEdges(t *testing.T) {
	bad1 := shedParams{good: 0.5, bad: 1, after: 2 * time.Second, full: 4 * time.Second}
	cases := []struct {
		name string
		p    shedParams
		a, u float64
		dt   time.Duration
		want float64
	}{
		{"u between good and bad holds A", specParams, 0.3, 0.75, time.Second, 0.3},
		{"u at good holds A", specParams, 0.3, 0.7, time.Second, 0.3},
		{"u at bad holds A (f = 0 there)", specParams, 0.3, 0.8, time.Second, 0.3},
		{"u between bad and 1 grows A in proportion", specParams, 0, 0.9, time.Second, 0.125},
		{"u above 1 grows A no faster than u = 1", specParams, 0, 3, time.Second, 0.25},
		{"u below good eases in proportion", specParams, 0.5, 0.35, time.Second, 0.375},
		{"idle eases at the full rate", specParams, 0.5, 0, time.Second, 0.25},
		{"clamped at 1", specParams, 0.9, 1, time.Second, 1},
		{"held at 1", specParams, 1, 1, time.Second, 1},
		{"clamped at -after/full", specParams, -0.4, 0, time.Second, -0.5},
		{"held at -after/full", specParams, -0.5, 0, time.Second, -0.5},
		{"dt longer than after: one step passes 0", specParams, -0.5, 1, 3 * time.Second, 0.25},
		{"dt longer than after and full: clamped at 1", specParams, -0.5, 1, 10 * time.Second, 1},
		{"dt longer than after, idle: clamped at -after/full", specParams, 1, 0, 10 * time.Second, -0.5},
		{"half a second moves half as far", specParams, 0, 1, 500 * time.Millisecond, 0.125},
		{"no time, no move", specParams, 0.3, 1, 0, 0.3},
		{"time running backwards does not move A", specParams, 0.3, 1, -time.Second, 0.3},
		{"bad 1: u = 1 holds A", bad1, 0.3, 1, time.Second, 0.3},
		{"bad 1: u above 1 grows A", bad1, 0.3, 1.5, time.Second, 0.55},
		{"bad 1: u below 1 and above good holds A", bad1, 0.3, 0.9, time.Second, 0.3},
		{"an A below a new floor (a reload raised it) comes up to it", specParams, -2, 0.75, time.Second, -0.5},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := shedStep(c.p, c.a, c.u, c.dt); got != c.want {
				t.Fatalf("shedStep(A=%v, u=%v, dt=%v) = %v, want %v", c.a, c.u, c.dt, got, c.want)
			}
		})
	}
}

// TestDropChance: the classes go from the least important, one after the
// other; the first is never shed; one class sheds nothing.
func TestDropChance(t *testing.T) {
	cases := []struct {
		name string
		a    float64
		n    int
		want []float64 // by class, most important first
	}{
		{"one class sheds nothing, even at 1", 1, 1, []float64{0}},
		{"two classes: the last in proportion", 0.5, 2, []float64{0, 0.5}},
		{"two classes at 1", 1, 2, []float64{0, 1}},
		{"four classes at 0.5", 0.5, 4, []float64{0, 0, 0.5, 1}},
		{"four classes at 1", 1, 4, []float64{0, 1, 1, 1}},
		{"at 0 nothing", 0, 4, []float64{0, 0, 0, 0}},
		{"below 0 nothing", -0.5, 4, []float64{0, 0, 0, 0}},
		{"just above 0, the last class barely", 1.0 / 1024, 3, []float64{0, 0, 2.0 / 1024}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for i, want := range c.want {
				if got := dropChance(c.a, c.n, i); got != want {
					t.Fatalf("class %d of %d at A=%v: %v, want %v", i, c.n, c.a, got, want)
				}
			}
		})
	}
}

// newTestShedder makes a shedder whose sampler does not run: the test
// drives it with a fake clock.
func newTestShedder(t *testing.T, sh *Shed, now time.Time) *shedder {
	t.Helper()
	if err := registerMetrics(prometheus.NewRegistry()); err != nil {
		t.Fatal(err)
	}
	s := newShedder(sh, now)
	t.Cleanup(func() { metrics.shedAmount.DeleteLabelValues(s.name) })
	return s
}

// TestShedderSamplesAndMoves drives a shedder's sampling with a fake clock:
// it averages the samples of the last second, moves the amount once a
// second by the real time passed, and logs once when shedding starts and
// once when it stops.
func TestShedderSamplesAndMoves(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	sh := &Shed{Name: "unit_fake_clock", Classes: []string{"critical", "normal", "low"}, Capacity: 4,
		Good: 0.7, Bad: 0.8, After: caddy.Duration(2 * time.Second), Full: caddy.Duration(4 * time.Second), logger: zap.New(core)}
	now := time.Unix(1_000_000, 0)
	s := newTestShedder(t, sh, now)
	if s.load() != -0.5 {
		t.Fatalf("starts at %v, want -0.5", s.load())
	}
	// second runs one second of samples, the in-flight count of sample i
	// being inFlight(i).
	second := func(inFlight func(i int) int64) {
		for i := range 20 {
			s.inFlight.Store(inFlight(i))
			now = now.Add(shedSampleEvery)
			s.tick(now)
			if i < 18 && s.samples == 0 {
				t.Fatalf("moved after %d samples", i+1)
			}
		}
		if s.samples != 0 {
			t.Fatalf("did not move after a second")
		}
	}
	full := func(int) int64 { return 4 }
	// Alternating 8 and 0 in flight averages 4: u = 1.
	alternating := func(i int) int64 { return int64(8 * (i % 2)) }
	idle := func(int) int64 { return 0 }

	second(full)
	if s.load() != -0.25 || s.u != 1 {
		t.Fatalf("after 1 s full: A = %v, u = %v", s.load(), s.u)
	}
	second(alternating)
	if s.load() != 0 || s.u != 1 {
		t.Fatalf("after 2 s: A = %v, u = %v; want 0 and 1 (8 and 0 in flight average 4)", s.load(), s.u)
	}
	if logs.Len() != 0 {
		t.Fatalf("logged before shedding: %v", logs.All())
	}
	second(full)
	if s.load() != 0.25 {
		t.Fatalf("after 3 s: A = %v", s.load())
	}
	s.shed.Add(7) // as if 7 requests were shed
	second(full)
	second(full)
	second(full)
	if s.load() != 1 {
		t.Fatalf("after 6 s: A = %v", s.load())
	}
	// Half the second at 4, half at 0: u = 0.5, f = 0.5/0.7 - 1.
	second(func(i int) int64 { return int64(4 * (i / 10)) })
	if want := 1 + (0.5/0.7-1)/4; s.u != 0.5 || s.load() != want {
		t.Fatalf("after half a second at full: u = %v, A = %v; want 0.5, %v", s.u, s.load(), want)
	}
	for s.load() > 0 {
		second(idle)
	}
	if started := logs.FilterMessage("load shedding started").All(); len(started) != 1 ||
		started[0].ContextMap()["shedder"] != "unit_fake_clock" || started[0].ContextMap()["amount"] != 0.25 {
		t.Fatalf("started lines: %v", started)
	}
	if stopped := logs.FilterMessage("load shedding stopped").All(); len(stopped) != 1 || stopped[0].ContextMap()["shed"] != int64(7) {
		t.Fatalf("stopped lines: %v", stopped)
	}
	if logs.Len() != 2 {
		t.Fatalf("%d log lines, want 2: %v", logs.Len(), logs.All())
	}

	// A sampler that missed its ticks (the process stalled) moves by the
	// time that passed.
	second(full)
	before := s.load()
	now = now.Add(3 * time.Second)
	s.inFlight.Store(4)
	s.tick(now)
	if want := shedStep(specParams, before, 1, 3*time.Second); s.load() != want {
		t.Fatalf("after a stall: A = %v, want %v", s.load(), want)
	}
}

// setAmount sets the shedder's amount as its sampler would, under its
// lock, so the sampler cannot overwrite it with a move it was making.
func setAmount(s *shedder, a float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.store(a)
}

// shedHandler provisions a handler from JSON and cleans it up after the
// test, stopping its shedder's sampler.
func shedHandler(t testing.TB, config string) *Handler {
	t.Helper()
	h := provisionHandler(t, config)
	t.Cleanup(func() { _ = h.Cleanup() })
	if h.Shed != nil {
		// As provisionHandler does for the handler's own logger.
		s := h.Shed.state
		s.mu.Lock()
		s.logger = zap.NewNop()
		s.mu.Unlock()
	}
	return h
}

// shedConfig is a handler with a shedder whose amount its sampler moves
// too slowly to matter in a test (full 1000h), so tests set it.
func shedConfig(name, extra string) string {
	return fmt.Sprintf(`{"shed":{"name":%q,"priority":"{http.request.header.X-Priority}","classes":["critical","normal","low"],
		"capacity":4,"after":"1000h","full":"1000h"%s}`, name, extra)
}

// TestShedHandler drives the handler without a server: what is shed, what
// a shed request gets, and what it never does (reach the app, count in
// flight, consume anything in a zone).
func TestShedHandler(t *testing.T) {
	h := shedHandler(t, shedConfig("unit_shed", `}, "zones":[{"name":"unit_shed_zone","key":"{http.request.header.X-Client}","limit":2,"window":"1h"}]`))
	// Drop chances strictly between 0 and 1 draw 0.5.
	h.Shed.random = func() float64 { return 0.5 }
	s := h.Shed.state
	var inFlightInNext int64
	send := func(priority, client string) served {
		t.Helper()
		r, repl := testRequest(context.Background(), http.MethodGet, "192.0.2.1", "X-Priority: "+priority, "X-Client: "+client)
		w := httptest.NewRecorder()
		out := served{status: http.StatusOK, header: w.Header(), repl: repl}
		err := h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
			out.reached = true
			inFlightInNext = s.inFlight.Load()
			return nil
		}))
		var he caddyhttp.HandlerError
		if errors.As(err, &he) {
			out.status = he.StatusCode
		} else if err != nil {
			t.Fatal(err)
		}
		return out
	}
	shedTotal := func(class string) float64 { return shedTotalValue(t, "unit_shed", class) }
	lowBefore, criticalBefore := shedTotal("low"), shedTotal("critical")

	setAmount(s, 1)
	for _, c := range []struct {
		priority string
		shed     bool
	}{
		{"critical", false},
		{"normal", true},
		{"low", true},
		{"", true},       // empty: the last class
		{"urgent", true}, // not a class: the last class
		{" critical ", false},
	} {
		client := "served"
		if c.shed {
			client = "shed"
		}
		got := send(c.priority, client)
		if c.shed {
			if got.status != http.StatusServiceUnavailable || got.reached || got.header.Get("Retry-After") != "1" {
				t.Fatalf("priority %q at A = 1: status %d, reached %v, Retry-After %q; want 503, not reached, 1",
					c.priority, got.status, got.reached, got.header.Get("Retry-After"))
			}
			if got.header.Get("X-RateLimit-Limit") != "" {
				t.Fatalf("priority %q: a shed request got zone headers: %v", c.priority, got.header)
			}
		} else if got.status != http.StatusOK || !got.reached || inFlightInNext != 1 {
			t.Fatalf("priority %q at A = 1: status %d, reached %v, in flight in next %d; want 200, reached, 1",
				c.priority, got.status, got.reached, inFlightInNext)
		}
	}
	if n := s.inFlight.Load(); n != 0 {
		t.Fatalf("%d in flight after every request returned", n)
	}
	if d := shedTotal("low") - lowBefore; d != 3 {
		t.Fatalf("shed_total{class=low} grew by %v, want 3 (low, empty, unknown)", d)
	}
	if d := shedTotal("critical") - criticalBefore; d != 0 {
		t.Fatalf("shed_total{class=critical} grew by %v", d)
	}

	// The shed requests consumed nothing in the zone: client "shed" still
	// has its 2.
	setAmount(s, -1)
	for i, want := range []int{200, 200, 429} {
		if got := send("low", "shed"); got.status != want {
			t.Fatalf("request %d of client shed after shedding: %d, want %d", i, got.status, want)
		}
	}

	// At A = 0.75, normal's chance is 0.5: the draw decides.
	setAmount(s, 0.75)
	h.Shed.random = func() float64 { return 0.49 }
	if got := send("normal", "a"); got.status != http.StatusServiceUnavailable {
		t.Fatalf("normal at chance 0.5, draw 0.49: %d, want 503", got.status)
	}
	h.Shed.random = func() float64 { return 0.5 }
	if got := send("normal", "b"); got.status != http.StatusOK {
		t.Fatalf("normal at chance 0.5, draw 0.5: %d, want 200", got.status)
	}
	// Chances of 0 and 1 draw nothing.
	h.Shed.random = func() float64 { t.Fatal("drew for a chance of 0 or 1"); return 0 }
	send("low", "c")
	send("critical", "d")
}

// shedTotalValue reads caddy_http_rate_limit_shed_total for a shedder and
// class, 0 if it has no such series.
func shedTotalValue(t *testing.T, shedder, class string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.shedTotal)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["shedder"] == shedder && labels["class"] == class {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestShedPriorityResolvedOnlyWhileShedding: with A <= 0 the priority
// template is not even resolved; with A > 0 it is, once per request.
func TestShedPriorityResolvedOnlyWhileShedding(t *testing.T) {
	h := shedHandler(t, `{"shed":{"name":"unit_lazy","priority":"{test.priority}","classes":["critical","low"],"capacity":4,"after":"1000h","full":"1000h"}}`)
	asked := 0
	send := func() served {
		r, repl := testRequest(context.Background(), http.MethodGet, "192.0.2.1")
		repl.Map(func(key string) (any, bool) {
			if key == "test.priority" {
				asked++
				return "low", true
			}
			return nil, false
		})
		w := httptest.NewRecorder()
		out := served{status: http.StatusOK, header: w.Header()}
		err := h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { out.reached = true; return nil }))
		var he caddyhttp.HandlerError
		if errors.As(err, &he) {
			out.status = he.StatusCode
		}
		return out
	}
	for _, a := range []float64{-0.5, 0} {
		setAmount(h.Shed.state, a)
		if got := send(); !got.reached || asked != 0 {
			t.Fatalf("A = %v: reached %v, priority resolved %d times; want reached, never resolved", a, got.reached, asked)
		}
	}
	setAmount(h.Shed.state, 1)
	if got := send(); got.reached || got.status != http.StatusServiceUnavailable || asked != 1 {
		t.Fatalf("A = 1: reached %v, status %d, priority resolved %d times; want shed, once", got.reached, got.status, asked)
	}
}

// TestShedStatusAndDryRun: status sets what a shed request gets; dry run
// counts what it would shed and sheds nothing.
func TestShedStatusAndDryRun(t *testing.T) {
	teapot := shedHandler(t, shedConfig("unit_status", `,"status":418}`))
	setAmount(teapot.Shed.state, 1)
	if got := serve(t, teapot, context.Background(), http.MethodGet, "192.0.2.1", "X-Priority: low"); got.status != 418 || got.reached {
		t.Fatalf("status 418: got %d, reached %v", got.status, got.reached)
	}

	dry := shedHandler(t, shedConfig("unit_dry_shed", `,"dry_run":true}`))
	setAmount(dry.Shed.state, 1)
	before := shedTotalValue(t, "unit_dry_shed", "low")
	got := serve(t, dry, context.Background(), http.MethodGet, "192.0.2.1", "X-Priority: low")
	if got.status != http.StatusOK || !got.reached || got.header.Get("Retry-After") != "" {
		t.Fatalf("dry run: status %d, reached %v, Retry-After %q; want 200, reached, none", got.status, got.reached, got.header.Get("Retry-After"))
	}
	if d := shedTotalValue(t, "unit_dry_shed", "low") - before; d != 1 {
		t.Fatalf("dry run: shed_total grew by %v, want 1", d)
	}
}

// shedSamplers counts the shedders' sampler goroutines in this process.
func shedSamplers() int {
	buf := make([]byte, 1<<20)
	return strings.Count(string(buf[:runtime.Stack(buf, true)]), ".(*shedder).run(")
}

// waitForSamplers waits until n sampler goroutines run, and fails the test
// if that takes more than 10 s.
func waitForSamplers(t *testing.T, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); shedSamplers() != n; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d shed samplers running, want %d", shedSamplers(), n)
		}
	}
}

// TestShedSharedByName: handlers whose shedders have the same name share
// one, across what a reload does (the new config is provisioned before the
// old one is cleaned up); its one sampler stops with the last of them.
func TestShedSharedByName(t *testing.T) {
	base := shedSamplers()
	config := func(capacity int) string {
		return fmt.Sprintf(`{"shed":{"name":"unit_shared","classes":["critical","low"],"capacity":%d}}`, capacity)
	}
	h1 := provisionHandler(t, config(4))
	h2 := provisionHandler(t, config(4))
	other := shedHandler(t, `{"shed":{"name":"unit_other","classes":["critical","low"],"capacity":4}}`)
	if h1.Shed.state != h2.Shed.state || h1.Shed.state == other.Shed.state {
		t.Fatal("shedders of one name not shared, or of two names shared")
	}
	waitForSamplers(t, base+2)

	// In flight in one handler counts in the other's shedder.
	held := make(chan struct{})
	entered := make(chan struct{})
	go func() {
		r, _ := testRequest(context.Background(), http.MethodGet, "192.0.2.1")
		_ = h1.ServeHTTP(httptest.NewRecorder(), r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
			close(entered)
			<-held
			return nil
		}))
	}()
	<-entered
	if n := h2.Shed.state.inFlight.Load(); n != 1 {
		t.Fatalf("in flight seen from the other handler: %d, want 1", n)
	}

	// A reload: a new config's handler comes, with a new capacity, then
	// the old ones go. The state is kept and the new settings apply.
	setAmount(h1.Shed.state, 0.5)
	h3 := provisionHandler(t, config(8))
	if err := h1.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if err := h2.Cleanup(); err != nil {
		t.Fatal(err)
	}
	s := h3.Shed.state
	if s != h1.Shed.state || s.load() != 0.5 || s.inFlight.Load() != 1 || s.info().Capacity != 8 {
		t.Fatalf("after the reload: same state %v, A %v, in flight %d, capacity %d; want true, 0.5, 1, 8",
			s == h1.Shed.state, s.load(), s.inFlight.Load(), s.info().Capacity)
	}
	// The request of the unloaded config finishes, and counts down.
	close(held)
	for deadline := time.Now().Add(10 * time.Second); s.inFlight.Load() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the old config's request never counted down")
		}
	}
	waitForSamplers(t, base+2)
	if err := h3.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if err := h3.Cleanup(); err != nil { // a second Cleanup is harmless
		t.Fatal(err)
	}
	waitForSamplers(t, base+1)
	if err := other.Cleanup(); err != nil {
		t.Fatal(err)
	}
	waitForSamplers(t, base)

	// A later config starts afresh.
	h4 := shedHandler(t, config(4))
	if h4.Shed.state == s || h4.Shed.state.load() != -DefaultShedAfter.Seconds()/DefaultShedFull.Seconds() {
		t.Fatalf("a new shedder after the last one went: same %v, A %v", h4.Shed.state == s, h4.Shed.state.load())
	}
}

// idleShedRequest is a request as Caddy hands it to the handler, with no
// handle_errors on its server.
func idleShedRequest() *http.Request {
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.Header.Set("X-Priority", "low")
	vars := map[string]any{caddyhttp.ClientIPVarKey: "203.0.113.9"}
	ctx := context.WithValue(req.Context(), caddyhttp.VarsCtxKey, vars)
	ctx = context.WithValue(ctx, caddyhttp.ServerCtxKey, new(caddyhttp.Server))
	req = req.WithContext(ctx)
	caddyhttp.NewTestReplacer(req)
	return req
}

// TestShedIdleAllocatesNothing: a shed block that is not shedding costs
// the request no allocation (the benchmark below shows the time).
func TestShedIdleAllocatesNothing(t *testing.T) {
	h := shedHandler(t, shedConfig("unit_idle_allocs", "}"))
	req, w := idleShedRequest(), httptest.NewRecorder()
	if n := testing.AllocsPerRun(1000, func() { _ = h.ServeHTTP(w, req, nextOK) }); n != 0 {
		t.Fatalf("%v allocations per request through an idle shedder, want 0", n)
	}
}

// BenchmarkShed measures the shedder on the request path: idle (A <= 0:
// one atomic read, and one add and one subtract for the request in
// flight), alone and in front of a zone, and shedding every request.
func BenchmarkShed(b *testing.B) {
	zone := `"zones":[{"name":"bench_shed_zone","limit":[2000000000],"window":"1m"}]`
	cases := []struct {
		name, config string
		amount       float64
	}{
		{"idle_alone", shedConfig("bench_idle_alone", "}"), -0.5},
		{"zone_only", `{` + zone + `}`, 0},
		{"idle_with_zone", shedConfig("bench_idle_zone", "},"+zone), -0.5},
		{"shedding_every_request", shedConfig("bench_shedding", "}"), 1},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			h := shedHandler(b, c.config)
			if h.Shed != nil {
				setAmount(h.Shed.state, c.amount)
			}
			req := idleShedRequest()
			vars, _ := req.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
			w := httptest.NewRecorder()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				// With a zone, a fresh request every 256 iterations, as in
				// BenchmarkHandler; a shedder alone registers nothing.
				if i++; i%256 == 0 && len(h.Zones) > 0 {
					req = idleShedRequest()
					vars, _ = req.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
				}
				delete(vars, placeholdersVar)
				_ = h.ServeHTTP(w, req, nextOK)
			}
		})
	}
}

// TestShedderName: names are printable ASCII, 0x20 to 0x7E.
func TestShedderName(t *testing.T) {
	for name, ok := range map[string]bool{
		"default": true, "api shed": true, "~!{}": true,
		"": false, "a\tb": false, "a\nb": false, "del\x7f": false, "café": false, "\x00": false,
	} {
		if err := checkShedderName(name); (err == nil) != ok {
			t.Errorf("checkShedderName(%q) = %v", name, err)
		}
	}
}
