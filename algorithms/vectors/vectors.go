// Package vectors holds the table of (time, key, cost) → decision test
// vectors that every store must satisfy, so the in-memory store and the
// Redis script are held to one definition of each algorithm.
package vectors

import (
	"math"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
)

// Step is one request in a Case: At is the offset from the Case's Start.
type Step struct {
	At        time.Duration
	Key       string
	Cost      int64
	Allowed   bool
	Remaining int64
	// RetryAfter, for a rejected step, is RetryAt minus the step's instant.
	RetryAfter time.Duration
	// ResetAfter, when not zero, is Reset minus the step's instant.
	ResetAfter time.Duration
	// Rate, when set, is the limit from this step on, as a reload would
	// change it; the Case's Rate holds until then.
	Rate *algorithms.Rate
}

// Case is a sequence of requests against one limit, starting from empty
// counters.
type Case struct {
	Name      string
	Algorithm algorithms.Algorithm
	Rate      algorithms.Rate
	// Wide tells that the case's limits and counts run past 2^31, to
	// 2^63-1 (a zone priced in money): a store takes its requests as
	// storage.Request.Wide.
	Wide  bool
	Steps []Step
}

// Start is the instant the cases count from: 2026-01-01 12:00:00 UTC, which
// is aligned to every window used below.
var Start = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

// at returns the offset from Start of an instant written in RFC 3339.
func at(instant string) time.Duration {
	t, err := time.Parse(time.RFC3339Nano, instant)
	if err != nil {
		panic(err)
	}
	return t.Sub(Start)
}

// zone returns the time zone of an IANA name.
func zone(name string) *time.Location {
	loc, err := time.LoadLocation(name)
	if err != nil {
		panic(err)
	}
	return loc
}

// Cases is the shared table.
var Cases = []Case{
	{
		// The worked example from the 2018 write-up of the sliding-window
		// algorithm: 3 requests per 60 s, windows from 12:00:00 and 12:01:00.
		Name:      "sliding_tail/worked_example",
		Algorithm: algorithms.SlidingTail,
		Rate:      algorithms.Rate{Units: 3, Window: time.Minute},
		Steps: []Step{
			{At: 5 * time.Second, Key: "a", Cost: 1, Allowed: true, Remaining: 2},
			{At: 15 * time.Second, Key: "a", Cost: 1, Allowed: true, Remaining: 1},
			// floor(2*59/60)=1, +0+1 = 2
			{At: 61 * time.Second, Key: "a", Cost: 1, Allowed: true, Remaining: 1},
			// floor(2*50/60)=1, +1+1 = 3
			{At: 70 * time.Second, Key: "a", Cost: 1, Allowed: true, Remaining: 0},
			// floor(2*20/60)=0, +2+1 = 3
			{At: 100 * time.Second, Key: "a", Cost: 1, Allowed: true, Remaining: 0},
			// weighted 2*10/60+3+1 = 4.3 > 3: rejected. The current window
			// alone is full, so it frees up once the 3 carried into the next
			// window round down to 2: floor(3*(60-e)/60) <= 2 from e = 1 ms.
			{At: 110 * time.Second, Key: "a", Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 10*time.Second + time.Millisecond},
			// floor(3*40/60)=2, +0+1 = 3: the rejection counted nothing.
			{At: 140 * time.Second, Key: "a", Cost: 1, Allowed: true, Remaining: 0},
		},
	},
	{
		Name:      "sliding_tail/previous_window_decays",
		Algorithm: algorithms.SlidingTail,
		Rate:      algorithms.Rate{Units: 4, Window: 10 * time.Second},
		Steps: []Step{
			{At: 0, Key: "k", Cost: 4, Allowed: true, Remaining: 0},
			// the 4 carried into the next window round down to 3 from e = 1 ms
			{At: 9 * time.Second, Key: "k", Cost: 1, Allowed: false, Remaining: 0, RetryAfter: time.Second + time.Millisecond},
			// next window, 2 s in: floor(4*8/10)=3, +0+1 = 4
			{At: 12 * time.Second, Key: "k", Cost: 1, Allowed: true, Remaining: 0},
			// floor(4*7.5/10)=3 +1 +1 = 5 > 4; floor(4*(10-e)/10) <= 2 needs
			// 10-e < 7.5, so the first allowed instant is 1 ms later
			{At: 12500 * time.Millisecond, Key: "k", Cost: 1, Allowed: false, Remaining: 0, RetryAfter: time.Millisecond},
			{At: 15 * time.Second, Key: "k", Cost: 1, Allowed: true, Remaining: 0},
			// other keys are counted apart
			{At: 15 * time.Second, Key: "other", Cost: 4, Allowed: true, Remaining: 0},
			// two windows later nothing is left
			{At: 30 * time.Second, Key: "k", Cost: 4, Allowed: true, Remaining: 0},
		},
	},
	{
		Name:      "sliding_tail/cost",
		Algorithm: algorithms.SlidingTail,
		Rate:      algorithms.Rate{Units: 10, Window: time.Second},
		Steps: []Step{
			{At: 0, Key: "c", Cost: 5, Allowed: true, Remaining: 5},
			{At: 100 * time.Millisecond, Key: "c", Cost: 5, Allowed: true, Remaining: 0},
			// next window: floor(10*(1000-e)/1000) <= 5 needs e > 400 ms
			{At: 200 * time.Millisecond, Key: "c", Cost: 5, Allowed: false, Remaining: 0, RetryAfter: 800*time.Millisecond + 401*time.Millisecond},
			// cost above the limit is never allowed; retry names the window end
			{At: 300 * time.Millisecond, Key: "c", Cost: 11, Allowed: false, Remaining: 0, RetryAfter: 700 * time.Millisecond},
			// next window, 600 ms in: floor(10*0.4)=4 +0 +5 = 9
			{At: 1600 * time.Millisecond, Key: "c", Cost: 5, Allowed: true, Remaining: 1},
		},
	},
	{
		Name:      "fixed_window/basic",
		Algorithm: algorithms.FixedWindow,
		Rate:      algorithms.Rate{Units: 3, Window: time.Minute},
		Steps: []Step{
			{At: 5 * time.Second, Key: "a", Cost: 1, Allowed: true, Remaining: 2},
			{At: 15 * time.Second, Key: "a", Cost: 1, Allowed: true, Remaining: 1},
			{At: 59 * time.Second, Key: "a", Cost: 1, Allowed: true, Remaining: 0},
			{At: 59500 * time.Millisecond, Key: "a", Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 500 * time.Millisecond},
			// a new window forgets everything
			{At: 60 * time.Second, Key: "a", Cost: 3, Allowed: true, Remaining: 0},
			{At: 61 * time.Second, Key: "b", Cost: 2, Allowed: true, Remaining: 1},
			{At: 62 * time.Second, Key: "b", Cost: 2, Allowed: false, Remaining: 1, RetryAfter: 58 * time.Second},
			{At: 63 * time.Second, Key: "b", Cost: 1, Allowed: true, Remaining: 0},
		},
	},
	{
		// A request whose clock reads a time before the window its key was
		// last taken in (a clock stepped back, or a request that read
		// the time just before another took in the next window) is decided
		// in that later window: it must not forget what was counted there.
		Name:      "fixed_window/clock_steps_back",
		Algorithm: algorithms.FixedWindow,
		Rate:      algorithms.Rate{Units: 2, Window: time.Minute},
		Steps: []Step{
			{At: 60 * time.Second, Key: "a", Cost: 1, Allowed: true, Remaining: 1},
			{At: 61 * time.Second, Key: "a", Cost: 1, Allowed: true, Remaining: 0},
			{At: 59500 * time.Millisecond, Key: "a", Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 60500 * time.Millisecond},
			{At: 62 * time.Second, Key: "a", Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 58 * time.Second},
		},
	},
	{
		Name:      "sliding_tail/clock_steps_back",
		Algorithm: algorithms.SlidingTail,
		Rate:      algorithms.Rate{Units: 2, Window: time.Minute},
		Steps: []Step{
			{At: 60 * time.Second, Key: "a", Cost: 1, Allowed: true, Remaining: 1},
			{At: 61 * time.Second, Key: "a", Cost: 1, Allowed: true, Remaining: 0},
			// Decided as of 12:01:00: the 2 counted then carry into the
			// next window and round down to 1 from 12:02:00.001.
			{At: 59500 * time.Millisecond, Key: "a", Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 60501 * time.Millisecond},
			{At: 62 * time.Second, Key: "a", Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 58001 * time.Millisecond},
		},
	},
	{
		// The documented gcra worked example: limit 10 per 1s, burst 3,
		// so T = 100ms.
		Name:      "gcra/spec_vector",
		Algorithm: algorithms.GCRA,
		Rate:      algorithms.Rate{Units: 10, Window: time.Second, Burst: 3},
		Steps: []Step{
			{At: 0, Key: "a", Cost: 1, Allowed: true, Remaining: 2, ResetAfter: 100 * time.Millisecond},
			{At: 0, Key: "a", Cost: 1, Allowed: true, Remaining: 1, ResetAfter: 200 * time.Millisecond},
			{At: 0, Key: "a", Cost: 1, Allowed: true, Remaining: 0, ResetAfter: 300 * time.Millisecond},
			{At: 0, Key: "a", Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 100 * time.Millisecond},
			{At: 100 * time.Millisecond, Key: "a", Cost: 1, Allowed: true, Remaining: 0, ResetAfter: 300 * time.Millisecond},
			{At: 100 * time.Millisecond, Key: "a", Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 100 * time.Millisecond},
			{At: time.Second, Key: "a", Cost: 1, Allowed: true, Remaining: 2},
			{At: time.Second, Key: "a", Cost: 1, Allowed: true, Remaining: 1},
			{At: time.Second, Key: "a", Cost: 1, Allowed: true, Remaining: 0},
		},
	},
	{
		// T = 333⅓ ms is no whole number of milliseconds: the fraction is
		// kept exactly, so each retry instant is the next millisecond after
		// the exact one, and no drift builds up.
		Name:      "gcra/fractional_interval",
		Algorithm: algorithms.GCRA,
		Rate:      algorithms.Rate{Units: 3, Window: time.Second, Burst: 1},
		Steps: []Step{
			{At: 0, Key: "f", Cost: 1, Allowed: true, Remaining: 0, ResetAfter: 334 * time.Millisecond},
			{At: 333 * time.Millisecond, Key: "f", Cost: 1, Allowed: false, Remaining: 0, RetryAfter: time.Millisecond},
			{At: 334 * time.Millisecond, Key: "f", Cost: 1, Allowed: true, Remaining: 0, ResetAfter: 334 * time.Millisecond},
			{At: 667 * time.Millisecond, Key: "f", Cost: 1, Allowed: false, Remaining: 0, RetryAfter: time.Millisecond},
			{At: 668 * time.Millisecond, Key: "f", Cost: 1, Allowed: true, Remaining: 0, ResetAfter: 334 * time.Millisecond},
			{At: 2002 * time.Millisecond, Key: "f", Cost: 1, Allowed: true, Remaining: 0},
		},
	},
	{
		Name:      "gcra/cost",
		Algorithm: algorithms.GCRA,
		Rate:      algorithms.Rate{Units: 10, Window: time.Second, Burst: 3},
		Steps: []Step{
			// more than the burst is never allowed: retry names the time
			// a bucket takes to fill
			{At: 0, Key: "c", Cost: 4, Allowed: false, Remaining: 3, RetryAfter: 300 * time.Millisecond},
			{At: 0, Key: "c", Cost: 3, Allowed: true, Remaining: 0, ResetAfter: 300 * time.Millisecond},
			// cost 0 is allowed while the bucket is not over-full, and
			// reports what is left
			{At: 50 * time.Millisecond, Key: "c", Cost: 0, Allowed: true, Remaining: 0, ResetAfter: 250 * time.Millisecond},
			{At: 400 * time.Millisecond, Key: "c", Cost: 0, Allowed: true, Remaining: 3},
		},
	},
	{
		// A clock stepped back sees a TAT further ahead than it is.
		Name:      "gcra/clock_steps_back",
		Algorithm: algorithms.GCRA,
		Rate:      algorithms.Rate{Units: 10, Window: time.Second, Burst: 3},
		Steps: []Step{
			{At: time.Second, Key: "b", Cost: 3, Allowed: true, Remaining: 0},
			{At: 500 * time.Millisecond, Key: "b", Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 600 * time.Millisecond},
			{At: 1100 * time.Millisecond, Key: "b", Cost: 1, Allowed: true, Remaining: 0},
		},
	},
	{
		// A key idle for a long time has a full bucket, and partial
		// refills count whole units.
		Name:      "gcra/idle_key",
		Algorithm: algorithms.GCRA,
		Rate:      algorithms.Rate{Units: 5, Window: time.Hour},
		Steps: []Step{
			{At: 0, Key: "i", Cost: 5, Allowed: true, Remaining: 0, ResetAfter: time.Hour},
			{At: 12 * time.Minute, Key: "i", Cost: 1, Allowed: true, Remaining: 0, ResetAfter: time.Hour},
			{At: 100 * 24 * time.Hour, Key: "i", Cost: 1, Allowed: true, Remaining: 4, ResetAfter: 12 * time.Minute},
		},
	},
	{
		// The largest limit over 30 days: T is 1.2069... ms, and the
		// products c·window and remaining's span pass 2^53.
		Name:      "gcra/largest_limit",
		Algorithm: algorithms.GCRA,
		Rate:      algorithms.Rate{Units: 1<<31 - 1, Window: 30 * 24 * time.Hour},
		Steps: []Step{
			{At: 0, Key: "h", Cost: 1<<31 - 1, Allowed: true, Remaining: 0, ResetAfter: 30 * 24 * time.Hour},
			{At: time.Millisecond, Key: "h", Cost: 1, Allowed: false, Remaining: 0, RetryAfter: time.Millisecond},
			{At: 2 * time.Millisecond, Key: "h", Cost: 1, Allowed: true, Remaining: 0},
			{At: 30 * 24 * time.Hour, Key: "h", Cost: 1, Allowed: true, Remaining: 1<<31 - 3, ResetAfter: 3 * time.Millisecond},
		},
	},
	{
		// 3 per 60 s in six sub-windows of 10 s. At 61 s the sub-windows 0
		// to 6 hold 2+1: the two of 0 s and 5 s leave when sub-window 7
		// starts, at 70 s. At 72 s the one of 55 s keeps the key full
		// until sub-window 5 leaves, at 120 s.
		Name:      "sliding_window/spec_example",
		Algorithm: algorithms.SlidingWindow,
		Rate:      algorithms.Rate{Units: 3, Window: time.Minute, Buckets: 6},
		Steps: []Step{
			{At: 0, Key: "a", Cost: 1, Allowed: true, Remaining: 2, ResetAfter: 70 * time.Second},
			{At: 5 * time.Second, Key: "a", Cost: 1, Allowed: true, Remaining: 1},
			{At: 55 * time.Second, Key: "a", Cost: 1, Allowed: true, Remaining: 0, ResetAfter: 65 * time.Second},
			{At: 61 * time.Second, Key: "a", Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 9 * time.Second},
			{At: 70 * time.Second, Key: "a", Cost: 1, Allowed: true, Remaining: 1},
			{At: 71 * time.Second, Key: "a", Cost: 1, Allowed: true, Remaining: 0},
			{At: 72 * time.Second, Key: "a", Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 48 * time.Second},
			{At: 120 * time.Second, Key: "a", Cost: 1, Allowed: true, Remaining: 0},
		},
	},
	{
		Name:      "sliding_window/cost",
		Algorithm: algorithms.SlidingWindow,
		Rate:      algorithms.Rate{Units: 10, Window: 10 * time.Second, Buckets: 5},
		Steps: []Step{
			{At: 0, Key: "c", Cost: 4, Allowed: true, Remaining: 6},
			{At: time.Second, Key: "c", Cost: 4, Allowed: true, Remaining: 2},
			// the 8 of sub-window 0 leave when sub-window 6 starts, at 12 s
			{At: 3 * time.Second, Key: "c", Cost: 3, Allowed: false, Remaining: 2, RetryAfter: 9 * time.Second},
			// a cost above the limit is never allowed: retry names the reset
			{At: 3500 * time.Millisecond, Key: "c", Cost: 11, Allowed: false, Remaining: 2, RetryAfter: 10500 * time.Millisecond},
			{At: 12 * time.Second, Key: "c", Cost: 3, Allowed: true, Remaining: 7},
		},
	},
	{
		Name:      "sliding_window/idle_gap",
		Algorithm: algorithms.SlidingWindow,
		Rate:      algorithms.Rate{Units: 2, Window: time.Minute},
		Steps: []Step{
			{At: 0, Key: "i", Cost: 1, Allowed: true, Remaining: 1},
			{At: 0, Key: "i", Cost: 1, Allowed: true, Remaining: 0},
			{At: time.Second, Key: "i", Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 65 * time.Second},
			{At: time.Hour, Key: "i", Cost: 1, Allowed: true, Remaining: 1},
		},
	},
	{
		// Counted in sub-window 6 (60 s); a request reading 59 s is
		// decided as of sub-window 6.
		Name:      "sliding_window/clock_steps_back",
		Algorithm: algorithms.SlidingWindow,
		Rate:      algorithms.Rate{Units: 2, Window: time.Minute, Buckets: 6},
		Steps: []Step{
			{At: 65 * time.Second, Key: "b", Cost: 1, Allowed: true, Remaining: 1},
			{At: 66 * time.Second, Key: "b", Cost: 1, Allowed: true, Remaining: 0},
			{At: 59 * time.Second, Key: "b", Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 71 * time.Second},
			{At: 130 * time.Second, Key: "b", Cost: 2, Allowed: true, Remaining: 0},
		},
	},
	{
		Name:      "sliding_window/buckets_2",
		Algorithm: algorithms.SlidingWindow,
		Rate:      algorithms.Rate{Units: 2, Window: 10 * time.Second, Buckets: 2},
		Steps: []Step{
			{At: 0, Key: "t", Cost: 1, Allowed: true, Remaining: 1},
			{At: 4900 * time.Millisecond, Key: "t", Cost: 1, Allowed: true, Remaining: 0},
			{At: 5 * time.Second, Key: "t", Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 10 * time.Second},
			{At: 15 * time.Second, Key: "t", Cost: 1, Allowed: true, Remaining: 1},
		},
	},
	{
		Name:      "sliding_window/buckets_60",
		Algorithm: algorithms.SlidingWindow,
		Rate:      algorithms.Rate{Units: 60, Window: time.Minute, Buckets: 60},
		Steps: []Step{
			{At: 0, Key: "s", Cost: 60, Allowed: true, Remaining: 0, ResetAfter: 61 * time.Second},
			{At: 59999 * time.Millisecond, Key: "s", Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 1001 * time.Millisecond},
			{At: 61 * time.Second, Key: "s", Cost: 60, Allowed: true, Remaining: 0},
		},
	},
	{
		// 1000 ms in three: sub-windows start at 0, 334, 667 and 1334 ms.
		Name:      "sliding_window/uneven_buckets",
		Algorithm: algorithms.SlidingWindow,
		Rate:      algorithms.Rate{Units: 1, Window: time.Second, Buckets: 3},
		Steps: []Step{
			{At: 0, Key: "u", Cost: 1, Allowed: true, Remaining: 0, ResetAfter: 1334 * time.Millisecond},
			{At: 500 * time.Millisecond, Key: "u", Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 834 * time.Millisecond},
			{At: 1333 * time.Millisecond, Key: "u", Cost: 1, Allowed: false, Remaining: 0, RetryAfter: time.Millisecond},
			{At: 1334 * time.Millisecond, Key: "u", Cost: 1, Allowed: true, Remaining: 0},
		},
	},
	// A reload that changes a zone's window starts its keys afresh: the
	// stored window index counts windows of the old length. Grown, it is
	// far ahead of the clock and must not be taken for a clock that
	// stepped back (deciding as of that window would reset centuries
	// later); shrunk, it is far behind.
	{
		Name:      "fixed_window/window_grows",
		Algorithm: algorithms.FixedWindow,
		Rate:      algorithms.Rate{Units: 3, Window: time.Second},
		Steps: []Step{
			{At: 0, Key: "g", Cost: 3, Allowed: true, Remaining: 0},
			{At: 500 * time.Millisecond, Key: "g", Cost: 1, Allowed: true, Remaining: 2,
				Rate: &algorithms.Rate{Units: 3, Window: time.Minute}},
			{At: time.Second, Key: "g", Cost: 2, Allowed: true, Remaining: 0},
			{At: 2 * time.Second, Key: "g", Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 58 * time.Second},
		},
	},
	{
		Name:      "fixed_window/window_shrinks",
		Algorithm: algorithms.FixedWindow,
		Rate:      algorithms.Rate{Units: 3, Window: time.Minute},
		Steps: []Step{
			{At: 0, Key: "s", Cost: 3, Allowed: true, Remaining: 0},
			{At: 30 * time.Second, Key: "s", Cost: 3, Allowed: true, Remaining: 0,
				Rate: &algorithms.Rate{Units: 3, Window: time.Second}},
		},
	},
	{
		Name:      "sliding_tail/window_grows",
		Algorithm: algorithms.SlidingTail,
		Rate:      algorithms.Rate{Units: 3, Window: time.Second},
		Steps: []Step{
			{At: 0, Key: "g", Cost: 3, Allowed: true, Remaining: 0},
			{At: 1500 * time.Millisecond, Key: "g", Cost: 3, Allowed: true, Remaining: 0,
				Rate: &algorithms.Rate{Units: 3, Window: time.Minute}},
			// the 3 carry into the next minute and round down to 2 from
			// 12:01:00.001
			{At: 2 * time.Second, Key: "g", Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 58001 * time.Millisecond},
		},
	},
	{
		Name:      "sliding_window/window_grows",
		Algorithm: algorithms.SlidingWindow,
		Rate:      algorithms.Rate{Units: 2, Window: time.Second},
		Steps: []Step{
			{At: 0, Key: "g", Cost: 2, Allowed: true, Remaining: 0},
			{At: 500 * time.Millisecond, Key: "g", Cost: 2, Allowed: true, Remaining: 0,
				Rate: &algorithms.Rate{Units: 2, Window: time.Minute}},
			// sub-window 0 of 6 s leaves at 66 s
			{At: time.Second, Key: "g", Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 65 * time.Second},
		},
	},
	// Calendar periods. January 2026 in New York runs from 05:00 UTC on
	// the 1st to 05:00 UTC on February 1st; February has 28 days.
	{
		Name:      "fixed_window/month_in_new_york",
		Algorithm: algorithms.FixedWindow,
		Rate:      algorithms.Rate{Units: 3, Calendar: algorithms.CalendarOf(algorithms.Month, zone("America/New_York"))},
		Steps: []Step{
			{At: 0, Key: "m", Cost: 1, Allowed: true, Remaining: 2, ResetAfter: 31*24*time.Hour - 7*time.Hour},
			{At: at("2026-02-01T04:00:00Z"), Key: "m", Cost: 2, Allowed: true, Remaining: 0, ResetAfter: time.Hour},
			// February in UTC, still January in New York
			{At: at("2026-02-01T04:59:59.999Z"), Key: "m", Cost: 1, Allowed: false, Remaining: 0, RetryAfter: time.Millisecond},
			{At: at("2026-02-01T05:00:00Z"), Key: "m", Cost: 1, Allowed: true, Remaining: 2, ResetAfter: 28 * 24 * time.Hour},
		},
	},
	{
		// The 10 of January weigh in February by the share of
		// February's 28 days still to run: 14 days, half, at 00:00 on
		// the 15th. Rejected with 6 in February, the key waits until
		// floor(10*(end-t)/28d) is 3: 0.6 of February gone.
		Name:      "sliding_tail/month_in_new_york",
		Algorithm: algorithms.SlidingTail,
		Rate:      algorithms.Rate{Units: 10, Calendar: algorithms.CalendarOf(algorithms.Month, zone("America/New_York"))},
		Steps: []Step{
			{At: at("2026-01-10T00:00:00Z"), Key: "t", Cost: 10, Allowed: true, Remaining: 0},
			{At: at("2026-02-15T05:00:00Z"), Key: "t", Cost: 5, Allowed: true, Remaining: 0, ResetAfter: 14 * 24 * time.Hour},
			// floor(10*(14d-1ms)/28d) = 4, +5 +1
			{At: at("2026-02-15T05:00:00.001Z"), Key: "t", Cost: 1, Allowed: true, Remaining: 0},
			{At: at("2026-02-15T05:00:00.001Z"), Key: "t", Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 241920 * time.Second},
			{At: at("2026-02-18T00:12:00.001Z"), Key: "t", Cost: 1, Allowed: true, Remaining: 0},
		},
	},
	{
		// New York's 2026-03-08 lasts 23 hours. A key full on the 7th
		// waits into the 8th until floor(3*(end-t)/23h) is 0: 2/3 of
		// the 8th's 23 hours, not of 24.
		Name:      "sliding_tail/day_of_23_hours",
		Algorithm: algorithms.SlidingTail,
		Rate:      algorithms.Rate{Units: 3, Calendar: algorithms.CalendarOf(algorithms.Day, zone("America/New_York"))},
		Steps: []Step{
			{At: at("2026-03-07T15:00:00Z"), Key: "d", Cost: 3, Allowed: true, Remaining: 0, ResetAfter: 14 * time.Hour},
			{At: at("2026-03-08T01:00:00Z"), Key: "d", Cost: 3, Allowed: false, Remaining: 0, RetryAfter: 4*time.Hour + 55200001*time.Millisecond},
			{At: at("2026-03-08T20:20:00Z"), Key: "d", Cost: 3, Allowed: false, Remaining: 2, RetryAfter: time.Millisecond},
			{At: at("2026-03-08T20:20:00.001Z"), Key: "d", Cost: 3, Allowed: true, Remaining: 0, ResetAfter: 27599999 * time.Millisecond},
		},
	},
	{
		// Santiago's 2026-09-06 has no midnight: its clock goes from
		// 23:59:59 on the 5th to 01:00 on the 6th, which starts the day,
		// 23 hours long.
		Name:      "fixed_window/day_without_midnight",
		Algorithm: algorithms.FixedWindow,
		Rate:      algorithms.Rate{Units: 2, Calendar: algorithms.CalendarOf(algorithms.Day, zone("America/Santiago"))},
		Steps: []Step{
			{At: at("2026-09-06T02:00:00Z"), Key: "s", Cost: 2, Allowed: true, Remaining: 0, ResetAfter: 2 * time.Hour},
			{At: at("2026-09-06T03:59:59.999Z"), Key: "s", Cost: 1, Allowed: false, Remaining: 0, RetryAfter: time.Millisecond},
			{At: at("2026-09-06T04:00:00Z"), Key: "s", Cost: 1, Allowed: true, Remaining: 1, ResetAfter: 23 * time.Hour},
		},
	},
	{
		// window 24h is cut on the epoch, at midnight UTC: the same
		// windows as a day in UTC, so a reload from one to the other
		// keeps the counts.
		Name:      "fixed_window/24h_is_a_day_in_utc",
		Algorithm: algorithms.FixedWindow,
		Rate:      algorithms.Rate{Units: 3, Window: 24 * time.Hour},
		Steps: []Step{
			{At: 0, Key: "u", Cost: 3, Allowed: true, Remaining: 0, ResetAfter: 12 * time.Hour},
			{At: time.Hour, Key: "u", Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 11 * time.Hour,
				Rate: &algorithms.Rate{Units: 3, Calendar: algorithms.CalendarOf(algorithms.Day, time.UTC)}},
			{At: 12 * time.Hour, Key: "u", Cost: 3, Allowed: true, Remaining: 0, ResetAfter: 24 * time.Hour},
		},
	},
	{
		// A day's index (20454) is far ahead of a month's (672): the
		// counts start afresh, as when a window grows.
		Name:      "fixed_window/day_becomes_month",
		Algorithm: algorithms.FixedWindow,
		Rate:      algorithms.Rate{Units: 3, Calendar: algorithms.CalendarOf(algorithms.Day, time.UTC)},
		Steps: []Step{
			{At: 0, Key: "g", Cost: 3, Allowed: true, Remaining: 0},
			{At: time.Second, Key: "g", Cost: 1, Allowed: true, Remaining: 2, ResetAfter: 31*24*time.Hour - 12*time.Hour - time.Second,
				Rate: &algorithms.Rate{Units: 3, Calendar: algorithms.CalendarOf(algorithms.Month, time.UTC)}},
		},
	},
	{
		Name:      "sliding_window/largest_limit",
		Algorithm: algorithms.SlidingWindow,
		Rate:      algorithms.Rate{Units: 1<<31 - 1, Window: time.Second},
		Steps: []Step{
			{At: 0, Key: "l", Cost: 1<<31 - 1, Allowed: true, Remaining: 0},
			{At: 999 * time.Millisecond, Key: "l", Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 101 * time.Millisecond},
			{At: 1100 * time.Millisecond, Key: "l", Cost: 1<<31 - 1, Allowed: true, Remaining: 0},
		},
	},
	{
		// The top of the 64-bit range, where doubles are off by
		// thousands: every unit counts.
		Name:      "fixed_window/64_bit",
		Algorithm: algorithms.FixedWindow,
		Rate:      algorithms.Rate{Units: math.MaxInt64, Window: time.Minute},
		Wide:      true,
		Steps: []Step{
			{At: 0, Key: "w", Cost: math.MaxInt64 - 10, Allowed: true, Remaining: 10},
			{At: time.Second, Key: "w", Cost: 11, Allowed: false, Remaining: 10, RetryAfter: 59 * time.Second},
			{At: 2 * time.Second, Key: "w", Cost: 1<<53 + 1, Allowed: false, Remaining: 10, RetryAfter: 58 * time.Second},
			{At: 3 * time.Second, Key: "w", Cost: 10, Allowed: true, Remaining: 0},
			{At: time.Minute, Key: "w", Cost: math.MaxInt64, Allowed: true, Remaining: 0},
		},
	},
	{
		Name:      "sliding_tail/64_bit",
		Algorithm: algorithms.SlidingTail,
		Rate:      algorithms.Rate{Units: math.MaxInt64, Window: time.Minute},
		Wide:      true,
		Steps: []Step{
			{At: 0, Key: "w", Cost: math.MaxInt64 - 3, Allowed: true, Remaining: 3},
			// The current window alone is too full: it frees up once its
			// count, carried into the next, decays by one unit, at once.
			{At: time.Second, Key: "w", Cost: 4, Allowed: false, Remaining: 3, RetryAfter: 59001 * time.Millisecond},
			{At: time.Second, Key: "w", Cost: 3, Allowed: true, Remaining: 0},
			// floor((2^63-1)*59000/60000) = 9069649169573862876 carried
			// 1 s into the next window, +2^53+1
			{At: 61 * time.Second, Key: "w", Cost: 1<<53 + 1, Allowed: true, Remaining: 144715668026171938},
			// One unit too many: the carried share falls by one 1 ms on.
			{At: 61 * time.Second, Key: "w", Cost: 144715668026171939, Allowed: false, Remaining: 144715668026171938, RetryAfter: time.Millisecond},
			{At: 61 * time.Second, Key: "w", Cost: 144715668026171938, Allowed: true, Remaining: 0},
		},
	},
}

// TakeFunc takes one request of cost for key at instant now against the
// case's algorithm and limit, the way a store would.
type TakeFunc func(t *testing.T, now time.Time, c Case, key string, cost int64) algorithms.Decision

// Run plays every case through take. Keys are prefixed with the case name so
// that one store can run all cases without the cases seeing each other.
func Run(t *testing.T, take TakeFunc) {
	t.Helper()
	for _, c := range Cases {
		t.Run(c.Name, func(t *testing.T) {
			for i, s := range c.Steps {
				if s.Rate != nil {
					c.Rate = *s.Rate
				}
				now := Start.Add(s.At)
				d := take(t, now, c, c.Name+"/"+s.Key, s.Cost)
				if d.Allowed != s.Allowed || d.Remaining != s.Remaining {
					t.Fatalf("step %d (+%s key %s cost %d): allowed=%v remaining=%d, want allowed=%v remaining=%d",
						i, s.At, s.Key, s.Cost, d.Allowed, d.Remaining, s.Allowed, s.Remaining)
				}
				if s.ResetAfter != 0 {
					if got := d.Reset.Sub(now); got != s.ResetAfter {
						t.Fatalf("step %d (+%s key %s): reset after %s, want %s", i, s.At, s.Key, got, s.ResetAfter)
					}
				}
				if !s.Allowed {
					if got := d.RetryAt.Sub(now); got != s.RetryAfter {
						t.Fatalf("step %d (+%s key %s): retry after %s, want %s", i, s.At, s.Key, got, s.RetryAfter)
					}
				}
			}
		})
	}
}

// Outcome is what a BanStep's request should get.
type Outcome int

const (
	// Allowed: the request is allowed, and its cost is in flight until
	// a later step ends it.
	Allowed Outcome = iota + 1
	// RefusedInFlight: refused only for costs still in flight: the
	// settled count had room. No ban; retry at once (Retry-After: 1).
	RefusedInFlight
	// BanBegins: refused, and the settled count left no room, so the key
	// is banned from now for the case's ban.
	BanBegins
	// Banned: refused by the ban the last BanBegins began, with its
	// end as the retry instant and the reset.
	Banned
)

func (o Outcome) String() string {
	switch o {
	case Allowed:
		return "allowed"
	case RefusedInFlight:
		return "refused for costs in flight"
	case BanBegins:
		return "refused, the ban begins"
	case Banned:
		return "banned"
	}
	return "unknown"
}

// BanStep is one event of a BanCase at At after Start: a request of Cost
// taken, or, with Ends set, the end of the request that step number Ends
// (counted from 1) took: its cost stays if its response counted (Kept),
// and is released if not.
type BanStep struct {
	At   time.Duration
	Cost int64
	Want Outcome
	Ends int
	Kept bool
}

// BanCase is a key's requests in a zone that counts only some statuses
// (count_status) and bans for Ban: only its settled count, the costs kept
// after their responses, may begin a ban.
type BanCase struct {
	Name      string
	Algorithm algorithms.Algorithm
	Rate      algorithms.Rate
	Ban       time.Duration
	Steps     []BanStep
}

// BanCases is the shared table of such keys.
var BanCases = []BanCase{
	{
		Name:      "fixed_window/in_flight_then_settled",
		Algorithm: algorithms.FixedWindow,
		Rate:      algorithms.Rate{Units: 3, Window: time.Minute},
		Ban:       time.Hour,
		Steps: []BanStep{
			{At: 0, Cost: 1, Want: Allowed},
			{At: 0, Cost: 1, Want: Allowed},
			{At: 0, Cost: 1, Want: Allowed},
			// three in flight fill the limit: a wait, not a ban
			{At: time.Second, Cost: 1, Want: RefusedInFlight},
			{At: 2 * time.Second, Ends: 1},
			{At: 2 * time.Second, Cost: 1, Want: Allowed},
			{At: 3 * time.Second, Ends: 2, Kept: true},
			{At: 3 * time.Second, Ends: 3, Kept: true},
			// two settled, one in flight
			{At: 4 * time.Second, Cost: 1, Want: RefusedInFlight},
			{At: 5 * time.Second, Ends: 6, Kept: true},
			{At: 6 * time.Second, Cost: 1, Want: BanBegins},
			// the ban outlasts the window, whatever the cost
			{At: 30 * time.Minute, Cost: 0, Want: Banned},
			{At: 61 * time.Minute, Cost: 1, Want: Allowed},
		},
	},
	{
		// A request in flight for two windows: its cost has left the
		// counts, and its end must not take another's off what is in
		// flight now.
		Name:      "fixed_window/in_flight_across_windows",
		Algorithm: algorithms.FixedWindow,
		Rate:      algorithms.Rate{Units: 1, Window: time.Second},
		Ban:       time.Minute,
		Steps: []BanStep{
			{At: 0, Cost: 1, Want: Allowed},
			{At: 2500 * time.Millisecond, Cost: 1, Want: Allowed},
			{At: 2600 * time.Millisecond, Cost: 1, Want: RefusedInFlight},
			{At: 2700 * time.Millisecond, Ends: 1, Kept: true},
			{At: 2800 * time.Millisecond, Cost: 1, Want: RefusedInFlight},
			{At: 2900 * time.Millisecond, Ends: 2, Kept: true},
			{At: 2950 * time.Millisecond, Cost: 1, Want: BanBegins},
		},
	},
	{
		// Costs in flight taken in the previous window come off its
		// weighted share.
		Name:      "sliding_tail/in_flight_in_the_previous_window",
		Algorithm: algorithms.SlidingTail,
		Rate:      algorithms.Rate{Units: 4, Window: time.Minute},
		Ban:       time.Hour,
		Steps: []BanStep{
			{At: 50 * time.Second, Cost: 1, Want: Allowed},
			{At: 50 * time.Second, Cost: 1, Want: Allowed},
			{At: 50 * time.Second, Cost: 1, Want: Allowed},
			{At: 50 * time.Second, Cost: 1, Want: Allowed},
			{At: 51 * time.Second, Ends: 1, Kept: true},
			{At: 51 * time.Second, Ends: 2, Kept: true},
			// floor(4*59/60) = 3, +1
			{At: 61 * time.Second, Cost: 1, Want: Allowed},
			// floor(4*58/60) = 3, +1 +1 = 5; settled: floor(2*58/60) = 1, +0 +1
			{At: 62 * time.Second, Cost: 1, Want: RefusedInFlight},
			{At: 63 * time.Second, Ends: 3, Kept: true},
			{At: 63 * time.Second, Ends: 4, Kept: true},
			// settled: floor(4*56/60) = 3, +0 +1 = 4
			{At: 64 * time.Second, Cost: 1, Want: RefusedInFlight},
			{At: 65 * time.Second, Ends: 7, Kept: true},
			{At: 66 * time.Second, Cost: 1, Want: BanBegins},
			{At: 67 * time.Second, Cost: 1, Want: Banned},
		},
	},
	{
		// T = 30 s: the costs in flight move the TAT back by 30 s each.
		Name:      "gcra/in_flight",
		Algorithm: algorithms.GCRA,
		Rate:      algorithms.Rate{Units: 2, Window: time.Minute},
		Ban:       time.Hour,
		Steps: []BanStep{
			{At: 0, Cost: 1, Want: Allowed},
			{At: 0, Cost: 1, Want: Allowed},
			{At: time.Second, Cost: 1, Want: RefusedInFlight},
			{At: 2 * time.Second, Ends: 1},
			{At: 3 * time.Second, Cost: 1, Want: Allowed},
			{At: 4 * time.Second, Ends: 2, Kept: true},
			// TAT 60 s, one in flight: settled 30 s, +30 s -4 s <= 60 s
			{At: 4 * time.Second, Cost: 1, Want: RefusedInFlight},
			{At: 5 * time.Second, Ends: 5, Kept: true},
			{At: 6 * time.Second, Cost: 1, Want: BanBegins},
		},
	},
	{
		Name:      "sliding_window/in_flight",
		Algorithm: algorithms.SlidingWindow,
		Rate:      algorithms.Rate{Units: 2, Window: time.Minute, Buckets: 6},
		Ban:       time.Hour,
		Steps: []BanStep{
			{At: 0, Cost: 1, Want: Allowed},
			{At: 5 * time.Second, Cost: 1, Want: Allowed},
			{At: 6 * time.Second, Cost: 1, Want: RefusedInFlight},
			{At: 7 * time.Second, Ends: 1, Kept: true},
			{At: 8 * time.Second, Cost: 1, Want: RefusedInFlight},
			{At: 9 * time.Second, Ends: 2},
			{At: 10 * time.Second, Cost: 1, Want: Allowed},
			{At: 11 * time.Second, Ends: 7, Kept: true},
			{At: 12 * time.Second, Cost: 1, Want: BanBegins},
			{At: 80 * time.Second, Cost: 1, Want: Banned},
		},
	},
}

// BanTake takes a request of cost for key at now, in a zone of the
// case's algorithm and rate that counts only some statuses and bans for
// the case's ban, the way a store would.
type BanTake func(t *testing.T, now time.Time, c BanCase, key string, cost int64) algorithms.Decision

// BanEnd ends, at now, the request of cost for key that d allowed: its
// cost stays if kept, and is released if not.
type BanEnd func(t *testing.T, now time.Time, c BanCase, key string, cost int64, d algorithms.Decision, kept bool)

// RunBans plays every ban case through take and end. Keys are prefixed
// with the case name, as Run's are.
func RunBans(t *testing.T, take BanTake, end BanEnd) {
	t.Helper()
	for _, c := range BanCases {
		t.Run(c.Name, func(t *testing.T) {
			key := c.Name + "/k"
			taken := make([]algorithms.Decision, len(c.Steps))
			var banEnds time.Time
			for i, s := range c.Steps {
				now := Start.Add(s.At)
				if s.Ends > 0 {
					end(t, now, c, key, c.Steps[s.Ends-1].Cost, taken[s.Ends-1], s.Kept)
					continue
				}
				d := take(t, now, c, key, s.Cost)
				taken[i] = d
				var ok bool
				switch s.Want {
				case Allowed:
					ok = d.Allowed
				case RefusedInFlight:
					ok = !d.Allowed && d.InFlight && d.RetryAt.Equal(now) && d.BanEnds.IsZero()
				case BanBegins:
					banEnds = now.Add(c.Ban)
					ok = !d.Allowed && !d.InFlight && d.BanStarted && d.BanEnds.Equal(banEnds) && d.RetryAt.Equal(banEnds) && d.Reset.Equal(banEnds)
				case Banned:
					ok = !d.Allowed && !d.InFlight && !d.BanStarted && d.BanEnds.Equal(banEnds) && d.RetryAt.Equal(banEnds) && d.Reset.Equal(banEnds)
				}
				if !ok {
					t.Fatalf("step %d (+%s cost %d): %+v, want %s", i+1, s.At, s.Cost, d, s.Want)
				}
			}
		})
	}
}
