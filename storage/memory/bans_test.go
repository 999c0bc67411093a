package memory

import (
	"context"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/algorithms/vectors"
	"github.com/d61b427a/caddy-rate-limit/internal/clocktest"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// loginRequest is a request of a zone that allows two attempts a minute
// and bans for an hour.
func loginRequest(key string) storage.Request {
	return storage.Request{Zone: "login", Key: key, Algorithm: algorithms.FixedWindow,
		Rate: algorithms.Rate{Units: 2, Window: time.Minute}, Cost: 1, Ban: time.Hour, Releasable: true}
}

// failMemory takes req and, if it is allowed, ends it as a failed login:
// its response counted, its cost stays.
func failMemory(c *counters, req storage.Request) algorithms.Decision {
	d := take1(c, req)
	if d.Allowed {
		kept := req
		kept.Counted = true
		c.finish([]storage.Request{kept}, []algorithms.Decision{d})
	}
	return d
}

// TestMemoryEndedBansSwept: the sweep lifts the bans that ended, and
// only those (storetest checks the bans themselves).
func TestMemoryEndedBansSwept(t *testing.T) {
	c, clock := newTestCounters(t, DefaultMaxKeys)
	for range 3 {
		failMemory(c, loginRequest("swept"))
	}
	clock.Add(time.Minute)
	for range 3 {
		failMemory(c, loginRequest("kept"))
	}
	clock.Add(time.Hour - 30*time.Second) // the first ban ended, the second not yet
	c.sweep()
	if n := c.bans(); n != 1 {
		t.Fatalf("%d bans kept after one of two ended, want 1", n)
	}
	if d := take1(c, loginRequest("kept")); d.BanEnds.IsZero() {
		t.Fatalf("the ban that had not ended was lifted: %+v", d)
	}
	clock.Add(time.Minute)
	c.sweep()
	if n := c.bans(); n != 0 {
		t.Fatalf("%d bans kept after they ended", n)
	}
}

// TestMemoryRefusedTellsBans: the store tells a banned key refused
// without a take, against the key's override if it has one, until the
// ban ends; a key over its limit but not banned is for a take to decide
// (storetest checks the rest of storage.Refuser).
func TestMemoryRefusedTellsBans(t *testing.T) {
	clock := clocktest.New(vectors.Start)
	m := New(0, clock.Now)
	t.Cleanup(func() { _ = m.Cleanup() })
	c := m.counters
	req := loginRequest("k")
	for range 3 {
		failMemory(c, req)
	}
	d, ok := m.Refused(req)
	if !ok || !d.BanEnds.Equal(clock.Now().Add(time.Hour)) || d.Limit != 2 {
		t.Fatalf("a banned key: %+v, %v; want refused until the ban's end against the limit 2", d, ok)
	}
	if err := m.SetOverride(context.Background(), "login", "k", storage.Override{Limit: 7}); err != nil {
		t.Fatal(err)
	}
	if d, ok := m.Refused(req); !ok || d.Limit != 7 {
		t.Fatalf("a banned key with an override: %+v, %v; want refused against the override's 7", d, ok)
	}
	over := storage.Request{Zone: "plain", Key: "k", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 1, Window: time.Hour}, Cost: 1}
	take1(c, over)
	if d := take1(c, over); d.Allowed {
		t.Fatalf("a second request against a limit of 1: %+v, want rejected", d)
	}
	if d, ok := m.Refused(over); ok {
		t.Fatalf("a key over its limit, not banned: refused with %+v, want a take to decide", d)
	}
	clock.Add(time.Hour)
	if d, ok := m.Refused(req); ok {
		t.Fatalf("once the ban ended: refused with %+v", d)
	}
}

// TestMemoryBansBounded: a flood of banned keys keeps at most max_keys
// bans, lifting those that end first.
func TestMemoryBansBounded(t *testing.T) {
	c, clock := newTestCounters(t, shardCount)
	for i := range 2000 {
		clock.Add(time.Millisecond)
		req := loginRequest(strconv.Itoa(i))
		req.Rate.Units, req.Releasable = 1, false // the second request is refused, and bans
		take1(c, req)
		if d := take1(c, req); !d.BanStarted {
			t.Fatalf("key %d not banned: %+v", i, d)
		}
	}
	if n := c.bans(); n > shardCount {
		t.Fatalf("%d bans kept, want at most %d", n, shardCount)
	}
	last := loginRequest("1999")
	if d := take1(c, last); d.BanEnds.IsZero() {
		t.Fatal("the newest ban was lifted")
	}
}

// bans counts the memory store's bans, ended or not.
func (c *counters) bans() int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		n += s.bans.len()
		s.mu.Unlock()
	}
	return n
}

// TestMemoryBanQueue: through random bans, re-bans, lifts and sweeps, a
// shard's bans agree with a plain map of them, the ban that ends first is
// at the top of the heap, a new ban past the bound lifts one that ends
// first, and a sweep lifts exactly the bans that ended.
func TestMemoryBanQueue(t *testing.T) {
	const bound = 50
	rng := rand.New(rand.NewPCG(3, 5))
	var q banQueue
	want := map[uint64]int64{}
	now := int64(1_000_000)
	for step := range 20_000 {
		h := uint64(rng.IntN(200) + 1)
		switch op := rng.IntN(10); {
		case op < 6:
			ends := now + int64(rng.IntN(10_000))
			if _, ok := want[h]; !ok && len(want) >= bound {
				soonest := int64(math.MaxInt64)
				for _, e := range want {
					soonest = min(soonest, e)
				}
				lifted := q.heap[0]
				if lifted.ends != soonest {
					t.Fatalf("step %d: the heap's top ends at %d, the soonest ban at %d", step, lifted.ends, soonest)
				}
				delete(want, lifted.h)
			}
			q.set(h, ends, bound)
			want[h] = ends
		case op < 8:
			_, had := want[h]
			if got := q.remove(h); got != had {
				t.Fatalf("step %d: remove reported %v, want %v", step, got, had)
			}
			delete(want, h)
		default:
			now += int64(rng.IntN(2000))
			q.expire(now)
			for k, e := range want {
				if e <= now {
					delete(want, k)
				}
			}
		}
		checkBans(t, step, &q, want)
	}
}

// checkBans checks that q holds the bans want, and that its heap and its
// index agree.
func checkBans(t *testing.T, step int, q *banQueue, want map[uint64]int64) {
	t.Helper()
	if q.len() != len(want) || len(q.at) != len(want) {
		t.Fatalf("step %d: %d bans in the heap, %d in the index, want %d", step, q.len(), len(q.at), len(want))
	}
	for h, e := range want {
		if got, ok := q.ends(h); !ok || got != e {
			t.Fatalf("step %d: ban of %d ends at %d (%v), want %d", step, h, got, ok, e)
		}
	}
	for i := range q.heap {
		if int(q.at[q.heap[i].h]) != i {
			t.Fatalf("step %d: the index puts %d at %d, the heap at %d", step, q.heap[i].h, q.at[q.heap[i].h], i)
		}
		if i > 0 && q.heap[(i-1)/2].ends > q.heap[i].ends {
			t.Fatalf("step %d: heap position %d ends before its parent", step, i)
		}
	}
}

// BenchmarkMemoryBanFull: a new ban in shards that each hold as many
// bans as their bound (2,000 here), so every ban lifts the one that
// ends first.
func BenchmarkMemoryBanFull(b *testing.B) {
	const perShard = 2000
	c := newCounters(shardCount*perShard, time.Now)
	defer c.Destruct()
	ban := func(i int) {
		req := loginRequest(strconv.Itoa(i))
		req.Rate.Units, req.Cost = 1, 2 // never allowed: banned at once
		take1(c, req)
	}
	i := 0
	for ; i < 2*shardCount*perShard; i++ {
		ban(i)
	}
	b.ReportAllocs()
	for b.Loop() {
		ban(i)
		i++
	}
}
