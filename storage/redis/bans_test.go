package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/algorithms/vectors"
	"github.com/d61b427a/caddy-rate-limit/internal/clocktest"
	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
	"github.com/d61b427a/caddy-rate-limit/internal/wait"
	"github.com/d61b427a/caddy-rate-limit/storage"
	"github.com/d61b427a/caddy-rate-limit/storage/memory"
)

// loginRequest is a request of a zone that allows two attempts a minute
// and bans for an hour.
func loginRequest(key string) storage.Request {
	return storage.Request{Zone: "login", Key: key, Algorithm: algorithms.FixedWindow,
		Rate: algorithms.Rate{Units: 2, Window: time.Minute}, Cost: 1, Ban: time.Hour, Releasable: true}
}

// failRedis takes req from r on the server's clock and, if it is
// allowed, ends it as a failed login: its response counted, its cost
// stays.
func failRedis(t *testing.T, r *Store, req storage.Request) algorithms.Decision {
	t.Helper()
	d := redisTake(t, r, time.Time{}, req)[0]
	if d.Allowed {
		kept := req
		kept.Counted = true
		if err := r.Finish(context.Background(), []storage.Request{kept}, []algorithms.Decision{d}); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// TestRedisBan: a ban lives in Redis beside the counts and holds for every
// instance; the deny cache keeps it whatever the cost; requests without a
// ban ignore it; an override does not cut it short; a reset lifts it on
// every instance.
func TestRedisBan(t *testing.T) {
	s := redistest.Standalone(t)
	prefix := "ban:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
	a := newRedisStore(t, &Store{KeyPrefix: prefix}, s.URL())
	b := newRedisStore(t, &Store{KeyPrefix: prefix, Timeout: caddy.Duration(time.Second + time.Millisecond)}, s.URL())
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
	for _, q := range []storage.Request{req, cheaper} {
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
	if err := a.SetOverride(context.Background(), "login", "k", storage.Override{Limit: 5, Expires: time.Now().Add(time.Second)}); err != nil {
		t.Fatal(err)
	}
	if err := a.DeleteOverride(context.Background(), "login", "k"); err != nil {
		t.Fatal(err)
	}
	st, err := b.KeyState(context.Background(), "login", "k", algorithms.Rate{Window: time.Minute})
	if err != nil || st.BanEnds.Sub(d.BanEnds).Abs() > time.Second {
		t.Fatalf("key state %+v (%v), want the ban until %s", st, err, d.BanEnds)
	}
	if err := a.ResetKey(context.Background(), "login", "k"); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*Store{a, b} {
		wait.For(t, "the reset reaches every instance", func() bool { return redisTake(t, r, time.Time{}, req)[0].Allowed })
	}
}

// TestRedisBanUnderOverride: a key banned while a per-key limit is in
// force keeps its ban past the override's end.
func TestRedisBanUnderOverride(t *testing.T) {
	s := redistest.Standalone(t)
	r := newRedisStore(t, new(Store), s.URL())
	ctx := context.Background()
	if err := r.SetOverride(ctx, "login", "o", storage.Override{Limit: 1, Expires: time.Now().Add(2 * time.Second)}); err != nil {
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

// TestRedisReleaseNotCached: a zone whose costs are released keeps no
// rejection in the deny cache, so a cost released is usable at once, on
// the server's clock (storetest checks the releases themselves).
func TestRedisReleaseNotCached(t *testing.T) {
	s := redistest.Standalone(t)
	r := newRedisStore(t, new(Store), s.URL())
	one := storage.Request{Zone: "gb", Key: "one", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 1, Window: time.Hour}, Cost: 1, Releasable: true}
	held := redisTake(t, r, time.Time{}, one)[0]
	if d := redisTake(t, r, time.Time{}, one)[0]; d.Allowed {
		t.Fatalf("second of one: %+v, want rejected", d)
	}
	if err := r.Finish(context.Background(), []storage.Request{one}, []algorithms.Decision{held}); err != nil {
		t.Fatal(err)
	}
	if d := redisTake(t, r, time.Time{}, one)[0]; !d.Allowed {
		t.Fatalf("after the first was released: %+v, want allowed", d)
	}
}

// TestRedisLeaseRelease: with leases, costs released go into the
// lease without a call; Redis ends with exactly the costs kept.
func TestRedisLeaseRelease(t *testing.T) {
	s := redistest.Standalone(t)
	r := leaseStore(t, s, fmt.Sprintf("lgb%d:", time.Now().UnixNano()), 0)
	fleetOf(t, s, 1, r)
	req := storage.Request{Zone: "lgb", Key: "k", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 1000, Window: time.Hour}, Cost: 1, Releasable: true}
	before, _ := s.ScriptCalls()
	for i := range 500 {
		d := redisTake(t, r, time.Time{}, req)[0]
		if !d.Allowed {
			t.Fatalf("request %d: %+v", i, d)
		}
		if i%10 == 0 {
			continue // kept: its response's status was listed
		}
		if err := r.Finish(context.Background(), []storage.Request{req}, []algorithms.Decision{d}); err != nil {
			t.Fatal(err)
		}
	}
	calls, _ := s.ScriptCalls()
	if calls-before > 20 {
		t.Fatalf("%d script calls for 500 requests and 450 releases, want few", calls-before)
	}
	wait.For(t, "the leases to be released", func() bool { return leasedUnits(r) == 0 })
	if n := counted(t, s, r, "lgb", "k"); n != 50 {
		t.Fatalf("Redis counts %d, want the 50 kept", n)
	}
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
// room it has: an instance taking leased units would admit a key that
// another instance has just banned.
func TestRedisNoLeaseForBans(t *testing.T) {
	s := redistest.Standalone(t)
	r := leaseStore(t, s, fmt.Sprintf("nlb%d:", time.Now().UnixNano()), 0)
	fleetOf(t, s, 1, r)
	req := storage.Request{Zone: "nlb", Key: "k", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 1000, Window: time.Hour}, Cost: 1, Ban: time.Hour}
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

// TestBansAgreeWithMemory: random requests of zones that ban and release
// costs, taken and ended (their costs kept or released) in random
// order over a few windows, get the same decisions from Redis as from the
// memory store, whose Go is the rules' reference, step by step: the same
// refusals for costs in flight, the same bans.
func TestBansAgreeWithMemory(t *testing.T) {
	s := redistest.Standalone(t)
	r := newRedisStore(t, new(Store), s.URL())
	clock := clocktest.New(vectors.Start)
	m := memory.New(0, clock.Now)
	t.Cleanup(func() { _ = m.Cleanup() })
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(33, 12))
	for _, alg := range []algorithms.Algorithm{algorithms.FixedWindow, algorithms.SlidingTail, algorithms.SlidingWindow, algorithms.GCRA} {
		t.Run(string(alg), func(t *testing.T) {
			inFlight, bans := 0, 0
			for k := range 20 {
				req := storage.Request{Zone: "agree", Key: fmt.Sprint(alg, k), Algorithm: alg, Releasable: true,
					Rate: algorithms.Rate{Units: 1 + rng.Int64N(6), Window: time.Duration(1000+rng.Int64N(20000)) * time.Millisecond},
					Ban:  time.Duration(1+rng.Int64N(10)) * time.Second}
				if alg == algorithms.SlidingWindow {
					req.Rate.Buckets = 2 + rng.IntN(5)
				}
				if alg == algorithms.GCRA {
					req.Rate.Burst = rng.Int64N(2 * req.Rate.Units)
				}
				type taken struct {
					req     storage.Request
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
						if err := m.Finish(ctx, []storage.Request{f.req}, []algorithms.Decision{f.memory}); err != nil {
							t.Fatal(err)
						}
						if err := r.Finish(ctx, []storage.Request{f.req}, []algorithms.Decision{f.redisAt}); err != nil {
							t.Fatal(err)
						}
						continue
					}
					q := req
					q.Cost = rng.Int64N(3)
					if alg == algorithms.GCRA {
						q.Cost++
					}
					taken1 := make([]algorithms.Decision, 1)
					if err := m.Take(ctx, []storage.Request{q}, taken1); err != nil {
						t.Fatal(err)
					}
					dm := taken1[0]
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

// TestRedisRefused: the store tells from its deny cache, with no script
// call, that a key is refused: a ban, whatever the request costs, and
// another rejection for the costs it stands for; not a request that
// could take from a lease (lease on), which Take answers first.
func TestRedisRefused(t *testing.T) {
	s := redistest.Standalone(t)
	r := newRedisStore(t, &Store{}, s.URL())
	refused := func(r *Store, q storage.Request) (algorithms.Decision, bool) {
		q.Key = storage.BoundKey(q.Key)
		return r.Refused(q)
	}
	req := loginRequest("k")
	failRedis(t, r, req)
	failRedis(t, r, req)
	ban := failRedis(t, r, req)
	plain := storage.Request{Zone: "plain", Key: "p", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 2, Window: time.Hour}, Cost: 2}
	redisTake(t, r, time.Time{}, plain)
	if d := redisTake(t, r, time.Time{}, plain)[0]; d.Allowed {
		t.Fatalf("a second request of cost 2 against a limit of 2: %+v, want rejected", d)
	}
	before := scriptCalls(t, s)
	free := req
	free.Cost = 0
	for _, q := range []storage.Request{req, free} {
		if d, ok := refused(r, q); !ok || !d.BanEnds.Equal(ban.BanEnds) || !d.RetryAt.Equal(ban.BanEnds) {
			t.Fatalf("cost %d on the banned key: %+v, %v; want the ban", q.Cost, d, ok)
		}
	}
	if d, ok := refused(r, plain); !ok || d.Allowed || d.RetryAt.IsZero() {
		t.Fatalf("a request of the rejected cost: %+v, %v; want the rejection", d, ok)
	}
	cheaper := plain
	cheaper.Cost = 1
	if d, ok := refused(r, cheaper); ok {
		t.Fatalf("a cheaper request than the one rejected: refused with %+v, want a take to decide", d)
	}
	if after := scriptCalls(t, s); after != before {
		t.Fatalf("%d script calls telling refusals, want 0", after-before)
	}
	leasing := newRedisStore(t, &Store{Lease: true}, s.URL())
	redisTake(t, leasing, time.Time{}, plain)
	redisTake(t, leasing, time.Time{}, plain)
	if d, ok := refused(leasing, plain); ok {
		t.Fatalf("lease on, a request that could take from a lease: refused with %+v, want Take to decide", d)
	}
	failRedis(t, leasing, loginRequest("l"))
	failRedis(t, leasing, loginRequest("l"))
	failRedis(t, leasing, loginRequest("l"))
	if _, ok := refused(leasing, loginRequest("l")); !ok {
		t.Fatalf("lease on, a banned key: not refused, want the ban (a zone that bans takes no lease)")
	}
}
