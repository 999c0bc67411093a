package redis

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/algorithms/vectors"
	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// trueUp trues up q, allowed with d, to actual at the script's clock at
// (the server's if zero).
func trueUp(t *testing.T, r *Store, at time.Time, q storage.Request, d algorithms.Decision, actual int64) {
	t.Helper()
	q.Key = storage.BoundKey(q.Key)
	q.TrueUp, q.Actual = true, actual
	if !at.IsZero() {
		r.scriptClock = func() time.Time { return at }
		defer func() { r.scriptClock = nil }()
	}
	if err := r.Finish(context.Background(), []storage.Request{q}, []algorithms.Decision{d}); err != nil {
		t.Fatal(err)
	}
}

// TestRedisDebtMatchesGo compares the finish script's debts with
// algorithms.Debt and DebtRing over random states: limits near 2^31,
// windows of months (where units×window passes 2^53), TATs kept for
// another limit, counts kept in the next window (a clock stepped back) or
// for a shorter window, rings of another number of buckets, and debts far
// past the bound.
func TestRedisDebtMatchesGo(t *testing.T) {
	s := redistest.Standalone(t)
	r := newRedisStore(t, new(Store), s.URL())
	rng := rand.New(rand.NewPCG(5, 6))
	logUniform := func(lo, hi int64) int64 {
		return int64(math.Exp(math.Log(float64(lo)) + rng.Float64()*(math.Log(float64(hi))-math.Log(float64(lo)))))
	}
	hget := func(key string, fields ...string) []string {
		t.Helper()
		out := make([]string, len(fields))
		for i, f := range fields {
			v, err := s.Do("HGET", key, f)
			if err != nil {
				t.Fatal(err)
			}
			out[i] = v
		}
		return out
	}
	atoi := func(v string) int64 {
		n, _ := strconv.ParseInt(v, 10, 64)
		return n
	}
	for i := range 1200 {
		alg := []algorithms.Algorithm{algorithms.FixedWindow, algorithms.SlidingTail, algorithms.SlidingWindow, algorithms.GCRA}[i%4]
		limit := logUniform(1, math.MaxInt32)
		l := algorithms.Rate{Units: limit, Window: time.Duration(logUniform(1, 90*24*3600*1000)) * time.Millisecond}
		if alg == algorithms.SlidingWindow {
			l.Buckets = int(2 + rng.Int64N(algorithms.MaxBuckets-1))
			l.Window = max(l.Window, time.Duration(l.Buckets)*time.Millisecond)
		}
		if alg == algorithms.GCRA && rng.IntN(2) == 0 {
			if l.Burst = logUniform(1, math.MaxInt32); l.Validate() != nil {
				l.Burst = 0
			}
		}
		w := l.Window.Milliseconds()
		now := time.UnixMilli(vectors.Start.UnixMilli() + rng.Int64N(1e12))
		units := logUniform(1, 4*limit)
		key := r.counterKey("z", "k"+strconv.Itoa(i))
		// A t far ahead keeps the script from moving the key's expiry to
		// when the debt stops mattering: by the script's clock, which
		// runs years ahead of the server's, in as little as a
		// millisecond.
		if _, err := s.Do("HSET", key, "t", "4503599627370496"); err != nil {
			t.Fatal(err)
		}
		d := algorithms.Decision{Allowed: true, Limit: limit}
		q := storage.Request{Zone: "z", Key: "k" + strconv.Itoa(i), Algorithm: alg, Rate: l, Cost: 1}
		fail := func(stored, got, want any) {
			t.Helper()
			t.Fatalf("%s limit %d window %dms burst %d buckets %d, %+v at %d, a debt of %d:\nscript %+v\nDebt   %+v",
				alg, limit, w, l.Burst, l.Buckets, stored, now.UnixMilli(), units, got, want)
		}
		switch alg {
		case algorithms.SlidingWindow:
			n := l.Buckets
			if rng.IntN(5) == 0 {
				n = int(2 + rng.Int64N(algorithms.MaxBuckets-1)) // kept for other buckets
			}
			idx := algorithms.SubWindow(now.UnixMilli(), w, l.Buckets)
			stored := algorithms.Ring{Index: idx - int64(n) - 2 + rng.Int64N(int64(2*n)+5), Buckets: n}
			var counts []string
			for k := range n + 1 {
				stored.Counts[k] = rng.Int64N(limit/int64(n+1) + 1)
				counts = append(counts, strconv.FormatInt(stored.Counts[k], 10))
			}
			if _, err := s.Do("HSET", key, "w", fmt.Sprint(stored.Index), "r", strings.Join(counts, ",")); err != nil {
				t.Fatal(err)
			}
			trueUp(t, r, now, q, d, 1+units)
			v := hget(key, "w", "r")
			got := algorithms.Ring{Index: atoi(v[0])}
			for k, c := range strings.Split(v[1], ",") {
				got.Counts[k] = atoi(c)
				got.Buckets = k
			}
			if want := algorithms.DebtRing(stored, now, l, units); got != want {
				fail(stored, got, want)
			}
		case algorithms.GCRA:
			burst := l.BurstFor(limit)
			depth, _ := algorithms.Interval(burst, l.Window, limit)
			den := limit
			if rng.IntN(4) == 0 {
				den = logUniform(1, math.MaxInt32) // kept for another limit
			}
			stored := algorithms.Counts{W: now.UnixMilli() - depth + rng.Int64N(3*depth+2), C: rng.Int64N(den), P: den}
			if _, err := s.Do("HSET", key, "w", fmt.Sprint(stored.W), "c", fmt.Sprint(stored.C), "p", fmt.Sprint(stored.P)); err != nil {
				t.Fatal(err)
			}
			trueUp(t, r, now, q, d, 1+units)
			v := hget(key, "w", "c", "p")
			got := algorithms.Counts{W: atoi(v[0]), C: atoi(v[1]), P: atoi(v[2])}
			if want := algorithms.Debt(alg, stored, now, l, units); got != want {
				fail(stored, got, want)
			}
		default:
			idx := now.UnixMilli() / w
			stored := algorithms.WindowCounts{Window: idx - 2 + rng.Int64N(5), Current: rng.Int64N(limit + 1), Previous: rng.Int64N(limit + 1)}.Counts()
			if _, err := s.Do("HSET", key, "w", fmt.Sprint(stored.W), "c", fmt.Sprint(stored.C), "p", fmt.Sprint(stored.P)); err != nil {
				t.Fatal(err)
			}
			trueUp(t, r, now, q, d, 1+units)
			v := hget(key, "w", "c", "p")
			got := algorithms.Counts{W: atoi(v[0]), C: atoi(v[1]), P: atoi(v[2])}
			if want := algorithms.Debt(alg, stored, now, l, units); got != want {
				fail(stored, got, want)
			}
		}
	}
}

// TestRedisDebtExpiry: a debt keeps its key for as long as it matters: a
// hash gone since the reservation (its window over) is made again with
// the expiry a take would give it, and a TAT moved ahead moves the expiry
// with it.
func TestRedisDebtExpiry(t *testing.T) {
	s := redistest.Standalone(t)
	r := newRedisStore(t, new(Store), s.URL())
	pttl := func(zone string) time.Duration {
		t.Helper()
		v, err := s.Do("PTTL", r.counterKey(zone, "k"))
		if err != nil {
			t.Fatal(err)
		}
		return time.Duration(mustInt(t, v)) * time.Millisecond
	}
	at := vectors.Start.Add(15 * time.Second) // 15 s into a minute

	q := storage.Request{Zone: "gone", Key: "k", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 5, Window: time.Minute}, Cost: 1}
	d := redisTake(t, r, at, q)[0]
	if _, err := s.Do("DEL", r.counterKey("gone", "k")); err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	trueUp(t, r, at, q, d, 4)
	// As a take's: the end of the next window, 105 s on; PTTL may be
	// short of it by the time between the true-up and the read.
	if got, want := pttl("gone"), 105*time.Second; got > want || got < want-time.Since(sent)-time.Millisecond {
		t.Fatalf("a hash made again by a debt expires in %s, want %s", got, want)
	}
	if c := counted(t, s, r, "gone", "k"); c != 3 {
		t.Fatalf("a hash made again by a debt of 3 counts %d", c)
	}

	// T = 1 min; the burst of 5 is a bucket of 5 min. Taking 5 puts the
	// TAT 5 min ahead; a debt of 3 moves it 3 min more.
	g := storage.Request{Zone: "gcra", Key: "k", Algorithm: algorithms.GCRA, Rate: algorithms.Rate{Units: 1, Window: time.Minute, Burst: 5}, Cost: 5}
	d = redisTake(t, r, at, g)[0]
	sent = time.Now()
	trueUp(t, r, at, g, d, 8)
	if got, want := pttl("gcra"), 8*time.Minute+time.Millisecond; got > want || got < want-time.Since(sent)-time.Millisecond {
		t.Fatalf("a gcra key whose debt moved its TAT 8 min ahead expires in %s, want %s", got, want)
	}
}

// TestRedisLeaseReservations: with leases, reservations (cost_from) take
// no lease, however hot their key: each is taken in Redis, where it is
// kept in flight, so every instance sees what all of them have in flight,
// and Redis counts exactly what the true-ups keep.
func TestRedisLeaseReservations(t *testing.T) {
	s := redistest.Standalone(t)
	prefix := fmt.Sprintf("lres%d:", time.Now().UnixNano())
	a, b := leaseStore(t, s, prefix, 0), leaseStore(t, s, prefix, 1)
	fleetOf(t, s, 2, a, b)
	req := storage.Request{Zone: "lres", Key: "k", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 100_000, Window: time.Hour},
		Cost: 4, Releasable: true, Reservation: true}
	type taken struct {
		r *Store
		d algorithms.Decision
	}
	var all []taken
	for i := range 200 {
		r := []*Store{a, b}[i%2]
		d := redisTake(t, r, time.Time{}, req)[0]
		if !d.Allowed {
			t.Fatalf("request %d: %+v", i, d)
		}
		all = append(all, taken{r, d})
	}
	if n := leasedUnits(a) + leasedUnits(b); n != 0 {
		t.Fatalf("%d units leased for reservations, want none", n)
	}
	for _, r := range []*Store{a, b} {
		st, err := r.KeyState(context.Background(), "lres", "k", algorithms.Rate{Window: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if st.InFlight != 800 {
			t.Fatalf("%d in flight, want the 800 the fleet reserved", st.InFlight)
		}
	}
	// Half are trued up to 1; the others' responses showed no cost.
	for i, x := range all {
		if i%2 == 0 {
			trueUp(t, x.r, time.Time{}, req, x.d, 1)
			continue
		}
		kept := req
		kept.Counted = true
		if err := x.r.Finish(context.Background(), []storage.Request{kept}, []algorithms.Decision{x.d}); err != nil {
			t.Fatal(err)
		}
	}
	st, err := a.KeyState(context.Background(), "lres", "k", algorithms.Rate{Window: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if st.InFlight != 0 {
		t.Fatalf("%d in flight once all are done, want 0", st.InFlight)
	}
	if n := counted(t, s, a, "lres", "k"); n != 100*1+100*4 {
		t.Fatalf("Redis counts %d, want the %d kept", n, 100*1+100*4)
	}
}
