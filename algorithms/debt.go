package algorithms

import "time"

// A zone that reads a request's cost from its response (cost_from) takes
// a reservation at admission, as it takes any cost, and trues it up when
// the response is done: the store keeps the actual cost in place of the
// reservation. Less is released from the window the reservation was
// taken in (Release, ReleaseRing), as a count_status release is. More is
// a debt: the difference is taken past the limit, whatever room is left,
// and the key is refused until its window has room again.
//
// A debt lands in the window of the moment it is taken, the true-up's,
// not in the reservation's: the key owes from now on, and must be
// refused from now on. Landed in the reservation's window, a debt would
// be lost whenever the response outlived that window (a fixed window no
// longer counts its previous window), and a long response is the usual
// one to cost more than reserved. So a debt is a take of its units at now
// that is never refused:
//   - fixed_window and sliding_tail: the counts roll to now's window, as
//     Decide rolls them, and the units add to its count. A fixed window
//     is refused until that window ends; a sliding tail carries its share
//     into the next one, as it does any count.
//   - sliding_window: the units add to now's sub-window, which counts
//     them until it leaves, a window and a sub-window later.
//   - gcra: the TAT, from now if it has passed, moves on by units×T, even
//     past the burst: the bucket refuses until it has refilled past them.
//   - concurrency: no debt. A concurrency request holds nothing once it
//     is done, and no zone reads a concurrency cost from a response
//     (storage.Request.Finishing).
//
// A key owes at most one limit past its limit (MostDebt): its window's
// count is at most twice the limit (a ring's sub-windows together), its
// TAT at most two bucket depths ahead of now. A response that shows a
// huge cost, misreported or made huge on purpose, so refuses its key for
// about a window at most beyond what a full window would; the memory
// store's counts of limits up to 2^31-1 stay in 32 bits, and wide counts
// (limits up to 2^63-1, a zone priced in money) stop at 2^63-1; and
// every GCRA instant stays below 2^53 ms, where the Redis script's
// doubles count exactly (MaxBucket).
//
// A debt that is the first count of a key in a new window rolls the key
// into it, as a take would, but no decision reports that roll: the next
// take finds the counts in its window already, and the usage of the
// window before goes unreported (Decision.Rolled).

// MostDebt returns the most units a debt on l can take: twice the limit
// (gcra: twice the burst), or 2^63-1 if that is less. More change
// nothing, so a store may send no more than these.
func MostDebt(alg Algorithm, l Rate) int64 {
	if alg == GCRA {
		return addCapped(l.BurstFor(l.Units), l.BurstFor(l.Units))
	}
	return addCapped(l.Units, l.Units)
}

// Debt returns the counts of a key after units are taken past its limit
// at now, a true-up's debt (see above), for the limit l.Units: the one
// the reservation was decided against. A debt of no units, and any on a
// concurrency key, returns counts as they are.
func Debt(alg Algorithm, counts Counts, now time.Time, l Rate, units int64) Counts {
	if units <= 0 || alg == Concurrency {
		return counts
	}
	units = min(units, MostDebt(alg, l))
	switch alg {
	case GCRA:
		limit, w := l.Units, l.Window.Milliseconds()
		t := fracTime{now.UnixMilli(), 0}
		tat := max2(gcraTAT(counts, limit), t)
		most := t.add(span(MostDebt(GCRA, l), w, limit), limit) // two bucket depths
		if next := tat.add(span(units, w, limit), limit); next.less(most) {
			tat = next
		} else {
			tat = max2(tat, most)
		}
		return gcraCounts(tat, limit)
	}
	c := counts.Windows()
	idx := l.WindowAt(now.UnixMilli()).Index
	switch {
	case c.Window > idx+1:
		c = WindowCounts{} // kept for a shorter window, as Decide finds it
	case c.Window > idx:
		idx = c.Window // taken in the next window: the clock stepped back
	}
	c = Roll(c, idx)
	c.Current += min(units, max(MostDebt(alg, l)-c.Current, 0))
	return c.Counts()
}

// DebtRing returns a sliding window key's ring r after units are taken
// past its limit at now, in now's sub-window, for the limit l.Units.
func DebtRing(r Ring, now time.Time, l Rate, units int64) Ring {
	if units <= 0 {
		return r
	}
	n, w := l.BucketsOr(), l.Window.Milliseconds()
	idx := SubWindow(now.UnixMilli(), w, n)
	switch {
	case r.Buckets == n && r.Index > idx+int64(n):
		r = Ring{} // kept for a shorter window, as DecideRing finds it
	case r.Buckets == n && r.Index > idx:
		idx = r.Index // taken in a later sub-window: the clock stepped back
	}
	r = r.Roll(idx, n)
	r.Counts[idx%int64(n+1)] += min(units, max(MostDebt(SlidingWindow, l)-r.Used(), 0))
	return r
}
