package storage

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/algorithms/vectors"
	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
)

// loginRequest is a request of a zone that allows two attempts a minute
// and bans for an hour.
func loginRequest(key string) Request {
	return Request{Zone: "login", Key: key, Algorithm: algorithms.FixedWindow,
		Rate: algorithms.Rate{Units: 2, Window: time.Minute}, Cost: 1, Ban: time.Hour, GivesBack: true}
}

// failMemory takes req and, if it is allowed, ends it as a failed login:
// its response counted, its cost stays.
func failMemory(c *memoryCounters, req Request) algorithms.Decision {
	d := take1(c, req)
	if d.Allowed {
		kept := req
		kept.Counted = true
		c.release([]Request{kept}, []algorithms.Decision{d})
	}
	return d
}

// TestMemoryBanVectors plays the shared ban cases on the memory store.
func TestMemoryBanVectors(t *testing.T) {
	c, clock := newTestCounters(t, DefaultMaxKeys)
	vectors.RunBans(t, func(t *testing.T, now time.Time, vc vectors.BanCase, key string, cost int64) algorithms.Decision {
		clock.Set(now)
		return take1(c, banVectorRequest(vc, key, cost))
	}, func(t *testing.T, now time.Time, vc vectors.BanCase, key string, cost int64, d algorithms.Decision, kept bool) {
		clock.Set(now)
		req := banVectorRequest(vc, key, cost)
		req.Counted = kept
		c.release([]Request{req}, []algorithms.Decision{d})
	})
}

// banVectorRequest is a request of a shared ban case.
func banVectorRequest(vc vectors.BanCase, key string, cost int64) Request {
	return Request{Zone: "z", Key: key, Algorithm: vc.Algorithm, Rate: vc.Rate, Cost: cost, Ban: vc.Ban, GivesBack: true}
}

// TestMemoryBan: the first rejection on the settled count bans the key for
// the zone's ban, past the end of its window; only requests that carry a
// ban honour it; a reset lifts it, and it ends by itself.
func TestMemoryBan(t *testing.T) {
	c, clock := newTestCounters(t, DefaultMaxKeys)
	m := &Memory{counters: c}
	req := loginRequest("k")
	failMemory(c, req)
	failMemory(c, req)
	start := clock.Now()
	d := failMemory(c, req)
	ends := start.Add(time.Hour)
	if d.Allowed || !d.BanStarted || !d.BanEnds.Equal(ends) || !d.RetryAt.Equal(ends) {
		t.Fatalf("third attempt: %+v, want a ban until %s", d, ends)
	}
	clock.Add(30 * time.Minute) // the window is long over
	if d := take1(c, req); d.Allowed || d.BanStarted || !d.RetryAt.Equal(ends) || d.Remaining != 0 {
		t.Fatalf("half an hour later: %+v, want still banned until %s", d, ends)
	}
	unbanned := req
	unbanned.Ban = 0
	if d := take1(c, unbanned); !d.Allowed {
		t.Fatalf("a request without a ban (the zone's ban removed): %+v, want allowed", d)
	}
	st, _ := m.KeyState(context.Background(), "login", "k", time.Minute)
	if !st.BanEnds.Equal(ends) {
		t.Fatalf("key state ban %s, want %s", st.BanEnds, ends)
	}
	if err := m.ResetKey(context.Background(), "login", "k"); err != nil {
		t.Fatal(err)
	}
	if d := failMemory(c, req); !d.Allowed {
		t.Fatalf("after a reset: %+v, want allowed", d)
	}
	for range 3 {
		failMemory(c, req)
	}
	clock.Add(time.Hour)
	if d := failMemory(c, req); !d.Allowed {
		t.Fatalf("after the ban: %+v, want allowed", d)
	}
	// An ended ban is swept.
	for range 3 {
		failMemory(c, loginRequest("swept"))
	}
	clock.Add(2 * time.Hour)
	c.sweep()
	if n := c.bans(); n != 0 {
		t.Fatalf("%d bans kept after they ended", n)
	}
}

// TestMemoryBansBounded: a flood of banned keys keeps at most max_keys
// bans, lifting those that end first.
func TestMemoryBansBounded(t *testing.T) {
	c, clock := newTestCounters(t, memoryShards)
	for i := range 2000 {
		clock.Add(time.Millisecond)
		req := loginRequest(strconv.Itoa(i))
		req.Rate.Units, req.Cost = 1, 2 // never allowed: banned at once
		if d := take1(c, req); !d.BanStarted {
			t.Fatalf("key %d not banned: %+v", i, d)
		}
	}
	if n := c.bans(); n > memoryShards {
		t.Fatalf("%d bans kept, want at most %d", n, memoryShards)
	}
	last := loginRequest("1999")
	if d := take1(c, last); d.BanEnds.IsZero() {
		t.Fatal("the newest ban was lifted")
	}
}

// bans counts the memory store's bans, ended or not.
func (c *memoryCounters) bans() int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		n += s.bans.len()
		s.mu.Unlock()
	}
	return n
}

// TestMemoryGiveBack: a cost given back comes off the window it was
// charged in, and a GCRA bucket refills by it.
func TestMemoryGiveBack(t *testing.T) {
	c, clock := newTestCounters(t, DefaultMaxKeys)
	req := Request{Zone: "gb", Key: "k", Algorithm: algorithms.SlidingTail, Rate: algorithms.Rate{Units: 10, Window: time.Minute}, Cost: 3, GivesBack: true}
	first := take1(c, req)
	take1(c, req)
	c.release([]Request{req}, []algorithms.Decision{first})
	if got, _ := c.inspect("gb", "k", req.Rate.Window.Milliseconds()); got.Current != 3 {
		t.Fatalf("after giving one back: %+v, want 3 counted", got)
	}
	// The next window: the cost comes off the previous one.
	clock.Add(time.Minute)
	second := take1(c, req)
	c.release([]Request{req}, []algorithms.Decision{first})
	if got, _ := c.inspect("gb", "k", req.Rate.Window.Milliseconds()); got.Previous != 0 || got.Current != 3 {
		t.Fatalf("after giving back a cost of the previous window: %+v, want 0 previous, 3 current", got)
	}
	c.release([]Request{req}, []algorithms.Decision{second})
	if got, _ := c.inspect("gb", "k", req.Rate.Window.Milliseconds()); got.Current != 0 {
		t.Fatalf("after giving back the current window's: %+v, want nothing counted", got)
	}

	g := Request{Zone: "gb", Key: "g", Algorithm: algorithms.GCRA, Rate: algorithms.Rate{Units: 4, Window: time.Minute}, Cost: 4, GivesBack: true}
	d := take1(c, g)
	c.release([]Request{g}, []algorithms.Decision{d})
	if d := take1(c, g); !d.Allowed {
		t.Fatalf("a gcra bucket emptied and given back: %+v, want full again", d)
	}
}

// failRedis takes req from r on the server's clock and, if it is
// allowed, ends it as a failed login: its response counted, its cost
// stays.
func failRedis(t *testing.T, r *Redis, req Request) algorithms.Decision {
	t.Helper()
	d := redisTake(t, r, time.Time{}, req)[0]
	if d.Allowed {
		kept := req
		kept.Counted = true
		if err := r.Release(context.Background(), []Request{kept}, []algorithms.Decision{d}); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// TestRedisBanVectors plays the shared ban cases on the Redis store.
func TestRedisBanVectors(t *testing.T) {
	s := redistest.Standalone(t)
	r := newRedisStore(t, new(Redis), s.URL())
	vectors.RunBans(t, func(t *testing.T, now time.Time, vc vectors.BanCase, key string, cost int64) algorithms.Decision {
		return redisTake(t, r, now, banVectorRequest(vc, key, cost))[0]
	}, func(t *testing.T, now time.Time, vc vectors.BanCase, key string, cost int64, d algorithms.Decision, kept bool) {
		req := banVectorRequest(vc, key, cost)
		req.Counted = kept
		if err := r.Release(context.Background(), []Request{req}, []algorithms.Decision{d}); err != nil {
			t.Fatal(err)
		}
	})
}

// TestRedisBan: a ban lives in Redis beside the counts and holds for every
// instance; the deny cache keeps it whatever the cost; requests without a
// ban ignore it; an override does not cut it short; a reset lifts it on
// every instance.
func TestRedisBan(t *testing.T) {
	s := redistest.Standalone(t)
	prefix := "ban:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
	a := newRedisStore(t, &Redis{KeyPrefix: prefix}, s.URL())
	b := newRedisStore(t, &Redis{KeyPrefix: prefix, Timeout: caddy.Duration(time.Second + time.Millisecond)}, s.URL())
	req := loginRequest("k")
	failRedis(t, a, req)
	failRedis(t, a, req)
	d := failRedis(t, a, req)
	if d.Allowed || !d.BanStarted || !d.RetryAt.Equal(d.BanEnds) || d.BanEnds.Before(time.Now().Add(59*time.Minute)) {
		t.Fatalf("third attempt: %+v, want a ban of an hour", d)
	}
	key := a.counterKey("login", "k")
	if ttl, err := s.Do("PTTL", key); err != nil || mustInt(t, ttl) < (59*time.Minute).Milliseconds() {
		t.Fatalf("the key expires in %s ms (%v), want the ban's hour", ttl, err)
	}
	before := scriptCalls(t, s)
	cheaper := req
	cheaper.Cost = 0
	for _, q := range []Request{req, cheaper} {
		if d2 := redisTake(t, a, time.Time{}, q)[0]; d2.Allowed || d2.BanStarted || !d2.BanEnds.Equal(d.BanEnds) {
			t.Fatalf("cost %d on the banned key: %+v, want the same ban", q.Cost, d2)
		}
	}
	if after := scriptCalls(t, s); after != before {
		t.Fatalf("%d script calls for a banned key, want 0: the deny cache holds bans", after-before)
	}
	if d2 := redisTake(t, b, time.Time{}, cheaper)[0]; d2.Allowed || d2.BanStarted || d2.BanEnds.Sub(d.BanEnds).Abs() > time.Second {
		t.Fatalf("another instance: %+v, want the same ban", d2)
	}
	unbanned := cheaper
	unbanned.Ban = 0
	if d2 := redisTake(t, a, time.Time{}, unbanned)[0]; !d2.Allowed {
		t.Fatalf("a request without a ban: %+v, want allowed", d2)
	}
	// An override that ends in a second does not take the ban with it.
	if err := a.SetOverride(context.Background(), "login", "k", Override{Limit: 5, Expires: time.Now().Add(time.Second)}); err != nil {
		t.Fatal(err)
	}
	if err := a.DeleteOverride(context.Background(), "login", "k"); err != nil {
		t.Fatal(err)
	}
	st, err := b.KeyState(context.Background(), "login", "k", time.Minute)
	if err != nil || st.BanEnds.Sub(d.BanEnds).Abs() > time.Second {
		t.Fatalf("key state %+v (%v), want the ban until %s", st, err, d.BanEnds)
	}
	if err := a.ResetKey(context.Background(), "login", "k"); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*Redis{a, b} {
		waitUntil(t, "the reset reaches every instance", func() bool { return redisTake(t, r, time.Time{}, req)[0].Allowed })
	}
}

// TestRedisBanUnderOverride: a key banned while a per-key limit is in
// force keeps its ban past the override's end.
func TestRedisBanUnderOverride(t *testing.T) {
	s := redistest.Standalone(t)
	r := newRedisStore(t, new(Redis), s.URL())
	ctx := context.Background()
	if err := r.SetOverride(ctx, "login", "o", Override{Limit: 1, Expires: time.Now().Add(2 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	req := loginRequest("o")
	failRedis(t, r, req)
	if d := failRedis(t, r, req); !d.BanStarted {
		t.Fatalf("over the override's limit: %+v, want a ban", d)
	}
	if ttl, err := s.Do("PTTL", r.counterKey("login", "o")); err != nil || mustInt(t, ttl) < (59*time.Minute).Milliseconds() {
		t.Fatalf("the key expires in %s ms (%v), want the ban's hour", ttl, err)
	}
}

// TestRedisGiveBack: a cost given back comes off the window it was
// charged in, in Redis; a zone whose costs come back keeps no rejection
// in the deny cache, so a cost given back is usable at once.
func TestRedisGiveBack(t *testing.T) {
	s := redistest.Standalone(t)
	r := newRedisStore(t, new(Redis), s.URL())
	at := time.UnixMilli(time.Now().UnixMilli() / 60000 * 60000).Add(time.Hour) // a window's start
	req := Request{Zone: "gb", Key: "k", Algorithm: algorithms.SlidingTail, Rate: algorithms.Rate{Units: 10, Window: time.Minute}, Cost: 3, GivesBack: true}
	first := redisTake(t, r, at, req)[0]
	redisTake(t, r, at, req)
	giveBack := func(q Request, d algorithms.Decision) {
		t.Helper()
		if err := r.Release(context.Background(), []Request{q}, []algorithms.Decision{d}); err != nil {
			t.Fatal(err)
		}
	}
	giveBack(req, first)
	if n := hashField(t, s, r.counterKey("gb", "k"), "c"); n != 3 {
		t.Fatalf("after giving one back: %d counted, want 3", n)
	}
	second := redisTake(t, r, at.Add(time.Minute), req)[0]
	giveBack(req, first)
	if p, c := hashField(t, s, r.counterKey("gb", "k"), "p"), hashField(t, s, r.counterKey("gb", "k"), "c"); p != 0 || c != 3 {
		t.Fatalf("after giving back a cost of the previous window: previous %d, current %d; want 0, 3", p, c)
	}
	giveBack(req, second)
	if c := hashField(t, s, r.counterKey("gb", "k"), "c"); c != 0 {
		t.Fatalf("after giving back the current window's: %d counted, want 0", c)
	}

	// On the server's clock, with the deny cache.
	one := Request{Zone: "gb", Key: "one", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 1, Window: time.Hour}, Cost: 1, GivesBack: true}
	held := redisTake(t, r, time.Time{}, one)[0]
	if d := redisTake(t, r, time.Time{}, one)[0]; d.Allowed {
		t.Fatalf("second of one: %+v, want rejected", d)
	}
	giveBack(one, held)
	if d := redisTake(t, r, time.Time{}, one)[0]; !d.Allowed {
		t.Fatalf("after the first was given back: %+v, want allowed", d)
	}

	g := Request{Zone: "gb", Key: "g", Algorithm: algorithms.GCRA, Rate: algorithms.Rate{Units: 4, Window: time.Minute}, Cost: 4, GivesBack: true}
	d := redisTake(t, r, time.Time{}, g)[0]
	giveBack(g, d)
	if d := redisTake(t, r, time.Time{}, g)[0]; !d.Allowed {
		t.Fatalf("a gcra bucket emptied and given back: %+v, want full again", d)
	}
}

// TestRedisLeaseGiveBack: with leases, costs given back go into the
// lease without a call; Redis ends with exactly the costs kept.
func TestRedisLeaseGiveBack(t *testing.T) {
	s := redistest.Standalone(t)
	r := leaseStore(t, s, fmt.Sprintf("lgb%d:", time.Now().UnixNano()), 0)
	fleetOf(t, s, 1, r)
	req := Request{Zone: "lgb", Key: "k", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 1000, Window: time.Hour}, Cost: 1, GivesBack: true}
	before, _ := s.ScriptCalls()
	for i := range 500 {
		d := redisTake(t, r, time.Time{}, req)[0]
		if !d.Allowed {
			t.Fatalf("request %d: %+v", i, d)
		}
		if i%10 == 0 {
			continue // kept: its response's status was listed
		}
		if err := r.Release(context.Background(), []Request{req}, []algorithms.Decision{d}); err != nil {
			t.Fatal(err)
		}
	}
	calls, _ := s.ScriptCalls()
	if calls-before > 20 {
		t.Fatalf("%d script calls for 500 requests and 450 give-backs, want few", calls-before)
	}
	waitUntil(t, "the leases go back", func() bool { return leasedUnits(r) == 0 })
	if n := counted(t, s, r, "lgb", "k"); n != 50 {
		t.Fatalf("Redis counts %d, want the 50 kept", n)
	}
}

func hashField(t *testing.T, s *redistest.Server, key, field string) int64 {
	t.Helper()
	v, err := s.Do("HGET", key, field)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.ParseInt(v, 10, 64)
	return n
}

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRedisNoLeaseForBans: a zone that bans takes no leases, however much
// room it has: an instance spending leased units would admit a key that
// another instance has just banned.
func TestRedisNoLeaseForBans(t *testing.T) {
	s := redistest.Standalone(t)
	r := leaseStore(t, s, fmt.Sprintf("nlb%d:", time.Now().UnixNano()), 0)
	fleetOf(t, s, 1, r)
	req := Request{Zone: "nlb", Key: "k", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 1000, Window: time.Hour}, Cost: 1, Ban: time.Hour}
	for range 50 {
		redisTake(t, r, time.Time{}, req)
	}
	if n := leasedUnits(r); n != 0 {
		t.Fatalf("%d units leased for a zone that bans, want none", n)
	}
	if n := counted(t, s, r, "nlb", "k"); n != 50 {
		t.Fatalf("Redis counts %d, want the 50 requests", n)
	}
}

// TestBansAgreeInBothStores: random requests of zones that ban and give
// costs back, taken and ended (their costs kept or given back) in random
// order over a few windows, get the same decisions from the memory store
// and from Redis, step by step: the same refusals for costs in flight,
// the same bans.
func TestBansAgreeInBothStores(t *testing.T) {
	s := redistest.Standalone(t)
	r := newRedisStore(t, new(Redis), s.URL())
	c, clock := newTestCounters(t, DefaultMaxKeys)
	rng := rand.New(rand.NewPCG(33, 12))
	for _, alg := range []algorithms.Algorithm{algorithms.FixedWindow, algorithms.SlidingTail, algorithms.SlidingWindow, algorithms.GCRA} {
		t.Run(string(alg), func(t *testing.T) {
			inFlight, bans := 0, 0
			for k := range 20 {
				req := Request{Zone: "agree", Key: fmt.Sprint(alg, k), Algorithm: alg, GivesBack: true,
					Rate: algorithms.Rate{Units: 1 + rng.Int64N(6), Window: time.Duration(1000+rng.Int64N(20000)) * time.Millisecond},
					Ban:  time.Duration(1+rng.Int64N(10)) * time.Second}
				if alg == algorithms.SlidingWindow {
					req.Rate.Buckets = 2 + rng.IntN(5)
				}
				if alg == algorithms.GCRA {
					req.Rate.Burst = rng.Int64N(2 * req.Rate.Units)
				}
				type taken struct {
					req     Request
					memory  algorithms.Decision
					redisAt algorithms.Decision
				}
				var flying []taken
				now := vectors.Start.Add(time.Duration(rng.Int64N(60_000)) * time.Millisecond)
				for step := range 60 {
					now = now.Add(time.Duration(rng.Int64N(req.Rate.Window.Milliseconds()/2+1)) * time.Millisecond)
					clock.Set(now)
					if len(flying) > 0 && rng.IntN(3) == 0 {
						i := rng.IntN(len(flying))
						f := flying[i]
						flying = slices.Delete(flying, i, i+1)
						f.req.Counted = rng.IntN(2) == 0
						c.release([]Request{f.req}, []algorithms.Decision{f.memory})
						if err := r.Release(context.Background(), []Request{f.req}, []algorithms.Decision{f.redisAt}); err != nil {
							t.Fatal(err)
						}
						continue
					}
					q := req
					q.Cost = rng.Int64N(3)
					if alg == algorithms.GCRA {
						q.Cost++
					}
					dm := take1(c, q)
					dr := redisTake(t, r, now, q)[0]
					if dm != dr {
						t.Fatalf("key %d step %d (%+v):\nmemory %+v\nredis  %+v", k, step, q, dm, dr)
					}
					if dm.Allowed && q.Cost > 0 {
						flying = append(flying, taken{q, dm, dr})
					}
					if dm.InFlight {
						inFlight++
					}
					if dm.BanStarted {
						bans++
					}
				}
			}
			if inFlight == 0 || bans == 0 {
				t.Fatalf("%d refusals for costs in flight and %d bans: the test does not reach them", inFlight, bans)
			}
			t.Logf("%d refusals for costs in flight, %d bans", inFlight, bans)
		})
	}
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
	c := newMemoryCounters(memoryShards*perShard, time.Now)
	defer c.Destruct()
	ban := func(i int) {
		req := loginRequest(strconv.Itoa(i))
		req.Rate.Units, req.Cost = 1, 2 // never allowed: banned at once
		take1(c, req)
	}
	i := 0
	for ; i < 2*memoryShards*perShard; i++ {
		ban(i)
	}
	b.ReportAllocs()
	for b.Loop() {
		ban(i)
		i++
	}
}
