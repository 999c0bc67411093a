package memory

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/caddyserver/caddy/v2"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/algorithms/vectors"
	"github.com/d61b427a/caddy-rate-limit/internal/clocktest"
	"github.com/d61b427a/caddy-rate-limit/internal/race"
	"github.com/d61b427a/caddy-rate-limit/storage"
	"github.com/d61b427a/caddy-rate-limit/storage/storetest"
)

func newTestCounters(t *testing.T, maxKeys int) (*counters, *clocktest.Clock) {
	t.Helper()
	clock := clocktest.New(vectors.Start)
	c := newCounters(maxKeys, clock.Now)
	t.Cleanup(func() { _ = c.Destruct() })
	return c, clock
}

func take1(c *counters, r storage.Request) algorithms.Decision {
	d := make([]algorithms.Decision, 1)
	c.take([]storage.Request{r}, d)
	return d[0]
}

// TestStore runs the suite every store passes on memory stores of their
// own, each on the suite's clock.
func TestStore(t *testing.T) {
	storetest.Run(t, func(t *testing.T, now func() time.Time) storage.Store {
		s := New(0, now)
		t.Cleanup(func() { _ = s.Cleanup() })
		return s
	})
}

// TestMemoryReleasedKeyForgotten: a concurrency key whose units all came
// back is forgotten, not kept at zero.
func TestMemoryReleasedKeyForgotten(t *testing.T) {
	c, _ := newTestCounters(t, DefaultMaxKeys)
	req := storage.Request{Zone: "conc", Key: "k", Algorithm: algorithms.Concurrency, Rate: algorithms.Rate{Units: 3, Window: time.Minute}, Cost: 2, Holder: 1}
	d := take1(c, req)
	if got, ok := c.inspect("conc", "k", algorithms.Rate{Window: time.Minute}); !ok || got.Held() != 2 {
		t.Fatalf("held %+v (%v), want 2", got, ok)
	}
	c.finish([]storage.Request{req}, []algorithms.Decision{d})
	if _, ok := c.inspect("conc", "k", algorithms.Rate{Window: time.Minute}); ok {
		t.Fatal("a key with nothing held is still kept")
	}
}

// TestMemoryHeldKeysAreNotEvicted: a flood of other keys past max_keys
// does not make the store forget units in flight.
func TestMemoryHeldKeysAreNotEvicted(t *testing.T) {
	c, _ := newTestCounters(t, shardCount) // one key per shard
	held := storage.Request{Zone: "conc", Key: "k", Algorithm: algorithms.Concurrency, Rate: algorithms.Rate{Units: 1, Window: time.Minute}, Cost: 1}
	if d := take1(c, held); !d.Allowed {
		t.Fatal(d)
	}
	for i := range 5000 {
		take1(c, storage.Request{Zone: "flood", Key: string(rune('a'+i%26)) + time.Duration(i).String(), Algorithm: algorithms.FixedWindow,
			Rate: algorithms.Rate{Units: 1, Window: time.Minute}, Cost: 1})
	}
	if d := take1(c, held); d.Allowed {
		t.Fatal("a held unit was evicted: a second request got in")
	}
}

func TestMemoryEvictsUnusedKeys(t *testing.T) {
	c, _ := newTestCounters(t, shardCount) // one key per shard
	l := algorithms.Rate{Units: 1, Window: time.Hour}
	// Fill far beyond the bound; the store must stay bounded.
	for i := 0; i < 10*shardCount; i++ {
		take1(c, storage.Request{Zone: "z", Key: fmt.Sprint(i), Algorithm: algorithms.FixedWindow, Rate: l, Cost: 1})
	}
	if n := c.len(); n > shardCount {
		t.Fatalf("%d keys kept, bound is %d", n, shardCount)
	}
	// The most recent key in each shard survives: the last key taken is
	// still counted, so a second request for it is rejected.
	last := storage.Request{Zone: "z", Key: fmt.Sprint(10*shardCount - 1), Algorithm: algorithms.FixedWindow, Rate: l, Cost: 1}
	if take1(c, last).Allowed {
		t.Fatal("most recently used key was evicted")
	}
}

// TestMemoryClockKeepsUsedKeys fills a store, keeps using some keys while
// many new ones arrive, and checks that the ones in use keep their counts
// (CLOCK gives them a second chance each time the hand passes) and that
// the bound holds throughout.
func TestMemoryClockKeepsUsedKeys(t *testing.T) {
	const bound = 100 * shardCount
	c, _ := newTestCounters(t, bound)
	l := algorithms.Rate{Units: 1 << 20, Window: time.Hour}
	req := func(k string) storage.Request {
		return storage.Request{Zone: "z", Key: k, Algorithm: algorithms.FixedWindow, Rate: l, Cost: 1}
	}
	hot := make([]string, 0, 50)
	for i := range cap(hot) {
		hot = append(hot, fmt.Sprint("hot-", i))
	}
	uses := 0
	for i := 0; i < 20*bound; i++ {
		take1(c, req(fmt.Sprint("cold-", i)))
		if i%100 == 0 {
			// Every hot key is used once per 100 new keys, while the hand
			// needs ~100 new keys per shard, 64*100 in all, to come round.
			for _, k := range hot {
				take1(c, req(k))
			}
			uses++
		}
		if i%1000 == 0 && c.len() > bound {
			t.Fatalf("%d keys kept after %d new ones, bound is %d", c.len(), i, bound)
		}
	}
	for _, k := range hot {
		if got, ok := c.inspect("z", k, l); !ok || got.Windows().Current != int64(uses) {
			t.Fatalf("hot key %s: %+v %v, want %d uses counted", k, got, ok, uses)
		}
	}
	if n := c.len(); n > bound || n < bound*9/10 {
		t.Fatalf("%d keys kept, want close to the bound %d", n, bound)
	}
}

func TestMemoryInspectAndReset(t *testing.T) {
	c, clock := newTestCounters(t, DefaultMaxKeys)
	l := algorithms.Rate{Units: 3, Window: time.Minute}
	r := storage.Request{Zone: "z", Key: "k", Algorithm: algorithms.SlidingTail, Rate: l, Cost: 2}
	if _, ok := c.inspect("z", "k", l); ok {
		t.Fatal("inspect found a key never taken")
	}
	if c.reset("z", "k") {
		t.Fatal("reset found a key never taken")
	}
	take1(c, r)
	clock.Set(vectors.Start.Add(time.Minute))
	take1(c, storage.Request{Zone: "z", Key: "k", Algorithm: algorithms.SlidingTail, Rate: l, Cost: 1})
	idx := algorithms.WindowIndex(vectors.Start.Add(time.Minute).UnixMilli(), time.Minute.Milliseconds())
	want := algorithms.WindowCounts{Window: idx, Current: 1, Previous: 2}.Counts()
	if got, ok := c.inspect("z", "k", l); !ok || got != want {
		t.Fatalf("inspect: %+v %v, want %+v", got, ok, want)
	}
	if _, ok := c.inspect("other", "k", l); ok {
		t.Fatal("inspect found k in a zone never used")
	}
	if !c.reset("z", "k") {
		t.Fatal("reset did not find the key")
	}
	if _, ok := c.inspect("z", "k", l); ok || c.len() != 0 {
		t.Fatalf("key still held after reset (%d keys)", c.len())
	}
	if d := take1(c, storage.Request{Zone: "z", Key: "k", Algorithm: algorithms.SlidingTail, Rate: l, Cost: 3}); !d.Allowed {
		t.Fatalf("full budget refused after reset: %+v", d)
	}
}

// TestMemoryShardTable drives one shard's table with hashes chosen to
// crowd a few home slots (so clusters form and wrap round the end of the
// table) through stores, removals, evictions, sweeps and shrinks, and
// checks it against a map after every step.
func TestMemoryShardTable(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var s shard
	model := map[uint64]uint32{} // hash -> expires
	check := func(step int) {
		t.Helper()
		if s.counts.n != len(model) {
			t.Fatalf("step %d: n=%d, model holds %d", step, s.counts.n, len(model))
		}
		used := 0
		for i, h := range s.counts.keys {
			if e := s.counts.slots[i]; h != 0 {
				used++
				if exp, ok := model[h]; !ok || exp != e.expires {
					t.Fatalf("step %d: slot %x (expires %d) not in model (%d %v)", step, h, e.expires, exp, ok)
				}
			}
		}
		if used != s.counts.n {
			t.Fatalf("step %d: %d slots used, n=%d", step, used, s.counts.n)
		}
		for h := range model {
			if _, ok := s.counts.lookup(h); !ok {
				t.Fatalf("step %d: %x unreachable", step, h)
			}
		}
	}
	randHash := func() uint64 {
		// top bits from a small set, so keys share home slots; low bits
		// random so they are distinct; never 0.
		return uint64(rng.IntN(4))<<62 | uint64(rng.IntN(3))<<58 | rng.Uint64()>>8 | 1
	}
	for step := range 20000 {
		bound := 200
		if step > 10000 {
			bound = 40 // a lower max_keys
		}
		switch op := rng.IntN(10); {
		case op < 6:
			h := randHash()
			exp := uint32(rng.IntN(100))
			before := s.counts.n
			_, had := s.counts.lookup(h)
			s.store(h, algorithms.WindowCounts{Current: 1}.Counts(), &storage.Request{Algorithm: algorithms.FixedWindow}, exp, bound, 0)
			if !had {
				// evictions, if any, took keys the model must forget
				for k := range model {
					if _, ok := s.counts.lookup(k); !ok {
						delete(model, k)
					}
				}
				if before >= bound && s.counts.n != bound {
					t.Fatalf("step %d: %d keys after a store into a full shard, bound %d", step, s.counts.n, bound)
				}
			}
			model[h] = exp
		case op < 8 && len(model) > 0:
			for h := range model {
				i, ok := s.counts.lookup(h)
				if !ok {
					t.Fatalf("step %d: %x missing", step, h)
				}
				s.counts.remove(i)
				delete(model, h)
				break
			}
		case op == 8:
			now := uint32(rng.IntN(100))
			s.sweep(now)
			for h, exp := range model {
				if exp <= now {
					delete(model, h)
				}
			}
		}
		check(step)
		if s.counts.n > bound {
			t.Fatalf("step %d: %d keys, bound %d", step, s.counts.n, bound)
		}
	}
}

func TestMemorySweepRemovesExpired(t *testing.T) {
	c, clock := newTestCounters(t, DefaultMaxKeys)
	for i := 0; i < 100; i++ {
		take1(c, storage.Request{Zone: "z", Key: fmt.Sprint(i), Algorithm: algorithms.SlidingTail, Rate: algorithms.Rate{Units: 5, Window: time.Second}, Cost: 1})
	}
	take1(c, storage.Request{Zone: "z", Key: "long", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 5, Window: time.Hour}, Cost: 1})
	// One window later a sliding tail still needs its counts.
	clock.Set(vectors.Start.Add(1500 * time.Millisecond))
	c.sweep()
	if n := c.len(); n != 101 {
		t.Fatalf("after one window: %d keys, want 101", n)
	}
	clock.Set(vectors.Start.Add(2 * time.Second))
	c.sweep()
	if n := c.len(); n != 1 {
		t.Fatalf("after two windows: %d keys, want only the hour-long one", n)
	}
}

// TestMemorySweepRemovesExpiredPeriods: a key counted in a calendar
// period is kept until the next period ends, however long the periods
// (March 2026 in New York ends at 04:00 UTC on April 1st, April a month
// later), and swept then.
func TestMemorySweepRemovesExpiredPeriods(t *testing.T) {
	c, clock := newTestCounters(t, DefaultMaxKeys)
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	rate := algorithms.Rate{Units: 5, Calendar: algorithms.CalendarOf(algorithms.Month, ny)}
	clock.Set(time.Date(2026, 3, 31, 23, 0, 0, 0, ny))
	take1(c, storage.Request{Zone: "z", Key: "k", Algorithm: algorithms.SlidingTail, Rate: rate, Cost: 1})
	endOfApril := time.Date(2026, 5, 1, 0, 0, 0, 0, ny)
	clock.Set(endOfApril.Add(-time.Second))
	c.sweep()
	if got, ok := c.inspect("z", "k", rate); !ok || got.Windows().Current != 1 {
		t.Fatalf("a second before April ends: %+v (kept %v), want March's count kept", got, ok)
	}
	clock.Set(endOfApril)
	c.sweep()
	if n := c.len(); n != 0 {
		t.Fatalf("once April ends: %d keys, want none", n)
	}
}

// TestMemorySweepShrinks: a table emptied by the sweep gives its memory
// back.
func TestMemorySweepShrinks(t *testing.T) {
	c, clock := newTestCounters(t, DefaultMaxKeys)
	for i := range 100 * shardCount {
		take1(c, storage.Request{Zone: "z", Key: fmt.Sprint(i), Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 5, Window: time.Second}, Cost: 1})
	}
	for i := range 2 * shardCount {
		take1(c, storage.Request{Zone: "z", Key: fmt.Sprint("long-", i), Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 5, Window: time.Hour}, Cost: 1})
	}
	clock.Set(vectors.Start.Add(2 * time.Second)) // counts live until the next window ends
	c.sweep()
	if n := c.len(); n != 2*shardCount {
		t.Fatalf("%d keys after the sweep, want %d", n, 2*shardCount)
	}
	for i := range c.shards {
		if s := &c.shards[i]; len(s.counts.slots) > minSlots && s.counts.n*4 < len(s.counts.slots) {
			t.Fatalf("shard %d: %d keys in %d slots after the sweep", i, s.counts.n, len(s.counts.slots))
		}
	}
	for i := range 2 * shardCount {
		if _, ok := c.inspect("z", fmt.Sprint("long-", i), algorithms.Rate{Window: time.Hour}); !ok {
			t.Fatalf("long-%d lost when its shard shrank", i)
		}
	}
}

// TestMemorySlotSize: 20 bytes of counts, 28 with the key, as the
// layout intends; a wide key's, 32.
func TestMemorySlotSize(t *testing.T) {
	if n := unsafe.Sizeof(slot{}); n != 20 {
		t.Fatalf("slot is %d bytes, want 20", n)
	}
	if n := unsafe.Sizeof(wideSlot{}); n != 32 {
		t.Fatalf("wideSlot is %d bytes, want 32", n)
	}
}

// TestMemoryTakeRange: the memory store counts in 32 bits, so it refuses
// limits and costs beyond maxCount rather than miscount them, and counts
// the largest ones exactly.
func TestMemoryTakeRange(t *testing.T) {
	m := new(Store)
	if err := m.Provision(caddy.Context{}); err != nil {
		t.Fatal(err)
	}
	defer m.Cleanup()
	d := make([]algorithms.Decision, 1)
	rate := algorithms.Rate{Units: maxCount, Window: time.Hour}
	for _, r := range []storage.Request{
		{Zone: "z", Key: "k", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: maxCount + 1, Window: time.Hour}, Cost: 1},
		{Zone: "z", Key: "k", Algorithm: algorithms.FixedWindow, Rate: rate, Cost: maxCount + 1},
		{Zone: "z", Key: "k", Algorithm: algorithms.FixedWindow, Rate: rate, Cost: -1},
		{Zone: "z", Key: "k", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 1}, Cost: 1},
		// Wide counts are for the windowed algorithms only.
		{Zone: "z", Key: "k", Algorithm: algorithms.GCRA, Rate: algorithms.Rate{Units: math.MaxInt64, Window: time.Hour}, Cost: 1, Wide: true},
		{Zone: "z", Key: "k", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: math.MaxInt64, Window: time.Hour}, Cost: -1, Wide: true},
	} {
		if err := m.Take(context.Background(), []storage.Request{r}, d); err == nil {
			t.Fatalf("%+v accepted", r)
		}
	}
	r := storage.Request{Zone: "range", Key: "k", Algorithm: algorithms.SlidingTail, Rate: rate, Cost: maxCount}
	if err := m.Take(context.Background(), []storage.Request{r}, d); err != nil || !d[0].Allowed || d[0].Used != maxCount {
		t.Fatalf("largest cost: %v %+v", err, d[0])
	}
	r.Cost = 1
	if err := m.Take(context.Background(), []storage.Request{r}, d); err != nil || d[0].Allowed || d[0].Used != maxCount {
		t.Fatalf("after the largest cost: %v %+v", err, d[0])
	}
	// A true-up's debt takes a count to at most twice the limit, which
	// 32 bits still hold, in a slot and in a ring.
	for _, alg := range []algorithms.Algorithm{algorithms.FixedWindow, algorithms.SlidingWindow} {
		r := storage.Request{Zone: "debt", Key: string(alg), Algorithm: alg, Rate: rate, Cost: 1, TrueUp: true, Actual: 3 * maxCount}
		if err := m.Take(context.Background(), []storage.Request{r}, d); err != nil || !d[0].Allowed {
			t.Fatalf("%s: %v %+v", alg, err, d[0])
		}
		if err := m.Finish(context.Background(), []storage.Request{r}, d); err != nil {
			t.Fatal(err)
		}
		used := func() int64 {
			if alg == algorithms.SlidingWindow {
				ring, _ := m.counters.inspectRing("debt", r.Key, rate)
				return ring.Used()
			}
			c, _ := m.counters.inspect("debt", r.Key, rate)
			return c.Windows().Current
		}()
		if used != 2*maxCount {
			t.Fatalf("%s: %d counted after a debt past twice the limit, want %d", alg, used, 2*maxCount)
		}
	}
}

// TestMemoryBoundFollowsRunningConfigs: the bound is the newest running
// config's max_keys. A config that is provisioned and then fails to load
// (cleaned up without ever running) or refused for a negative bound leaves
// the running config's bound in place; a huge bound does not overflow.
func TestMemoryBoundFollowsRunningConfigs(t *testing.T) {
	provision := func(maxKeys int) (*Store, error) {
		m := &Store{MaxKeys: maxKeys}
		return m, m.Provision(caddy.Context{})
	}
	running, err := provision(6400)
	if err != nil {
		t.Fatal(err)
	}
	defer running.Cleanup()
	perShard := func() int64 { return running.counters.maxPerShard.Load() }
	if perShard() != 100 {
		t.Fatalf("per shard %d for 6,400 keys, want 100", perShard())
	}

	failed, err := provision(640)
	if err != nil || perShard() != 10 {
		t.Fatalf("per shard %d (%v) while a 640-key config loads, want 10", perShard(), err)
	}
	failed.Cleanup()
	if perShard() != 100 {
		t.Fatalf("per shard %d after the new config failed, want 100 again", perShard())
	}

	if _, err := provision(-5); err == nil || perShard() != 100 {
		t.Fatalf("max_keys -5: %v, per shard %d, want refused and 100", err, perShard())
	}

	// A config (or handler) that does not set max_keys leaves the bound
	// in force as it is.
	unset, err := provision(0)
	if err != nil || perShard() != 100 {
		t.Fatalf("per shard %d (%v) beside a config without max_keys, want 100", perShard(), err)
	}
	running.Cleanup()
	if want := int64((DefaultMaxKeys-1)/shardCount + 1); perShard() != want {
		t.Fatalf("per shard %d with only a config without max_keys left, want the default's %d", perShard(), want)
	}
	defer unset.Cleanup()

	huge, err := provision(math.MaxInt)
	if err != nil || perShard() < math.MaxInt/shardCount {
		t.Fatalf("max_keys MaxInt: %v, per shard %d", err, perShard())
	}
	huge.Cleanup()
}

// TestMemorySharedAcrossProvisions shows that two configs (an old one and
// the one replacing it) see the same counters, and that the sweeper runs
// until the last one is cleaned up, and stops then: the cleanup destroys
// the counters, and Destruct returns once the sweeper has ended.
func TestMemorySharedAcrossProvisions(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	old, next := new(Store), new(Store)
	if err := old.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	r := []storage.Request{{Zone: "z", Key: "k", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 1, Window: time.Hour}, Cost: 1}}
	d := make([]algorithms.Decision, 1)
	if err := old.Take(ctx, r, d); err != nil || !d[0].Allowed {
		t.Fatalf("first take: %v %+v", err, d[0])
	}
	if err := next.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	counters := old.counters
	if next.counters != counters {
		t.Fatal("the new config has counters of its own")
	}
	if err := old.Cleanup(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-counters.done:
		t.Fatal("the sweeper stopped while a config still uses the store")
	default:
	}
	if err := next.Take(ctx, r, d); err != nil || d[0].Allowed {
		t.Fatalf("counter lost across provisions: %v %+v", err, d[0])
	}
	if err := next.Cleanup(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-counters.done:
	default:
		t.Fatal("the sweeper still runs after the last config using the store was cleaned up")
	}
}

func BenchmarkMemoryTake(b *testing.B) {
	c := newCounters(DefaultMaxKeys, time.Now)
	defer c.Destruct()
	for _, alg := range []algorithms.Algorithm{algorithms.FixedWindow, algorithms.SlidingTail} {
		b.Run(string(alg), func(b *testing.B) {
			b.ReportAllocs()
			reqs := []storage.Request{{Zone: "z", Key: "203.0.113.7", Algorithm: alg, Rate: algorithms.Rate{Units: 1 << 30, Window: time.Minute}, Cost: 1}}
			d := make([]algorithms.Decision, 1)
			for b.Loop() {
				c.take(reqs, d)
			}
		})
	}
	b.Run("parallel_distinct_keys", func(b *testing.B) {
		b.ReportAllocs()
		var n atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			reqs := []storage.Request{{Zone: "z", Key: fmt.Sprint("client-", n.Add(1)), Algorithm: algorithms.SlidingTail, Rate: algorithms.Rate{Units: 1 << 30, Window: time.Minute}, Cost: 1}}
			d := make([]algorithms.Decision, 1)
			for pb.Next() {
				c.take(reqs, d)
			}
		})
	})
}

// BenchmarkMemoryTakeDistinct takes for 100,000 distinct keys in turn, so
// that lookups miss the CPU caches as they would under many clients.
func BenchmarkMemoryTakeDistinct(b *testing.B) {
	const n = 100_000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = ipKey(i)
	}
	rate := algorithms.Rate{Units: 1 << 30, Window: time.Minute}
	c := newCounters(DefaultMaxKeys, time.Now)
	defer c.Destruct()
	d := make([]algorithms.Decision, 1)
	for _, k := range keys {
		c.take([]storage.Request{{Zone: "z", Key: k, Algorithm: algorithms.SlidingTail, Rate: rate, Cost: 1}}, d)
	}
	b.Run("100k_keys", func(b *testing.B) {
		b.ReportAllocs()
		reqs := []storage.Request{{Zone: "z", Algorithm: algorithms.SlidingTail, Rate: rate, Cost: 1}}
		i := 0
		for b.Loop() {
			reqs[0].Key = keys[i]
			c.take(reqs, d)
			if i++; i == n {
				i = 0
			}
		}
	})
	b.Run("parallel_100k_keys", func(b *testing.B) {
		b.ReportAllocs()
		var next atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			reqs := []storage.Request{{Zone: "z", Algorithm: algorithms.SlidingTail, Rate: rate, Cost: 1}}
			d := make([]algorithms.Decision, 1)
			i := int(next.Add(7919)) % n // start each goroutine elsewhere
			for pb.Next() {
				reqs[0].Key = keys[i]
				c.take(reqs, d)
				if i++; i == n {
					i = 0
				}
			}
		})
	})
}

// ipKey returns a distinct key shaped like an IPv4 address, as most keys are.
func ipKey(i int) string {
	return "10." + strconv.Itoa(i>>16&255) + "." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255)
}

const bytesPerKeyChild = "MEMORY_BYTES_PER_KEY_CHILD"

// BenchmarkMemoryBytesPerKey reports what one more key costs: the growth
// of the process's RSS (rss-B/key) and of the heap in use (heap-B/key)
// between 20,000 and 200,000 distinct keys, divided by 180,000. It
// measures in a fresh process (this test binary, running
// TestMemoryBytesPerKeyChild) so that memory freed by other benchmarks
// cannot hide the growth; ns/op means nothing here.
func BenchmarkMemoryBytesPerKey(b *testing.B) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestMemoryBytesPerKeyChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), bytesPerKeyChild+"=1")
	out, err := cmd.Output()
	if err != nil {
		b.Fatalf("child: %v\n%s", err, out)
	}
	metrics := map[string]float64{}
	for sc := bufio.NewScanner(strings.NewReader(string(out))); sc.Scan(); {
		if name, v, ok := strings.Cut(sc.Text(), "="); ok {
			if f, err := strconv.ParseFloat(v, 64); err == nil {
				metrics[name] = f
			}
		}
	}
	if len(metrics) != 2 {
		b.Fatalf("child printed no figures:\n%s", out)
	}
	for b.Loop() {
	}
	b.ReportMetric(0, "ns/op")
	for name, v := range metrics {
		b.ReportMetric(v, name)
	}
}

// TestMemoryBytesPerKeyChild is the measuring half of
// BenchmarkMemoryBytesPerKey; it runs only when the benchmark starts it.
func TestMemoryBytesPerKeyChild(t *testing.T) {
	if os.Getenv(bytesPerKeyChild) == "" {
		t.Skip("run by BenchmarkMemoryBytesPerKey")
	}
	c := newCounters(DefaultMaxKeys, time.Now)
	defer c.Destruct()
	rate := algorithms.Rate{Units: 1 << 30, Window: time.Hour}
	d := make([]algorithms.Decision, 1)
	fill := func(from, to int) {
		for i := from; i < to; i++ {
			c.take([]storage.Request{{Zone: "z", Key: ipKey(i), Algorithm: algorithms.SlidingTail, Rate: rate, Cost: 1}}, d)
		}
	}
	measure := func() (rss, heap uint64) {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		statm, err := os.ReadFile("/proc/self/statm")
		if err != nil {
			t.Skip("no /proc/self/statm:", err)
		}
		fields := strings.Fields(string(statm))
		pages, err := strconv.ParseUint(fields[1], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return pages * uint64(os.Getpagesize()), ms.HeapInuse
	}
	const small, large = 20_000, 200_000
	fill(0, small)
	rss0, heap0 := measure()
	fill(small, large)
	rss1, heap1 := measure()
	if n := c.len(); n != large {
		t.Fatalf("%d keys held, want %d", n, large)
	}
	fmt.Printf("rss-B/key=%.1f\n", float64(int64(rss1-rss0))/(large-small))
	fmt.Printf("heap-B/key=%.1f\n", float64(int64(heap1-heap0))/(large-small))
}

// len counts the keys held, for tests.
func (c *counters) len() int {
	n := 0
	for i := range c.shards {
		c.shards[i].mu.Lock()
		n += c.shards[i].keys()
		c.shards[i].mu.Unlock()
	}
	return n
}

func TestMemoryShardSize(t *testing.T) {
	if n := unsafe.Sizeof(shard{}); n%64 != 0 {
		t.Fatalf("shard is %d bytes, want a multiple of a 64-byte cache line", n)
	}
}

// roundTripInstants are the instants the round-trip tests store counts
// at: from 1970 to 2100.
var roundTripInstants = []time.Time{
	time.Unix(3, 0),
	vectors.Start,
	vectors.Start.Add(123456789 * time.Millisecond),
	time.Date(2100, 6, 1, 0, 0, 0, 7e6, time.UTC),
}

// TestMemorySlotRoundTrip: a slot keeps 32 bits of Counts.W and finds
// the rest from its expiry: window indexes for windows of 1 ms to 30
// days, and GCRA TATs up to 30 days ahead, at instants from 1970 to 2100,
// read back whole; so does a GCRA TAT moved back by a release of a
// month. A calendar period's index is read back whole too.
func TestMemorySlotRoundTrip(t *testing.T) {
	tokyo, err := time.LoadLocation("Asia/Tokyo")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []algorithms.CalendarPeriod{algorithms.Day, algorithms.Week, algorithms.Month, algorithms.Year} {
		for _, alg := range []algorithms.Algorithm{algorithms.FixedWindow, algorithms.SlidingTail} {
			for _, at := range roundTripInstants {
				r := storage.Request{Algorithm: alg, Rate: algorithms.Rate{Units: 3, Calendar: algorithms.CalendarOf(p, tokyo)}, Cost: 3}
				_, want := algorithms.Decide(alg, algorithms.Counts{}, at, r.Rate, r.Cost)
				var e slot
				e.set(want, alg, expiry(&r, want), false)
				if got := e.counts(r.Rate); got != want {
					t.Fatalf("%s, %s in Tokyo, at %s: read back %+v, want %+v", alg, p, at, got, want)
				}
			}
		}
	}
	month := 30 * 24 * time.Hour
	for _, w := range []time.Duration{time.Millisecond, 7 * time.Millisecond, time.Second, time.Minute, 24 * time.Hour, month} {
		for _, alg := range []algorithms.Algorithm{algorithms.FixedWindow, algorithms.SlidingTail, algorithms.GCRA} {
			for _, at := range roundTripInstants {
				r := storage.Request{Algorithm: alg, Rate: algorithms.Rate{Units: 3, Window: w}, Cost: 3}
				d, want := algorithms.Decide(alg, algorithms.Counts{}, at, r.Rate, r.Cost)
				var e slot
				e.set(want, alg, expiry(&r, want), false)
				if got := e.counts(algorithms.Rate{Window: w}); got != want {
					t.Fatalf("%s, window %s, at %s: read back %+v, want %+v", alg, w, at, got, want)
				}
				if alg == algorithms.GCRA {
					// Through the store, which must move the expiry with
					// the TAT.
					c, clock := newTestCounters(t, DefaultMaxKeys)
					clock.Set(at)
					r.Zone, r.Key = "g", "k"
					c.finish([]storage.Request{r}, []algorithms.Decision{take1(c, r)})
					back := algorithms.Release(alg, want, d, r.Rate, r.Cost)
					if got, _ := c.inspect("g", "k", algorithms.Rate{Window: w}); got != back {
						t.Fatalf("gcra, window %s, at %s, released: read back %+v, want %+v", w, at, got, back)
					}
				}
			}
		}
	}
}

// TestMemoryTakeAllocatesNothing: a take allocates nothing, for every
// algorithm, whether its key is kept already or new (in tables with room
// for it: growing a table allocates).
func TestMemoryTakeAllocatesNothing(t *testing.T) {
	if race.Enabled {
		t.Skip("allocation counts are not asserted under the race detector")
	}
	hour := algorithms.Rate{Units: 1 << 30, Window: time.Hour}
	month := algorithms.Rate{Units: 1 << 30, Calendar: algorithms.CalendarOf(algorithms.Month, time.UTC)}
	for _, z := range []struct {
		name string
		alg  algorithms.Algorithm
		rate algorithms.Rate
	}{
		{"fixed_window", algorithms.FixedWindow, hour}, {"sliding_tail", algorithms.SlidingTail, hour},
		{"gcra", algorithms.GCRA, hour}, {"concurrency", algorithms.Concurrency, hour},
		{"sliding_window", algorithms.SlidingWindow, hour}, {"sliding_tail by the month", algorithms.SlidingTail, month},
	} {
		alg := z.name
		c, _ := newTestCounters(t, DefaultMaxKeys)
		req := storage.Request{Zone: "a", Algorithm: z.alg, Rate: z.rate, Cost: 1}
		reqs := []storage.Request{req}
		d := make([]algorithms.Decision, 1)
		const runs = 1000
		keys := make([]string, runs+1)
		for i := range keys {
			keys[i] = "k" + strconv.Itoa(i)
			reqs[0].Key = keys[i]
			c.take(reqs, d)
		}
		reqs[0].Key = keys[0]
		if n := testing.AllocsPerRun(runs, func() { c.take(reqs, d) }); n != 0 {
			t.Errorf("%s: %v allocations a take of a kept key, want 0", alg, n)
		}
		// Forget the keys, keeping the tables they grew, and take them
		// again as new ones.
		for _, k := range keys {
			c.reset("a", k)
		}
		i := 0
		if n := testing.AllocsPerRun(runs, func() {
			reqs[0].Key = keys[i]
			i++
			c.take(reqs, d)
		}); n != 0 {
			t.Errorf("%s: %v allocations a take of a new key, want 0", alg, n)
		}
	}
}
