package redis

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/internal/clocktest"
	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

func loadZone(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// TestRedisCalendarPeriodIsRedisClocks: at a period's edge, an instance
// whose clock is minutes off decides in the period Redis's clock is in,
// as every other instance does. The store's clock (r.now) is 3 minutes
// behind or ahead of the script's (Redis's clock, which the test sets),
// around midnight on February 1st in New York. An instance more than a
// period off gets an error, not a decision in the wrong period.
func TestRedisCalendarPeriodIsRedisClocks(t *testing.T) {
	s := redistest.Standalone(t)
	ny := loadZone(t, "America/New_York")
	month := algorithms.Rate{Units: 1, Calendar: algorithms.CalendarOf(algorithms.Month, ny)}
	edge := time.Date(2026, 2, 1, 0, 0, 0, 0, ny)
	january, february := month.WindowAt(edge.UnixMilli()-1), month.WindowAt(edge.UnixMilli())
	for _, skew := range []time.Duration{-3 * time.Minute, 3 * time.Minute} {
		t.Run(fmt.Sprint("skew ", skew), func(t *testing.T) {
			r := newRedisStore(t, new(Store), s.URL())
			req := storage.Request{Zone: "monthly", Key: "k", Algorithm: algorithms.FixedWindow, Rate: month, Cost: 1}
			take := func(redisClock time.Time) algorithms.Decision {
				t.Helper()
				r.now = func() time.Time { return redisClock.Add(skew) }
				return redisTake(t, r, redisClock, req)[0]
			}
			if d := take(edge.Add(-time.Second)); !d.Allowed || d.Window != january.Index {
				t.Fatalf("a second before the edge on Redis's clock: %+v, want allowed in January (%d)", d, january.Index)
			}
			if d := take(edge.Add(-time.Millisecond)); d.Allowed || !d.RetryAt.Equal(edge) {
				t.Fatalf("a millisecond before the edge on Redis's clock: %+v, want rejected until the edge", d)
			}
			d := take(edge)
			if !d.Allowed || d.Window != february.Index || !d.Reset.Equal(time.UnixMilli(february.End)) {
				t.Fatalf("at the edge on Redis's clock, %s on the instance's: %+v, want allowed in February (%d) until %s",
					edge.Add(skew), d, february.Index, time.UnixMilli(february.End))
			}
			w, err := s.Do("HGET", r.counterKey("monthly", storage.BoundKey("k")), "w")
			if err != nil || w != strconv.FormatInt(february.Index, 10) {
				t.Fatalf("Redis keeps the key's counts in window %s (%v), want February's, %d", w, err, february.Index)
			}
		})
	}
	t.Run("a period off", func(t *testing.T) {
		r := newRedisStore(t, new(Store), s.URL())
		day := algorithms.Rate{Units: 1, Calendar: algorithms.CalendarOf(algorithms.Day, ny)}
		r.now = func() time.Time { return edge.Add(-50 * time.Hour) }
		d := make([]algorithms.Decision, 1)
		r.scriptClock = func() time.Time { return edge }
		err := r.Take(context.Background(), []storage.Request{{Zone: "daily", Key: "k", Algorithm: algorithms.FixedWindow, Rate: day, Cost: 1}}, d)
		if err == nil || !strings.Contains(err.Error(), "a calendar period or more") {
			t.Fatalf("an instance two days behind Redis: %+v (%v), want an error", d[0], err)
		}
	})
}

// TestRedisCalendarEveryBoundary: at every boundary of every period from
// 2024 to 2030, in UTC, New York and Santiago (whose clock moves at
// midnight), the take script puts a request a millisecond before the
// boundary in the period before it and one at the boundary in the period
// after, with the expiry the end of the period after that: the periods
// Go computes. The store's clock is 5 minutes ahead of the script's
// before the boundary and 5 minutes behind at it, so the script picks
// among the periods it is handed, not the one the store's clock is in.
// The calls are pipelined, a thousand at a time.
func TestRedisCalendarEveryBoundary(t *testing.T) {
	s := redistest.Standalone(t)
	r := newRedisStore(t, new(Store), s.URL())
	opts, err := goredis.ParseURL(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	rdb := goredis.NewClient(opts)
	defer rdb.Close()
	ctx := context.Background()
	if err := takeScript.Load(ctx, rdb).Err(); err != nil {
		t.Fatal(err)
	}

	type call struct {
		key           string
		rate          algorithms.Rate
		at            time.Time
		window, after int64
	}
	var calls []call
	for _, zone := range []string{"UTC", "America/New_York", "America/Santiago"} {
		loc := loadZone(t, zone)
		for _, period := range []algorithms.CalendarPeriod{algorithms.Day, algorithms.Week, algorithms.Month, algorithms.Year} {
			cal := algorithms.CalendarOf(period, loc)
			end := time.Date(2031, 1, 1, 0, 0, 0, 0, loc).UnixMilli()
			for p := cal.At(time.Date(2024, 1, 1, 0, 0, 0, 0, loc).UnixMilli()); p.End < end; p = cal.Of(p.Index + 1) {
				next := cal.Of(p.Index + 1)
				key := r.counterKey(zone+"/"+string(period), strconv.FormatInt(p.Index, 10))
				rate := algorithms.Rate{Units: 1, Calendar: cal}
				calls = append(calls,
					call{key + ":before", rate, time.UnixMilli(p.End - 1), p.Index, next.End},
					call{key + ":at", rate, time.UnixMilli(p.End), next.Index, cal.Of(next.Index + 1).End})
			}
		}
	}
	if len(calls) < 2*3*(7*365+7*52+7*12+7) {
		t.Fatalf("%d calls, want two a boundary", len(calls))
	}
	for chunk := range slices.Chunk(calls, 1000) {
		pipe := rdb.Pipeline()
		evals := make([]*goredis.Cmd, len(chunk))
		fields := make([]*goredis.SliceCmd, len(chunk))
		for i, c := range chunk {
			skew := 5 * time.Minute
			if strings.HasSuffix(c.key, ":at") {
				skew = -skew
			}
			q := storage.Request{Algorithm: algorithms.FixedWindow, Rate: c.rate, Cost: 1}
			zone := scriptZone(q, 0, c.at.Add(skew))
			args := append([]any{c.at.UnixMilli(), 1, "1", 1, 1}, zone[:]...)
			evals[i] = pipe.EvalSha(ctx, takeScript.Hash(), []string{c.key}, args...)
			fields[i] = pipe.HMGet(ctx, c.key, "w", "t")
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
		for i, c := range chunk {
			v := fields[i].Val()
			if len(v) != 2 || v[0] != strconv.FormatInt(c.window, 10) || v[1] != strconv.FormatInt(c.after, 10) {
				t.Fatalf("%s at %s: Redis keeps window and expiry %v, want %d and %d", c.key, c.at.UTC(), v, c.window, c.after)
			}
		}
	}
}

// TestRedisLeaseCalendarPeriod: a lease of a calendar period's units is
// good for the period it was taken in. Leased decisions report the
// period's end, and once the instance's clock reaches it, the next
// request is decided by a script call, not from what is left of the
// lease. Redis's clock is its own; the period is a day in whichever of
// three zones has the most of its day left, so that Redis's clock stays
// in it while the test runs.
func TestRedisLeaseCalendarPeriod(t *testing.T) {
	s := redistest.Standalone(t)
	r := leaseStore(t, s, "calendar:", 0)
	now := time.Now()
	var rate algorithms.Rate
	var day algorithms.Span
	for _, zone := range []string{"UTC", "Asia/Tokyo", "America/New_York"} {
		l := algorithms.Rate{Units: 1 << 30, Calendar: algorithms.CalendarOf(algorithms.Day, loadZone(t, zone))}
		if p := l.WindowAt(now.UnixMilli()); p.End > day.End {
			rate, day = l, p
		}
	}
	clock := now
	r.now = func() time.Time { return clock }
	req := storage.Request{Zone: "daily", Key: "hot", Algorithm: algorithms.FixedWindow, Rate: rate, Cost: 1}
	if _, err := s.Do("CONFIG", "RESETSTAT"); err != nil {
		t.Fatal(err)
	}
	end := time.UnixMilli(day.End)
	const requests = 200
	for i := range requests {
		d := redisTake(t, r, time.Time{}, req)[0]
		// The period's end, moved to the instance's clock by as much as
		// it is off Redis's: milliseconds on one machine.
		if !d.Allowed || d.Window != day.Index || d.Reset.Sub(end).Abs() > time.Second {
			t.Fatalf("request %d: %+v, want allowed in day %d, until %s", i, d, day.Index, end)
		}
	}
	if calls := scriptCalls(t, s); calls > requests/10 {
		t.Fatalf("%d script calls for %d requests, want leases to decide most", calls, requests)
	}
	if leasedUnits(r) == 0 {
		t.Fatal("no units leased")
	}
	if _, err := s.Do("CONFIG", "RESETSTAT"); err != nil {
		t.Fatal(err)
	}
	clock = end.Add(time.Second)
	redisTake(t, r, time.Time{}, req)
	if calls := scriptCalls(t, s); calls == 0 {
		t.Fatal("a request after the period's end was taken from the period's lease")
	}
}

// TestRedisDenyCacheCalendarPeriod: a sliding tail full for the day is
// refused from the local cache until its retry instant, a millisecond
// into the next day; asked at the day's end, the cached refusal reports
// the next day's end as its reset, with no Redis command. The day is the
// one of three zones with the most of it left, so that Redis's clock
// stays in it; the store's clock is the test's.
func TestRedisDenyCacheCalendarPeriod(t *testing.T) {
	s := redistest.Standalone(t)
	r := newRedisStore(t, new(Store), s.URL())
	clock := clocktest.New(time.Now())
	r.now = clock.Now
	var rate algorithms.Rate
	var day algorithms.Span
	for _, zone := range []string{"UTC", "Asia/Tokyo", "America/New_York"} {
		l := algorithms.Rate{Units: 2, Calendar: algorithms.CalendarOf(algorithms.Day, loadZone(t, zone))}
		if p := l.WindowAt(clock.Now().UnixMilli()); p.End > day.End {
			rate, day = l, p
		}
	}
	req := storage.Request{Zone: "daily", Key: "k", Algorithm: algorithms.SlidingTail, Rate: rate, Cost: 1}
	redisTake(t, r, time.Time{}, req)
	redisTake(t, r, time.Time{}, req)
	first := redisTake(t, r, time.Time{}, req)[0]
	end := time.UnixMilli(day.End)
	if first.Allowed || first.RetryAt.Sub(end).Abs() > time.Second || first.Reset.Sub(end).Abs() > time.Second {
		t.Fatalf("third request: %+v, want rejected until the day's end, %s", first, end)
	}
	if _, err := s.Do("CONFIG", "RESETSTAT"); err != nil {
		t.Fatal(err)
	}
	clock.Set(first.Reset)
	d := redisTake(t, r, time.Time{}, req)[0]
	next := rate.WindowOf(day.Index + 1)
	if d.Allowed || !d.RetryAt.Equal(first.RetryAt) || !d.Reset.Equal(first.Reset.Add(time.Duration(next.Length())*time.Millisecond)) {
		t.Fatalf("at the day's end, cached: %+v, want the refusal until %s, reset a day of %s later", d, first.RetryAt, time.Duration(next.Length())*time.Millisecond)
	}
	if n := scriptCalls(t, s); n != 0 {
		t.Fatalf("cached refusal ran %d scripts", n)
	}
}
