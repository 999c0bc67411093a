// Package storetest is the suite every rate_limit store passes: the rules
// of storage.Store and storage.Admin, played through the contract alone,
// so that the memory store, the Redis store and any store to come keep
// them alike. A store's own tests call Run with a constructor of fresh
// stores; what only one store does (its tables, its scripts, its cluster)
// is tested beside it.
package storetest

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/algorithms/vectors"
	"github.com/d61b427a/caddy-rate-limit/internal/clocktest"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// NewStore returns a store for one subtest, holding no counts, that
// decides by the clock now, which the suite moves, and is cleaned up when
// t ends.
type NewStore func(t *testing.T, now func() time.Time) storage.Store

// Run plays the suite's subtests, each on a store of its own from
// newStore. The subtests about the admin side (key state, resets,
// overrides, and the releases they read back) skip a store that is not
// a storage.Admin, and the one about refusals told without a take
// (storage.Refuser) one that is not a Refuser, or that does not tell a
// ban from what it holds.
//
// A subtest's clock starts at the real clock's next minute, unless it
// plays the shared vectors (algorithms/vectors), which bring their own
// instants: a store may read the admin side's instants (a ban's end) off
// a clock of its own (the Redis server's), which agrees with the suite's
// then, and the subtests that move their clock far ahead compare no such
// instant after moving it.
func Run(t *testing.T, newStore NewStore) {
	for _, c := range []struct {
		name string
		run  func(t *testing.T, s *suite)
	}{
		{"vectors", testVectors},
		{"calendar_periods", testCalendarPeriods},
		{"ban_vectors", testBanVectors},
		{"never_over", testNeverOver},
		{"refuses_bad_requests", testRefuses},
		{"all_or_nothing", testAllOrNothing},
		{"exact_under_concurrency", testExactUnderConcurrency},
		{"keys_never_share", testKeysNeverShare},
		{"concurrency_units", testConcurrencyUnits},
		{"release", testRelease},
		{"ring_release", testRingRelease},
		{"true_up_vectors", testTrueUpVectors},
		{"true_up", testTrueUp},
		{"reserved_in_flight", testReservedInFlight},
		{"wide", testWide},
		{"wide_calendar", testWideCalendar},
		{"ban", testBan},
		{"ban_never_passes", testBanNeverPasses},
		{"wide_ban", testWideBan},
		{"refused", testRefused},
		{"reset", testReset},
		{"override", testOverride},
	} {
		t.Run(c.name, func(t *testing.T) {
			clock := clocktest.New(time.Now().Truncate(time.Minute).Add(time.Minute))
			c.run(t, &suite{Store: newStore(t, clock.Now), clock: clock})
		})
	}
}

// suite is one subtest's store and clock, which moves only when the
// subtest moves it.
type suite struct {
	storage.Store
	clock *clocktest.Clock
}

// take decides reqs, whose keys it bounds as the handler does, and fails
// the test on a store error.
func (s *suite) take(t *testing.T, reqs ...storage.Request) []algorithms.Decision {
	t.Helper()
	for i := range reqs {
		reqs[i].Key = storage.BoundKey(reqs[i].Key)
	}
	d := make([]algorithms.Decision, len(reqs))
	if err := s.Take(context.Background(), reqs, d); err != nil {
		t.Fatal(err)
	}
	return d
}

// release ends reqs, allowed with decisions d.
func (s *suite) release(t *testing.T, reqs []storage.Request, d []algorithms.Decision) {
	t.Helper()
	for i := range reqs {
		reqs[i].Key = storage.BoundKey(reqs[i].Key)
	}
	if err := s.Finish(context.Background(), reqs, d); err != nil {
		t.Fatal(err)
	}
}

// admin returns the store's admin side, and skips the test if it has none.
func (s *suite) admin(t *testing.T) storage.Admin {
	t.Helper()
	a, ok := s.Store.(storage.Admin)
	if !ok {
		t.Skip("the store has no admin side")
	}
	return a
}

// keyState reads what the store holds for key in zone, whose window is
// window; keyStateIn, for a zone whose windows are rate's.
func (s *suite) keyState(t *testing.T, zone, key string, window time.Duration) storage.KeyState {
	t.Helper()
	return s.keyStateIn(t, zone, key, algorithms.Rate{Window: window})
}

func (s *suite) keyStateIn(t *testing.T, zone, key string, rate algorithms.Rate) storage.KeyState {
	t.Helper()
	st, err := s.admin(t).KeyState(context.Background(), zone, storage.BoundKey(key), rate)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func (s *suite) resetKey(t *testing.T, zone, key string) {
	t.Helper()
	if err := s.admin(t).ResetKey(context.Background(), zone, storage.BoundKey(key)); err != nil {
		t.Fatal(err)
	}
}

// testVectors plays the shared cases of every algorithm.
func testVectors(t *testing.T, s *suite) {
	vectors.Run(t, func(t *testing.T, now time.Time, vc vectors.Case, key string, cost int64) algorithms.Decision {
		s.clock.Set(now)
		return s.take(t, storage.Request{Zone: "z", Key: key, Algorithm: vc.Algorithm, Rate: vc.Rate, Cost: cost, Wide: vc.Wide})[0]
	})
}

// testCalendarPeriods: a zone whose window is a day in New York counts
// until local midnight, which here ends a day of 23 hours (DST began at
// 02:00), and keeps the day's index, days since 1970 in New York's
// calendar, beside its counts. At midnight a fixed window starts afresh;
// a sliding tail weighs the day before by the share of the new day still
// to run, all of it at first.
func testCalendarPeriods(t *testing.T, s *suite) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	rate := algorithms.Rate{Units: 2, Calendar: algorithms.CalendarOf(algorithms.Day, ny)}
	midnight := time.Date(2026, 3, 9, 0, 0, 0, 0, ny)
	day := rate.WindowAt(midnight.UnixMilli() - 1)
	if day.Length() != 23*time.Hour.Milliseconds() || day.End != midnight.UnixMilli() {
		t.Fatalf("2026-03-08 in New York is %+v, want 23 hours to midnight", day)
	}
	for _, alg := range []algorithms.Algorithm{algorithms.FixedWindow, algorithms.SlidingTail} {
		zone := "calendar_" + string(alg)
		req := storage.Request{Zone: zone, Key: "k", Algorithm: alg, Rate: rate, Cost: 1}
		s.clock.Set(midnight.Add(-time.Millisecond))
		for i := range 2 {
			if d := s.take(t, req)[0]; !d.Allowed || !d.Reset.Equal(midnight) || d.Window != day.Index {
				t.Fatalf("%s: request %d before midnight: %+v, want allowed in day %d, reset at %s", alg, i+1, d, day.Index, midnight)
			}
		}
		d := s.take(t, req)[0]
		if d.Allowed || alg == algorithms.FixedWindow && !d.RetryAt.Equal(midnight) || !d.RetryAt.After(midnight.Add(-time.Millisecond)) {
			t.Fatalf("%s: third request before midnight: %+v, want rejected until midnight or later", alg, d)
		}
		if c := s.keyStateIn(t, zone, "k", rate).Counts.Windows(); c.Window != day.Index || c.Current != 2 {
			t.Fatalf("%s: the store keeps %+v, want 2 in day %d", alg, c, day.Index)
		}
		s.clock.Set(midnight)
		d = s.take(t, req)[0]
		switch {
		case alg == algorithms.FixedWindow && (!d.Allowed || d.Remaining != 1 || d.Window != day.Index+1):
			t.Fatalf("%s: at midnight %+v, want allowed with 1 remaining in day %d", alg, d, day.Index+1)
		case alg == algorithms.SlidingTail && (d.Allowed || !d.Reset.Equal(midnight.AddDate(0, 0, 1))):
			t.Fatalf("%s: at midnight %+v, want rejected, the day before weighing whole until %s", alg, d, midnight.AddDate(0, 0, 1))
		}
	}
}

// testBanVectors plays the shared cases of zones that ban and give costs
// back: refusals for costs in flight, bans begun on the settled count.
func testBanVectors(t *testing.T, s *suite) {
	req := func(vc vectors.BanCase, key string, cost int64) storage.Request {
		return storage.Request{Zone: "z", Key: key, Algorithm: vc.Algorithm, Rate: vc.Rate, Cost: cost, Ban: vc.Ban, Releasable: true}
	}
	vectors.RunBans(t, func(t *testing.T, now time.Time, vc vectors.BanCase, key string, cost int64) algorithms.Decision {
		s.clock.Set(now)
		return s.take(t, req(vc, key, cost))[0]
	}, func(t *testing.T, now time.Time, vc vectors.BanCase, key string, cost int64, d algorithms.Decision, kept bool) {
		s.clock.Set(now)
		q := req(vc, key, cost)
		q.Counted = kept
		s.release(t, []storage.Request{q}, []algorithms.Decision{d})
	})
}

// testNeverOver: the sliding window's promise, that no window of its
// length admits more than its limit, whatever the traffic.
func testNeverOver(t *testing.T, s *suite) {
	vectors.NeverOver(t, func(key string, rate algorithms.Rate, a vectors.Arrival) algorithms.Decision {
		s.clock.Set(a.At)
		return s.take(t, storage.Request{Zone: "never_over", Key: key, Algorithm: algorithms.SlidingWindow, Rate: rate, Cost: a.Cost})[0]
	})
}

// testRefuses: a request the algorithms cannot decide (a negative cost, a
// limit without a window) is a store error, not a decision.
func testRefuses(t *testing.T, s *suite) {
	for _, q := range []storage.Request{
		{Zone: "z", Key: "k", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 3, Window: time.Minute}, Cost: -1},
		{Zone: "z", Key: "k", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 3}, Cost: 1},
	} {
		if err := s.Take(context.Background(), []storage.Request{q}, make([]algorithms.Decision, 1)); err == nil {
			t.Errorf("%+v: decided, want a store error", q)
		}
	}
}

// testAllOrNothing: a request that one of its zones rejects is taken in
// none of them.
func testAllOrNothing(t *testing.T, s *suite) {
	wide := storage.Request{Zone: "wide", Key: "k", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 10, Window: time.Hour}, Cost: 1}
	narrow := storage.Request{Zone: "narrow", Key: "k", Algorithm: algorithms.SlidingTail, Rate: algorithms.Rate{Units: 1, Window: time.Hour}, Cost: 1}
	if d := s.take(t, wide, narrow); !d[0].Allowed || !d[1].Allowed {
		t.Fatalf("first: %+v", d)
	}
	for i := range 5 {
		if d := s.take(t, wide, narrow); !d[0].Allowed || d[1].Allowed {
			t.Fatalf("attempt %d: %+v, want wide allowing and narrow rejecting", i, d)
		}
	}
	if d := s.take(t, wide)[0]; d.Used != 2 {
		t.Fatalf("wide counts %d after the rejected requests, want 2 (the first and this one)", d.Used)
	}
}

// testExactUnderConcurrency: requests decided at once, from many
// goroutines, for two zones of one key in either order, allow exactly the
// limit.
func testExactUnderConcurrency(t *testing.T, s *suite) {
	const limit, workers, each = 150, 8, 50
	req := storage.Request{Zone: "z", Key: "hot", Algorithm: algorithms.SlidingTail, Rate: algorithms.Rate{Units: limit, Window: time.Hour}, Cost: 1}
	other := storage.Request{Zone: "z2", Key: "hot", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 1 << 30, Window: time.Hour}, Cost: 1}
	var allowed atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range workers {
		wg.Go(func() {
			<-start
			d := make([]algorithms.Decision, 2)
			for i := range each {
				// Either order, so that a store locking keys one by one
				// shows whether it can deadlock.
				reqs := []storage.Request{req, other}
				if i%2 == 1 {
					reqs[0], reqs[1] = other, req
				}
				if err := s.Take(context.Background(), reqs, d); err != nil {
					t.Error(err)
					return
				}
				if d[0].Allowed && d[1].Allowed {
					allowed.Add(1)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	if got := allowed.Load(); got != limit {
		t.Fatalf("allowed %d of %d, want exactly %d", got, workers*each, limit)
	}
}

// testKeysNeverShare: the same key in different zones, and different
// splits of the same bytes into zone and key, count apart.
func testKeysNeverShare(t *testing.T, s *suite) {
	pairs := [][2]string{
		{"a", "k"}, {"b", "k"}, {"ab", "c"}, {"a", "bc"}, {"abc", ""}, {"", "abc"},
		{"a\x00b", "c"}, {"a", "b\x00c"}, {"a\x00", "bc"}, {"a:b", "c"}, {"a", "b:c"},
		{"\x01\x00\x00\x00\x00\x00\x00\x00a", "b"}, {"", "\x01\x00\x00\x00\x00\x00\x00\x00ab"},
	}
	req := func(p [2]string) storage.Request {
		return storage.Request{Zone: p[0], Key: p[1], Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 1, Window: time.Hour}, Cost: 1}
	}
	for _, p := range pairs {
		if d := s.take(t, req(p))[0]; !d.Allowed {
			t.Fatalf("zone %q key %q shares a counter with an earlier pair", p[0], p[1])
		}
	}
	for _, p := range pairs {
		if d := s.take(t, req(p))[0]; d.Allowed {
			t.Fatalf("zone %q key %q: its first request was not counted", p[0], p[1])
		}
	}
}

// testConcurrencyUnits: a concurrency zone holds units until they are
// released, rejects past its limit, wakes Released's waiters at a
// release, and releases nothing twice.
func testConcurrencyUnits(t *testing.T, s *suite) {
	var holder uint64
	req := func(cost int64) storage.Request {
		holder++
		return storage.Request{Zone: "conc", Key: "k", Algorithm: algorithms.Concurrency,
			Rate: algorithms.Rate{Units: 3, Window: time.Minute}, Cost: cost, Holder: holder}
	}
	// The decisions do not matter to a concurrency request's release.
	release := func(reqs ...storage.Request) {
		t.Helper()
		s.release(t, reqs, make([]algorithms.Decision, len(reqs)))
	}
	a, b := req(1), req(2)
	if d := s.take(t, a)[0]; !d.Allowed || d.Remaining != 2 {
		t.Fatalf("first: %+v", d)
	}
	if d := s.take(t, b)[0]; !d.Allowed || d.Remaining != 0 {
		t.Fatalf("second: %+v", d)
	}
	c := req(1)
	if d := s.take(t, c)[0]; d.Allowed || d.RetryAt.After(s.clock.Now().Add(time.Second)) {
		t.Fatalf("third: %+v, want rejected with no retry instant ahead", d)
	}
	woken := s.Released()
	release(b)
	select {
	case <-woken:
	default:
		t.Fatal("Finish did not wake Released's waiters")
	}
	if d := s.take(t, c)[0]; !d.Allowed || d.Remaining != 1 {
		t.Fatalf("after a release: %+v", d)
	}
	// Released twice, b and a release nothing more: the whole limit is
	// free again, and no more than it.
	release(b, a, c, a)
	all := req(3)
	if d := s.take(t, all)[0]; !d.Allowed || d.Remaining != 0 {
		t.Fatalf("the whole limit after releasing everything: %+v", d)
	}
	if d := s.take(t, req(1))[0]; d.Allowed {
		t.Fatalf("one more beside the whole limit: %+v, want rejected: a unit released twice was released twice", d)
	}
	release(all)
}

// testRelease: a cost released (a response that does not count) comes
// off the window it was taken in, and a GCRA bucket refills by it.
func testRelease(t *testing.T, s *suite) {
	window := time.Minute
	s.clock.Set(s.clock.Now().Truncate(window))
	req := storage.Request{Zone: "gb", Key: "k", Algorithm: algorithms.SlidingTail, Rate: algorithms.Rate{Units: 10, Window: window}, Cost: 3, Releasable: true}
	counts := func() algorithms.WindowCounts {
		t.Helper()
		return s.keyState(t, "gb", "k", window).Counts.Windows()
	}
	release := func(d algorithms.Decision) {
		t.Helper()
		s.release(t, []storage.Request{req}, []algorithms.Decision{d})
	}
	first := s.take(t, req)[0]
	s.take(t, req)
	release(first)
	if got := counts(); got.Current != 3 {
		t.Fatalf("after releasing one: %+v, want 3 counted", got)
	}
	// In the next window, the first window's cost comes off the previous
	// window.
	s.clock.Add(window)
	second := s.take(t, req)[0]
	release(first)
	if got := counts(); got.Previous != 0 || got.Current != 3 {
		t.Fatalf("after releasing a cost of the previous window: %+v, want 0 previous, 3 current", got)
	}
	release(second)
	if got := counts(); got.Current != 0 {
		t.Fatalf("after releasing the current window's: %+v, want nothing counted", got)
	}

	g := storage.Request{Zone: "gb", Key: "g", Algorithm: algorithms.GCRA, Rate: algorithms.Rate{Units: 4, Window: time.Minute}, Cost: 4, Releasable: true}
	d := s.take(t, g)[0]
	if again := s.take(t, g)[0]; again.Allowed {
		t.Fatalf("a gcra bucket emptied: %+v, want rejected", again)
	}
	s.release(t, []storage.Request{g}, []algorithms.Decision{d})
	if d := s.take(t, g)[0]; !d.Allowed {
		t.Fatalf("a gcra bucket emptied and released: %+v, want full again", d)
	}
}

// testRingRelease: a sliding window's cost released comes off the
// sub-window it was taken in; the admin side reads the ring, and a
// reset forgets it.
func testRingRelease(t *testing.T, s *suite) {
	window := time.Minute
	s.clock.Set(s.clock.Now().Truncate(window))
	req := storage.Request{Zone: "rg", Key: "k", Algorithm: algorithms.SlidingWindow, Rate: algorithms.Rate{Units: 2, Window: window, Buckets: 6}, Cost: 1}
	first := s.take(t, req)[0]
	s.clock.Add(15 * time.Second) // a later sub-window
	second := s.take(t, req)[0]
	if d := s.take(t, req)[0]; d.Allowed {
		t.Fatalf("third of two: %+v, want rejected", d)
	}
	s.release(t, []storage.Request{req}, []algorithms.Decision{first})
	st := s.keyState(t, "rg", "k", window)
	if st.Ring.Buckets != 6 || st.Ring.Used() != 1 || st.Ring.Index != second.Window {
		t.Fatalf("key state %+v, want a ring of 6 buckets holding 1, in sub-window %d", st.Ring, second.Window)
	}
	if d := s.take(t, req)[0]; !d.Allowed || d.Remaining != 0 {
		t.Fatalf("after releasing the first: %+v, want allowed with none left", d)
	}
	s.resetKey(t, "rg", "k")
	if d := s.take(t, req)[0]; !d.Allowed || d.Remaining != 1 {
		t.Fatalf("after a reset: %+v, want allowed with 1 left", d)
	}
}

// testTrueUpVectors plays the shared true-ups: reservations taken and
// trued up to what their responses showed, releasing the difference or
// taking it past the limit.
func testTrueUpVectors(t *testing.T, s *suite) {
	req := func(vc vectors.TrueUpCase, key string, cost int64) storage.Request {
		return storage.Request{Zone: "z", Key: key, Algorithm: vc.Algorithm, Rate: vc.Rate, Cost: cost, Releasable: true, Wide: vc.Wide}
	}
	vectors.RunTrueUps(t, func(t *testing.T, now time.Time, vc vectors.TrueUpCase, key string, cost int64) algorithms.Decision {
		s.clock.Set(now)
		return s.take(t, req(vc, key, cost))[0]
	}, func(t *testing.T, now time.Time, vc vectors.TrueUpCase, key string, cost int64, d algorithms.Decision, actual int64) {
		s.clock.Set(now)
		q := req(vc, key, cost)
		q.TrueUp, q.Actual = true, actual
		s.release(t, []storage.Request{q}, []algorithms.Decision{d})
	})
}

// testTrueUp: a reservation trued up to less releases the difference,
// from the window it was taken in; trued up to more, takes the
// difference past the limit, in the window of the true-up, and the key
// is refused until that window ends; trued up to itself, changes
// nothing. In a zone that keeps its costs in flight, the true-up ends
// the reservation's time in flight and the key's settled count keeps
// the actual cost.
func testTrueUp(t *testing.T, s *suite) {
	window := time.Minute
	s.clock.Set(s.clock.Now().Truncate(window))
	trueUp := func(q storage.Request, d algorithms.Decision, actual int64) {
		t.Helper()
		q.TrueUp, q.Actual = true, actual
		s.release(t, []storage.Request{q}, []algorithms.Decision{d})
	}
	counts := func(zone string) algorithms.WindowCounts {
		t.Helper()
		return s.keyState(t, zone, "k", window).Counts.Windows()
	}

	t.Run("releases_the_difference", func(t *testing.T) {
		q := storage.Request{Zone: "less", Key: "k", Algorithm: algorithms.SlidingTail, Rate: algorithms.Rate{Units: 10, Window: window}, Cost: 6, Releasable: true}
		d := s.take(t, q)[0]
		s.clock.Add(window) // the reservation's window is now the previous one
		trueUp(q, d, 2)
		if got := counts("less"); got.Window != d.Window || got.Current != 2 {
			t.Fatalf("counts %+v after a true-up of 6 to 2, want 2 in window %d", got, d.Window)
		}
	})

	t.Run("debt_refuses_until_the_window_has_room", func(t *testing.T) {
		q := storage.Request{Zone: "more", Key: "k", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 10, Window: window}, Cost: 4, Releasable: true}
		d := s.take(t, q)[0]
		s.clock.Add(window + time.Second) // trued up in the next window
		trueUp(q, d, 14)
		if got := counts("more"); got.Window != d.Window+1 || got.Current != 10 {
			t.Fatalf("counts %+v after a true-up of 4 to 14 in the next window, want 10 in window %d", got, d.Window+1)
		}
		one := q
		one.Cost = 1
		end := time.UnixMilli((d.Window + 2) * window.Milliseconds())
		if d := s.take(t, one)[0]; d.Allowed || !d.RetryAt.Equal(end) {
			t.Fatalf("after the debt: %+v, want refused until %s", d, end)
		}
		s.clock.Set(end)
		if d := s.take(t, one)[0]; !d.Allowed {
			t.Fatalf("in the window after the debt's: %+v, want allowed", d)
		}
	})

	t.Run("actual_equal_to_the_reservation", func(t *testing.T) {
		for _, alg := range []algorithms.Algorithm{algorithms.SlidingTail, algorithms.GCRA} {
			zone := "same_" + string(alg)
			q := storage.Request{Zone: zone, Key: "k", Algorithm: alg, Rate: algorithms.Rate{Units: 10, Window: window}, Cost: 3, Releasable: true}
			d := s.take(t, q)[0]
			before := s.keyState(t, zone, "k", window).Counts
			trueUp(q, d, 3)
			if got := s.keyState(t, zone, "k", window).Counts; got != before {
				t.Fatalf("%s: counts %+v after a true-up of 3 to 3, want %+v as before", alg, got, before)
			}
		}
	})

	t.Run("in_flight", func(t *testing.T) {
		// Three a minute, banning: A reserves 1 and B 2, both in flight;
		// A is trued up to 2. The count is 4, of which B's 2 are still in
		// flight, so a third request is refused for those only. B's end
		// settles the count at 4, and a request of no cost begins a ban.
		q := storage.Request{Zone: "flight", Key: "k", Algorithm: algorithms.FixedWindow,
			Rate: algorithms.Rate{Units: 3, Window: window}, Cost: 1, Ban: time.Hour, Releasable: true}
		a := q
		b := q
		b.Cost = 2
		da, db := s.take(t, a)[0], s.take(t, b)[0]
		if !da.Allowed || !db.Allowed {
			t.Fatalf("A %+v, B %+v: want both allowed", da, db)
		}
		trueUp(a, da, 2)
		if got := counts("flight"); got.Current != 4 {
			t.Fatalf("counts %+v after a true-up of 1 to 2, want 4", got)
		}
		if d := s.take(t, q)[0]; d.Allowed || !d.InFlight || !d.BanEnds.IsZero() {
			t.Fatalf("with B's 2 in flight: %+v, want refused for costs in flight only", d)
		}
		kept := b
		kept.Counted = true
		s.release(t, []storage.Request{kept}, []algorithms.Decision{db})
		free := q
		free.Cost = 0
		if d := s.take(t, free)[0]; d.Allowed || !d.BanStarted {
			t.Fatalf("with 4 settled: %+v, want refused, and the ban begun", d)
		}
	})
}

// testReservedInFlight: the reservations of a zone without a ban
// (cost_from) are kept in flight, by every algorithm, until their
// release, which the admin side shows (KeyState.InFlight): a true-up or a
// reservation kept whole ends one, and nothing else is kept in flight.
// They change no decision: a request refused while they fill the limit
// is refused as any, until the window has room, not for costs in flight.
func testReservedInFlight(t *testing.T, s *suite) {
	window := time.Minute
	s.clock.Set(s.clock.Now().Truncate(window))
	for _, alg := range []algorithms.Algorithm{algorithms.FixedWindow, algorithms.SlidingTail, algorithms.SlidingWindow, algorithms.GCRA} {
		t.Run(string(alg), func(t *testing.T) {
			zone := "reserved_" + string(alg)
			inFlight := func() int64 {
				t.Helper()
				return s.keyState(t, zone, "k", window).InFlight
			}
			q := storage.Request{Zone: zone, Key: "k", Algorithm: alg, Rate: algorithms.Rate{Units: 100, Window: window},
				Cost: 30, Releasable: true, Reservation: true}
			a, b := q, q
			b.Cost = 50
			da, db := s.take(t, a)[0], s.take(t, b)[0]
			if !da.Allowed || !db.Allowed {
				t.Fatalf("A %+v, B %+v: want both allowed", da, db)
			}
			if got := inFlight(); got != 80 {
				t.Fatalf("%d in flight with reservations of 30 and 50 admitted, want 80", got)
			}
			// A cost that is no reservation, in the same zone, is not
			// kept in flight.
			plain := q
			plain.Cost, plain.Reservation = 5, false
			if d := s.take(t, plain)[0]; !d.Allowed {
				t.Fatalf("a cost of 5 beside 80: %+v, want allowed", d)
			}
			if got := inFlight(); got != 80 {
				t.Fatalf("%d in flight after a cost that is no reservation, want 80", got)
			}
			over := q
			over.Cost = 20
			if d := s.take(t, over)[0]; d.Allowed || d.InFlight || !d.RetryAt.After(s.clock.Now()) {
				t.Fatalf("a reservation of 20 beside 85: %+v, want refused until the window has room, not for costs in flight", d)
			}
			// A is trued up to 10; B's response showed no cost, and its
			// reservation stands.
			a.TrueUp, a.Actual = true, 10
			s.release(t, []storage.Request{a}, []algorithms.Decision{da})
			if got := inFlight(); got != 50 {
				t.Fatalf("%d in flight after A's true-up, want B's 50", got)
			}
			b.Counted = true
			s.release(t, []storage.Request{b}, []algorithms.Decision{db})
			if got := inFlight(); got != 0 {
				t.Fatalf("%d in flight once both are done, want 0", got)
			}
		})
	}
}

// testWide: a wide key (a zone priced in money) keeps its counts, its
// reservations in flight and a per-key override exactly past 2^53, to
// the unit, as the admin side reads them: reserved, trued up, and taken
// up to the override.
func testWide(t *testing.T, s *suite) {
	window := time.Hour
	s.clock.Set(s.clock.Now().Truncate(window))
	const (
		reserved = 1<<62 + 3
		actual   = 1<<53 + 1
		override = 1<<62 + 5
	)
	for _, alg := range []algorithms.Algorithm{algorithms.FixedWindow, algorithms.SlidingTail} {
		t.Run(string(alg), func(t *testing.T) {
			zone := "wide_" + string(alg)
			q := storage.Request{Zone: zone, Key: "k", Algorithm: alg, Rate: algorithms.Rate{Units: math.MaxInt64, Window: window},
				Cost: reserved, Releasable: true, Reservation: true, Wide: true}
			d := s.take(t, q)[0]
			if !d.Allowed || d.Remaining != math.MaxInt64-reserved {
				t.Fatalf("a reservation of 2^62+3: %+v, want allowed, 2^63-1 less it remaining", d)
			}
			if st := s.keyState(t, zone, "k", window); st.Counts.Windows().Current != reserved || st.InFlight != reserved {
				t.Fatalf("key state %+v, want 2^62+3 counted and in flight", st)
			}
			q.TrueUp, q.Actual = true, actual
			s.release(t, []storage.Request{q}, []algorithms.Decision{d})
			if st := s.keyState(t, zone, "k", window); st.Counts.Windows().Current != actual || st.InFlight != 0 {
				t.Fatalf("key state %+v, want 2^53+1 counted, nothing in flight", st)
			}
			if err := s.admin(t).SetOverride(context.Background(), zone, "k", storage.Override{Limit: override}); err != nil {
				t.Fatal(err)
			}
			if st := s.keyState(t, zone, "k", window); st.Override == nil || st.Override.Limit != override {
				t.Fatalf("override %+v, want 2^62+5", st.Override)
			}
			next := storage.Request{Zone: zone, Key: "k", Algorithm: alg, Rate: algorithms.Rate{Units: math.MaxInt64, Window: window}, Cost: override - actual + 1, Wide: true}
			if d := s.take(t, next)[0]; d.Allowed || d.Limit != override || d.Remaining != override-actual {
				t.Fatalf("one unit past the override: %+v, want refused against 2^62+5, 2^62+5-(2^53+1) remaining", d)
			}
			next.Cost--
			if d := s.take(t, next)[0]; !d.Allowed || d.Remaining != 0 {
				t.Fatalf("up to the override: %+v, want allowed, nothing remaining", d)
			}
			if st := s.keyState(t, zone, "k", window); st.Counts.Windows().Current != override {
				t.Fatalf("key state %+v, want the override's 2^62+5 counted", st)
			}
		})
	}
}

// testWideCalendar: a wide key in a calendar month (a budget in money
// "a month") counts exactly past 2^53 in the month, a true-up's debt
// included, until the month ends at local midnight on the 1st. Then a
// fixed window starts afresh, and a sliding tail weighs the month before
// by the share of the new month still to run, a month of 31 days less
// the hour DST took: as Decide weighs it, to the unit.
func testWideCalendar(t *testing.T, s *suite) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	rate := algorithms.Rate{Units: 1<<62 + 5, Calendar: algorithms.CalendarOf(algorithms.Month, ny)}
	end := time.Date(2026, 3, 1, 0, 0, 0, 0, ny)
	month := rate.WindowAt(end.UnixMilli() - 1)
	if next := rate.WindowOf(month.Index + 1); month.End != end.UnixMilli() || next.Length() != (31*24-1)*time.Hour.Milliseconds() {
		t.Fatalf("February 2026 in New York is %+v, March %+v, want March 31 days less an hour from midnight on the 1st", month, next)
	}
	const reserved, actual = 1<<62 + 3, 1<<62 + 1<<53 + 1
	for _, alg := range []algorithms.Algorithm{algorithms.FixedWindow, algorithms.SlidingTail} {
		zone := "wide_calendar_" + string(alg)
		s.clock.Set(end.Add(-time.Minute))
		q := storage.Request{Zone: zone, Key: "k", Algorithm: alg, Rate: rate, Cost: reserved, Releasable: true, Reservation: true, Wide: true}
		d := s.take(t, q)[0]
		if !d.Allowed || d.Remaining != 2 || !d.Reset.Equal(end) || d.Window != month.Index {
			t.Fatalf("%s: a reservation of 2^62+3 of 2^62+5: %+v, want allowed, 2 remaining, in month %d until %s", alg, d, month.Index, end)
		}
		q.TrueUp, q.Actual = true, actual
		s.release(t, []storage.Request{q}, []algorithms.Decision{d})
		if st := s.keyStateIn(t, zone, "k", rate); st.Counts.Windows().Window != month.Index || st.Counts.Windows().Current != actual || st.InFlight != 0 {
			t.Fatalf("%s: after a true-up to 2^62+2^53+1 the store keeps %+v, want it counted in month %d, nothing in flight", alg, st, month.Index)
		}
		one := storage.Request{Zone: zone, Key: "k", Algorithm: alg, Rate: rate, Cost: 1, Wide: true}
		d = s.take(t, one)[0]
		if d.Allowed || d.Remaining != 0 || alg == algorithms.FixedWindow && !d.RetryAt.Equal(end) || !d.RetryAt.After(end.Add(-time.Millisecond)) {
			t.Fatalf("%s: one unit past the debt: %+v, want refused until the month's end or later", alg, d)
		}
		s.clock.Set(end)
		whole := one
		whole.Cost = rate.Units
		d = s.take(t, whole)[0]
		if alg == algorithms.FixedWindow {
			if !d.Allowed || d.Remaining != 0 || d.Window != month.Index+1 {
				t.Fatalf("%s: the whole limit at midnight on the 1st: %+v, want allowed in month %d", alg, d, month.Index+1)
			}
			continue
		}
		if d.Allowed {
			t.Fatalf("%s: the whole limit at midnight on the 1st: %+v, want refused, February weighing whole", alg, d)
		}
		at := end.AddDate(0, 0, 10)
		s.clock.Set(at)
		room, _ := algorithms.Decide(alg, algorithms.WindowCounts{Window: month.Index, Current: actual}.Counts(), at, rate, 0)
		one.Cost = room.Remaining + 1
		if d := s.take(t, one)[0]; d.Allowed {
			t.Fatalf("%s: 10 days into March, one unit more than the %d February leaves: %+v, want refused", alg, room.Remaining, d)
		}
		one.Cost--
		if d := s.take(t, one)[0]; !d.Allowed || d.Remaining != 0 {
			t.Fatalf("%s: 10 days into March, the %d February leaves: %+v, want allowed, nothing remaining", alg, room.Remaining, d)
		}
	}
}

// loginRequest is a request of a zone that allows two attempts a minute,
// bans for an hour, and releases the costs of responses it does not
// count.
func loginRequest(key string) storage.Request {
	return storage.Request{Zone: "login", Key: key, Algorithm: algorithms.FixedWindow,
		Rate: algorithms.Rate{Units: 2, Window: time.Minute}, Cost: 1, Ban: time.Hour, Releasable: true}
}

// fail takes q and, if it is allowed, ends it as a failed login: its
// response counted, its cost stays.
func (s *suite) fail(t *testing.T, q storage.Request) algorithms.Decision {
	t.Helper()
	d := s.take(t, q)[0]
	if d.Allowed {
		kept := q
		kept.Counted = true
		s.release(t, []storage.Request{kept}, []algorithms.Decision{d})
	}
	return d
}

// testBanNeverPasses: a request whose cost is more than its zone ever
// lets pass (above the limit, a wide zone's too, or above a gcra zone's
// burst) is refused without a ban: it says nothing of the key's other
// requests, which the handler answers as too large rather than as over
// the limit.
func testBanNeverPasses(t *testing.T, s *suite) {
	windowed := loginRequest("large")
	windowed.Cost = 3
	gcra := storage.Request{Zone: "burst", Key: "large", Algorithm: algorithms.GCRA,
		Rate: algorithms.Rate{Units: 10, Window: time.Minute, Burst: 2}, Cost: 3, Ban: time.Hour, Releasable: true}
	// $10 against $2 in picodollars: a cost whose digits, read as text,
	// would come before the limit's.
	wide := storage.Request{Zone: "wide_ban", Key: "large", Algorithm: algorithms.FixedWindow,
		Rate: algorithms.Rate{Units: 2_000_000_000_000, Window: time.Minute}, Cost: 10_000_000_000_000, Ban: time.Hour,
		Releasable: true, Reservation: true, Wide: true}
	for _, q := range []storage.Request{windowed, gcra, wide} {
		if d := s.take(t, q)[0]; d.Allowed || d.BanStarted || !d.BanEnds.IsZero() {
			t.Fatalf("%s: a cost of %d: %+v, want refused without a ban", q.Zone, q.Cost, d)
		}
		q.Cost = 1
		if d := s.take(t, q)[0]; !d.Allowed {
			t.Fatalf("%s: then a cost of 1: %+v, want allowed: no ban", q.Zone, d)
		}
	}
}

// testWideBan: a wide zone's refusal of a cost that could pass later
// bans the key, whatever the cost's and the limit's digits say read as
// text: $0.90 beside $0.50 taken of $1, in picodollars.
func testWideBan(t *testing.T, s *suite) {
	q := storage.Request{Zone: "wide_ban", Key: "k", Algorithm: algorithms.FixedWindow,
		Rate: algorithms.Rate{Units: 1_000_000_000_000, Window: time.Minute}, Cost: 500_000_000_000, Ban: time.Hour, Wide: true}
	if d := s.take(t, q)[0]; !d.Allowed {
		t.Fatalf("$0.50 of $1: %+v, want allowed", d)
	}
	q.Cost = 900_000_000_000
	if d := s.take(t, q)[0]; d.Allowed || !d.BanStarted {
		t.Fatalf("$0.90 beside $0.50 taken of $1: %+v, want refused, and a ban begun", d)
	}
	q.Cost = 100_000_000_000
	if d := s.take(t, q)[0]; d.Allowed || d.BanEnds.IsZero() {
		t.Fatalf("then $0.10, which the window has room for: %+v, want refused by the ban", d)
	}
}

// testBan: the first rejection on the settled count bans the key for the
// zone's ban, past the end of its window; only requests that carry a ban
// honour it; the admin side shows it, a reset lifts it, and it ends by
// itself.
func testBan(t *testing.T, s *suite) {
	req := loginRequest("k")
	s.fail(t, req)
	s.fail(t, req)
	ends := s.clock.Now().Add(time.Hour)
	d := s.fail(t, req)
	if d.Allowed || !d.BanStarted || !d.BanEnds.Equal(ends) || !d.RetryAt.Equal(ends) {
		t.Fatalf("third attempt: %+v, want a ban until %s", d, ends)
	}
	s.clock.Add(30 * time.Minute) // the window is long over
	if d := s.take(t, req)[0]; d.Allowed || d.BanStarted || !d.RetryAt.Equal(ends) || d.Remaining != 0 {
		t.Fatalf("half an hour later: %+v, want still banned until %s", d, ends)
	}
	free := req
	free.Cost = 0
	if d := s.take(t, free)[0]; d.Allowed || !d.BanEnds.Equal(ends) {
		t.Fatalf("a request of cost 0: %+v, want the same ban", d)
	}
	unbanned := req
	unbanned.Ban = 0
	if d := s.take(t, unbanned)[0]; !d.Allowed {
		t.Fatalf("a request without a ban (the zone's ban removed): %+v, want allowed", d)
	}
	if st := s.keyState(t, "login", "k", time.Minute); st.BanEnds.Sub(ends).Abs() > time.Second {
		t.Fatalf("key state's ban ends at %s, want %s", st.BanEnds, ends)
	}
	s.resetKey(t, "login", "k")
	if d := s.fail(t, req); !d.Allowed {
		t.Fatalf("after a reset: %+v, want allowed", d)
	}
	for range 3 {
		s.fail(t, req)
	}
	if d := s.take(t, req)[0]; d.Allowed || d.BanEnds.IsZero() {
		t.Fatalf("after three more failures: %+v, want banned again", d)
	}
	s.clock.Add(time.Hour)
	if d := s.fail(t, req); !d.Allowed {
		t.Fatalf("after the ban: %+v, want allowed", d)
	}
}

// testRefused: a store that tells refusals without a take tells only
// those a take would answer: a banned key's, with its ban's end, to
// requests that carry a ban, whatever they cost; not to a key never
// refused, nor to a request without a ban, nor once a reset lifted the
// ban. Asking takes nothing.
func testRefused(t *testing.T, s *suite) {
	r, ok := s.Store.(storage.Refuser)
	if !ok {
		t.Skip("the store is not a storage.Refuser")
	}
	refused := func(q storage.Request) (algorithms.Decision, bool) {
		q.Key = storage.BoundKey(q.Key)
		return r.Refused(q)
	}
	req := loginRequest("k")
	if d, ok := refused(req); ok {
		t.Fatalf("a key never seen: refused with %+v", d)
	}
	s.fail(t, req)
	s.fail(t, req)
	ban := s.fail(t, req)
	if ban.Allowed || ban.BanEnds.IsZero() {
		t.Fatalf("third attempt: %+v, want a ban", ban)
	}
	d, ok := refused(req)
	if !ok {
		t.Skip("the store does not tell a ban from what it holds")
	}
	if d.Allowed || !d.BanEnds.Equal(ban.BanEnds) || !d.RetryAt.Equal(ban.BanEnds) || d.Remaining != 0 || d.Limit != req.Rate.Units {
		t.Fatalf("refused: %+v, want the ban until %s against the limit %d", d, ban.BanEnds, req.Rate.Units)
	}
	free := req
	free.Cost = 0
	if d, ok := refused(free); !ok || !d.BanEnds.Equal(ban.BanEnds) {
		t.Fatalf("a request of cost 0: %+v, %v; want the same ban", d, ok)
	}
	unbanned := req
	unbanned.Ban = 0
	if d, ok := refused(unbanned); ok {
		t.Fatalf("a request without a ban (the zone's ban removed): refused with %+v", d)
	}
	if d, ok := refused(loginRequest("other")); ok {
		t.Fatalf("another key: refused with %+v", d)
	}
	if d := s.take(t, loginRequest("other"))[0]; !d.Allowed || d.Used != 1 {
		t.Fatalf("the other key's first take after it was asked about: %+v, want allowed, using 1", d)
	}
	s.resetKey(t, "login", "k")
	if d, ok := refused(req); ok {
		t.Fatalf("after a reset: refused with %+v", d)
	}
}

// testReset: a reset forgets a key's counts, so its full budget is
// allowed again, in that zone only.
func testReset(t *testing.T, s *suite) {
	rate := algorithms.Rate{Units: 3, Window: time.Hour}
	req := storage.Request{Zone: "z", Key: "k", Algorithm: algorithms.SlidingTail, Rate: rate, Cost: 3}
	other := req
	other.Zone = "other"
	s.take(t, req, other)
	if d := s.take(t, req)[0]; d.Allowed {
		t.Fatalf("over the limit: %+v, want rejected", d)
	}
	if st := s.keyState(t, "z", "k", rate.Window); st.Counts.Windows().Current != 3 {
		t.Fatalf("key state %+v, want 3 counted", st.Counts)
	}
	s.resetKey(t, "z", "k")
	if st := s.keyState(t, "z", "k", rate.Window); st.Counts.Windows().Current != 0 || st.Counts.Windows().Previous != 0 {
		t.Fatalf("key state after a reset %+v, want nothing counted", st.Counts)
	}
	if d := s.take(t, req)[0]; !d.Allowed {
		t.Fatalf("the full budget after a reset: %+v, want allowed", d)
	}
	if d := s.take(t, other)[0]; d.Allowed {
		t.Fatalf("the same key in another zone after the reset: %+v, want still rejected", d)
	}
}

// testOverride: a per-key limit decides its key's requests in place of
// the zone's until it is removed, and the admin side shows it meanwhile.
func testOverride(t *testing.T, s *suite) {
	a := s.admin(t)
	ctx := context.Background()
	rate := algorithms.Rate{Units: 3, Window: time.Hour}
	req := storage.Request{Zone: "z", Key: "vip", Algorithm: algorithms.FixedWindow, Rate: rate, Cost: 1}
	if err := a.SetOverride(ctx, "z", storage.BoundKey("vip"), storage.Override{Limit: 5}); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if d := s.take(t, req)[0]; !d.Allowed || d.Limit != 5 {
			t.Fatalf("request %d under the override: %+v, want allowed against 5", i, d)
		}
	}
	if d := s.take(t, req)[0]; d.Allowed {
		t.Fatalf("sixth under an override of 5: %+v, want rejected", d)
	}
	other := req
	other.Key = "plain"
	if d := s.take(t, other)[0]; d.Limit != 3 {
		t.Fatalf("another key: limit %d, want the zone's 3", d.Limit)
	}
	if st := s.keyState(t, "z", "vip", rate.Window); st.Override == nil || st.Override.Limit != 5 {
		t.Fatalf("key state's override %+v, want a limit of 5", st.Override)
	}
	if err := a.DeleteOverride(ctx, "z", storage.BoundKey("vip")); err != nil {
		t.Fatal(err)
	}
	if st := s.keyState(t, "z", "vip", rate.Window); st.Override != nil {
		t.Fatalf("key state's override %+v after it was removed, want none", st.Override)
	}
	// What the key used under the override still counts: removing an
	// override changes the limit, not the counts.
	if d := s.take(t, req)[0]; d.Allowed || d.Limit != 3 || d.Used < 5 {
		t.Fatalf("after the override was removed: %+v, want rejected against the zone's 3 with the 5 used under the override", d)
	}
}
