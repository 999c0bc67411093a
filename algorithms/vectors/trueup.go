package vectors

import (
	"math"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
)

// TrueUpStep is one event of a TrueUpCase at At after Start: a request
// taking Cost (a reservation), decided as a Step is; or, with Ends set,
// the true-up of the request that step number Ends (counted from 1)
// took: its response showed Actual, which the store keeps in place of
// that step's cost.
type TrueUpStep struct {
	At         time.Duration
	Cost       int64
	Allowed    bool
	Remaining  int64
	RetryAfter time.Duration
	Ends       int
	Actual     int64
}

// TrueUpCase is a key's requests in a zone that reads their costs from
// their responses (cost_from): each takes a reservation, and is trued up
// when its response is done. A debt lands in the window of the true-up
// (algorithms.Debt); what is released comes off the window the
// reservation was taken in (algorithms.Release).
type TrueUpCase struct {
	Name      string
	Algorithm algorithms.Algorithm
	Rate      algorithms.Rate
	// Wide is Case.Wide.
	Wide  bool
	Steps []TrueUpStep
}

// TrueUpCases is the shared table of true-ups.
var TrueUpCases = []TrueUpCase{
	{
		Name:      "fixed_window/debt_and_release",
		Algorithm: algorithms.FixedWindow,
		Rate:      algorithms.Rate{Units: 10, Window: time.Minute},
		Steps: []TrueUpStep{
			{At: 0, Cost: 5, Allowed: true, Remaining: 5},
			// 12 kept for the 5 reserved: 7 past the limit
			{At: 10 * time.Second, Ends: 1, Actual: 12},
			{At: 20 * time.Second, Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 40 * time.Second},
			// a new window forgets the debt
			{At: 60 * time.Second, Cost: 4, Allowed: true, Remaining: 6},
			// 1 kept for the 4 reserved: 3 released
			{At: 70 * time.Second, Ends: 4, Actual: 1},
			{At: 80 * time.Second, Cost: 9, Allowed: true, Remaining: 0},
		},
	},
	{
		// Reserved in the first minute, trued up in the second: the debt
		// lands in the second, where a reservation's window would have
		// lost it.
		Name:      "fixed_window/debt_lands_in_the_window_of_the_true_up",
		Algorithm: algorithms.FixedWindow,
		Rate:      algorithms.Rate{Units: 10, Window: time.Minute},
		Steps: []TrueUpStep{
			{At: 50 * time.Second, Cost: 4, Allowed: true, Remaining: 6},
			{At: 70 * time.Second, Ends: 1, Actual: 10},
			{At: 71 * time.Second, Cost: 5, Allowed: false, Remaining: 4, RetryAfter: 49 * time.Second},
			{At: 72 * time.Second, Cost: 4, Allowed: true, Remaining: 0},
		},
	},
	{
		// Reserved on the last evening of January in New York, trued
		// up after midnight: the debt lands in February.
		Name:      "fixed_window/debt_lands_in_the_month_of_the_true_up",
		Algorithm: algorithms.FixedWindow,
		Rate:      algorithms.Rate{Units: 10, Calendar: algorithms.CalendarOf(algorithms.Month, zone("America/New_York"))},
		Steps: []TrueUpStep{
			{At: at("2026-02-01T04:00:00Z"), Cost: 5, Allowed: true, Remaining: 5},
			{At: at("2026-02-01T05:30:00Z"), Ends: 1, Actual: 12},
			{At: at("2026-02-01T06:00:00Z"), Cost: 4, Allowed: false, Remaining: 3, RetryAfter: 28*24*time.Hour - time.Hour},
			{At: at("2026-02-01T06:00:00Z"), Cost: 3, Allowed: true, Remaining: 0},
		},
	},
	{
		Name:      "sliding_tail/debt_carries_into_the_next_window",
		Algorithm: algorithms.SlidingTail,
		Rate:      algorithms.Rate{Units: 4, Window: 10 * time.Second},
		Steps: []TrueUpStep{
			{At: 0, Cost: 2, Allowed: true, Remaining: 2},
			{At: time.Second, Ends: 1, Actual: 6},
			// the 6 carried into the next window round down to 3 once
			// 6*(10000-e) < 4*10000: from e = 3334 ms
			{At: 2 * time.Second, Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 11334 * time.Millisecond},
			{At: 13334 * time.Millisecond, Cost: 1, Allowed: true, Remaining: 0},
		},
	},
	{
		// A debt owes at most one limit past the limit: 40 kept for 4
		// reserved counts 8, whose share has decayed to 3 from 5001 ms
		// into the next window (40 would have taken until 9001 ms).
		Name:      "sliding_tail/debt_bounded",
		Algorithm: algorithms.SlidingTail,
		Rate:      algorithms.Rate{Units: 4, Window: 10 * time.Second},
		Steps: []TrueUpStep{
			{At: 0, Cost: 4, Allowed: true, Remaining: 0},
			{At: time.Second, Ends: 1, Actual: 40},
			{At: 11 * time.Second, Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 4001 * time.Millisecond},
			{At: 15001 * time.Millisecond, Cost: 1, Allowed: true, Remaining: 0},
		},
	},
	{
		// 4 per 60 s in six sub-windows of 10 s. The debt of 3 lands in
		// sub-window 2 (20 s), not 0: at 70 s, when sub-window 0 has
		// left, it still counts, until 90 s.
		Name:      "sliding_window/debt_and_release",
		Algorithm: algorithms.SlidingWindow,
		Rate:      algorithms.Rate{Units: 4, Window: time.Minute, Buckets: 6},
		Steps: []TrueUpStep{
			{At: 0, Cost: 2, Allowed: true, Remaining: 2},
			{At: 25 * time.Second, Ends: 1, Actual: 5},
			{At: 26 * time.Second, Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 44 * time.Second},
			{At: 70 * time.Second, Cost: 1, Allowed: true, Remaining: 0},
			{At: 71 * time.Second, Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 19 * time.Second},
			{At: 95 * time.Second, Cost: 3, Allowed: true, Remaining: 0},
			// 1 kept for the 3 reserved: 2 released from sub-window 9
			{At: 96 * time.Second, Ends: 6, Actual: 1},
			{At: 97 * time.Second, Cost: 2, Allowed: true, Remaining: 0},
		},
	},
	{
		// T = 100 ms, a bucket of 5 (500 ms). The debt moves the TAT past
		// the burst; a huge one moves it at most two bucket depths (1 s)
		// ahead of the true-up.
		Name:      "gcra/debt_and_release",
		Algorithm: algorithms.GCRA,
		Rate:      algorithms.Rate{Units: 10, Window: time.Second, Burst: 5},
		Steps: []TrueUpStep{
			{At: 0, Cost: 2, Allowed: true, Remaining: 3},
			// TAT 200 ms, +4 units: 600 ms, past 10 ms + the bucket's 500
			{At: 10 * time.Millisecond, Ends: 1, Actual: 6},
			// 600 + 100 - (20 + 500) = 180 ms to wait
			{At: 20 * time.Millisecond, Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 180 * time.Millisecond},
			{At: 200 * time.Millisecond, Cost: 1, Allowed: true, Remaining: 0},
			// TAT 700 ms + 49 units, bounded to 300 ms + 1 s
			{At: 300 * time.Millisecond, Ends: 4, Actual: 50},
			// 1300 + 100 - (310 + 500)
			{At: 310 * time.Millisecond, Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 590 * time.Millisecond},
			{At: 900 * time.Millisecond, Cost: 1, Allowed: true, Remaining: 0},
			{At: 5 * time.Second, Cost: 5, Allowed: true, Remaining: 0},
			// 2 kept for the 5 reserved: the TAT moves back 300 ms
			{At: 5 * time.Second, Ends: 8, Actual: 2},
			{At: 5 * time.Second, Cost: 3, Allowed: true, Remaining: 0},
		},
	},
	{
		// At the top of the 64-bit range a debt stops at 2^63-1: twice
		// the limit does not fit.
		Name:      "fixed_window/64_bit_debt",
		Algorithm: algorithms.FixedWindow,
		Rate:      algorithms.Rate{Units: math.MaxInt64, Window: time.Minute},
		Wide:      true,
		Steps: []TrueUpStep{
			{At: 0, Cost: math.MaxInt64 - 1, Allowed: true, Remaining: 1},
			{At: 10 * time.Second, Ends: 1, Actual: math.MaxInt64},
			{At: 20 * time.Second, Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 40 * time.Second},
			{At: time.Minute, Cost: math.MaxInt64, Allowed: true, Remaining: 0},
		},
	},
	{
		// What is released is released to the unit, past 2^53.
		Name:      "sliding_tail/64_bit_release",
		Algorithm: algorithms.SlidingTail,
		Rate:      algorithms.Rate{Units: math.MaxInt64, Window: time.Minute},
		Wide:      true,
		Steps: []TrueUpStep{
			{At: 0, Cost: 1<<62 + 3, Allowed: true, Remaining: 1<<62 - 4},
			{At: 10 * time.Second, Ends: 1, Actual: 1<<53 + 1},
			{At: 20 * time.Second, Cost: math.MaxInt64 - 1<<53 - 1, Allowed: true, Remaining: 0},
			// Full: the count carried into the next window decays by a
			// unit 1 ms into it.
			{At: 20 * time.Second, Cost: 1, Allowed: false, Remaining: 0, RetryAfter: 40001 * time.Millisecond},
		},
	},
}

// TrueUpTake takes a request of cost for key at now, in a zone of the
// case's algorithm and rate, the way a store would.
type TrueUpTake func(t *testing.T, now time.Time, c TrueUpCase, key string, cost int64) algorithms.Decision

// TrueUpEnd trues up, at now, the request of cost for key that d
// allowed: its response showed actual.
type TrueUpEnd func(t *testing.T, now time.Time, c TrueUpCase, key string, cost int64, d algorithms.Decision, actual int64)

// RunTrueUps plays every true-up case through take and end. Keys are
// prefixed with the case name, as Run's are.
func RunTrueUps(t *testing.T, take TrueUpTake, end TrueUpEnd) {
	t.Helper()
	for _, c := range TrueUpCases {
		t.Run(c.Name, func(t *testing.T) {
			key := c.Name + "/k"
			taken := make([]algorithms.Decision, len(c.Steps))
			for i, s := range c.Steps {
				now := Start.Add(s.At)
				if s.Ends > 0 {
					end(t, now, c, key, c.Steps[s.Ends-1].Cost, taken[s.Ends-1], s.Actual)
					continue
				}
				d := take(t, now, c, key, s.Cost)
				taken[i] = d
				if d.Allowed != s.Allowed || d.Remaining != s.Remaining {
					t.Fatalf("step %d (+%s cost %d): allowed=%v remaining=%d, want allowed=%v remaining=%d",
						i+1, s.At, s.Cost, d.Allowed, d.Remaining, s.Allowed, s.Remaining)
				}
				if !s.Allowed {
					if got := d.RetryAt.Sub(now); got != s.RetryAfter {
						t.Fatalf("step %d (+%s cost %d): retry after %s, want %s", i+1, s.At, s.Cost, got, s.RetryAfter)
					}
				}
			}
		})
	}
}
