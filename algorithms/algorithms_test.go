package algorithms_test

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/algorithms/vectors"
)

// TestVectors runs the shared table against Decide itself, with counts kept
// in a map the way the simplest store would.
func TestVectors(t *testing.T) {
	counts := map[string]algorithms.Counts{}
	rings := map[string]algorithms.Ring{}
	vectors.Run(t, func(t *testing.T, now time.Time, c vectors.Case, key string, cost int64) algorithms.Decision {
		if c.Algorithm == algorithms.SlidingWindow {
			d, next := algorithms.DecideRing(rings[key], now, c.Rate, cost)
			rings[key] = next
			return d
		}
		d, next := algorithms.Decide(c.Algorithm, counts[key], now, c.Rate, cost)
		counts[key] = next
		return d
	})
}

// TestTrueUpVectors runs the shared true-ups against Decide, Release and
// Debt, with counts kept in maps as in TestVectors.
func TestTrueUpVectors(t *testing.T) {
	counts := map[string]algorithms.Counts{}
	rings := map[string]algorithms.Ring{}
	vectors.RunTrueUps(t, func(t *testing.T, now time.Time, c vectors.TrueUpCase, key string, cost int64) algorithms.Decision {
		if c.Algorithm == algorithms.SlidingWindow {
			d, next := algorithms.DecideRing(rings[key], now, c.Rate, cost)
			rings[key] = next
			return d
		}
		d, next := algorithms.Decide(c.Algorithm, counts[key], now, c.Rate, cost)
		counts[key] = next
		return d
	}, func(t *testing.T, now time.Time, c vectors.TrueUpCase, key string, cost int64, d algorithms.Decision, actual int64) {
		l := c.Rate
		l.Units = d.Limit
		switch {
		case actual < cost && c.Algorithm == algorithms.SlidingWindow:
			rings[key] = algorithms.ReleaseRing(rings[key], d, cost-actual)
		case actual < cost:
			counts[key] = algorithms.Release(c.Algorithm, counts[key], d, l, cost-actual)
		case c.Algorithm == algorithms.SlidingWindow:
			rings[key] = algorithms.DebtRing(rings[key], now, l, actual-cost)
		default:
			counts[key] = algorithms.Debt(c.Algorithm, counts[key], now, l, actual-cost)
		}
	})
}

// TestDebt checks, over random states, that a debt never lowers a key's
// counts, adds its units to now's window (a TAT: moves it on by their
// span) while under the bound, and never takes the counts past it: twice
// the limit, a TAT two bucket depths ahead of now.
func TestDebt(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 5000 {
		l := algorithms.Rate{Units: 1 + rng.Int64N(1000), Window: time.Duration(1+rng.Int64N(100_000)) * time.Millisecond}
		w := l.Window.Milliseconds()
		now := time.UnixMilli(vectors.Start.UnixMilli() + rng.Int64N(1e9))
		idx := now.UnixMilli() / w
		units := 1 + rng.Int64N(3*l.Units)
		for _, alg := range []algorithms.Algorithm{algorithms.FixedWindow, algorithms.SlidingTail} {
			c := algorithms.WindowCounts{Window: idx - 2 + rng.Int64N(4), Current: rng.Int64N(2*l.Units + 1), Previous: rng.Int64N(2*l.Units + 1)}
			rolled := algorithms.Roll(c, max(idx, c.Window))
			got := algorithms.Debt(alg, c.Counts(), now, l, units).Windows()
			want := rolled
			want.Current = max(rolled.Current, min(rolled.Current+units, 2*l.Units))
			if got != want {
				t.Fatalf("%s limit %d: a debt of %d on %+v at window %d: %+v, want %+v", alg, l.Units, units, c, idx, got, want)
			}
		}

		l.Burst = 1 + rng.Int64N(2*l.Units)
		depth, _ := algorithms.Interval(l.Burst, l.Window, l.Units)
		stored := algorithms.Counts{W: now.UnixMilli() - depth + rng.Int64N(4*depth+2), C: rng.Int64N(l.Units), P: l.Units}
		got := algorithms.Debt(algorithms.GCRA, stored, now, l, units)
		from := max(stored.TATMillis(), now.UnixMilli())
		span, _ := algorithms.Interval(units, l.Window, l.Units)
		bound, _ := algorithms.Interval(2*l.Burst, l.Window, l.Units)
		switch tat := got.TATMillis(); {
		case got.TATLimit() != l.Units:
			t.Fatalf("gcra: a debt wrote a TAT for limit %d, want %d", got.TATLimit(), l.Units)
		case tat < from || tat == stored.TATMillis() && got.C < stored.C:
			t.Fatalf("gcra: a debt moved the TAT back: %+v -> %+v at %d", stored, got, now.UnixMilli())
		case tat > max(stored.TATMillis(), now.UnixMilli()+bound+1):
			t.Fatalf("gcra: a debt moved the TAT to %d, past %d and two bucket depths, %d", tat, now.UnixMilli(), bound)
		case from+span+1 < now.UnixMilli()+bound && (tat < from+span || tat > from+span+1):
			t.Fatalf("gcra: a debt of %d (%d ms) moved the TAT from %d to %d", units, span, from, tat)
		}
	}
	if c := (algorithms.Counts{C: 2}); algorithms.Debt(algorithms.Concurrency, c, vectors.Start, algorithms.Rate{Units: 3, Window: time.Minute}, 5) != c {
		t.Fatal("a debt on a concurrency key changed its counts")
	}
}

// TestRetryAtIsFirstAllowedInstant checks, for many states, that the retry
// instant is allowed and the millisecond before it is not.
func TestRetryAtIsFirstAllowedInstant(t *testing.T) {
	l := algorithms.Rate{Units: 7, Window: 3 * time.Second}
	start := vectors.Start
	for _, alg := range []algorithms.Algorithm{algorithms.SlidingTail, algorithms.FixedWindow} {
		// Counts up to twice the limit: a debt takes them past it.
		for prev := int64(0); prev <= 14; prev++ {
			for cur := int64(0); cur <= 14; cur++ {
				for cost := int64(1); cost <= 7; cost++ {
					for _, at := range []time.Duration{0, time.Millisecond, 1499 * time.Millisecond, 2999 * time.Millisecond} {
						c := algorithms.WindowCounts{Window: start.UnixMilli() / 3000, Current: cur, Previous: prev}.Counts()
						now := start.Add(at)
						d, after := algorithms.Decide(alg, c, now, l, cost)
						if d.Allowed {
							continue
						}
						if after != c {
							t.Fatalf("%s prev=%d cur=%d cost=%d: rejection changed counts %+v -> %+v", alg, prev, cur, cost, c, after)
						}
						if !d.RetryAt.After(now) {
							t.Fatalf("%s prev=%d cur=%d cost=%d at %s: retry %s not after now", alg, prev, cur, cost, at, d.RetryAt.Sub(now))
						}
						if got, _ := algorithms.Decide(alg, c, d.RetryAt, l, cost); !got.Allowed {
							t.Fatalf("%s prev=%d cur=%d cost=%d at %s: not allowed at retry instant +%s", alg, prev, cur, cost, at, d.RetryAt.Sub(now))
						}
						before := d.RetryAt.Add(-time.Millisecond)
						if before.After(now) {
							if got, _ := algorithms.Decide(alg, c, before, l, cost); got.Allowed {
								t.Fatalf("%s prev=%d cur=%d cost=%d at %s: already allowed 1ms before retry", alg, prev, cur, cost, at)
							}
						}
					}
				}
			}
		}
	}
}

// TestHugeNumbersDoNotOverflow uses a limit near 2^31 and a window of a year,
// whose product overflows 64 bits.
func TestHugeNumbersDoNotOverflow(t *testing.T) {
	l := algorithms.Rate{Units: math.MaxInt32, Window: 365 * 24 * time.Hour}
	w := l.Window.Milliseconds()
	idx := vectors.Start.UnixMilli() / w
	now := time.UnixMilli(idx*w + w/2)
	c := algorithms.WindowCounts{Window: idx - 1, Current: math.MaxInt32}.Counts()
	d, _ := algorithms.Decide(algorithms.SlidingTail, c, now, l, 1)
	// half of the previous window is still inside: floor(MaxInt32/2) used
	if want := int64(math.MaxInt32/2) + 1; d.Used != want || !d.Allowed {
		t.Fatalf("used %d allowed %v, want %d allowed", d.Used, d.Allowed, want)
	}
}

func TestLimitValidate(t *testing.T) {
	for _, l := range []algorithms.Rate{{Units: 0, Window: time.Second}, {Units: -1, Window: time.Second}, {Units: 1}, {Units: 1, Window: time.Microsecond}, {Units: 1, Window: time.Second, Burst: -1}, {Units: 1, Window: 24 * time.Hour, Burst: 1 << 31}} {
		if l.Validate() == nil {
			t.Errorf("%+v accepted", l)
		}
	}
	if err := (algorithms.Rate{Units: 1, Window: time.Millisecond}).Validate(); err != nil {
		t.Error(err)
	}
}

// BenchmarkDecide decides in epoch windows of a minute and in calendar
// months in New York, whose boundaries the calendar computes once a
// period: the two should cost about the same.
func BenchmarkDecide(b *testing.B) {
	now := vectors.Start.Add(30 * time.Second)
	for _, rate := range []struct {
		name string
		l    algorithms.Rate
	}{
		{"1m", algorithms.Rate{Units: 1 << 30, Window: time.Minute}},
		{"month", algorithms.Rate{Units: 1 << 30, Calendar: algorithms.CalendarOf(algorithms.Month, mustZone(b, "America/New_York"))}},
	} {
		for _, alg := range []algorithms.Algorithm{algorithms.FixedWindow, algorithms.SlidingTail} {
			b.Run(string(alg)+"/"+rate.name, func(b *testing.B) {
				b.ReportAllocs()
				c := algorithms.WindowCounts{Window: rate.l.WindowAt(now.UnixMilli()).Index - 1, Current: 1000}.Counts()
				for b.Loop() {
					_, c = algorithms.Decide(alg, c, now, rate.l, 1)
				}
			})
		}
	}
}

// TestRolledReportsTheFinishedWindow: a decision that moves a key into a
// new window reports what the key used in the last window it was taken
// in; a new key and a key within its window report no roll.
func TestRolledReportsTheFinishedWindow(t *testing.T) {
	rate := algorithms.Rate{Units: 10, Window: time.Minute}
	start := time.UnixMilli(vectors.Start.UnixMilli() / 60000 * 60000)
	var c algorithms.Counts
	steps := []struct {
		at       time.Duration
		cost     int64
		rolled   bool
		finished int64
	}{
		{0, 3, false, 0},           // a new key
		{time.Second, 4, false, 0}, // same window: 7 used
		{time.Minute, 1, true, 7},  // next window: the last one used 7
		{time.Minute + time.Second, 1, false, 0},
		{5 * time.Minute, 2, true, 2}, // idle for windows: the last used one had 2
	}
	for i, s := range steps {
		d, next := algorithms.Decide(algorithms.SlidingTail, c, start.Add(s.at), rate, s.cost)
		if !d.Allowed || d.Rolled != s.rolled || d.Finished != s.finished {
			t.Fatalf("step %d: allowed %v rolled %v finished %d, want rolled %v finished %d", i, d.Allowed, d.Rolled, d.Finished, s.rolled, s.finished)
		}
		c = next
	}
}

// TestGCRARetryAtIsFirstAllowedInstant drives keys with random costs and
// gaps through rates whose interval is and is not a whole number of
// milliseconds, and checks every rejection's retry instant exactly: allowed
// there, not 1 ms before.
func TestGCRARetryAtIsFirstAllowedInstant(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	rates := []algorithms.Rate{
		{Units: 10, Window: time.Second, Burst: 3},
		{Units: 3, Window: time.Second, Burst: 1},
		{Units: 7, Window: 1000 * time.Millisecond},
		{Units: 1000, Window: 7 * time.Millisecond, Burst: 50},
		{Units: 1<<31 - 1, Window: 30 * 24 * time.Hour, Burst: 5},
		{Units: 1, Window: 24 * time.Hour, Burst: 2},
	}
	for _, l := range rates {
		var c algorithms.Counts
		now := vectors.Start
		burst := l.BurstFor(l.Units)
		for range 2000 {
			now = now.Add(time.Duration(rng.IntN(int(l.Window.Milliseconds()/l.Units+2))) * time.Millisecond)
			cost := int64(rng.IntN(int(min(burst, 4)))) + 1
			d, next := algorithms.Decide(algorithms.GCRA, c, now, l, cost)
			if d.Remaining < 0 || d.Remaining > burst {
				t.Fatalf("%+v: remaining %d outside [0, %d]", l, d.Remaining, burst)
			}
			if d.Allowed {
				c = next
				continue
			}
			if next != c {
				t.Fatalf("%+v: rejection changed the state %+v -> %+v", l, c, next)
			}
			if !d.RetryAt.After(now) {
				t.Fatalf("%+v: retry %s not after now", l, d.RetryAt.Sub(now))
			}
			if got, _ := algorithms.Decide(algorithms.GCRA, c, d.RetryAt, l, cost); !got.Allowed {
				t.Fatalf("%+v cost %d: not allowed at the retry instant", l, cost)
			}
			if before := d.RetryAt.Add(-time.Millisecond); before.After(now) {
				if got, _ := algorithms.Decide(algorithms.GCRA, c, before, l, cost); got.Allowed {
					t.Fatalf("%+v cost %d: allowed 1 ms before the retry instant", l, cost)
				}
			}
		}
	}
}

// TestGCRAKeepsTheRateExactly takes one unit at every first allowed
// instant, 5,000 times, at 3 per second with a burst of 2: the burst at
// once, then the k-th unit at exactly ceil((k−1)·1000/3) ms, with no drift
// from rounding. (With a burst of 1 a request that comes the fraction of a
// millisecond after its TAT restarts the schedule from then, as GCRA
// does.)
func TestGCRAKeepsTheRateExactly(t *testing.T) {
	l := algorithms.Rate{Units: 3, Window: time.Second, Burst: 2}
	var c algorithms.Counts
	now := vectors.Start
	for k := int64(0); k < 5000; {
		d, next := algorithms.Decide(algorithms.GCRA, c, now, l, 1)
		if !d.Allowed {
			now = d.RetryAt
			continue
		}
		if got, want := now.Sub(vectors.Start).Milliseconds(), max((k-1)*1000+2, 0)/3; got != want {
			t.Fatalf("unit %d allowed at +%d ms, want +%d ms", k, got, want)
		}
		c = next
		k++
	}
}

// TestGCRALimitChangeRescalesTheFraction: a TAT kept in thirds of a
// millisecond, read for a limit of 7, is rounded down, never up.
func TestGCRALimitChangeRescalesTheFraction(t *testing.T) {
	three := algorithms.Rate{Units: 3, Window: time.Second, Burst: 1}
	_, c := algorithms.Decide(algorithms.GCRA, algorithms.Counts{}, vectors.Start, three, 1) // TAT = +333⅓ ms
	seven := algorithms.Rate{Units: 7, Window: time.Second, Burst: 1}
	// At +333 ms the old TAT is ⅓ ms ahead: rescaled to 2/7 ms, so a
	// request of T = 142 6/7 ms needs TAT−t+T <= T: rejected until +334.
	d, _ := algorithms.Decide(algorithms.GCRA, c, vectors.Start.Add(333*time.Millisecond), seven, 1)
	if d.Allowed || d.RetryAt.Sub(vectors.Start) != 334*time.Millisecond {
		t.Fatalf("allowed %v retry +%s, want rejected until +334ms", d.Allowed, d.RetryAt.Sub(vectors.Start))
	}
}

func TestConcurrency(t *testing.T) {
	l := algorithms.Rate{Units: 3, Window: time.Minute}
	now := vectors.Start
	var c algorithms.Counts
	for i, want := range []bool{true, true, false} {
		d, next := algorithms.Decide(algorithms.Concurrency, c, now, l, int64(1+i%2))
		if d.Allowed != want {
			t.Fatalf("request %d: allowed %v, want %v", i, d.Allowed, want)
		}
		if !d.Allowed && !d.RetryAt.Equal(now) {
			t.Fatalf("rejection retry %s, want now", d.RetryAt.Sub(now))
		}
		c = next
	}
	if c.Held() != 3 {
		t.Fatalf("held %d, want 3", c.Held())
	}
	c = algorithms.Release(algorithms.Concurrency, c, algorithms.Decision{}, l, 2)
	if d, _ := algorithms.Decide(algorithms.Concurrency, c, now, l, 2); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("after release: %+v", d)
	}
	release := func(c algorithms.Counts, units int64) algorithms.Counts {
		return algorithms.Release(algorithms.Concurrency, c, algorithms.Decision{}, l, units)
	}
	if c = release(release(c, 1), 1); c.Held() != 0 {
		t.Fatalf("released below zero: %d", c.Held())
	}
}

func BenchmarkDecideGCRA(b *testing.B) {
	l := algorithms.Rate{Units: 1000, Window: 7 * time.Second, Burst: 50}
	now := vectors.Start
	var c algorithms.Counts
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(7 * time.Millisecond)
		var d algorithms.Decision
		d, c = algorithms.Decide(algorithms.GCRA, c, now, l, 1)
		_ = d
	}
}

// TestReleaseUndoesATake: a cost released right after it was taken
// leaves the key deciding as if the request had never come, for every
// algorithm and many states.
func TestReleaseUndoesATake(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 27))
	for _, alg := range []algorithms.Algorithm{algorithms.SlidingTail, algorithms.FixedWindow, algorithms.GCRA, algorithms.Concurrency} {
		l := algorithms.Rate{Units: 9, Window: 3 * time.Second}
		var c algorithms.Counts
		now := vectors.Start
		for i := range 2000 {
			now = now.Add(time.Duration(rng.IntN(700)) * time.Millisecond)
			cost := int64(1 + rng.IntN(3))
			before, _ := algorithms.Decide(alg, c, now, l, 0)
			d, taken := algorithms.Decide(alg, c, now, l, cost)
			if !d.Allowed {
				c = taken
				if alg == algorithms.Concurrency {
					c = algorithms.Counts{}
				}
				continue
			}
			back := algorithms.Release(alg, taken, d, l, cost)
			after, _ := algorithms.Decide(alg, back, now, l, 0)
			if after.Remaining != before.Remaining || after.Used != before.Used {
				t.Fatalf("%s step %d: released, remaining %d used %d; before the take %d and %d",
					alg, i, after.Remaining, after.Used, before.Remaining, before.Used)
			}
			if rng.IntN(2) == 0 {
				c = taken // keep some takes, so the key fills up
			} else {
				c = back
			}
		}
	}
}

// TestReleaseWindows: a windowed cost comes off the window it was taken
// in, current or since become the previous one, never off a later one,
// and no count goes below zero.
func TestReleaseWindows(t *testing.T) {
	l := algorithms.Rate{Units: 10, Window: time.Second}
	d := algorithms.Decision{Allowed: true, Window: 100}
	for _, tc := range []struct {
		name     string
		in, want algorithms.WindowCounts
	}{
		{"same window", algorithms.WindowCounts{Window: 100, Current: 5, Previous: 2}, algorithms.WindowCounts{Window: 100, Current: 3, Previous: 2}},
		{"now the previous window", algorithms.WindowCounts{Window: 101, Current: 4, Previous: 5}, algorithms.WindowCounts{Window: 101, Current: 4, Previous: 3}},
		{"long gone", algorithms.WindowCounts{Window: 102, Current: 4, Previous: 5}, algorithms.WindowCounts{Window: 102, Current: 4, Previous: 5}},
		{"never below zero", algorithms.WindowCounts{Window: 100, Current: 1}, algorithms.WindowCounts{Window: 100}},
		{"a reset key", algorithms.WindowCounts{}, algorithms.WindowCounts{}},
	} {
		if got := algorithms.Release(algorithms.FixedWindow, tc.in.Counts(), d, l, 2).Windows(); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// TestBanDecision: a banned key's decision is a rejection until the ban
// ends, with nothing remaining.
func TestBanDecision(t *testing.T) {
	now := vectors.Start
	d, _ := algorithms.Decide(algorithms.FixedWindow, algorithms.Counts{}, now, algorithms.Rate{Units: 5, Window: time.Minute}, 1)
	ends := now.Add(time.Hour)
	b := d.Ban(ends, true)
	if b.Allowed || b.Remaining != 0 || !b.RetryAt.Equal(ends) || !b.BanEnds.Equal(ends) || !b.Reset.Equal(ends) || !b.BanStarted {
		t.Fatalf("banned decision %+v", b)
	}
}

// TestSettled: the costs in flight come off the counts they were taken
// into: windowed ones off their own window, the newest of a ring first, a
// gcra TAT by their span; costs taken two windows ago are forgotten, and
// the end of one of them takes nothing off the costs in flight now.
func TestSettled(t *testing.T) {
	now := vectors.Start.Add(90 * time.Second) // in window 1 of a minute
	minute := algorithms.Rate{Units: 10, Window: time.Minute}
	w := algorithms.WindowIndex(vectors.Start.UnixMilli(), time.Minute.Milliseconds())
	inFlight := algorithms.TakeInFlight(algorithms.TakeInFlight(algorithms.WindowCounts{}, w, 2), w+1, 3)
	if want := (algorithms.WindowCounts{Window: w + 1, Current: 3, Previous: 2}); inFlight != want {
		t.Fatalf("in flight %+v, want %+v", inFlight, want)
	}
	counts := algorithms.WindowCounts{Window: w + 1, Current: 4, Previous: 5}.Counts()
	if got, want := algorithms.Settled(algorithms.SlidingTail, counts, inFlight, now, minute).Windows(), (algorithms.WindowCounts{Window: w + 1, Current: 1, Previous: 3}); got != want {
		t.Errorf("sliding tail settled %+v, want %+v", got, want)
	}
	if got := algorithms.Settled(algorithms.FixedWindow, algorithms.Counts{}, inFlight, now, minute); got != (algorithms.Counts{}) {
		t.Errorf("settled counts of a key reset since: %+v, want none", got)
	}

	ring := algorithms.Ring{Index: 7, Buckets: 3}
	ring.Counts[7%4], ring.Counts[6%4], ring.Counts[5%4] = 2, 1, 4
	settled := algorithms.SettledRing(ring, inFlight, now, minute)
	if settled.Counts[7%4] != 0 || settled.Counts[6%4] != 0 || settled.Counts[5%4] != 2 {
		t.Errorf("ring %v less 5 in flight: %v, want the newest sub-windows emptied first", ring.Counts[:4], settled.Counts[:4])
	}

	gcra := algorithms.Rate{Units: 2, Window: time.Minute}
	d, tat := algorithms.Decide(algorithms.GCRA, algorithms.Counts{}, now, gcra, 2)
	one := algorithms.TakeInFlight(algorithms.WindowCounts{}, d.Window, 1)
	if after, _ := algorithms.Decide(algorithms.GCRA, algorithms.Settled(algorithms.GCRA, tat, one, now, gcra), now, gcra, 0); after.Remaining != 1 {
		t.Errorf("gcra bucket emptied by 2, one in flight: %d remaining settled, want 1", after.Remaining)
	}

	// Two windows on, the costs taken in window w are forgotten; the end
	// of one of them leaves the costs of window w+2 alone.
	later := algorithms.TakeInFlight(inFlight, w+2, 1)
	if want := (algorithms.WindowCounts{Window: w + 2, Current: 1, Previous: 3}); later != want {
		t.Fatalf("in flight two windows on %+v, want %+v", later, want)
	}
	if got := algorithms.EndInFlight(later, w, 2); got != later {
		t.Errorf("the end of a cost of window %d took %+v to %+v", w, later, got)
	}
	if got, want := algorithms.EndInFlight(later, w+1, 5), (algorithms.WindowCounts{Window: w + 2, Current: 1}); got != want {
		t.Errorf("the end of a cost of the previous window: %+v, want %+v (never below zero)", got, want)
	}
}

// TestNeverOverTheLimit: sliding_window admits no more than the limit in
// any interval of one window, whatever the traffic, and at least
// limit×n/(n+1) a window under steady demand. The other algorithms'
// worst cases on the same traffic are reported, for the docs.
func TestNeverOverTheLimit(t *testing.T) {
	rings := map[string]algorithms.Ring{}
	vectors.NeverOver(t, func(key string, rate algorithms.Rate, a vectors.Arrival) algorithms.Decision {
		d, next := algorithms.DecideRing(rings[key], a.At, rate, a.Cost)
		rings[key] = next
		return d
	})
	for _, alg := range []algorithms.Algorithm{algorithms.SlidingWindow, algorithms.SlidingTail, algorithms.FixedWindow, algorithms.GCRA} {
		counts := map[string]algorithms.Counts{}
		rings := map[string]algorithms.Ring{}
		take := func(key string, rate algorithms.Rate, a vectors.Arrival) algorithms.Decision {
			if alg == algorithms.SlidingWindow {
				d, next := algorithms.DecideRing(rings[key], a.At, rate, a.Cost)
				rings[key] = next
				return d
			}
			d, next := algorithms.Decide(alg, counts[key], a.At, rate, a.Cost)
			counts[key] = next
			return d
		}
		for _, rate := range vectors.PropertyRates {
			most, steady := vectors.WorstRatio([]algorithms.Rate{rate}, take)
			t.Logf("%-14s limit %3d per %-5s (%2d buckets): most in any window %.2f× the limit; under steady demand %.2f× a window",
				alg, rate.Units, rate.Window, rate.BucketsOr(), most, steady)
		}
	}
}
