package shed

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/d61b427a/caddy-rate-limit/internal/promtest"
	"github.com/d61b427a/caddy-rate-limit/internal/race"
)

// vectorParams are the settings of the shedder's test vector (the one in
// docs/load-shedding.md): good 0.7, bad 0.8, after 2s, full 4s.
var vectorParams = params{good: 0.7, bad: 0.8, after: 2 * time.Second, full: 4 * time.Second}

// chances are the drop chances of classes critical, normal and low.
func chances(a float64) [3]float64 {
	return [3]float64{dropChance(a, 3, 0), dropChance(a, 3, 1), dropChance(a, 3, 2)}
}

// TestShedVector is the shedder's test vector, second by second: capacity 4,
// classes critical normal low, u held at 1 until 6 s, then at 0. Made-up
// times, no clock: the amount moves once a second by step.
func TestShedVector(t *testing.T) {
	steps := []struct {
		second  int
		u       float64 // utilization over the second that ends here
		a       float64
		chances [3]float64 // critical, normal, low
		note    string
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
	a := vectorParams.floor()
	if a != -0.5 || chances(a) != [3]float64{} {
		t.Fatalf("A starts at %v with chances %v, want -0.5 and none", a, chances(a))
	}
	for _, s := range steps {
		a = step(vectorParams, a, s.u, time.Second)
		if a != s.a || chances(a) != s.chances {
			t.Fatalf("at %d s: A = %v, chances %v; want %v, %v (%s)", s.second, a, chances(a), s.a, s.chances, s.note)
		}
	}
}

// TestShedStepEdges: the cases around the formula's corners, one step
// each.
func TestShedStepEdges(t *testing.T) {
	bad1 := params{good: 0.5, bad: 1, after: 2 * time.Second, full: 4 * time.Second}
	cases := []struct {
		name string
		p    params
		a, u float64
		dt   time.Duration
		want float64
	}{
		{"u between good and bad holds A", vectorParams, 0.3, 0.75, time.Second, 0.3},
		{"u at good holds A", vectorParams, 0.3, 0.7, time.Second, 0.3},
		{"u at bad holds A (f = 0 there)", vectorParams, 0.3, 0.8, time.Second, 0.3},
		{"u between bad and 1 grows A in proportion", vectorParams, 0, 0.9, time.Second, 0.125},
		{"u above 1 grows A no faster than u = 1", vectorParams, 0, 3, time.Second, 0.25},
		{"u below good eases in proportion", vectorParams, 0.5, 0.35, time.Second, 0.375},
		{"idle eases at the full rate", vectorParams, 0.5, 0, time.Second, 0.25},
		{"clamped at 1", vectorParams, 0.9, 1, time.Second, 1},
		{"held at 1", vectorParams, 1, 1, time.Second, 1},
		{"clamped at -after/full", vectorParams, -0.4, 0, time.Second, -0.5},
		{"held at -after/full", vectorParams, -0.5, 0, time.Second, -0.5},
		{"dt longer than after: one step passes 0", vectorParams, -0.5, 1, 3 * time.Second, 0.25},
		{"dt longer than after and full: clamped at 1", vectorParams, -0.5, 1, 10 * time.Second, 1},
		{"dt longer than after, idle: clamped at -after/full", vectorParams, 1, 0, 10 * time.Second, -0.5},
		{"half a second moves half as far", vectorParams, 0, 1, 500 * time.Millisecond, 0.125},
		{"no time, no move", vectorParams, 0.3, 1, 0, 0.3},
		{"time running backwards does not move A", vectorParams, 0.3, 1, -time.Second, 0.3},
		{"bad 1: u = 1 holds A", bad1, 0.3, 1, time.Second, 0.3},
		{"bad 1: u above 1 grows A", bad1, 0.3, 1.5, time.Second, 0.55},
		{"bad 1: u below 1 and above good holds A", bad1, 0.3, 0.9, time.Second, 0.3},
		{"an A below a new floor (a reload raised it) comes up to it", vectorParams, -2, 0.75, time.Second, -0.5},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := step(c.p, c.a, c.u, c.dt); got != c.want {
				t.Fatalf("step(A=%v, u=%v, dt=%v) = %v, want %v", c.a, c.u, c.dt, got, c.want)
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
	t.Cleanup(func() { metrics.amount.DeleteLabelValues(s.name) })
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
			now = now.Add(sampleEvery)
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
	if want := step(vectorParams, before, 1, 3*time.Second); s.load() != want {
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

// provisioned provisions sh from its JSON config, as the handler does,
// and lets go of it when tb ends. Its sampler runs, but with after and
// full of 1000h (see config) it moves the amount too slowly to matter:
// tests set the amount.
func provisioned(tb testing.TB, sh *Shed) *Shed {
	tb.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	tb.Cleanup(cancel)
	if err := sh.Provision(ctx, zap.NewNop()); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = sh.Cleanup() })
	return sh
}

// config is a shedder of three classes whose amount only tests move.
func config(name string) *Shed {
	return &Shed{Name: name, Priority: "{http.request.header.X-Priority}", Classes: []string{"critical", "normal", "low"},
		Capacity: 4, After: caddy.Duration(1000 * time.Hour), Full: caddy.Duration(1000 * time.Hour)}
}

// request returns a replacer for a request with the given priority header
// ("" for none), as Caddy hands it to the handler.
func request(priority string) *caddy.Replacer {
	r := httptest.NewRequest("GET", "/", nil)
	if priority != "" {
		r.Header.Set("X-Priority", priority)
	}
	return caddyhttp.NewTestReplacer(r)
}

// shedTotalValue reads caddy_http_rate_limit_shed_total for a shedder and
// class, 0 if it has no such series.
func shedTotalValue(t *testing.T, shedder, class string) float64 {
	return promtest.Counter(t, metrics.total, map[string]string{"shedder": shedder, "class": class})
}

// TestCheck: what is shed at a given amount, by class, counted per class;
// a drop chance strictly between 0 and 1 draws, and 0 and 1 do not.
func TestCheck(t *testing.T) {
	sh := provisioned(t, config("unit_check"))
	sh.random = func() float64 { return 0.5 }
	total := func(class string) float64 { return shedTotalValue(t, "unit_check", class) }
	lowBefore, criticalBefore := total("low"), total("critical")

	setAmount(sh.state, 1)
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
		err := sh.Check(request(c.priority))
		if (err != nil) != c.shed {
			t.Fatalf("priority %q at A = 1: Check = %v, want shed %v", c.priority, err, c.shed)
		}
		if c.shed && !strings.Contains(fmt.Sprint(err), `shedder "unit_check"`) {
			t.Fatalf("priority %q: error %q does not name the shedder", c.priority, err)
		}
	}
	if d := total("low") - lowBefore; d != 3 {
		t.Fatalf("shed_total{class=low} grew by %v, want 3 (low, empty, unknown)", d)
	}
	if d := total("critical") - criticalBefore; d != 0 {
		t.Fatalf("shed_total{class=critical} grew by %v", d)
	}

	// At A = 0.75, normal's chance is 0.5: the draw decides.
	setAmount(sh.state, 0.75)
	sh.random = func() float64 { return 0.49 }
	if sh.Check(request("normal")) == nil {
		t.Fatal("normal at chance 0.5, draw 0.49: not shed")
	}
	sh.random = func() float64 { return 0.5 }
	if err := sh.Check(request("normal")); err != nil {
		t.Fatalf("normal at chance 0.5, draw 0.5: %v", err)
	}
	// Chances of 0 and 1 draw nothing.
	sh.random = func() float64 { t.Fatal("drew for a chance of 0 or 1"); return 0 }
	if sh.Check(request("low")) == nil || sh.Check(request("critical")) != nil {
		t.Fatal("at A = 0.75: low not shed, or critical shed")
	}
}

// TestPriorityResolvedOnlyWhileShedding: with A <= 0 the priority template
// is not even resolved; with A > 0 it is, once per request.
func TestPriorityResolvedOnlyWhileShedding(t *testing.T) {
	sh := config("unit_lazy")
	sh.Priority, sh.Classes = "{test.priority}", []string{"critical", "low"}
	provisioned(t, sh)
	asked := 0
	repl := func() *caddy.Replacer {
		repl := caddy.NewReplacer()
		repl.Map(func(key string) (any, bool) {
			if key == "test.priority" {
				asked++
				return "low", true
			}
			return nil, false
		})
		return repl
	}
	for _, a := range []float64{-0.5, 0} {
		setAmount(sh.state, a)
		if err := sh.Check(repl()); err != nil || asked != 0 {
			t.Fatalf("A = %v: Check = %v, priority resolved %d times; want nil, never resolved", a, err, asked)
		}
	}
	setAmount(sh.state, 1)
	if err := sh.Check(repl()); err == nil || asked != 1 {
		t.Fatalf("A = 1: Check = %v, priority resolved %d times; want shed, once", err, asked)
	}
}

// TestDryRunShedsNothing: dry run counts what it would shed and sheds
// nothing; a status set in the config is what a shed request answers.
func TestDryRunShedsNothing(t *testing.T) {
	dry := config("unit_dry")
	dry.DryRun = true
	provisioned(t, dry)
	setAmount(dry.state, 1)
	before := shedTotalValue(t, "unit_dry", "low")
	if err := dry.Check(request("low")); err != nil {
		t.Fatalf("dry run: Check = %v, want nil", err)
	}
	if d := shedTotalValue(t, "unit_dry", "low") - before; d != 1 {
		t.Fatalf("dry run: shed_total grew by %v, want 1", d)
	}

	if sh := provisioned(t, config("unit_default_status")); sh.Status != DefaultStatus {
		t.Fatalf("status %d, want the default %d", sh.Status, DefaultStatus)
	}
	teapot := config("unit_teapot")
	teapot.Status = 418
	if provisioned(t, teapot).Status != 418 {
		t.Fatal("status 418 not kept")
	}
}

// stopped reports whether s's sampler has stopped: Destruct, which the
// pool calls when the last user of the name is cleaned up, waits for it.
func stopped(s *shedder) bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// TestSharedByName: shedders with the same name share one state, across
// what a reload does (the new config is provisioned before the old one is
// cleaned up); its one sampler stops with the last of them.
func TestSharedByName(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	provision := func(name string, capacity int) *Shed {
		t.Helper()
		sh := &Shed{Name: name, Classes: []string{"critical", "low"}, Capacity: capacity}
		if err := sh.Provision(ctx, zap.NewNop()); err != nil {
			t.Fatal(err)
		}
		return sh
	}
	cleanup := func(sh *Shed) {
		t.Helper()
		if err := sh.Cleanup(); err != nil {
			t.Fatal(err)
		}
	}
	h1, h2, other := provision("unit_shared", 4), provision("unit_shared", 4), provision("unit_other", 4)
	if h1.state != h2.state || h1.state == other.state {
		t.Fatal("shedders of one name not shared, or of two names shared")
	}
	if stopped(h1.state) || stopped(other.state) {
		t.Fatal("a sampler stopped while its shedder is in use")
	}

	// In flight through one handler counts in the other's shedder.
	h1.Enter()
	if n := h2.state.inFlight.Load(); n != 1 {
		t.Fatalf("in flight seen from the other handler: %d, want 1", n)
	}

	// A reload: a new config's shedder comes, with a new capacity, then
	// the old ones go. The state is kept and the new settings apply.
	setAmount(h1.state, 0.5)
	h3 := provision("unit_shared", 8)
	cleanup(h1)
	cleanup(h2)
	s := h3.state
	if s != h1.state || s.load() != 0.5 || s.inFlight.Load() != 1 || s.info().Capacity != 8 {
		t.Fatalf("after the reload: same state %v, A %v, in flight %d, capacity %d; want true, 0.5, 1, 8",
			s == h1.state, s.load(), s.inFlight.Load(), s.info().Capacity)
	}
	// The request of the unloaded config finishes, and counts down.
	h1.Leave()
	if n := s.inFlight.Load(); n != 0 {
		t.Fatalf("%d in flight after the old config's request left", n)
	}
	if stopped(s) {
		t.Fatal("the sampler stopped while the new config uses it")
	}
	cleanup(h3)
	cleanup(h3) // a second Cleanup is harmless
	if !stopped(s) || stopped(other.state) {
		t.Fatalf("after the last of a name went: its sampler stopped %v, the other's %v; want true, false", stopped(s), stopped(other.state))
	}
	cleanup(other)
	if !stopped(other.state) {
		t.Fatal("the other sampler runs after its shedder went")
	}

	// A later config starts afresh.
	h4 := provision("unit_shared", 4)
	defer cleanup(h4)
	if h4.state == s || h4.state.load() != -DefaultAfter.Seconds()/DefaultFull.Seconds() {
		t.Fatalf("a new shedder after the last one went: same %v, A %v", h4.state == s, h4.state.load())
	}
}

// TestListShowsEveryShedder: the admin API's view of the running
// shedders, by name, with each class's drop chance now.
func TestListShowsEveryShedder(t *testing.T) {
	sh := provisioned(t, config("unit_list"))
	setAmount(sh.state, 0.75)
	sh.Enter()
	defer sh.Leave()
	for _, info := range List() {
		if info.Name != "unit_list" {
			continue
		}
		want := []ClassInfo{{"critical", 0}, {"normal", 0.5}, {"low", 1}}
		if info.Amount != 0.75 || info.InFlight != 1 || info.Capacity != 4 || fmt.Sprint(info.Classes) != fmt.Sprint(want) {
			t.Fatalf("listed %+v; want A 0.75, 1 in flight, capacity 4, chances %v", info, want)
		}
		return
	}
	t.Fatal("unit_list not listed")
}

// TestIdleCheckAllocatesNothing: a shedder that is not shedding costs a
// request one atomic read and no allocation.
func TestIdleCheckAllocatesNothing(t *testing.T) {
	if race.Enabled {
		t.Skip("allocation counts are not asserted under the race detector")
	}
	sh := provisioned(t, config("unit_idle"))
	repl := request("low")
	if n := testing.AllocsPerRun(1000, func() {
		if err := sh.Check(repl); err != nil {
			t.Fatal(err)
		}
		sh.Enter()
		sh.Leave()
	}); n != 0 {
		t.Fatalf("%v allocations per request through an idle shedder, want 0", n)
	}
}

// BenchmarkCheck measures the shedder on the request path: idle (A <= 0),
// and shedding every request (the priority resolved, the class found).
func BenchmarkCheck(b *testing.B) {
	for _, c := range []struct {
		name   string
		amount float64
	}{{"idle", -0.5}, {"shedding_every_request", 1}} {
		b.Run(c.name, func(b *testing.B) {
			sh := provisioned(b, config("bench_"+c.name))
			setAmount(sh.state, c.amount)
			repl := request("low")
			b.ReportAllocs()
			for b.Loop() {
				_ = sh.Check(repl)
				sh.Enter()
				sh.Leave()
			}
		})
	}
}

// TestName: names are printable ASCII, 0x20 to 0x7E.
func TestName(t *testing.T) {
	for name, ok := range map[string]bool{
		"default": true, "api shed": true, "~!{}": true,
		"": false, "a\tb": false, "a\nb": false, "del\x7f": false, "café": false, "\x00": false,
	} {
		if err := checkName(name); (err == nil) != ok {
			t.Errorf("checkName(%q) = %v", name, err)
		}
	}
}
