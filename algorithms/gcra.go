package algorithms

import (
	"math/bits"
	"time"
)

// GCRA keeps one instant per key, the theoretical arrival time TAT: when
// the key's bucket is full again. With the emission interval T =
// window/limit, a request of cost c at t is allowed iff
// max(TAT, t) + c·T − t <= burst·T, and then TAT becomes max(TAT, t) + c·T.
//
// T is a whole number of milliseconds only when the limit divides the
// window, so instants are kept exactly as ms + frac/limit, 0 <= frac <
// limit: a millisecond and a fraction of one in units of 1/limit ms. No
// floating point is involved, and nothing is rounded except where an
// instant is handed out (Reset and RetryAt, rounded up to the next whole
// millisecond, the first at which the bucket really has room).
//
// Where precision could be lost, and why it is not:
//   - c·T and burst·T are c·window/limit: the products c·window and
//     burst·window reach 2^31 × 2^43 ms (a window of centuries), so they
//     are formed in 128 bits (bits.Mul64) before dividing by the limit.
//     The quotients are at most MaxBucket (Rate.Validate; the default
//     burst makes burst·T the window itself), so they fit in 64 bits.
//   - Remaining is (t + burst·T − TAT)/T = (that span in 1/limit ms)/window;
//     the span in 1/limit ms reaches 2^50 × 2^31, again formed in 128 bits.
//   - A stored TAT whose fraction was kept for another limit (the limit
//     changed, through a placeholder or the admin API) is rescaled to the
//     new limit rounding down: the bucket is then at most 1/limit ms
//     fuller than exact, never emptier.

// fracTime is an instant or a span: ms + frac/den milliseconds, where den
// is the limit it was computed for.
type fracTime struct{ ms, frac int64 }

func (a fracTime) less(b fracTime) bool {
	return a.ms < b.ms || a.ms == b.ms && a.frac < b.frac
}

func (a fracTime) add(b fracTime, den int64) fracTime {
	s := fracTime{a.ms + b.ms, a.frac + b.frac}
	if s.frac >= den {
		s.ms, s.frac = s.ms+1, s.frac-den
	}
	return s
}

func (a fracTime) sub(b fracTime, den int64) fracTime {
	s := fracTime{a.ms - b.ms, a.frac - b.frac}
	if s.frac < 0 {
		s.ms, s.frac = s.ms-1, s.frac+den
	}
	return s
}

// ceil returns the instant rounded up to a whole millisecond.
func (a fracTime) ceil() time.Time {
	if a.frac > 0 {
		return time.UnixMilli(a.ms + 1)
	}
	return time.UnixMilli(a.ms)
}

// span returns n·window/limit as a fracTime in units of 1/limit ms.
func span(n, window, limit int64) fracTime {
	q, r := mulDivMod(n, window, limit)
	return fracTime{q, r}
}

// gcraTAT reads the TAT a store keeps in Counts, for limit: W holds its
// whole milliseconds, C its fraction in units of 1/P ms, P being the limit
// it was computed for (TATLimit), which the fraction is rescaled from. An
// empty Counts is the epoch, which is the past.
func gcraTAT(c Counts, limit int64) fracTime {
	if c.P <= 0 || c.C <= 0 {
		return fracTime{c.W, 0}
	}
	if c.P == limit {
		return fracTime{c.W, c.C}
	}
	f, _ := mulDivMod(c.C, limit, c.P)
	return fracTime{c.W, min(f, limit-1)}
}

// gcraCounts is what a gcra key whose TAT is tat, for limit, keeps.
func gcraCounts(tat fracTime, limit int64) Counts {
	return Counts{W: tat.ms, C: tat.frac, P: limit}
}

// TATMillis reads c as a gcra key's counts: its TAT's whole milliseconds.
func (c Counts) TATMillis() int64 { return c.W }

// TATLimit reads c as a gcra key's counts: the limit its TAT was computed
// for, the last the key was decided against (0 for an empty key).
func (c Counts) TATLimit() int64 { return c.P }

// BurstFor returns the units a GCRA bucket holds for a request decided
// against limit: the rate's Burst, or by default the limit itself.
func (l Rate) BurstFor(limit int64) int64 {
	if l.Burst > 0 {
		return l.Burst
	}
	return limit
}

// Capacity is the most cost a request of the algorithm may have and
// ever be allowed under limit: a gcra zone's burst, else the limit. A
// request costing more can never pass, however long it waits, so its
// refusal bans nobody.
func Capacity(alg Algorithm, l Rate, limit int64) int64 {
	if alg == GCRA {
		return l.BurstFor(limit)
	}
	return limit
}

func decideGCRA(c Counts, now time.Time, l Rate, cost int64) (Decision, Counts) {
	limit, w := l.Units, l.Window.Milliseconds()
	burst := l.BurstFor(limit)
	t := fracTime{now.UnixMilli(), 0}
	tat := gcraTAT(c, limit)
	base := max2(tat, t)
	full := t.add(span(burst, w, limit), limit) // t + burst·T

	d := Decision{Limit: limit, Window: WindowIndex(t.ms, w)}
	after, keep := base, tat // a rejection keeps the TAT as it was
	if cost > burst {
		// Never allowed: name the time an empty bucket takes to fill, as
		// the windowed algorithms name the window's end.
		d.RetryAt = full.ceil()
	} else {
		next := base.add(span(cost, w, limit), limit)
		if !full.less(next) {
			d.Allowed = true
			after, keep = next, next
		} else {
			// The first instant t' with next − t' <= burst·T.
			d.RetryAt = next.sub(full, limit).add(t, limit).ceil()
		}
	}
	d.Reset = after.ceil()
	if room := full.sub(after, limit); room.ms >= 0 {
		// floor((room in 1/limit ms) / window): at most burst.
		hi, lo := bits.Mul64(uint64(room.ms), uint64(limit))
		lo, carry := bits.Add64(lo, uint64(room.frac), 0)
		q, _ := bits.Div64(hi+carry, lo, uint64(w))
		d.Remaining = int64(q)
	}
	d.Used = burst - d.Remaining
	return d, gcraCounts(keep, limit)
}

func max2(a, b fracTime) fracTime {
	if a.less(b) {
		return b
	}
	return a
}

// Interval returns n·window/limit, the time n units take to accrue at
// the rate of limit per window, as whole milliseconds and a fraction in
// units of 1/limit ms: the amount a GCRA take of n moved the TAT.
func Interval(n int64, window time.Duration, limit int64) (ms, frac int64) {
	s := span(n, window.Milliseconds(), limit)
	return s.ms, s.frac
}
