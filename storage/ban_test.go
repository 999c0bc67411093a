package storage

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
)

// loginRequest is a request of a zone that allows two attempts a minute
// and bans for an hour.
func loginRequest(key string) Request {
	return Request{Zone: "login", Key: key, Algorithm: algorithms.FixedWindow,
		Rate: algorithms.Rate{Units: 2, Window: time.Minute}, Cost: 1, Ban: time.Hour, GivesBack: true}
}

// TestMemoryBan: the first rejection bans the key for the zone's ban,
// past the end of its window; only requests that carry a ban honour it;
// a reset lifts it, and it ends by itself.
func TestMemoryBan(t *testing.T) {
	c, clock := newTestCounters(t, DefaultMaxKeys)
	m := &Memory{counters: c}
	req := loginRequest("k")
	take1(c, req)
	take1(c, req)
	start := clock.Now()
	d := take1(c, req)
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
	if d := take1(c, req); !d.Allowed {
		t.Fatalf("after a reset: %+v, want allowed", d)
	}
	for range 3 {
		take1(c, req)
	}
	clock.Add(time.Hour)
	if d := take1(c, req); !d.Allowed {
		t.Fatalf("after the ban: %+v, want allowed", d)
	}
	// An ended ban is swept.
	for range 3 {
		take1(c, loginRequest("swept"))
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
		n += len(s.bans)
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
	redisTake(t, a, time.Time{}, req)
	redisTake(t, a, time.Time{}, req)
	d := redisTake(t, a, time.Time{}, req)[0]
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
	redisTake(t, r, time.Time{}, req)
	if d := redisTake(t, r, time.Time{}, req)[0]; !d.BanStarted {
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
