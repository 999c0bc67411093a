package redis

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"math/big"
	"math/rand/v2"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	goredis "github.com/redis/go-redis/v9"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/algorithms/vectors"
	"github.com/d61b427a/caddy-rate-limit/internal/clocktest"
	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
	"github.com/d61b427a/caddy-rate-limit/internal/wait"
	"github.com/d61b427a/caddy-rate-limit/storage"
	"github.com/d61b427a/caddy-rate-limit/storage/storetest"
)

var poolTimeout = goredis.ErrPoolTimeout

// newRedisStore provisions a Redis store for addresses with a key prefix of
// its own, and cleans it up when t ends.
func newRedisStore(t testing.TB, r *Store, addresses ...string) *Store {
	t.Helper()
	r.Addresses = addresses
	if r.Timeout == 0 {
		// Generous: on a busy machine (the race detector, two suites at
		// once) a script call can take longer than the default 50ms, and
		// a test that is not about timeouts must not fail for that.
		r.Timeout = caddy.Duration(5 * time.Second)
	}
	if r.KeyPrefix == "" {
		r.KeyPrefix = "test:" + strconv.FormatInt(rand.Int64(), 36) + ":"
	}
	if err := r.Provision(caddy.Context{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Cleanup() })
	return r
}

// scriptCalls returns how many script calls s has run.
func scriptCalls(t testing.TB, s *redistest.Server) int {
	t.Helper()
	n, err := s.ScriptCalls()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// redisTake takes requests from the store at instant at (the script's
// clock), or the server's clock if at is zero.
func redisTake(t testing.TB, r *Store, at time.Time, reqs ...storage.Request) []algorithms.Decision {
	t.Helper()
	d := make([]algorithms.Decision, len(reqs))
	for i := range reqs {
		reqs[i].Key = storage.BoundKey(reqs[i].Key)
	}
	if !at.IsZero() {
		r.scriptClock = func() time.Time { return at }
		defer func() { r.scriptClock = nil }()
	}
	if err := r.Take(context.Background(), reqs, d); err != nil {
		t.Fatal(err)
	}
	return d
}

// storeOn returns the suite's constructor of stores on Redis at
// addresses: each with a key prefix of its own, deciding by the suite's
// clock, which is the scripts' clock (and so without the deny cache).
func storeOn(r func() *Store, addresses ...string) storetest.NewStore {
	return func(t *testing.T, now func() time.Time) storage.Store {
		s := newRedisStore(t, r(), addresses...)
		s.now, s.scriptClock = now, now
		return s
	}
}

// TestStore runs the suite every store passes on one Redis server.
func TestStore(t *testing.T) {
	s := redistest.Standalone(t)
	storetest.Run(t, storeOn(func() *Store { return new(Store) }, s.URL()))
}

// TestRedisScriptMatchesDecide compares the script's verdict and counts
// with algorithms.Decide over random states, including limits near 2^31
// and windows of months, where prev*(window-elapsed) passes 2^53, counts
// up to twice the limit and TATs up to two bucket depths ahead (as a
// true-up's debt leaves them), and at the exact millisecond a rejection
// turns into an allowance.
func TestRedisScriptMatchesDecide(t *testing.T) {
	s := redistest.Standalone(t)
	r := newRedisStore(t, new(Store), s.URL())
	rng := rand.New(rand.NewPCG(1, 2))
	logUniform := func(lo, hi int64) int64 {
		return int64(math.Exp(math.Log(float64(lo)) + rng.Float64()*(math.Log(float64(hi))-math.Log(float64(lo)))))
	}

	check := func(t *testing.T, alg algorithms.Algorithm, l algorithms.Rate, stored algorithms.Counts, now time.Time, cost int64) algorithms.Decision {
		t.Helper()
		key := r.counterKey("z", "k")
		if _, err := s.Do("HSET", key, "w", fmt.Sprint(stored.W), "c", fmt.Sprint(stored.C), "p", fmt.Sprint(stored.P)); err != nil {
			t.Fatal(err)
		}
		want, _ := algorithms.Decide(alg, stored, now, l, cost)
		got := make([]algorithms.Decision, 1)
		if err := r.runTake(context.Background(), takeCall{c: r.client, deadline: time.Now().Add(10 * time.Second), clock: now.UnixMilli(), keys: []string{key}, reqs: []storage.Request{{Zone: "z", Key: "k", Algorithm: alg, Rate: l, Cost: cost}}, decisions: got}, false); err != nil {
			t.Fatal(err)
		}
		if got[0] != want {
			t.Fatalf("%s limit %d window %dms counts %+v now %d cost %d:\nscript %+v\nDecide %+v",
				alg, l.Units, l.Window.Milliseconds(), stored, now.UnixMilli(), cost, got[0], want)
		}
		return want
	}

	t.Run("huge", func(t *testing.T) {
		// The previous window holds prev = 2^31-1 and the elapsed time e
		// is picked so that prev*(w-e) = (limit)*w - 1 with both sides
		// near 2^62: floor(prev*(w-e)/w) = limit-1, so a request of cost
		// 1 just fits. Doubles cannot tell the two products apart.
		prev := int64(math.MaxInt32)
		for days := int64(30); days > 20; days-- {
			w := days * 24 * 3600 * 1000
			e := new(big.Int).ModInverse(big.NewInt(prev), big.NewInt(w)).Int64() // prev*e = 1 mod w
			if w-e < w/2 {
				continue
			}
			x := new(big.Int).Mul(big.NewInt(prev), big.NewInt(w-e))
			x.Add(x, big.NewInt(1))
			limit := new(big.Int).Div(x, big.NewInt(w)).Int64() // (prev*(w-e)+1)/w, exact
			if float64(prev)*float64(w-e) != float64(limit)*float64(w) {
				continue
			}
			l := algorithms.Rate{Units: limit, Window: time.Duration(w) * time.Millisecond}
			idx := vectors.Start.UnixMilli()/w + 1
			stored := algorithms.WindowCounts{Window: idx - 1, Current: prev}.Counts()
			if d := check(t, algorithms.SlidingTail, l, stored, time.UnixMilli(idx*w+e), 1); !d.Allowed {
				t.Fatalf("window %d days: want allowed: %+v", days, d)
			}
			if d := check(t, algorithms.SlidingTail, l, stored, time.UnixMilli(idx*w+e-1), 1); d.Allowed {
				t.Fatalf("window %d days: 1ms earlier, want rejected: %+v", days, d)
			}
			return
		}
		t.Fatal("found no window for the case")
	})

	t.Run("random", func(t *testing.T) {
		algs := []algorithms.Algorithm{algorithms.SlidingTail, algorithms.FixedWindow}
		boundaries := 0
		for range 1500 {
			alg := algs[rng.IntN(2)]
			l := algorithms.Rate{Units: logUniform(1, math.MaxInt32), Window: time.Duration(logUniform(1, 90*24*3600*1000)) * time.Millisecond}
			w := l.Window.Milliseconds()
			now := time.UnixMilli(vectors.Start.UnixMilli() + rng.Int64N(1e12))
			idx := now.UnixMilli() / w
			stored := algorithms.WindowCounts{
				Window:   idx + 1 - rng.Int64N(4), // a window ahead: another clock wrote it
				Current:  rng.Int64N(2*l.Units + 1),
				Previous: rng.Int64N(2*l.Units + 1),
			}.Counts()
			cost := rng.Int64N(l.Units/2 + 2)
			d := check(t, alg, l, stored, now, cost)
			if !d.Allowed && d.RetryAt.Sub(now) > time.Millisecond {
				check(t, alg, l, stored, d.RetryAt.Add(-time.Millisecond), cost)
				check(t, alg, l, stored, d.RetryAt, cost)
				boundaries++
			}
		}
		if boundaries < 100 {
			t.Fatalf("only %d boundary cases", boundaries)
		}
	})

	t.Run("calendar", func(t *testing.T) {
		// Random calendar periods from 2024 to 2030, at instants near
		// their ends, where the next period's length decides a retry,
		// with the store's clock up to a day off the script's.
		defer func(now func() time.Time) { r.now = now }(r.now)
		zones := []string{"UTC", "America/New_York", "America/Santiago", "America/Havana", "Australia/Lord_Howe"}
		periods := []algorithms.CalendarPeriod{algorithms.Day, algorithms.Week, algorithms.Month, algorithms.Year}
		from, to := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli(), time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
		boundaries := 0
		for range 1500 {
			loc, err := time.LoadLocation(zones[rng.IntN(len(zones))])
			if err != nil {
				t.Fatal(err)
			}
			alg := []algorithms.Algorithm{algorithms.SlidingTail, algorithms.FixedWindow}[rng.IntN(2)]
			l := algorithms.Rate{Units: logUniform(1, math.MaxInt32), Calendar: algorithms.CalendarOf(periods[rng.IntN(len(periods))], loc)}
			p := l.WindowAt(from + rng.Int64N(to-from))
			now := time.UnixMilli(p.End - 1 - logUniform(1, p.Length()))
			skew := time.Duration(rng.Int64N(2*24*3600*1000)-24*3600*1000) * time.Millisecond
			if l.Calendar.Period() == algorithms.Day {
				skew /= 2 // less than a period
			}
			r.now = func() time.Time { return now.Add(skew) }
			stored := algorithms.WindowCounts{
				Window:   p.Index + 1 - rng.Int64N(4),
				Current:  rng.Int64N(2*l.Units + 1),
				Previous: rng.Int64N(2*l.Units + 1),
			}.Counts()
			cost := rng.Int64N(l.Units/2 + 2)
			d := check(t, alg, l, stored, now, cost)
			if !d.Allowed && d.RetryAt.Sub(now) > time.Millisecond {
				for _, at := range []time.Time{d.RetryAt.Add(-time.Millisecond), d.RetryAt} {
					r.now = func() time.Time { return at.Add(skew) }
					check(t, alg, l, stored, at, cost)
				}
				boundaries++
			}
		}
		if boundaries < 100 {
			t.Fatalf("only %d boundary cases", boundaries)
		}
	})

	t.Run("gcra", func(t *testing.T) {
		// Random TATs around now, kept for this limit or another one,
		// with limits and windows where cost·window and burst·window pass
		// 2^53, and the millisecond either side of each retry instant.
		boundaries := 0
		for range 1500 {
			limit := logUniform(1, math.MaxInt32)
			l := algorithms.Rate{Units: limit, Window: time.Duration(logUniform(1, 90*24*3600*1000)) * time.Millisecond}
			if rng.IntN(2) == 0 {
				l.Burst = logUniform(1, math.MaxInt32)
				if l.Validate() != nil {
					l.Burst = 0
				}
			}
			burst := l.BurstFor(limit)
			now := time.UnixMilli(vectors.Start.UnixMilli() + rng.Int64N(1e12))
			den := limit
			if rng.IntN(4) == 0 {
				den = logUniform(1, math.MaxInt32)
			}
			depth, _ := algorithms.Interval(burst, l.Window, limit)
			// The TAT's whole ms, its fraction in 1/den ms, and den.
			stored := algorithms.Counts{
				W: now.UnixMilli() - depth/2 + rng.Int64N(2*depth+depth/2+2),
				C: rng.Int64N(den),
				P: den,
			}
			cost := rng.Int64N(min(burst, 1<<20) + 2)
			d := check(t, algorithms.GCRA, l, stored, now, cost)
			if !d.Allowed && d.RetryAt.Sub(now) > time.Millisecond && cost <= burst {
				check(t, algorithms.GCRA, l, stored, d.RetryAt.Add(-time.Millisecond), cost)
				check(t, algorithms.GCRA, l, stored, d.RetryAt, cost)
				boundaries++
			}
		}
		if boundaries < 100 {
			t.Fatalf("only %d boundary cases", boundaries)
		}
	})
}

// TestRedisKeys: a key's counters are named <prefix>{<tag>}{<key>}:<zone>,
// the tag the first 4 bytes, as hex, of HMAC-SHA256 of the key with the
// fleet's secret in Redis: the same for each zone of a key, which so
// share a slot, and nothing a client can choose. Keys bounded by BoundKey
// make distinct names, short enough, however hostile the key.
func TestRedisKeys(t *testing.T) {
	s := redistest.Standalone(t)
	r := newRedisStore(t, &Store{KeyPrefix: "rl:"}, s.URL())
	secret, err := s.Do("GET", "rl:tag_secret")
	if err != nil || len(secret) != 64 {
		t.Fatalf("the secret in Redis: %q (%v), want 64 hex digits", secret, err)
	}
	long := strings.Repeat("x", 10000)
	seen := map[string]string{}
	for _, key := range []string{"1.2.3.4", "user:42", "2001:db8::1", "a}b", "{a}", long, "",
		// a key that looks like a hashed one is hashed itself, so it
		// cannot take over the counter of the long key
		storage.BoundKey(long)} {
		bound := storage.BoundKey(key)
		mac := hmac.New(sha256.New, []byte(secret))
		mac.Write([]byte(bound))
		tag := "{" + hex.EncodeToString(mac.Sum(nil)[:4]) + "}"
		got := r.counterKey("z", bound)
		if want := "rl:" + tag + "{" + bound + "}:z"; got != want {
			t.Errorf("counterKey(%.20q) = %q, want %q", key, got, want)
		}
		if other := r.counterKey("other zone", bound); hashTag(other) != tag {
			t.Errorf("key %.20q: tag %s in zone z, %s in another", key, tag, hashTag(other))
		}
		if prev, ok := seen[got]; ok {
			t.Errorf("keys %.20q and %.20q share %q", prev, key, got)
		}
		seen[got] = key
		redisTake(t, r, time.Time{}, storage.Request{Zone: "z", Key: key, Algorithm: algorithms.SlidingTail, Rate: algorithms.Rate{Units: 5, Window: time.Minute}, Cost: 1})
	}
	keys, err := s.Do("KEYS", "rl:{*")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(strings.Split(keys, "\n")); n != len(seen) {
		t.Fatalf("%d keys in Redis, want %d:\n%s", n, len(seen), keys)
	}
	for _, k := range strings.Split(keys, "\n") {
		if _, ok := seen[k]; !ok {
			t.Errorf("unexpected key %q in Redis", k)
		}
		if len(k) > 110 {
			t.Errorf("key of %d bytes in Redis", len(k))
		}
	}
}

// TestRedisExpiry checks that every key a request writes expires. A
// take's counters expire when the next window ends (see take.lua): the
// script sets the TTL relative to its own clock, and the TTL then counts
// down in real time until PTTL reads it, so PTTL may be short of the
// full TTL by the time between the take and the read, measured around
// both, and by no more. Then every kind of key a request writes has a
// TTL: the counters of a take of each algorithm, with a ban, costs in
// flight (a count_status zone's, a reservation's) and a lease; what
// releases and a true-up's debt write, also to a hash that had expired; a
// concurrency key's holders, also
// when a take, its release and another take fall in one millisecond
// (which leaves the second holder in a set the first take's expiry no
// longer covers); and the instances' announcements. Every key in Redis
// has a TTL but the fleet's secret, which key names derive from
// (keys.go); after overrides and a dial with a TTL, and a reset, only the
// admin epoch, which counts the operators' changes, joins it.
func TestRedisExpiry(t *testing.T) {
	s := redistest.Standalone(t)
	r := newRedisStore(t, new(Store), s.URL())
	ctx := context.Background()
	at := vectors.Start.Add(15 * time.Second) // 15 s into a minute
	minute := algorithms.Rate{Units: 5, Window: time.Minute}
	for _, c := range []struct {
		alg  algorithms.Algorithm
		want time.Duration
	}{
		{algorithms.FixedWindow, 105 * time.Second},
		{algorithms.SlidingTail, 105 * time.Second},
	} {
		sent := time.Now()
		redisTake(t, r, at, storage.Request{Zone: string(c.alg), Key: "k", Algorithm: c.alg, Rate: minute, Cost: 1})
		ttl, err := s.Do("PTTL", r.counterKey(string(c.alg), "k"))
		if err != nil {
			t.Fatal(err)
		}
		// Both clocks count in whole milliseconds: one more of slack.
		between := time.Since(sent) + time.Millisecond
		ms, _ := strconv.ParseInt(ttl, 10, 64)
		if got := time.Duration(ms) * time.Millisecond; got > c.want || got < c.want-between {
			t.Errorf("%s: PTTL %s, want %s less at most the %s between the take and the read", c.alg, got, c.want, between)
		}
	}

	// The other algorithms; a concurrency key taken, released and taken
	// again in one millisecond.
	redisTake(t, r, at, storage.Request{Zone: "sliding_window", Key: "k", Algorithm: algorithms.SlidingWindow, Rate: algorithms.Rate{Units: 5, Window: time.Minute, Buckets: 6}, Cost: 1})
	redisTake(t, r, at, storage.Request{Zone: "gcra", Key: "k", Algorithm: algorithms.GCRA, Rate: algorithms.Rate{Units: 5, Window: time.Minute, Burst: 3}, Cost: 1})
	held := storage.Request{Zone: "concurrency", Key: "k", Algorithm: algorithms.Concurrency, Rate: minute, Cost: 1, Holder: 1}
	redisTake(t, r, at, held)
	if err := release(r, held); err != nil {
		t.Fatal(err)
	}
	held.Holder = 2
	redisTake(t, r, at, held)
	// A ban, which begins at the third failed attempt.
	login := loginRequest("k")
	for range 3 {
		failRedis(t, r, login)
	}
	if st, err := r.KeyState(ctx, login.Zone, login.Key, algorithms.Rate{Window: time.Minute}); err != nil || st.BanEnds.IsZero() {
		t.Fatalf("key state after 3 attempts: %+v (%v), want a ban", st, err)
	}
	// Costs in flight: a count_status zone's, then kept; a reservation,
	// then trued up to more than it, a debt.
	failRedis(t, r, storage.Request{Zone: "failures", Key: "k", Algorithm: algorithms.FixedWindow, Rate: minute, Cost: 1, Ban: time.Hour, Releasable: true})
	reserved := storage.Request{Zone: "tokens", Key: "k", Algorithm: algorithms.SlidingTail, Rate: algorithms.Rate{Units: 100, Window: time.Minute}, Cost: 10, Releasable: true, Reservation: true}
	d := redisTake(t, r, time.Time{}, reserved)
	if st, err := r.KeyState(ctx, reserved.Zone, reserved.Key, algorithms.Rate{Window: time.Minute}); err != nil || st.InFlight != 10 {
		t.Fatalf("key state of a reservation: %+v (%v), want 10 in flight", st, err)
	}
	reserved.TrueUp, reserved.Actual = true, 500
	if err := r.Finish(ctx, []storage.Request{reserved}, d); err != nil {
		t.Fatal(err)
	}
	// A debt on a key whose hash is gone (its request outlived the
	// window after its own, and the hash expired) makes it again.
	outlived := reserved
	outlived.Zone, outlived.TrueUp = "outlived", false
	d = redisTake(t, r, time.Time{}, outlived)
	if _, err := s.Do("DEL", r.counterKey(outlived.Zone, outlived.Key)); err != nil {
		t.Fatal(err)
	}
	outlived.TrueUp = true
	if err := r.Finish(ctx, []storage.Request{outlived}, d); err != nil {
		t.Fatal(err)
	}
	// A lease, taken by a key's requests after its first, and released
	// untaken once the key goes unused.
	leased := leaseStore(t, s, "leased:", 1)
	const requests = 20
	calls := scriptCalls(t, s)
	for range requests {
		redisTake(t, leased, time.Time{}, storage.Request{Zone: "leased", Key: "hot", Algorithm: algorithms.SlidingTail, Rate: algorithms.Rate{Units: 1 << 20, Window: time.Hour}, Cost: 1})
	}
	if n := scriptCalls(t, s) - calls; n >= requests {
		t.Fatalf("%d script calls for %d requests of one key, want fewer: leases", n, requests)
	}
	wait.For(t, "the lease's untaken units to be released", func() bool { return counted(t, s, leased, "leased", "hot") == requests })
	// The instances announce themselves.
	r.watcher().refresh()
	leased.watcher().refresh()

	written := []string{r.instancesKey(), leased.instancesKey(), r.holderKey("concurrency", "k"), leased.counterKey("leased", "hot")}
	for _, zone := range []string{"fixed_window", "sliding_tail", "sliding_window", "gcra", "concurrency", "login", "failures", "tokens", "outlived"} {
		written = append(written, r.counterKey(zone, "k"))
	}
	for _, key := range written {
		if n, err := s.Do("EXISTS", key); err != nil || n != "1" {
			t.Fatalf("%s is not in Redis (%s, %v): nothing checks its TTL", key, n, err)
		}
	}
	forever := func() []string {
		t.Helper()
		keys, err := s.Do("KEYS", "*")
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, key := range strings.Split(keys, "\n") {
			if ttl, err := s.Do("PTTL", key); err != nil || mustInt(t, ttl) < 0 {
				out = append(out, key)
			}
		}
		slices.Sort(out)
		return out
	}
	want := []string{leased.tagSecretKey(), r.tagSecretKey()}
	slices.Sort(want)
	if got := forever(); !slices.Equal(got, want) {
		t.Fatalf("keys without a TTL: %q, want only the secrets %q", got, want)
	}

	// An operator's changes with a TTL: overrides of a key with counts
	// and of one without, a dial, and a reset of the banned key.
	for _, key := range []string{"k", "new"} {
		if err := r.SetOverride(ctx, "fixed_window", key, storage.Override{Limit: 9, Expires: time.Now().Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.SetZoneDial(ctx, "fixed_window", storage.ZoneDial{Mode: storage.ModeDryRun, Expires: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if err := r.ResetKey(ctx, login.Zone, login.Key); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{r.counterKey("fixed_window", "new"), r.dialKey("fixed_window")} {
		if n, err := s.Do("EXISTS", key); err != nil || n != "1" {
			t.Fatalf("%s is not in Redis (%s, %v): nothing checks its TTL", key, n, err)
		}
	}
	want = append(want, r.epochKey())
	slices.Sort(want)
	if got := forever(); !slices.Equal(got, want) {
		t.Fatalf("keys without a TTL after changes with one: %q, want only %q", got, want)
	}
}

// TestRedisScriptFlushed: a server that has lost the take script, as after
// a restart or a failover to a replica that never ran it, is sent the
// script in full, and every decision is counted once.
func TestRedisScriptFlushed(t *testing.T) {
	s := redistest.Standalone(t)
	r := newRedisStore(t, new(Store), s.URL())
	q := storage.Request{Zone: "z", Key: "k", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 10, Window: time.Hour}, Cost: 1}
	for i := range 3 {
		if _, err := s.Do("SCRIPT", "FLUSH"); err != nil {
			t.Fatal(err)
		}
		if d := redisTake(t, r, time.Time{}, q); !d[0].Allowed || d[0].Remaining != int64(9-i) {
			t.Fatalf("take %d after SCRIPT FLUSH: %+v", i, d[0])
		}
	}
	if c, _ := s.Do("HGET", r.counterKey("z", "k"), "c"); c != "3" {
		t.Fatalf("counts %s, want 3", c)
	}
}

// TestRedisTakeScriptLoadedOnce: the take script, joined from its pieces
// once, reaches a fresh server in full once (after the first EVALSHA's
// NOSCRIPT), and every later decision runs it by its hash.
func TestRedisTakeScriptLoadedOnce(t *testing.T) {
	s := redistest.Standalone(t)
	r := newRedisStore(t, new(Store), s.URL())
	for _, cmd := range [][]string{{"CONFIG", "SET", "slowlog-log-slower-than", "0"}, {"CONFIG", "SET", "slowlog-max-len", "1000"}, {"SLOWLOG", "RESET"}} {
		if _, err := s.Do(cmd...); err != nil {
			t.Fatal(err)
		}
	}
	const takes = 5
	q := storage.Request{Zone: "z", Key: "k", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 10, Window: time.Hour}, Cost: 1}
	for i := range takes {
		if d := redisTake(t, r, time.Time{}, q); !d[0].Allowed || d[0].Remaining != int64(9-i) {
			t.Fatalf("take %d: %+v", i, d[0])
		}
	}
	entries, err := r.client.rdb.SlowLogGet(context.Background(), -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	// The slow log cuts long arguments, such as a script's source.
	head := takeSource[:64]
	evals, bySHA := 0, 0
	for _, e := range entries {
		a := e.Args
		switch {
		case len(a) < 2:
		case strings.EqualFold(a[0], "eval") && strings.HasPrefix(a[1], head):
			evals++
		case strings.EqualFold(a[0], "evalsha") && a[1] == takeScript.Hash():
			bySHA++
		}
	}
	// The first EVALSHA is answered NOSCRIPT, and followed by the EVAL.
	if evals != 1 || bySHA != takes {
		t.Fatalf("%d takes: %d EVAL and %d EVALSHA of the take script, want 1 and %d", takes, evals, bySHA, takes)
	}
	if got, err := r.client.rdb.ScriptExists(context.Background(), takeScript.Hash()).Result(); err != nil || !got[0] {
		t.Fatalf("SCRIPT EXISTS %s: %v, %v", takeScript.Hash(), got, err)
	}
}

// TestTakeScriptPieces: the take script is every take*.lua piece and
// the pieces it shares with the finish script (all the finish script's
// but finish.lua), joined in the order its head lists them, each once.
func TestTakeScriptPieces(t *testing.T) {
	own, err := fs.Glob(scriptPieces, "scripts/take*.lua")
	if err != nil {
		t.Fatal(err)
	}
	shared := finishOrder[:len(finishOrder)-1]
	want := slices.Sorted(slices.Values(append(own, shared...)))
	if got := slices.Sorted(slices.Values(takeOrder)); !slices.Equal(got, want) {
		t.Fatalf("takeOrder has %q, want each of %q once", got, want)
	}
	var listed []string
	for _, m := range regexp.MustCompile(`(?m)^--   (\S+\.lua)`).FindAllStringSubmatch(takeSource, -1) {
		listed = append(listed, "scripts/"+m[1])
	}
	if !slices.Equal(listed, takeOrder) {
		t.Fatalf("take.lua lists the pieces as %q, takeOrder as %q", listed, takeOrder)
	}
	at := 0
	for _, name := range takeOrder {
		src, err := fs.ReadFile(scriptPieces, name)
		if err != nil {
			t.Fatal(err)
		}
		i := strings.Index(takeSource[at:], string(src))
		if i < 0 {
			t.Fatalf("%s is not in the take script after the pieces before it", name)
		}
		at += i + len(src)
	}
}

// TestTakeScriptLayout: the take script reads each zone's arguments and
// writes its answer at the offsets the store writes and reads them at.
func TestTakeScriptLayout(t *testing.T) {
	want := map[string]int{
		"ARG_ALG":      argAlgorithm,
		"ARG_LIMIT":    argLimit,
		"ARG_WINDOW":   argWindow,
		"ARG_COST":     argCost,
		"ARG_EXTRA":    argExtra,
		"ARG_LEASE":    argLease,
		"ARG_BAN":      argBan,
		"ARG_INFLIGHT": argInFlight,
		"ZONE_ARGS":    zoneArgs,
		"OUT_W":        outW,
		"OUT_C":        outC,
		"OUT_P":        outP,
		"OUT_ALLOWS":   outAllows,
		"OUT_LIMIT":    outLimit,
		"OUT_LEASED":   outLeased,
		"OUT_BAN":      outBan,
		"OUT_INFLIGHT": outInFlight,
		"ZONE_VALUES":  zoneValues,
	}
	if got := scriptLayout(t, takeSource, "ARG|OUT|ZONE"); !maps.Equal(got, want) {
		t.Fatalf("the take script's layout is %v, the store's %v", got, want)
	}
}

// TestFinishScriptLayout: the finish script reads each key's arguments
// at the offsets the store writes them at.
func TestFinishScriptLayout(t *testing.T) {
	want := map[string]int{
		"ARG_ALG":     finAlgorithm,
		"ARG_AT":      finAt,
		"ARG_UNITS":   finUnits,
		"ARG_HOLDER":  finHolder,
		"ARG_LIMIT":   finLimit,
		"ARG_IW":      finInFlightWindow,
		"ARG_IC":      finInFlightCost,
		"ARG_DEBT":    finDebt,
		"ARG_WINDOW":  finWindow,
		"ARG_EXTRA":   finExtra,
		"ARG_NOW":     finNow,
		"FINISH_ARGS": finishArgs,
	}
	if got := scriptLayout(t, finishSource, "ARG|FINISH"); !maps.Equal(got, want) {
		t.Fatalf("the finish script's layout is %v, the store's %v", got, want)
	}
}

// scriptLayout reads the offsets a script declares, in declarations such
// as `local OUT_W, OUT_C = 0, 1`, of the names that start with one of
// prefixes (a regexp alternation) and an underscore.
func scriptLayout(t *testing.T, src, prefixes string) map[string]int {
	t.Helper()
	name := `(?:` + prefixes + `)_\w+`
	got := make(map[string]int)
	decl := regexp.MustCompile(`(?m)^local ((?:` + name + `, )*` + name + `) = ([\d, ]+)$`)
	for _, m := range decl.FindAllStringSubmatch(src, -1) {
		names, values := strings.Split(m[1], ", "), strings.Split(m[2], ", ")
		if len(names) != len(values) {
			t.Fatalf("%q: %d names, %d values", m[0], len(names), len(values))
		}
		for i, name := range names {
			v, err := strconv.Atoi(values[i])
			if err != nil {
				t.Fatal(err)
			}
			got[name] = v
		}
	}
	return got
}

func TestRedisRejectedWritesNothing(t *testing.T) {
	s := redistest.Standalone(t)
	r := newRedisStore(t, new(Store), s.URL())
	l := algorithms.Rate{Units: 3, Window: time.Minute}
	at := vectors.Start

	// A cost above the limit on a fresh key creates nothing.
	d := redisTake(t, r, at, storage.Request{Zone: "a", Key: "k", Algorithm: algorithms.SlidingTail, Rate: l, Cost: 4})
	if d[0].Allowed {
		t.Fatal("cost above the limit allowed")
	}
	if n, _ := s.Do("EXISTS", r.counterKey("a", "k")); n != "0" {
		t.Fatal("a rejected request created its key")
	}

	// Two zones, one of them full: the other takes nothing.
	redisTake(t, r, at, storage.Request{Zone: "b", Key: "k", Algorithm: algorithms.FixedWindow, Rate: l, Cost: 3})
	for i := range 3 {
		d := redisTake(t, r, at,
			storage.Request{Zone: "a", Key: "k", Algorithm: algorithms.SlidingTail, Rate: l, Cost: 1},
			storage.Request{Zone: "b", Key: "k", Algorithm: algorithms.FixedWindow, Rate: l, Cost: 1})
		if !d[0].Allowed || d[1].Allowed {
			t.Fatalf("request %d: %+v", i, d)
		}
	}
	if n, _ := s.Do("EXISTS", r.counterKey("a", "k")); n != "0" {
		t.Fatal("zone a took requests zone b rejected")
	}
	if c, _ := s.Do("HGET", r.counterKey("b", "k"), "c"); c != "3" {
		t.Fatalf("zone b counts %s, want 3", c)
	}
}

// TestRedisClockSkew runs the store with a local clock an hour ahead of
// Redis's, and an hour behind: decisions are made on Redis's clock, and
// the times in them are moved to the local clock, so Retry-After stays
// right. The limit is a GCRA one, 1 per 10 minutes: no window edge on
// Redis's clock can fall between the two requests, and an instant not
// moved, or moved the wrong way, is an hour out of the 10 minutes.
func TestRedisClockSkew(t *testing.T) {
	s := redistest.Standalone(t)
	for _, skew := range []time.Duration{time.Hour, -time.Hour} {
		r := newRedisStore(t, new(Store), s.URL())
		r.now = func() time.Time { return time.Now().Add(skew) }
		period := 10 * time.Minute
		req := storage.Request{Zone: "z", Key: "k", Algorithm: algorithms.GCRA, Rate: algorithms.Rate{Units: 1, Window: period}, Cost: 1}
		redisTake(t, r, time.Time{}, req)
		d := redisTake(t, r, time.Time{}, req)
		if d[0].Allowed {
			t.Fatal("second request allowed")
		}
		local := r.now()
		if wait := d[0].RetryAt.Sub(local); wait <= 0 || wait > period {
			t.Fatalf("skew %s: retry in %s, want within %s", skew, wait, period)
		}
		if reset := d[0].Reset.Sub(local); reset <= 0 || reset > period {
			t.Fatalf("skew %s: reset in %s, want within %s", skew, reset, period)
		}
	}
}

// TestRedisDenyCache checks that a key over its limit is answered locally
// until its retry instant, with no Redis command, and takes in Redis again
// from that instant on. The store's local clock is the test's, moved to
// the retry instant rather than slept to; and the limit is a GCRA one, with
// no window edge on Redis's (real) clock for the first requests to
// straddle.
func TestRedisDenyCache(t *testing.T) {
	s := redistest.Standalone(t)
	r := newRedisStore(t, new(Store), s.URL())
	clock := clocktest.New(time.Now())
	r.now = clock.Now
	req := storage.Request{Zone: "z", Key: "k", Algorithm: algorithms.GCRA, Rate: algorithms.Rate{Units: 2, Window: time.Hour}, Cost: 1}
	redisTake(t, r, time.Time{}, req)
	redisTake(t, r, time.Time{}, req)
	first := redisTake(t, r, time.Time{}, req)[0]
	if first.Allowed || !first.RetryAt.After(clock.Now()) {
		t.Fatalf("third request: %+v, want rejected with a retry instant ahead", first)
	}
	if _, err := s.Do("CONFIG", "RESETSTAT"); err != nil {
		t.Fatal(err)
	}
	for range 100 {
		d := redisTake(t, r, time.Time{}, req)[0]
		if d.Allowed || !d.RetryAt.Equal(first.RetryAt) {
			t.Fatalf("cached answer %+v, want %+v", d, first)
		}
		// A higher cost is rejected from the cache too; a different
		// limit is not the same rejection.
		redisTake(t, r, time.Time{}, storage.Request{Zone: "z", Key: "k", Algorithm: req.Algorithm, Rate: req.Rate, Cost: 2})
	}
	// Another zone in the same request takes nothing.
	d := redisTake(t, r, time.Time{}, req, storage.Request{Zone: "other", Key: "k", Algorithm: req.Algorithm, Rate: req.Rate, Cost: 1})
	if d[0].Allowed || !d[1].Allowed {
		t.Fatalf("two zones: %+v", d)
	}
	// A millisecond before the retry instant, the rejection still stands.
	clock.Set(first.RetryAt.Add(-time.Millisecond))
	if d := redisTake(t, r, time.Time{}, req)[0]; d.Allowed || !d.RetryAt.Equal(first.RetryAt) {
		t.Fatalf("cached answer 1ms before the retry instant %+v, want %+v", d, first)
	}
	if n := scriptCalls(t, s); n != 0 {
		t.Fatalf("cached rejections ran %d scripts", n)
	}
	if n, _ := s.Do("EXISTS", r.counterKey("other", "k")); n != "0" {
		t.Fatal("the other zone took the request")
	}
	clock.Set(first.RetryAt)
	redisTake(t, r, time.Time{}, req)
	if n := scriptCalls(t, s); n != 1 {
		t.Fatalf("at the retry instant %d scripts ran, want 1: Redis decides again", n)
	}
}

func TestDenyCacheBounded(t *testing.T) {
	var c denyCache
	c.init()
	now := time.Now()
	req := storage.Request{Zone: "z", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 1, Window: time.Minute}, Cost: 1}
	d := []algorithms.Decision{{Limit: 1, RetryAt: now.Add(time.Minute), Reset: now.Add(time.Minute)}}
	for i := range 2 * denyCacheShards * denyShardSize {
		c.store([]string{strconv.Itoa(i)}, []storage.Request{req}, d, now)
	}
	if n, max := c.len(), denyCacheShards*denyShardSize; n > max || int(c.size.Load()) != n {
		t.Fatalf("cache holds %d (counted %d), bound %d", n, c.size.Load(), max)
	}
}

// TestRedisTimeoutAndBreaker pauses and kills Redis: decisions fail with
// the reason the outage gives (the timeout budget for a hung server, a
// refused connection for a dead one); after
// three failures the breaker answers without calling Redis; once Redis is
// back, decisions resume. Durations are logged, never asserted: they depend
// on the machine.
func TestRedisTimeoutAndBreaker(t *testing.T) {
	s := redistest.Standalone(t)
	r := newRedisStore(t, &Store{Timeout: caddy.Duration(50 * time.Millisecond)}, s.URL())
	req := storage.Request{Zone: "z", Key: "k", Algorithm: algorithms.SlidingTail, Rate: algorithms.Rate{Units: 1000, Window: time.Minute}, Cost: 1}
	take := func() (time.Duration, error) {
		d := make([]algorithms.Decision, 1)
		start := time.Now()
		err := r.Take(context.Background(), []storage.Request{req}, d)
		return time.Since(start), err
	}
	if _, err := take(); err != nil {
		t.Fatal(err)
	}

	// recovers waits until a decision succeeds again: once the breaker's
	// cooldown has passed and its probe reached the server.
	recovers := func(t *testing.T) {
		t.Helper()
		wait.For(t, "decisions succeed again", func() bool {
			_, err := take()
			return err == nil
		})
	}
	timedOut := func(err error) bool {
		var ne net.Error
		return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
	}
	refused := func(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

	for _, outage := range []struct {
		name   string
		reason func(error) bool
	}{{"paused", timedOut}, {"killed", refused}} {
		t.Run(outage.name, func(t *testing.T) {
			if outage.name == "paused" {
				if err := s.Pause(); err != nil {
					t.Fatal(err)
				}
			} else {
				s.Kill()
			}
			var failing, open []time.Duration
			for i := range breakerThreshold {
				took, err := take()
				if err == nil || errors.Is(err, errBreakerOpen) || !outage.reason(err) {
					t.Fatalf("failure %d: %v, want the failure of the %s server", i, err, outage.name)
				}
				failing = append(failing, took)
			}
			for range 100 {
				took, err := take()
				if !errors.Is(err, errBreakerOpen) {
					t.Fatalf("breaker not open: %v", err)
				}
				open = append(open, took)
			}
			t.Logf("failures took %v; the open breaker answered in at most %v", failing, slices.Max(open))
			if outage.name == "paused" {
				if err := s.Resume(); err != nil {
					t.Fatal(err)
				}
			} else if err := s.Restart(); err != nil {
				t.Fatal(err)
			}
			recovers(t)
		})
	}
}

func TestBreaker(t *testing.T) {
	var b breaker
	now := time.Now()
	boom := errors.New("i/o timeout")
	for i := range breakerThreshold - 1 {
		if err := b.allow(now); err != nil {
			t.Fatalf("failure %d: %v", i, err)
		}
		b.done(boom, true, now)
	}
	// Failures that do not count leave it closed.
	for range 10 {
		b.done(fmt.Errorf("wrapped: %w", poolTimeout), failureCounts(context.Background(), poolTimeout), now)
		canceled, cancel := context.WithCancel(context.Background())
		cancel()
		b.done(boom, failureCounts(canceled, boom), now)
	}
	if err := b.allow(now); err != nil {
		t.Fatalf("opened on failures that do not count: %v", err)
	}
	b.done(boom, true, now)
	if err := b.allow(now.Add(breakerCooldown - time.Millisecond)); !errors.Is(err, errBreakerOpen) {
		t.Fatalf("within the cooldown: %v", err)
	}
	// After the cooldown one probe goes through, the rest wait for it.
	later := now.Add(breakerCooldown)
	if err := b.allow(later); err != nil {
		t.Fatalf("probe: %v", err)
	}
	if err := b.allow(later); !errors.Is(err, errBreakerOpen) {
		t.Fatalf("second request during the probe: %v", err)
	}
	b.done(boom, true, later) // the probe failed: open again
	if err := b.allow(later.Add(breakerCooldown / 2)); !errors.Is(err, errBreakerOpen) {
		t.Fatalf("after a failed probe: %v", err)
	}
	b.allow(later.Add(breakerCooldown))
	b.done(nil, true, later.Add(breakerCooldown)) // the probe succeeded
	if err := b.allow(later.Add(breakerCooldown)); err != nil {
		t.Fatalf("after a good probe: %v", err)
	}
}

// TestRedisSharedClient: configs with the same connection settings share
// one client, closed when the last of them is cleaned up. Another pool
// size or timeout (from which the connection timeouts derive) gets its
// own.
func TestRedisSharedClient(t *testing.T) {
	s := redistest.Standalone(t)
	a := newRedisStore(t, new(Store), s.URL())
	b := newRedisStore(t, &Store{KeyPrefix: "other:"}, s.URL())
	if a.client != b.client {
		t.Fatal("two stores for one Redis do not share a client")
	}
	if other := newRedisStore(t, &Store{PoolSize: 3}, s.URL()); other.client == a.client {
		t.Fatal("a different pool size shares the client")
	}
	if other := newRedisStore(t, &Store{Timeout: caddy.Duration(time.Second)}, s.URL()); other.client == a.client {
		t.Fatal("a different timeout shares the client")
	}
	client := a.client
	if err := a.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if err := client.rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("client closed while b uses it: %v", err)
	}
	if err := b.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if err := client.rdb.Ping(context.Background()).Err(); err == nil {
		t.Fatal("client still open after the last user left")
	}
}

func TestRedisProvision(t *testing.T) {
	s := redistest.Standalone(t)
	t.Setenv("RL_TEST_REDIS_URL", s.URL()+"/3")
	r := newRedisStore(t, new(Store), "{env.RL_TEST_REDIS_URL}")
	redisTake(t, r, time.Time{}, storage.Request{Zone: "z", Key: "k", Algorithm: algorithms.SlidingTail, Rate: algorithms.Rate{Units: 5, Window: time.Minute}, Cost: 1})
	if n, err := s.Do("DBSIZE"); err != nil || n != "0" {
		t.Fatalf("database 0 holds %s keys (%v); the URL said database 3", n, err)
	}
	if n, err := s.DoIn(3, "EXISTS", r.counterKey("z", "k")); err != nil || n != "1" {
		t.Fatalf("database 3 does not hold the counter: %s %v", n, err)
	}

	t.Setenv("RL_TEST_BAD_URL", "redis://user:secret@127.0.0.1:notaport")
	for _, c := range []struct {
		r    Store
		want string
	}{
		{Store{Addresses: []string{"redis://127.0.0.1:notaport"}}, `address "redis://127.0.0.1:notaport"`},
		{Store{Addresses: []string{"{env.RL_TEST_BAD_URL}"}}, `address "{env.RL_TEST_BAD_URL}" = "redis://user:xxxxx@127.0.0.1:notaport"`},
		{Store{Addresses: []string{"{env.RL_TEST_UNSET_VARIABLE}"}}, `address "{env.RL_TEST_UNSET_VARIABLE}"`},
		{Store{Addresses: []string{"http://127.0.0.1:1"}}, `scheme "http" is not supported`},
		{Store{Addresses: []string{"redis://127.0.0.1:1?pool_size=3"}}, `URL option "pool_size" is not supported`},
		{Store{Addresses: []string{"redis://127.0.0.1:1/x"}}, `invalid database number`},
		{Store{Addresses: []string{"redis://127.0.0.1:1", "redis://127.0.0.1:2"}}, "2 addresses given (want one, or cluster or sentinel)"},
		{Store{Addresses: []string{"redis://a:1", "redis://u:p@b:1"}, Cluster: true}, "must be the same for every address"},
		{Store{Addresses: []string{"redis://a:1/2"}, Cluster: true}, "only database 0"},
		{Store{Addresses: []string{"redis://a:1"}, Cluster: true, Sentinel: "m"}, "exclude each other"},
		{Store{Addresses: []string{"redis://a:1"}, KeyPrefix: "rl{x}:"}, "key_prefix"},
		{Store{Addresses: []string{"redis://a:1"}, PoolSize: -1}, "pool_size"},
		{Store{Addresses: []string{"redis://a:1"}, Timeout: -1}, "timeout"},
		{Store{}, "at least one"},
	} {
		err := c.r.Provision(caddy.Context{})
		if err == nil {
			c.r.Cleanup()
			t.Errorf("%v: provisioned", c.r.Addresses)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %q, want it to contain %q", c.r.Addresses, err, c.want)
		}
		if strings.Contains(err.Error(), "secret") {
			t.Errorf("error shows the password: %v", err)
		}
	}
}

func TestRedisUnmarshalCaddyfile(t *testing.T) {
	good := []struct {
		input string
		want  Store
	}{
		{`redis {
			address redis://u:p@10.0.0.1:6380/2
		}`, Store{Addresses: []string{"redis://u:p@10.0.0.1:6380/2"}}},
		{`redis {
			address redis://a:7000 redis://b:7000
			address rediss://c:7000
			cluster
			timeout 100ms
			key_prefix app:rl:
			pool_size 20
		}`, Store{Addresses: []string{"redis://a:7000", "redis://b:7000", "rediss://c:7000"}, Cluster: true, Timeout: caddy.Duration(100 * time.Millisecond), KeyPrefix: "app:rl:", PoolSize: 20}},
		{`redis {
			address {env.REDIS_SENTINEL_1} 10.0.0.2:26379
			sentinel mymaster
		}`, Store{Addresses: []string{"{env.REDIS_SENTINEL_1}", "10.0.0.2:26379"}, Sentinel: "mymaster"}},
	}
	for _, c := range good {
		var r Store
		if err := r.UnmarshalCaddyfile(caddyfile.NewTestDispenser(c.input)); err != nil {
			t.Errorf("%s: %v", c.input, err)
			continue
		}
		if fmt.Sprint(r) != fmt.Sprint(c.want) {
			t.Errorf("%s:\ngot  %+v\nwant %+v", c.input, r, c.want)
		}
	}
	bad := []struct{ input, want string }{
		{`redis`, "address: missing"},
		{`redis {
			address redis://h:port
		}`, `address "redis://h:port"`},
		{`redis {
			address redis://u:pw@h:99999999
		}`, `address "redis://u:xxxxx@h:99999999"`},
		{`redis {
			address
		}`, "wrong argument count"},
		{`redis {
			address redis://a:1
			sentinel
		}`, "sentinel: missing (want the master name)"},
		{`redis {
			address redis://a:1
			cluster
			sentinel m
		}`, "exclude each other"},
		{`redis {
			address redis://a:1 redis://b:1
		}`, "want one, or cluster or sentinel"},
		{`redis {
			address redis://a:1
			timeout soon
		}`, `timeout: want a positive duration, got "soon"`},
		{`redis {
			address redis://a:1
			key_prefix {x}
		}`, "key_prefix"},
		{`redis {
			address redis://a:1
			pool_size -3
		}`, "pool_size"},
		{`redis {
			address redis://a:1
			db 2
		}`, `unknown subdirective "db"`},
		{`redis {
			address redis://a:1
			timeout 1s
			timeout 2s
		}`, "timeout: repeated"},
		{`redis {
			address redis://a:1
			cluster
			cluster
		}`, "cluster: repeated"},
	}
	for _, c := range bad {
		var r Store
		err := r.UnmarshalCaddyfile(caddyfile.NewTestDispenser(c.input))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", c.input, err, c.want)
		}
	}
}

// TestRedisTLSAndAuth connects over TLS (rediss://) and as an ACL user
// with a password from the URL, speaking RESP2; a wrong password or an
// untrusted certificate fails the decision rather than going unnoticed.
func TestRedisTLSAndAuth(t *testing.T) {
	bin, _ := redistest.Binaries(t)
	s, err := redistest.Start(bin, t.TempDir(), redistest.Options{
		TLS:  true,
		Args: []string{"--user", "limiter", "on", ">s3cret", "~rl:*", "+@all"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Kill)
	req := storage.Request{Zone: "z", Key: "k", Algorithm: algorithms.SlidingTail, Rate: algorithms.Rate{Units: 5, Window: time.Minute}, Cost: 1}
	base := strings.TrimPrefix(s.URL(), "rediss://")

	// The first decision dials, shakes hands, authenticates and loads the
	// script: more than the default 50ms on a busy machine, and not what
	// this test is about.
	r := newRedisStore(t, &Store{KeyPrefix: "rl:", Timeout: caddy.Duration(time.Second)}, "rediss://limiter:s3cret@"+base+"?skip_verify=true")
	if d := redisTake(t, r, time.Time{}, req); !d[0].Allowed {
		t.Fatalf("%+v", d)
	}
	list, err := s.Do("CLIENT", "LIST")
	if err != nil || !strings.Contains(list, "user=limiter") {
		t.Fatalf("no connection as user limiter: %v\n%s", err, list)
	}
	// RESP2, authenticated with AUTH rather than HELLO 3: go-redis
	// peeks for RESP3 push notifications before every command otherwise.
	for line := range strings.Lines(list) {
		fields := strings.Fields(line)
		if slices.Contains(fields, "name="+clientName) && !slices.Contains(fields, "resp=2") {
			t.Errorf("a store connection does not speak RESP2: %s", line)
		}
	}

	for _, c := range []struct{ name, url string }{
		{"wrong password", "rediss://limiter:wrong@" + base + "?skip_verify=true"},
		{"untrusted certificate", "rediss://limiter:s3cret@" + base},
		{"plain text to a TLS port", "redis://limiter:s3cret@" + base},
	} {
		r := newRedisStore(t, &Store{KeyPrefix: "rl:", Timeout: caddy.Duration(time.Second)}, c.url)
		err := r.Take(context.Background(), []storage.Request{req}, make([]algorithms.Decision, 1))
		if err == nil {
			t.Errorf("%s: no error", c.name)
		}
		t.Logf("%s: %v", c.name, err)
	}
}

func TestRedisSentinel(t *testing.T) {
	s := redistest.NewSentinel(t, "rlmaster")
	r := newRedisStore(t, &Store{Sentinel: s.Name}, s.Sentinel.URL())
	req := storage.Request{Zone: "z", Key: "k", Algorithm: algorithms.SlidingTail, Rate: algorithms.Rate{Units: 3, Window: time.Minute}, Cost: 1}
	for i := range 4 {
		if d := redisTake(t, r, time.Time{}, req)[0]; d.Allowed != (i < 3) {
			t.Fatalf("request %d: %+v", i, d)
		}
	}
	if c, err := s.Master.Do("HGET", r.counterKey("z", "k"), "c"); err != nil || c != "3" {
		t.Fatalf("master holds %q (%v), want 3", c, err)
	}
}

func TestRedisCluster(t *testing.T) {
	c := redistest.NewCluster(t, 3)
	// One subtest hangs a node for as long as this timeout: it stays well
	// under the cluster's node timeout (2s), past which the cluster would
	// take the node for failed and refuse every later subtest.
	r := newRedisStore(t, &Store{Cluster: true, Timeout: caddy.Duration(time.Second)}, c.URLs()...)

	t.Run("storetest", func(t *testing.T) {
		storetest.Run(t, storeOn(func() *Store { return &Store{Cluster: true, Timeout: caddy.Duration(time.Second)} }, c.URLs()...))
	})

	// scripts sums a command's calls over the nodes.
	calls := func(t *testing.T, cmd string) int {
		n := 0
		for _, node := range c.Nodes {
			stats, err := node.CommandStats()
			if err != nil {
				t.Fatal(err)
			}
			n += stats[cmd]
		}
		return n
	}
	// clusterScriptCalls sums the decisions' script calls over the nodes: the
	// instances' announcement, once a second, is the only script that calls
	// HGETALL, once a call, and Redis counts the commands scripts call, so
	// the HGETALL calls are the announcements to take off.
	clusterScriptCalls := func(t *testing.T) int {
		return calls(t, "evalsha") + calls(t, "eval") - calls(t, "hgetall")
	}
	resetStats := func(t *testing.T) {
		for _, node := range c.Nodes {
			if _, err := node.Do("CONFIG", "RESETSTAT"); err != nil {
				t.Fatal(err)
			}
		}
	}
	// nodeOf returns the index of the node that holds key.
	nodeOf := func(t *testing.T, key string) int {
		for i, node := range c.Nodes {
			if n, err := node.Do("EXISTS", key); err == nil && n == "1" {
				return i
			}
		}
		t.Fatalf("no node holds %s", key)
		return -1
	}
	l := algorithms.Rate{Units: 2, Window: time.Minute}

	t.Run("keys spread over nodes", func(t *testing.T) {
		used := map[int]bool{}
		for i := range 30 {
			key := "client-" + strconv.Itoa(i)
			redisTake(t, r, time.Time{}, storage.Request{Zone: "spread", Key: key, Algorithm: algorithms.SlidingTail, Rate: l, Cost: 1})
			used[nodeOf(t, r.counterKey("spread", key))] = true
		}
		if len(used) != len(c.Nodes) {
			t.Fatalf("30 keys landed on %d of %d nodes", len(used), len(c.Nodes))
		}
	})

	t.Run("zones of one key in one script", func(t *testing.T) {
		resetStats(t)
		d := redisTake(t, r, time.Time{},
			storage.Request{Zone: "one-a", Key: "k", Algorithm: algorithms.SlidingTail, Rate: l, Cost: 1},
			storage.Request{Zone: "one-b", Key: "k", Algorithm: algorithms.FixedWindow, Rate: l, Cost: 1})
		if !d[0].Allowed || !d[1].Allowed {
			t.Fatalf("%+v", d)
		}
		if n := clusterScriptCalls(t); n != 1 {
			t.Fatalf("%d script calls for two zones of one key, want 1", n)
		}
	})

	// Two keys on different nodes, so the zones are decided in two calls.
	var k1, k2 string
	for i := 0; k2 == ""; i++ {
		key := "slot-" + strconv.Itoa(i)
		redisTake(t, r, time.Time{}, storage.Request{Zone: "probe", Key: key, Algorithm: algorithms.SlidingTail, Rate: l, Cost: 1})
		switch {
		case k1 == "":
			k1 = key
		case nodeOf(t, r.counterKey("probe", key)) != nodeOf(t, r.counterKey("probe", k1)):
			k2 = key
		}
	}
	count := func(t *testing.T, zone, key string) string {
		for _, node := range c.Nodes {
			if v, err := node.Do("HGET", r.counterKey(zone, key), "c"); err == nil && v != "" {
				return v
			}
		}
		return "0"
	}

	t.Run("cross-slot rejection in the first group", func(t *testing.T) {
		// The first group (k1) is full: the second (k2) only decides.
		redisTake(t, r, time.Time{}, storage.Request{Zone: "x1", Key: k1, Algorithm: algorithms.FixedWindow, Rate: l, Cost: 2})
		for range 3 {
			d := redisTake(t, r, time.Time{},
				storage.Request{Zone: "x1", Key: k1, Algorithm: algorithms.FixedWindow, Rate: l, Cost: 1},
				storage.Request{Zone: "x2", Key: k2, Algorithm: algorithms.FixedWindow, Rate: l, Cost: 1})
			if d[0].Allowed || !d[1].Allowed {
				t.Fatalf("%+v", d)
			}
		}
		if got := count(t, "x2", k2); got != "0" {
			t.Fatalf("zone x2 took %s", got)
		}
	})

	t.Run("cross-slot rejection in a later group is released", func(t *testing.T) {
		// The second group (k2) is full: the first (k1) is taken, then
		// released.
		redisTake(t, r, time.Time{}, storage.Request{Zone: "y2", Key: k2, Algorithm: algorithms.SlidingTail, Rate: l, Cost: 2})
		resetStats(t)
		for range 3 {
			d := redisTake(t, r, time.Time{},
				storage.Request{Zone: "y1", Key: k1, Algorithm: algorithms.SlidingTail, Rate: l, Cost: 1},
				storage.Request{Zone: "y2", Key: k2, Algorithm: algorithms.SlidingTail, Rate: l, Cost: 1})
			if !d[0].Allowed || d[1].Allowed {
				t.Fatalf("%+v", d)
			}
			r.client.denies.clear() // decide in Redis every time
		}
		if got := count(t, "y1", k1); got != "0" {
			t.Fatalf("zone y1 keeps %s after releases", got)
		}
		if n := clusterScriptCalls(t); n != 9 {
			t.Fatalf("%d script calls for 3 rejected cross-slot requests, want 9 (take, check, release)", n)
		}
		// Both allowed: both taken.
		d := redisTake(t, r, time.Time{},
			storage.Request{Zone: "y1", Key: k1, Algorithm: algorithms.SlidingTail, Rate: l, Cost: 1},
			storage.Request{Zone: "y3", Key: k2, Algorithm: algorithms.SlidingTail, Rate: l, Cost: 1})
		if !d[0].Allowed || !d[1].Allowed || count(t, "y1", k1) != "1" || count(t, "y3", k2) != "1" {
			t.Fatalf("%+v", d)
		}
	})

	t.Run("a rejection stands when a later group cannot be reached", func(t *testing.T) {
		// k1's zone is full; k2's node hangs. The request is rejected, not
		// turned into a store error that on_store_error allow would pass.
		long := algorithms.Rate{Units: 1, Window: time.Hour}
		redisTake(t, r, time.Time{}, storage.Request{Zone: "h1", Key: k1, Algorithm: algorithms.FixedWindow, Rate: long, Cost: 1})
		r.client.denies.init() // decide in Redis, not the deny cache
		hung := c.Nodes[nodeOf(t, r.counterKey("probe", k2))]
		if err := hung.Pause(); err != nil {
			t.Fatal(err)
		}
		d := make([]algorithms.Decision, 2)
		err := r.Take(context.Background(), []storage.Request{
			{Zone: "h1", Key: k1, Algorithm: algorithms.FixedWindow, Rate: long, Cost: 1},
			{Zone: "h2", Key: k2, Algorithm: algorithms.FixedWindow, Rate: long, Cost: 1},
		}, d)
		if err := hung.Resume(); err != nil {
			t.Fatal(err)
		}
		if err != nil || d[0].Allowed || d[0].RetryAt.IsZero() || !d[1].Allowed {
			t.Fatalf("err %v, decisions %+v: want h1 rejected, h2 not reached", err, d)
		}
	})

	t.Run("slots of keys", func(t *testing.T) {
		for i := range 50 {
			key := r.counterKey("z", storage.BoundKey("slot-key-"+strconv.Itoa(i)))
			want, err := c.Nodes[0].Do("CLUSTER", "KEYSLOT", key)
			if err != nil {
				t.Fatal(err)
			}
			if got := strconv.Itoa(keySlot(key)); got != want {
				t.Fatalf("keySlot(%q) = %s, Redis says %s", key, got, want)
			}
		}
	})

	t.Run("coalesced batches over slots", func(t *testing.T) {
		// Concurrent requests for keys in several slots, some of them
		// for two keys in different slots at once, most of them over
		// their limit: each slot's calls decide several requests, and
		// exactly the limit is allowed and counted everywhere.
		r := newRedisStore(t, &Store{Cluster: true, Timeout: caddy.Duration(10 * time.Second)}, c.URLs()...)
		count := func(t *testing.T, zone, key string) string {
			for _, node := range c.Nodes {
				if v, err := node.Do("HGET", r.counterKey(zone, key), "c"); err == nil && v != "" {
					return v
				}
			}
			return "0"
		}
		const keys, each, limit = 6, 30, 5
		l := algorithms.Rate{Units: limit, Window: time.Hour}
		one := func(zone string, k int) storage.Request {
			return storage.Request{Zone: zone, Key: "mix-" + strconv.Itoa(k), Algorithm: algorithms.FixedWindow, Rate: l, Cost: 1}
		}
		type result struct {
			pair    bool
			key     int
			allowed bool
		}
		results := make(chan result, keys*each+each)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for k := range keys {
			for range each {
				wg.Go(func() {
					<-start
					d := make([]algorithms.Decision, 1)
					if err := r.Take(context.Background(), []storage.Request{one("mix", k)}, d); err != nil {
						t.Error(err)
						return
					}
					results <- result{key: k, allowed: d[0].Allowed}
				})
			}
		}
		// Requests for two keys on different nodes: both zones or none.
		for range each {
			wg.Go(func() {
				<-start
				d := make([]algorithms.Decision, 2)
				err := r.Take(context.Background(), []storage.Request{
					{Zone: "pair", Key: k1, Algorithm: algorithms.FixedWindow, Rate: l, Cost: 1},
					{Zone: "pair", Key: k2, Algorithm: algorithms.FixedWindow, Rate: l, Cost: 1},
				}, d)
				if err != nil {
					t.Error(err)
					return
				}
				results <- result{pair: true, allowed: d[0].Allowed && d[1].Allowed}
			})
		}
		resetStats(t)
		close(start)
		wg.Wait()
		close(results)
		t.Logf("%d requests in %d script calls", keys*each+each, clusterScriptCalls(t))
		allowed := make([]int, keys)
		pairs := 0
		for res := range results {
			switch {
			case res.pair && res.allowed:
				pairs++
			case res.allowed:
				allowed[res.key]++
			}
		}
		for k, n := range allowed {
			if n != limit {
				t.Errorf("key %d: %d allowed, want %d", k, n, limit)
			}
			if got := count(t, "mix", "mix-"+strconv.Itoa(k)); got != strconv.Itoa(limit) {
				t.Errorf("key %d: Redis counts %s, want %d", k, got, limit)
			}
		}
		if pairs != limit || count(t, "pair", k1) != strconv.Itoa(limit) || count(t, "pair", k2) != strconv.Itoa(limit) {
			t.Errorf("two-slot requests: %d allowed, Redis counts %s and %s, want %d", pairs, count(t, "pair", k1), count(t, "pair", k2), limit)
		}
	})

	t.Run("concurrent exactness", func(t *testing.T) {
		// 10 keys over the nodes, 40 concurrent requests each, limit 7.
		// The timeout is generous: this is about exactness, not speed.
		r := newRedisStore(t, &Store{Cluster: true, Timeout: caddy.Duration(10 * time.Second)}, c.URLs()...)
		var wg sync.WaitGroup
		var mu sync.Mutex
		allowed := map[string]int{}
		for k := range 10 {
			key := "exact-" + strconv.Itoa(k)
			for range 40 {
				wg.Go(func() {
					d := make([]algorithms.Decision, 1)
					err := r.Take(context.Background(), []storage.Request{{Zone: "exact", Key: key, Algorithm: algorithms.SlidingTail, Rate: algorithms.Rate{Units: 7, Window: time.Minute}, Cost: 1}}, d)
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						t.Error(err)
					} else if d[0].Allowed {
						allowed[key]++
					}
				})
			}
		}
		wg.Wait()
		for k := range 10 {
			if n := allowed["exact-"+strconv.Itoa(k)]; n != 7 {
				t.Errorf("key %d: %d allowed, want 7", k, n)
			}
		}
	})
	t.Run("bans", func(t *testing.T) {
		// Keys on every node: each is banned by its third attempt, on the
		// node that holds it, which keeps the hash for the ban's hour;
		// another instance sees the ban, and a reset lifts it on both.
		b := newRedisStore(t, &Store{Cluster: true, KeyPrefix: r.KeyPrefix, Timeout: caddy.Duration(time.Second + time.Millisecond)}, c.URLs()...)
		nodes := map[int]bool{}
		for i := 0; len(nodes) < len(c.Nodes); i++ {
			key := "banned-" + strconv.Itoa(i)
			req := loginRequest(key)
			failRedis(t, r, req)
			failRedis(t, r, req)
			d := failRedis(t, r, req)
			if d.Allowed || !d.BanStarted || d.BanEnds.Before(time.Now().Add(59*time.Minute)) {
				t.Fatalf("%s, third attempt: %+v, want a ban of an hour", key, d)
			}
			node := nodeOf(t, r.counterKey("login", key))
			nodes[node] = true
			if ttl, err := c.Nodes[node].Do("PTTL", r.counterKey("login", key)); err != nil || mustInt(t, ttl) < (59*time.Minute).Milliseconds() {
				t.Fatalf("%s expires in %s ms (%v), want the ban's hour", key, ttl, err)
			}
			if d2 := redisTake(t, b, time.Time{}, req)[0]; d2.Allowed || d2.BanEnds.Sub(d.BanEnds).Abs() > time.Second {
				t.Fatalf("%s on another instance: %+v, want the same ban", key, d2)
			}
			if err := b.ResetKey(context.Background(), "login", key); err != nil {
				t.Fatal(err)
			}
			for _, s := range []*Store{r, b} {
				wait.For(t, "the reset reaches every instance", func() bool { return redisTake(t, s, time.Time{}, req)[0].Allowed })
			}
		}
	})
}

// BenchmarkRedisTake measures one decision against a real redis-server:
// one EVALSHA round trip over loopback.
func BenchmarkRedisTake(b *testing.B) {
	s := redistest.Standalone(b)
	r := newRedisStore(b, new(Store), s.URL())
	reqs := []storage.Request{{Zone: "bench", Algorithm: algorithms.SlidingTail, Rate: algorithms.Rate{Units: math.MaxInt32, Window: time.Minute}, Cost: 1}}
	d := make([]algorithms.Decision, 1)
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = "10.0." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256)
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		reqs[0].Key = keys[i%len(keys)]
		if err := r.Take(ctx, reqs, d); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRedisTakeParallel measures decisions from many goroutines at
// once against a real redis-server: for one hot key and for many keys. It
// reports decisions/s and Redis's own CPU time per decision (INFO cpu), and
// from that how many decisions one Redis core sustains.
func BenchmarkRedisTakeParallel(b *testing.B) {
	s := redistest.Standalone(b)
	// A generous timeout: this measures throughput, and a busy machine
	// must not turn waits for a connection into errors.
	r := newRedisStore(b, &Store{Timeout: caddy.Duration(time.Second)}, s.URL())
	// viaStore decides one request through the store, which coalesces
	// concurrent decisions; alone sends each request in a script call of
	// its own, without coalescing.
	viaStore := func(q storage.Request, d []algorithms.Decision) error {
		return r.Take(context.Background(), []storage.Request{q}, d)
	}
	alone := func(q storage.Request, d []algorithms.Decision) error {
		t := &callPart{keys: []string{r.counterKey(q.Zone, q.Key)}, reqs: []storage.Request{q}, take: true}
		r.client.call(context.Background(), 0, []*callPart{t})
		d[0].Allowed = t.err == nil && t.vals[3] == 1
		return t.err
	}
	// leased decides through a store with lease on (a client of its own,
	// by its timeout): a key in demand is mostly decided from leases.
	rl := newRedisStore(b, &Store{Timeout: caddy.Duration(time.Second + time.Millisecond), Lease: true}, s.URL())
	leased := func(q storage.Request, d []algorithms.Decision) error {
		return rl.Take(context.Background(), []storage.Request{q}, d)
	}
	for _, c := range []struct {
		name string
		keys int
		take func(storage.Request, []algorithms.Decision) error
	}{
		{"one key", 1, viaStore},
		{"many keys", 1024, viaStore},
		{"one key alone", 1, alone},
		{"many keys alone", 1024, alone},
		{"one key leased", 1, leased},
		{"many keys leased", 1024, leased},
	} {
		b.Run(c.name, func(b *testing.B) {
			keys := make([]string, c.keys)
			for i := range keys {
				keys[i] = "10.1." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256)
			}
			var next atomic.Int64
			if _, err := s.Do("CONFIG", "RESETSTAT"); err != nil {
				b.Fatal(err)
			}
			cpu0 := redisCPU(b, s)
			b.SetParallelism(32)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				req := storage.Request{Zone: "bench", Algorithm: algorithms.SlidingTail, Rate: algorithms.Rate{Units: math.MaxInt32, Window: time.Minute}, Cost: 1}
				d := make([]algorithms.Decision, 1)
				for pb.Next() {
					req.Key = keys[int(next.Add(1))%len(keys)]
					if err := c.take(req, d); err != nil {
						b.Error(err)
						return
					}
					if !d[0].Allowed {
						b.Error("rejected")
						return
					}
				}
			})
			b.StopTimer()
			reportRedisCPU(b, redisCPU(b, s)-cpu0)
			reportScriptCost(b, s)
		})
	}
}

// redisCPU returns the CPU time redis-server has used, system and user.
func redisCPU(b *testing.B, s *redistest.Server) time.Duration {
	b.Helper()
	var total float64
	for _, f := range []string{"used_cpu_sys", "used_cpu_user"} {
		v, err := s.Info("cpu", f)
		if err != nil {
			b.Fatal(err)
		}
		x, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil {
			b.Fatal(err)
		}
		total += x
	}
	return time.Duration(total * float64(time.Second))
}

// reportScriptCost reports, from INFO commandstats, what one take script
// call costs Redis (usec_per_call) and how many decisions it made.
func reportScriptCost(b *testing.B, s *redistest.Server) {
	b.Helper()
	text, err := s.Do("INFO", "commandstats")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:")
		if !ok {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			x, _ := strconv.ParseFloat(v, 64)
			switch k {
			case "calls":
				b.ReportMetric(float64(b.N)/x, "decisions/call")
			case "usec_per_call":
				b.ReportMetric(x, "evalsha-µs/call")
			}
		}
	}
}

// reportRedisCPU reports decisions/s, Redis CPU per decision, and the
// decisions one Redis core would sustain at that cost.
func reportRedisCPU(b *testing.B, cpu time.Duration) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
	perOp := cpu.Seconds() / float64(b.N)
	b.ReportMetric(perOp*1e6, "redis-µs/op")
	if perOp > 0 {
		b.ReportMetric(1/perOp, "decisions/redis-core-s")
	}
}

// len counts the cached rejections, for tests.
func (c *denyCache) len() int {
	n := 0
	for i := range c.shards {
		c.shards[i].mu.Lock()
		n += len(c.shards[i].entries)
		c.shards[i].mu.Unlock()
	}
	return n
}

// TestRedisTakeAfterCleanup: Caddy cleans up an old config while its
// requests may still be running. A decision in flight keeps the config's
// client open until it ends, and a request that starts deciding after the
// cleanup is still decided and counted, on a borrowed client. Once the
// last decision has ended, no connection is left open.
func TestRedisTakeAfterCleanup(t *testing.T) {
	s := redistest.Standalone(t)
	r := newRedisStore(t, new(Store), s.URL())
	take := func() error {
		d := make([]algorithms.Decision, 1)
		return r.Take(context.Background(), []storage.Request{{Zone: "z", Key: "k", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 100, Window: time.Hour}, Cost: 1}}, d)
	}
	open := func() int {
		n, err := s.Clients(clientName)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	// A decision in flight across the cleanup: its client stays open.
	c, own, err := r.acquire()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if err := c.rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("client closed under a decision in flight: %v", err)
	}
	// A request that starts after the cleanup is decided and counted.
	if err := take(); err != nil {
		t.Fatalf("take after cleanup: %v", err)
	}
	r.end(own)
	if err := c.rdb.Ping(context.Background()).Err(); err == nil {
		t.Fatal("client still open after the last decision ended")
	}
	if err := take(); err != nil {
		t.Fatalf("take after the last decision ended: %v", err)
	}
	if n, err := s.Do("HGET", r.counterKey("z", "k"), "c"); err != nil || n != "2" {
		t.Fatalf("counter %q (%v), want 2: every request is counted", n, err)
	}
	wait.For(t, "no connection is left open after the last decision", func() bool { return open() == 0 })
}

// TestRedisCoalescedExact sends many concurrent requests for one key with
// limit n through the store: however they fall into shared script calls,
// exactly n are allowed and counted. How many calls they took depends on
// the scheduler and is logged; TestRedisQueuedShareACall checks the
// sharing itself.
func TestRedisCoalescedExact(t *testing.T) {
	s := redistest.Standalone(t)
	r := newRedisStore(t, &Store{Timeout: caddy.Duration(10 * time.Second)}, s.URL())
	const requests, limit = 400, 150
	req := storage.Request{Zone: "z", Key: "k", Algorithm: algorithms.SlidingTail, Rate: algorithms.Rate{Units: limit, Window: time.Hour}, Cost: 1}
	var allowed atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range requests {
		wg.Go(func() {
			<-start
			d := make([]algorithms.Decision, 1)
			if err := r.Take(context.Background(), []storage.Request{req}, d); err != nil {
				t.Error(err)
			} else if d[0].Allowed {
				allowed.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	if n := allowed.Load(); n != limit {
		t.Errorf("%d allowed, want %d", n, limit)
	}
	if c, err := s.Do("HGET", r.counterKey("z", "k"), "c"); err != nil || c != strconv.Itoa(limit) {
		t.Errorf("Redis counts %q (%v), want %d", c, err, limit)
	}
	// Rejections after the first are answered by the deny cache, so the
	// calls are to be compared with the allowed requests, not all of them.
	calls, err := s.ScriptCalls()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d requests, %d of them allowed, in %d script calls", requests, allowed.Load(), calls)
}

// TestRedisCoalescedCancel: a request whose context ends while it waits for
// a call in flight returns without waiting for that call, and is never
// sent; the others in its batch are decided and counted. The call in
// flight is to a paused server and has an hour's timeout, so it cannot
// end before the server resumes: the cancelled request must return first.
func TestRedisCoalescedCancel(t *testing.T) {
	s := redistest.Standalone(t)
	r := newRedisStore(t, &Store{Timeout: caddy.Duration(time.Hour)}, s.URL())
	req := storage.Request{Zone: "z", Key: "k", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 100, Window: time.Hour}, Cost: 1}
	redisTake(t, r, time.Time{}, req) // connect and load the script
	b := r.client.batcher(r.counterKey("z", "k"))
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		wait.For(t, what, func() bool {
			b.mu.Lock()
			defer b.mu.Unlock()
			return cond()
		})
	}

	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	take := func(ctx context.Context) error {
		return r.Take(ctx, []storage.Request{req}, make([]algorithms.Decision, 1))
	}
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	wg.Go(func() { errs <- take(context.Background()) }) // the call in flight
	// Its call has taken the queue, the request alone.
	waitFor("a call in flight", func() bool { return b.busy && len(b.waiting) == 0 })
	ctx, cancel := context.WithCancel(context.Background())
	cancelled := make(chan error, 1)
	go func() { cancelled <- take(ctx) }()
	for range 5 {
		wg.Go(func() { errs <- take(context.Background()) })
	}
	waitFor("six queued requests", func() bool { return len(b.waiting) == 6 })
	cancel()
	// Only the test's deadline bounds the wait: a request that waited for
	// the call in flight would wait for the server, paused until below.
	select {
	case err := <-cancelled:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled request: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Error("a cancelled request waits for the call in flight")
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if c, err := s.Do("HGET", r.counterKey("z", "k"), "c"); err != nil || c != "7" {
		t.Errorf("Redis counts %q (%v), want 7: the cancelled request must not be taken", c, err)
	}
}

// TestRedisQueuedShareACall: the requests for a slot that queue while a
// call for it is in flight are decided together by the next call, up to
// maxBatch of them, and the calls after it decide the rest. A call is held
// in flight by pausing the server, n requests queue behind it, and once the
// server resumes exactly 1 + ⌈n/maxBatch⌉ script calls have decided the
// n + 1 requests, each counted once.
//
// How many of a burst of requests read off the network together join the
// first one's call, rather than the one after it, is the scheduler's
// business (slotQueue.next yields so that they can): it is not asserted here;
// BenchmarkRedisTakeParallel reports decisions per call.
func TestRedisQueuedShareACall(t *testing.T) {
	s := redistest.Standalone(t)
	// A timeout longer than the test: the call held in flight waits for
	// the paused server, not for its deadline.
	r := newRedisStore(t, &Store{Timeout: caddy.Duration(time.Hour)}, s.URL())
	req := storage.Request{Zone: "z", Key: "k", Algorithm: algorithms.SlidingTail, Rate: algorithms.Rate{Units: 1 << 30, Window: time.Hour}, Cost: 1}
	redisTake(t, r, time.Time{}, req) // connect and load the script: c = 1
	b := r.client.batcher(r.counterKey("z", "k"))
	batcherIs := func(cond func() bool) func() bool {
		return func() bool {
			b.mu.Lock()
			defer b.mu.Unlock()
			return cond()
		}
	}
	take := func() error {
		return r.Take(context.Background(), []storage.Request{req}, make([]algorithms.Decision, 1))
	}

	sent := 1
	for _, n := range []int{5, maxBatch, 2*maxBatch + 3} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			before := scriptCalls(t, s)
			if err := s.Pause(); err != nil {
				t.Fatal(err)
			}
			// A step that fails must not leave the server paused: the
			// call in flight would not end, nor would the next step.
			t.Cleanup(func() { _ = s.Resume() })
			errs := make(chan error, n+1)
			go func() { errs <- take() }()
			wait.For(t, "a call in flight", batcherIs(func() bool { return b.busy && len(b.waiting) == 0 }))
			for range n {
				go func() { errs <- take() }()
			}
			wait.For(t, fmt.Sprintf("%d requests queued", n), batcherIs(func() bool { return len(b.waiting) == n }))
			if err := s.Resume(); err != nil {
				t.Fatal(err)
			}
			for range n + 1 {
				if err := <-errs; err != nil {
					t.Error(err)
				}
			}
			sent += n + 1
			if got, want := scriptCalls(t, s)-before, 1+(n+maxBatch-1)/maxBatch; got != want {
				t.Errorf("%d script calls for a call in flight and %d requests queued behind it, want %d", got, n, want)
			}
		})
	}
	if c, err := s.Do("HGET", r.counterKey("z", "k"), "c"); err != nil || c != strconv.Itoa(sent) {
		t.Errorf("Redis counts %q (%v), want %d", c, err, sent)
	}
}

// TestRedisCallGroupsSameRequests checks that a call which sends requests
// that are the same as one entry of the take script (groupParts) decides
// each of them, and leaves the counters, exactly as calls of one request
// each, in the order the call put them in, would. The requests are drawn
// at random: every algorithm but concurrency (which is never grouped),
// one or two zones, small limits so that entries run out part way, costs
// of 0 to 3 (1 to 3 for gcra), counters stored before or not, per-key
// overrides, decide-only requests, and requests of another cost or key in
// the same call, and zones that ban, some of them keeping costs in flight.
func TestRedisCallGroupsSameRequests(t *testing.T) {
	s := redistest.Standalone(t)
	r := newRedisStore(t, new(Store), s.URL())
	ctx := context.Background()
	rdb := r.client.rdb
	rng := rand.New(rand.NewPCG(3, 4))
	algs := []algorithms.Algorithm{algorithms.SlidingTail, algorithms.FixedWindow, algorithms.GCRA, algorithms.SlidingWindow}
	// counters reads what a key's hash holds, but for the key's name.
	counters := func(key string) map[string]string {
		m, err := rdb.HGetAll(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	grouped := 0
	for i := range 300 {
		now := vectors.Start.UnixMilli() + rng.Int64N(1e9)
		zones := 1 + rng.IntN(2)
		var reqs []storage.Request
		for range zones {
			alg := algs[rng.IntN(len(algs))]
			// Windows of 10 s or more, and gcra costs of 1 or more, keep
			// what the script writes for longer than the test runs: it
			// compares what is stored, and a key written to expire in a
			// millisecond (a gcra request of cost 0) may be gone.
			l := algorithms.Rate{Units: 1 + rng.Int64N(12), Window: time.Duration(1e4+rng.Int64N(36e5)) * time.Millisecond}
			cost := rng.Int64N(4)
			if alg == algorithms.GCRA {
				l.Burst = rng.Int64N(2 * l.Units)
				cost = 1 + rng.Int64N(3)
			}
			if alg == algorithms.SlidingWindow {
				l.Buckets = 2 + rng.IntN(20)
			}
			var ban time.Duration
			if rng.IntN(3) == 0 {
				ban = time.Duration(1+rng.Int64N(3600)) * time.Second
			}
			// Half the zones that ban release costs, and keep their
			// costs in flight.
			reqs = append(reqs, storage.Request{Algorithm: alg, Rate: l, Cost: cost, Ban: ban, Releasable: ban > 0 && rng.IntN(2) == 0})
		}
		// Two sets of keys in the same state: one decided by one call,
		// the other by a call per request.
		keys := func(set string) []string {
			var ks []string
			for z := range zones {
				ks = append(ks, r.counterKey(fmt.Sprintf("%s.%d.%d", set, i, z), "k"))
			}
			return ks
		}
		one, each := keys("one"), keys("each")
		for z := range zones {
			if rng.IntN(2) == 0 {
				continue // not stored yet
			}
			var fields []any
			w := reqs[z].Rate.Window.Milliseconds()
			switch reqs[z].Algorithm {
			case algorithms.GCRA:
				fields = []any{"w", now - w + rng.Int64N(2*w), "c", rng.Int64N(reqs[z].Rate.Units), "p", reqs[z].Rate.Units}
			case algorithms.SlidingWindow:
				// A ring of the zone's buckets (or, now and then, of
				// others), up to two sub-windows behind or one ahead.
				n := reqs[z].Rate.BucketsOr()
				if rng.IntN(5) == 0 {
					n = 2 + rng.IntN(20)
				}
				counts := make([]string, n+1)
				for k := range counts {
					counts[k] = strconv.FormatInt(rng.Int64N(reqs[z].Rate.Units/2+1), 10)
				}
				fields = []any{"w", algorithms.SubWindow(now, w, reqs[z].Rate.BucketsOr()) - 2 + rng.Int64N(4), "r", strings.Join(counts, ",")}
			default:
				fields = []any{"w", now/w - rng.Int64N(3), "c", rng.Int64N(reqs[z].Rate.Units + 1), "p", rng.Int64N(reqs[z].Rate.Units + 1)}
			}
			fields = append(fields, "t", now+2*w)
			if rng.IntN(4) == 0 {
				fields = append(fields, "o", 1+rng.Int64N(12), "ox", 0)
			}
			if rng.IntN(4) == 0 {
				// A ban that has ended or has not.
				fields = append(fields, "b", now-1000+rng.Int64N(2000))
			}
			if reqs[z].Releasable && rng.IntN(2) == 0 {
				// Costs in flight, taken in this window or up to two
				// before.
				fields = append(fields, "iw", now/w-rng.Int64N(3), "ic", rng.Int64N(reqs[z].Rate.Units+1), "ip", rng.Int64N(reqs[z].Rate.Units+1))
			}
			for _, k := range []string{one[z], each[z]} {
				if err := rdb.HSet(ctx, k, fields...).Err(); err != nil {
					t.Fatal(err)
				}
			}
		}
		take := rng.IntN(5) != 0
		newTake := func(keys []string, reqs []storage.Request) *callPart {
			return &callPart{keys: keys, reqs: reqs, take: take}
		}
		// The same request m times, and now and then one of another cost
		// on the same keys, or on keys of its own, in between.
		var parts []*callPart
		other := slices.Clone(reqs)
		other[0].Cost++
		m := 1 + rng.IntN(12)
		for range m {
			parts = append(parts, newTake(one, reqs))
			switch rng.IntN(6) {
			case 0:
				parts = append(parts, newTake(one, other))
			case 1:
				parts = append(parts, newTake(keys(fmt.Sprint("lone", len(parts))), reqs))
			}
		}
		c := r.client
		c.call(ctx, now, parts)
		for _, tk := range parts {
			if tk.same > 1 {
				grouped++
			}
		}
		// The same requests, in the order the call decided them, one call
		// each, on the other keys (and on a copy of each lone key).
		for j, tk := range parts {
			ks := each
			if tk.keys[0] != one[0] {
				ks = nil
				for _, k := range tk.keys {
					ks = append(ks, k+":each")
				}
			}
			alone := newTake(ks, tk.reqs)
			c.call(ctx, now, []*callPart{alone})
			if tk.err != nil || alone.err != nil {
				t.Fatalf("case %d: errors %v, %v", i, tk.err, alone.err)
			}
			if !slices.Equal(tk.vals, alone.vals) {
				t.Fatalf("case %d, request %d of %d (%+v, take %v):\none call  %v\neach      %v", i, j, len(parts), tk.reqs, take, tk.vals, alone.vals)
			}
		}
		for z := range zones {
			if got, want := counters(one[z]), counters(each[z]); !maps.Equal(got, want) {
				t.Fatalf("case %d, zone %d: counters after one call %v, after a call each %v", i, z, got, want)
			}
		}
	}
	if grouped < 200 {
		t.Fatalf("only %d entries stood for more than one request", grouped)
	}
}

// TestRedisCoalescedDeadline: queued requests keep their own deadlines
// without a timer each. One whose deadline passed while it queued fails
// without being sent, while the call goes ahead for the others; the call
// ends at the earliest of their deadlines, so none waits past its own.
func TestRedisCoalescedDeadline(t *testing.T) {
	s := redistest.Standalone(t)
	// A timeout longer than the test: only the requests' own deadlines
	// can end the call to the paused server below.
	r := newRedisStore(t, &Store{Timeout: caddy.Duration(time.Hour)}, s.URL())
	req := storage.Request{Zone: "z", Key: "k", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 100, Window: time.Hour}, Cost: 1}
	redisTake(t, r, time.Time{}, req) // connect and load the script
	key := r.counterKey("z", "k")
	b := r.client.batcher(key)
	queue := func(deadline time.Time) *callPart {
		tk := &callPart{keys: []string{key}, reqs: []storage.Request{req}, take: true, deadline: deadline, done: make(chan struct{})}
		b.mu.Lock()
		b.busy = true
		b.waiting = append(b.waiting, tk)
		b.mu.Unlock()
		return tk
	}
	wait := func(tk *callPart) error {
		t.Helper()
		select {
		case <-tk.done:
			return tk.err
		case <-time.After(30 * time.Second):
			t.Fatal("a queued request waits past its deadline")
			return nil
		}
	}

	expired := queue(time.Now().Add(-time.Millisecond))
	live := queue(time.Now().Add(time.Hour))
	b.drain(r.client.sendTakes)
	if err := wait(expired); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("expired request: %v, want %v", err, context.DeadlineExceeded)
	}
	if err := wait(live); err != nil {
		t.Errorf("live request: %v", err)
	}
	if c, err := s.Do("HGET", key, "c"); err != nil || c != "2" {
		t.Errorf("Redis counts %q (%v), want 2: the expired request must not be sent", c, err)
	}

	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	soon := queue(time.Now().Add(100 * time.Millisecond))
	late := queue(time.Now().Add(time.Hour))
	go b.drain(r.client.sendTakes)
	for _, tk := range []*callPart{soon, late} {
		var ne net.Error
		if err := wait(tk); !errors.Is(err, context.DeadlineExceeded) && !(errors.As(err, &ne) && ne.Timeout()) {
			t.Errorf("request in a call to a paused server: %v, want a timeout", err)
		}
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
}

// TestRedisSentRequestHeldUntilAnswered checks that a request whose context
// ends after a call has picked it up returns only once that call has
// answered. The call reads the request's arguments until then (to answer
// an entry of requests that are the same, after the reply), and the
// handler reuses them, a pooled slice, as soon as Take returns: were Take
// to return at once, the call could read another request's arguments, or
// zeros (and divide by a window of 0).
func TestRedisSentRequestHeldUntilAnswered(t *testing.T) {
	s := redistest.Standalone(t)
	r := newRedisStore(t, &Store{Timeout: caddy.Duration(time.Hour)}, s.URL())
	req := storage.Request{Zone: "z", Key: "k", Algorithm: algorithms.SlidingTail, Rate: algorithms.Rate{Units: 100, Window: time.Hour}, Cost: 1}
	redisTake(t, r, time.Time{}, req) // connect and load the script: c = 1
	key := r.counterKey("z", "k")
	b := r.client.batcher(key)
	queued := func(n int) func() bool {
		return func() bool {
			b.mu.Lock()
			defer b.mu.Unlock()
			return len(b.waiting) == n
		}
	}
	// As if a call were in flight, so that both requests queue, the one
	// whose client goes away first.
	b.mu.Lock()
	b.busy = true
	b.mu.Unlock()
	newTake := func() *callPart {
		return &callPart{keys: []string{key}, reqs: []storage.Request{req}, take: true, deadline: time.Now().Add(time.Hour)}
	}
	ctx, cancel := context.WithCancel(context.Background())
	gone, stays := newTake(), newTake()
	type result struct {
		err      error
		answered bool
	}
	goneDone := make(chan result, 1)
	go func() {
		err := r.client.take(ctx, gone)
		var res result
		select {
		case <-gone.done:
			res.answered = true
		default:
		}
		res.err = err
		clear(gone.reqs) // as the handler's pool does once Take returns
		goneDone <- res
	}()
	wait.For(t, "the first request queues", queued(1))
	staysDone := make(chan error, 1)
	go func() { staysDone <- r.client.take(context.Background(), stays) }()
	wait.For(t, "the second request queues", queued(2))

	// One call picks both up, as one entry, and waits for a paused Redis.
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	go b.drain(r.client.sendTakes)
	wait.For(t, "a call picks both up", func() bool {
		return gone.state.Load() == partSent && stays.state.Load() == partSent
	})
	cancel()
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	res := <-goneDone
	if !errors.Is(res.err, context.Canceled) {
		t.Errorf("request whose client went away: %v, want %v", res.err, context.Canceled)
	}
	if !res.answered {
		t.Error("a request whose client went away returned while its call was in flight")
	}
	if err := <-staysDone; err != nil {
		t.Fatalf("the other request: %v", err)
	}
	// It is decided after the one whose client went away, which was sent
	// and so taken: it saw a count of 2.
	if want := []int64{stays.vals[0], 2, 0, 1, 100, 0, 0, 0}; !slices.Equal(stays.vals, want) {
		t.Errorf("the other request saw %v, want %v", stays.vals, want)
	}
	if c, err := s.Do("HGET", key, "c"); err != nil || c != "3" {
		t.Errorf("Redis counts %q (%v), want 3", c, err)
	}
}

// BenchmarkRedisTakeLocalFallback measures what on_store_error local
// costs while Redis answers: each admission is counted in the local
// fallback's memory too (mirror). One hot key with lease on, mostly
// decided from leases (the path where that count weighs most), and 1024
// keys, one script call each, with and without the fallback.
func BenchmarkRedisTakeLocalFallback(b *testing.B) {
	s := redistest.Standalone(b)
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = "10.0." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256)
	}
	for i, c := range []struct {
		name         string
		lease, local bool
		keys         int
	}{
		{"leased hot key", true, false, 1},
		{"leased hot key, local", true, true, 1},
		{"1024 keys", false, false, 1024},
		{"1024 keys, local", false, true, 1024},
	} {
		b.Run(c.name, func(b *testing.B) {
			// A client of its own (by its timeout), whose fallback no
			// other case turned on.
			r := newRedisStore(b, &Store{Timeout: caddy.Duration(time.Second + time.Duration(i)*time.Millisecond), Lease: c.lease}, s.URL())
			if c.local {
				r.Local()
			}
			reqs := []storage.Request{{Zone: "bench", Algorithm: algorithms.SlidingTail, Rate: algorithms.Rate{Units: math.MaxInt32, Window: time.Minute}, Cost: 1}}
			d := make([]algorithms.Decision, 1)
			ctx := context.Background()
			b.ReportAllocs()
			for n := 0; b.Loop(); n++ {
				reqs[0].Key = keys[n%c.keys]
				if err := r.Take(ctx, reqs, d); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
