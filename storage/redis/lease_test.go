package redis

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/internal/promtest"
	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
	"github.com/d61b427a/caddy-rate-limit/internal/threadtime"
	"github.com/d61b427a/caddy-rate-limit/internal/wait"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// leaseStore is a Redis store with lease on and a client of its own: the
// stores of one test are instances of a fleet, each with its own leases
// (they share the process's id, so the fleet's size is set by the test).
func leaseStore(t *testing.T, s *redistest.Server, prefix string, instance int) *Store {
	t.Helper()
	// A timeout of its own gives the store a client of its own.
	r := newRedisStore(t, &Store{Lease: true, KeyPrefix: prefix, Timeout: caddy.Duration(5*time.Second + time.Duration(instance)*time.Millisecond)}, s.URL())
	return r
}

// fleetOf makes the stores' fleet n instances, as their watchers read it:
// n-1 others announced (for the next hour) beside this process.
func fleetOf(t *testing.T, s *redistest.Server, n int, stores ...*Store) {
	t.Helper()
	for i := 1; i < n; i++ {
		if _, err := s.Do("HSET", stores[0].instancesKey(), "other-"+strconv.Itoa(i), strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range stores {
		r.watcher().refresh()
		if got := r.Instances(); got != n {
			t.Fatalf("%d instances read, want %d", got, n)
		}
	}
}

// counted reads the units Redis counts in a windowed key's current window,
// or in a sliding window's ring.
func counted(t *testing.T, s *redistest.Server, r *Store, zone, key string) int64 {
	t.Helper()
	if ring, err := s.Do("HGET", r.counterKey(zone, key), "r"); err == nil && ring != "" {
		var n int64
		for _, c := range strings.Split(ring, ",") {
			v, _ := strconv.ParseInt(c, 10, 64)
			n += v
		}
		return n
	}
	v, err := s.Do("HGET", r.counterKey(zone, key), "c")
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.ParseInt(v, 10, 64)
	return n
}

// leasedUnits counts the units this store's client holds in leases.
func leasedUnits(r *Store) int64 {
	_, units := r.client.leases.count()
	return units
}

// count counts the table's records and the units they hold.
func (t *leaseTable) count() (records int, units int64) {
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		records += len(s.m)
		for _, l := range s.m {
			units += l.units
		}
		s.mu.Unlock()
	}
	return records, units
}

// TestRedisLeaseTakesWithoutCalls: a key requested again and again on one
// instance is decided from leases after its first request: far fewer
// script calls than requests, every unit counted in Redis before it is
// taken, and the untaken units released once the key goes unused, which
// leaves Redis with exactly the units taken.
func TestRedisLeaseTakesWithoutCalls(t *testing.T) {
	s := redistest.Standalone(t)
	r := leaseStore(t, s, "lease1:", 0)
	req := storage.Request{Zone: "z", Key: "hot", Algorithm: algorithms.SlidingTail, Rate: algorithms.Rate{Units: 1 << 30, Window: time.Hour}, Cost: 1}
	if _, err := s.Do("CONFIG", "RESETSTAT"); err != nil {
		t.Fatal(err)
	}
	const requests = 2000
	for i := range requests {
		d := redisTake(t, r, time.Time{}, req)[0]
		if !d.Allowed || d.Limit != 1<<30 || d.Remaining != 1<<30-int64(i)-1 {
			t.Fatalf("request %d: %+v, want allowed with %d remaining", i, d, 1<<30-i-1)
		}
		// Units are counted before they are taken.
		if c := counted(t, s, r, "z", "hot"); c < int64(i)+1 {
			t.Fatalf("after request %d Redis counts %d", i, c)
		}
	}
	calls, err := s.ScriptCalls()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d requests in %d script calls", requests, calls)
	if calls > requests/20 {
		t.Fatalf("%d script calls for %d requests of one key, want leases to decide most", calls, requests)
	}
	// The units are released once the lease is unused, and Redis then
	// counts exactly those taken.
	wait.For(t, "the untaken units to be released", func() bool { return counted(t, s, r, "z", "hot") == requests })
	if n := leasedUnits(r); n != 0 {
		t.Fatalf("%d units still leased", n)
	}
}

// TestRedisLeaseFleetNeverOver: three instances, each with four clients
// taking for one key far beyond its limit, admit no more than the limit
// (and, every instance wanting more to the end, all but a few units of
// it); what Redis counts at the end is exactly what was admitted.
func TestRedisLeaseFleetNeverOver(t *testing.T) {
	s := redistest.Standalone(t)
	const limit = 300
	for _, alg := range []algorithms.Algorithm{algorithms.FixedWindow, algorithms.SlidingTail, algorithms.SlidingWindow} {
		t.Run(string(alg), func(t *testing.T) {
			prefix := "fleet-" + string(alg) + ":"
			var fleet []*Store
			for i := range 3 {
				fleet = append(fleet, leaseStore(t, s, prefix, i))
			}
			fleetOf(t, s, 3, fleet...)
			req := storage.Request{Zone: "z", Key: "k", Algorithm: alg, Rate: algorithms.Rate{Units: limit, Window: time.Hour}, Cost: 1}
			var admitted atomic.Int64
			var wg sync.WaitGroup
			for _, r := range fleet {
				for range 4 {
					wg.Go(func() {
						// Until a run of rejections: by then this instance's
						// lease is all taken and Redis has nothing left.
						for misses := 0; misses < 20; {
							d := make([]algorithms.Decision, 1)
							if err := r.Take(context.Background(), []storage.Request{req}, d); err != nil {
								t.Error(err)
								return
							}
							if d[0].Allowed {
								admitted.Add(1)
								misses = 0
							} else {
								misses++
							}
						}
					})
				}
			}
			wg.Wait()
			n := admitted.Load()
			t.Logf("%d of %d admitted", n, limit)
			if n > limit || n < limit*98/100 {
				t.Fatalf("%d admitted, want at most %d and at least 98%% of it", n, limit)
			}
			// Every instance was refused at the end, so none holds units,
			// and Redis counts exactly what was admitted.
			for _, r := range fleet {
				if u := leasedUnits(r); u != 0 {
					t.Fatalf("%d units leased after the instance was refused", u)
				}
			}
			if c := counted(t, s, fleet[0], "z", "k"); c != n {
				t.Fatalf("Redis counts %d, %d were admitted", c, n)
			}
		})
	}
}

// TestRedisLeaseCap: a lease never takes more than floor(room / 2N) of
// what the key has left, so the last units of a window are decided one at
// a time, exactly.
func TestRedisLeaseCap(t *testing.T) {
	s := redistest.Standalone(t)
	r := leaseStore(t, s, "cap:", 0)
	fleetOf(t, s, 2, r)
	req := storage.Request{Zone: "z", Key: "k", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 40, Window: time.Hour}, Cost: 1}
	for i := range 40 {
		if d := redisTake(t, r, time.Time{}, req)[0]; !d.Allowed {
			t.Fatalf("request %d rejected", i)
		}
		held, c := leasedUnits(r), counted(t, s, r, "z", "k")
		// Room after this request and its lease, against what is held:
		// a lease taken with room R is at most R/4 (N = 2).
		if held > 0 && held*4 > 40-(c-held) {
			t.Fatalf("after request %d: %d units leased with %d counted, more than a quarter of the room", i, held, c)
		}
	}
	if d := redisTake(t, r, time.Time{}, req)[0]; d.Allowed {
		t.Fatal("the 41st request allowed")
	}
}

// TestRedisLeaseGCRA: a gcra lease has no unit taken later than the TAT it
// was counted at, so a fleet on leases admits no more than the bucket and
// its refill allow, and Redis ends with the units admitted.
func TestRedisLeaseGCRA(t *testing.T) {
	s := redistest.Standalone(t)
	r := leaseStore(t, s, "gcra:", 0)
	// 200 a second, a bucket of 100.
	req := storage.Request{Zone: "z", Key: "k", Algorithm: algorithms.GCRA, Rate: algorithms.Rate{Units: 200, Window: time.Second, Burst: 100}, Cost: 1}
	start := time.Now()
	admitted := 0
	for range 1000 {
		if redisTake(t, r, time.Time{}, req)[0].Allowed {
			admitted++
		}
	}
	elapsed := time.Since(start)
	// The bucket, plus what refilled while the requests ran (and one for
	// the rounding of the millisecond clock).
	most := 100 + int(elapsed.Seconds()*200) + 1
	t.Logf("%d of 1000 admitted in %v (at most %d)", admitted, elapsed, most)
	if admitted > most || admitted < 100 {
		t.Fatalf("%d admitted in %v, want the bucket's 100 and at most %d", admitted, elapsed, most)
	}
}

// TestRedisLeaseDroppedOnAdminChange: a reset through another instance
// moves the admin epoch; at its next refresh the instance holding a lease
// drops it, unreleased, and takes in Redis again.
func TestRedisLeaseDroppedOnAdminChange(t *testing.T) {
	s := redistest.Standalone(t)
	a, b := leaseStore(t, s, "admin:", 0), leaseStore(t, s, "admin:", 1)
	req := storage.Request{Zone: "z", Key: "k", Algorithm: algorithms.SlidingTail, Rate: algorithms.Rate{Units: 1000, Window: time.Hour}, Cost: 1}
	for range 50 {
		redisTake(t, a, time.Time{}, req)
	}
	if leasedUnits(a) == 0 {
		t.Fatal("no lease after 50 requests for one key")
	}
	if err := b.ResetKey(context.Background(), "z", "k"); err != nil {
		t.Fatal(err)
	}
	a.watcher().refresh()
	if n := leasedUnits(a); n != 0 {
		t.Fatalf("%d units still leased after a reset elsewhere", n)
	}
	before, _ := s.ScriptCalls()
	d := redisTake(t, a, time.Time{}, req)[0]
	after, _ := s.ScriptCalls()
	if !d.Allowed || after != before+1 || counted(t, s, a, "z", "k") != 1 {
		t.Fatalf("after the reset: %+v in %d calls, Redis counts %d; want Redis's own decision on a fresh key", d, after-before, counted(t, s, a, "z", "k"))
	}
}

// TestRedisInstances: each instance announces itself when it rereads the
// dials; N counts those that announced in the last 5 s and forgets the
// others.
func TestRedisInstances(t *testing.T) {
	s := redistest.Standalone(t)
	r := newRedisStore(t, new(Store), s.URL())
	w := r.watcher()
	w.refresh()
	if n := r.Instances(); n != 1 {
		t.Fatalf("%d instances alone, want 1", n)
	}
	now, err := s.Do("TIME")
	if err != nil {
		t.Fatal(err)
	}
	secs, err := strconv.ParseInt(strings.Fields(now)[0], 10, 64)
	if err != nil {
		t.Fatalf("TIME answered %q", now)
	}
	ms := secs * 1000
	key := r.instancesKey()
	for id, at := range map[string]int64{"other-1": ms, "other-2": ms - 1000, "gone": ms - 60000} {
		if _, err := s.Do("HSET", key, id, strconv.FormatInt(at, 10)); err != nil {
			t.Fatal(err)
		}
	}
	w.refresh()
	if n := r.Instances(); n != 3 {
		t.Fatalf("%d instances, want 3: this one and two announced lately", n)
	}
	if v, _ := s.Do("HEXISTS", key, "gone"); v != "0" {
		t.Fatal("an instance gone a minute ago is still listed")
	}
}

// TestRedisAnnounceBySHA: an instance announces itself by the script's
// SHA1 (EVALSHA), not its text, once the server knows the script; a
// server that lost its scripts gets the text once, and the instance is
// announced all the same.
func TestRedisAnnounceBySHA(t *testing.T) {
	s := redistest.Standalone(t)
	r := newRedisStore(t, new(Store), s.URL())
	w := r.watcher()
	w.refresh()
	stats := func() map[string]int {
		t.Helper()
		m, err := s.CommandStats()
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	before := stats()
	w.refresh()
	w.refresh()
	after := stats()
	if evals, shas := after["eval"]-before["eval"], after["evalsha"]-before["evalsha"]; evals != 0 || shas < 2 {
		t.Fatalf("two refreshes sent %d EVAL and %d EVALSHA, want no EVAL and at least 2 EVALSHA", evals, shas)
	}
	for _, cmd := range [][]string{{"SCRIPT", "FLUSH"}, {"DEL", r.instancesKey()}} {
		if _, err := s.Do(cmd...); err != nil {
			t.Fatal(err)
		}
	}
	w.refresh()
	if v, _ := s.Do("HEXISTS", r.instancesKey(), processID); v != "1" {
		t.Fatal("after SCRIPT FLUSH, the refresh did not announce the instance")
	}
	before = stats()
	w.refresh()
	if after := stats(); after["eval"] != before["eval"] {
		t.Fatalf("the refresh after the one that sent the script sent %d EVAL, want none", after["eval"]-before["eval"])
	}
}

// TestRedisLocalFallback: the local fallback gives each instance its share
// of a limit (floor(limit/N)), in the same algorithm. It begins from what
// Redis admitted for this instance (a key whose share was spent through
// Redis is refused at once), and what it admitted alone is taken in
// Redis once Redis answers again, a take or the dial watcher's refresh;
// its counts stay.
func TestRedisLocalFallback(t *testing.T) {
	s := redistest.Standalone(t)
	r := newRedisStore(t, new(Store), s.URL())
	fleetOf(t, s, 3, r)
	local := r.Local()
	req := storage.Request{Zone: "z", Key: "k", Algorithm: algorithms.SlidingTail, Rate: algorithms.Rate{Units: 31, Window: time.Hour}, Cost: 1}
	takeLocal := func(q storage.Request) algorithms.Decision {
		d := make([]algorithms.Decision, 1)
		if err := local.Take(context.Background(), []storage.Request{q}, d); err != nil {
			t.Fatal(err)
		}
		return d[0]
	}
	spent := req
	spent.Key = "spent"
	for range 10 {
		redisTake(t, r, time.Time{}, spent)
	}
	if d := takeLocal(spent); d.Allowed {
		t.Fatal("a key this instance took its share of through Redis was allowed by the local fallback")
	}
	for i := range 10 {
		if d := takeLocal(req); !d.Allowed || d.Limit != 10 {
			t.Fatalf("local request %d: %+v, want allowed against 10 (31/3)", i, d)
		}
	}
	if d := takeLocal(req); d.Allowed {
		t.Fatal("the 11th local request allowed")
	}
	if d := redisTake(t, r, time.Time{}, req)[0]; !d.Allowed || d.Used != 1 { // Redis answers again
		t.Fatalf("Redis's first answer: %+v, want allowed, used 1", d)
	}
	wait.For(t, "Redis counts the 10 admitted locally", func() bool {
		st, err := r.KeyState(context.Background(), "z", "k", algorithms.Rate{Window: time.Hour})
		return err == nil && st.Counts.C == 11
	})
	if d := takeLocal(req); d.Allowed {
		t.Fatal("the local counts did not outlive Redis's answer")
	}
	// With no request to find Redis back, the dial watcher's refresh,
	// once a second, catches Redis up.
	quiet := req
	quiet.Key = "quiet"
	for range 3 {
		takeLocal(quiet)
	}
	r.watcher().refresh()
	wait.For(t, "Redis counts the 3 admitted locally, taken by the refresh's catch-up", func() bool {
		st, err := r.KeyState(context.Background(), "z", "quiet", algorithms.Rate{Window: time.Hour})
		return err == nil && st.Counts.C == 3
	})
}

// TestRedisLeaseReleasedOnShutdown: the leases a client holds are
// released when the last config using it is cleaned up, so Redis counts
// exactly the units taken.
func TestRedisLeaseReleasedOnShutdown(t *testing.T) {
	s := redistest.Standalone(t)
	r := leaseStore(t, s, "shutdown:", 0)
	req := storage.Request{Zone: "z", Key: "k", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 1 << 20, Window: time.Hour}, Cost: 1}
	for range 100 {
		redisTake(t, r, time.Time{}, req)
	}
	if leasedUnits(r) == 0 {
		t.Fatal("no lease held after 100 requests")
	}
	if err := r.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if c := counted(t, s, r, "z", "k"); c != 100 {
		t.Fatalf("Redis counts %d after shutdown, want the 100 taken", c)
	}
}

// TestRedisNoLeaseBesideConcurrency: a request that a concurrency zone
// also counts takes in Redis every time, and wants no lease for its other
// zones, which it could never take from.
func TestRedisNoLeaseBesideConcurrency(t *testing.T) {
	s := redistest.Standalone(t)
	r := leaseStore(t, s, "conc:", 0)
	reqs := func(holder uint64) []storage.Request {
		return []storage.Request{
			{Zone: "rate", Key: "k", Algorithm: algorithms.SlidingTail, Rate: algorithms.Rate{Units: 1000, Window: time.Hour}, Cost: 1},
			{Zone: "conc", Key: "k", Algorithm: algorithms.Concurrency, Rate: algorithms.Rate{Units: 10, Window: time.Minute}, Cost: 1, Holder: holder},
		}
	}
	before, _ := s.ScriptCalls()
	for i := range 20 {
		q := reqs(uint64(i))
		redisTake(t, r, time.Time{}, q...)
		// The concurrency request is released, as the handler does.
		if err := release(r, q[1]); err != nil {
			t.Fatal(err)
		}
	}
	takes, _ := s.ScriptCalls()
	if leasedUnits(r) != 0 || counted(t, s, r, "rate", "k") != 20 || takes-before < 20 {
		t.Fatalf("%d units leased, %d counted, %d script calls; want none leased and 20 counted in 20 takes", leasedUnits(r), counted(t, s, r, "rate", "k"), takes-before)
	}
}

// TestRedisLeaseKeySeenOnce: keys requested once each, as a flood of
// fresh keys sends them, leave no record in the lease table and are
// decided by Redis; a key requested again soon after gets a record and a
// lease.
func TestRedisLeaseKeySeenOnce(t *testing.T) {
	s := redistest.Standalone(t)
	r := leaseStore(t, s, "once:", 0)
	req := storage.Request{Zone: "z", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 1000, Window: time.Hour}, Cost: 1}
	for i := range 1000 {
		req.Key = "fresh-" + strconv.Itoa(i)
		if d := redisTake(t, r, time.Time{}, req)[0]; !d.Allowed || d.Remaining != 999 {
			t.Fatalf("key %d: %+v, want allowed with 999 remaining", i, d)
		}
	}
	if n := r.client.leases.records(); n != 0 {
		t.Fatalf("%d lease records after 1000 keys requested once each, want none", n)
	}
	req.Key = "again"
	redisTake(t, r, time.Time{}, req)
	redisTake(t, r, time.Time{}, req)
	if n, units := r.client.leases.count(); n != 1 || units == 0 {
		t.Fatalf("%d records holding %d units after a key requested twice, want its record and a lease", n, units)
	}
}

// TestLeaseTableFreshKeysAllocateNothing: a request for a key seen for the
// first time allocates nothing that outlives the request.
func TestLeaseTableFreshKeysAllocateNothing(t *testing.T) {
	var table leaseTable
	table.init()
	keys, reqs := make([]string, 1), []storage.Request{{Zone: "z", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 1000, Window: time.Minute}, Cost: 1}}
	fresh := make([]string, 1001)
	for i := range fresh {
		fresh[i] = "{k" + strconv.Itoa(i) + "}:z"
	}
	now, n := time.Now(), 0
	allocs := testing.AllocsPerRun(1000, func() {
		keys[0] = fresh[n]
		n++
		table.wants(keys, reqs, now)
	})
	if allocs != 0 {
		t.Fatalf("%v allocations a fresh key, want none", allocs)
	}
}

// TestLeaseTableUnderFlood: a flood of a million distinct keys, each
// requested twice (so that each earns a record and a lease of a unit), at
// ten million keys a minute with the sweep running, never takes the table
// past maxLeaseRecords records; a hot key requested among them keeps its
// lease (at most one call for 20 of its requests); and no unit is lost
// to the records forgotten to make room: every unit leased is taken,
// released or still held.
func TestLeaseTableUnderFlood(t *testing.T) {
	var table leaseTable
	table.init()
	q := storage.Request{Zone: "z", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 1000, Window: time.Minute}, Cost: 1}
	hot, hotReqs := []string{"{hot}:z"}, []storage.Request{q}
	hotReqs[0].Rate.Units = 1 << 30
	now := time.UnixMilli(1_700_000_000_000)
	every := time.Minute / 10_000_000
	next := now.Add(leaseSweep)
	var leased, taken, released int64
	var hotRequests, hotCalls int
	noSeries := func(string) *leaseSeries { return nil }
	// call stands for a call to Redis that leases all the units wanted.
	call := func(keys []string, reqs []storage.Request, limit int64) {
		wants := table.wants(keys, reqs, now)
		if wants == nil {
			return
		}
		window := now.UnixMilli() / q.Rate.Window.Milliseconds()
		d := []algorithms.Decision{{Allowed: true, Limit: limit, Remaining: limit - 2, Reset: time.UnixMilli((window + 1) * q.Rate.Window.Milliseconds()), Window: window}}
		table.leased(keys, reqs, &leaseAnswer{wants: wants, leased: wants, tats: make([]int64, 1)}, d, now, noSeries)
		leased += wants[0]
	}
	reqs := []storage.Request{q}
	hotDecision := make([]algorithms.Decision, 1)
	for i := range 1_000_000 {
		now = now.Add(every)
		keys := []string{"{k" + strconv.Itoa(i) + "}:z"}
		call(keys, reqs, q.Rate.Units)
		call(keys, reqs, q.Rate.Units)
		if i%100 == 0 {
			hotRequests++
			if table.take(hot, hotReqs, hotDecision, now) {
				taken++
			} else {
				hotCalls++
				call(hot, hotReqs, hotReqs[0].Rate.Units)
			}
		}
		if !now.Before(next) {
			for _, h := range table.due(now) {
				released += h.units
			}
			next = next.Add(leaseSweep)
			if n := table.records(); n > maxLeaseRecords {
				t.Fatalf("%d records after %d keys, want at most %d", n, i+1, maxLeaseRecords)
			}
		}
	}
	n, held := table.count()
	t.Logf("%d records; %d units leased, %d taken, %d released, %d held; the hot key called %d times in %d requests", n, leased, taken, released, held, hotCalls, hotRequests)
	if n > maxLeaseRecords || n < maxLeaseRecords/2 {
		t.Fatalf("%d records at the end, want at most %d, and the flood's recent keys", n, maxLeaseRecords)
	}
	if hotCalls > hotRequests/20 {
		t.Fatalf("the hot key called %d times in %d requests, want leases to decide most", hotCalls, hotRequests)
	}
	if leased < 1_000_000 || taken+released+held != leased {
		t.Fatalf("%d units leased, %d taken, %d released and %d held: want every key leased, and every unit taken, released or held", leased, taken, released, held)
	}
}

// TestRedisLeaseHotKeyUnderFlood: while a flood of fresh keys, some
// requested twice so that the lease table's shards fill up, runs through the
// same store, a hot key is still decided from leases: at most one Redis
// decision per 20 requests. The flood sends only keys of the hot key's
// shard, the only ones that compete with it: on a slow machine a flood
// spread over every shard fills none before its records are forgotten.
func TestRedisLeaseHotKeyUnderFlood(t *testing.T) {
	s := redistest.Standalone(t)
	r := leaseStore(t, s, "flood:", 0)
	flood := storage.Request{Zone: "flood", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 1000, Window: time.Hour}, Cost: 1}
	hot := storage.Request{Zone: "hot-under-flood", Key: "hot", Algorithm: algorithms.SlidingTail, Rate: algorithms.Rate{Units: 1 << 30, Window: time.Hour}, Cost: 1}
	shard := r.client.leases.shard(r.counterKey(hot.Zone, hot.Key))
	inShard := func(key string) bool { return r.client.leases.shard(r.counterKey(flood.Zone, key)) == shard }
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			d := make([]algorithms.Decision, 1)
			take := func(q storage.Request) {
				if err := r.Take(context.Background(), []storage.Request{q}, d); err != nil {
					t.Error(err)
				}
			}
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				once, twice := flood, flood
				once.Key = "once-" + strconv.Itoa(g) + "-" + strconv.Itoa(i)
				twice.Key = "twice-" + strconv.Itoa(g) + "-" + strconv.Itoa(i)
				if inShard(once.Key) {
					take(once)
				}
				if inShard(twice.Key) {
					take(twice)
					take(twice)
				}
			}
		})
	}
	defer wg.Wait()
	defer close(stop)
	wait.For(t, "the flood to fill the hot key's shard", func() bool {
		shard.mu.Lock()
		defer shard.mu.Unlock()
		return len(shard.m) >= leaseShardRecords
	})
	taken := func() float64 { return leaseUnitsOf(t, hot.Zone, "taken") }
	before := taken()
	const requests = 2000
	for i := range requests {
		if d := redisTake(t, r, time.Time{}, hot)[0]; !d.Allowed {
			t.Fatalf("hot request %d rejected", i)
		}
	}
	calls := requests - int(taken()-before)
	t.Logf("%d of %d hot requests decided by Redis", calls, requests)
	if calls > requests/20 {
		t.Fatalf("%d of %d requests of a hot key decided by Redis during a flood, want leases to decide most", calls, requests)
	}
}

// leaseUnitsOf reads lease_units_total{zone,outcome}.
func leaseUnitsOf(t *testing.T, zone, outcome string) float64 {
	return promtest.Counter(t, metrics.leaseUnits, map[string]string{"zone": zone, "outcome": outcome})
}

// BenchmarkLeaseSweep runs the lease table through a key-rotation flood on
// a simulated clock: so many distinct keys a minute, each requested once
// (a fresh key per request) or twice (the second time taking a lease of
// one unit, as when a flood repeats each key), with the sweep every
// leaseSweep. The table first takes leaseForget's worth of the flood, so
// it holds what the rules keep. An op is one key of the flood;
// max-hold-ns is the longest the sweep held a lock that requests need, in
// the CPU time of its thread (max-wall-ns in wall time, which on a shared
// machine includes the time others had the CPU), p99-hold-ns the 99th
// percentile of those holds, records how many keys the table held at the
// end.
func BenchmarkLeaseSweep(b *testing.B) {
	for _, perMinute := range []int{1_000_000, 10_000_000} {
		for _, times := range []int{1, 2} {
			b.Run(strconv.Itoa(perMinute/1_000_000)+"M-keys-a-minute/requested-"+strconv.Itoa(times)+"x", func(b *testing.B) {
				benchmarkLeaseSweep(b, perMinute, times)
			})
		}
	}
}

func benchmarkLeaseSweep(b *testing.B, perMinute, times int) {
	every := time.Minute / time.Duration(perMinute)
	q := storage.Request{Zone: "z", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 1000, Window: time.Minute}, Cost: 1}
	var t leaseTable
	t.init()
	now := time.UnixMilli(1_700_000_000_000)
	noSeries := func(string) *leaseSeries { return nil }
	flood := func(key string) {
		keys, reqs := []string{key}, []storage.Request{q}
		t.wants(keys, reqs, now)
		if times < 2 {
			return
		}
		wants := t.wants(keys, reqs, now)
		if wants == nil {
			return
		}
		window := now.UnixMilli() / q.Rate.Window.Milliseconds()
		d := []algorithms.Decision{{Allowed: true, Limit: 1000, Remaining: 998, Reset: time.UnixMilli((window + 1) * q.Rate.Window.Milliseconds()), Window: window}}
		t.leased(keys, reqs, &leaseAnswer{wants: wants, leased: []int64{1}, tats: make([]int64, 1)}, d, now, noSeries)
	}
	key := func(n int) string { return "bench:{k" + strconv.Itoa(n) + "}:z" }
	n := 0
	for range int(leaseForget / every) {
		now = now.Add(every)
		flood(key(n))
		n++
	}
	t.due(now)
	keys := make([]string, b.N)
	for i := range keys {
		keys[i] = key(n + i)
	}
	// The sweep, as due runs it, timed shard by shard: each holds its
	// shard's lock.
	var holds []time.Duration
	var maxWall time.Duration
	sweep := func() {
		var out []heldUnits
		for i := range t.shards {
			start, cpu := time.Now(), threadtime.Now()
			out = t.shards[i].due(now, out)
			holds = append(holds, threadtime.Now()-cpu)
			maxWall = max(maxWall, time.Since(start))
		}
	}
	next := now.Add(leaseSweep)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		now = now.Add(every)
		flood(keys[i])
		if !now.Before(next) {
			sweep()
			next = next.Add(leaseSweep)
		}
	}
	sweep()
	b.StopTimer()
	reportHolds(b, holds, maxWall)
	b.ReportMetric(float64(t.records()), "records")
}
