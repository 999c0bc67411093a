// Package algorithms holds the rate-limiting arithmetic as pure functions of
// (counts, now, limit, cost): no clocks, no I/O, no locks. Every store keeps
// the same Counts and has Decide compute the answer, so the in-memory store and
// the Redis script agree on every decision.
//
// Time is counted in whole milliseconds since the Unix epoch. Windows of a
// length are aligned to the epoch, and calendar periods (Calendar) start at
// local midnight in their time zone, so every instance and every store cuts
// windows at the same instants.
package algorithms

import (
	"fmt"
	"math"
	"math/bits"
	"time"
)

// Algorithm names a way of counting requests in a window.
type Algorithm string

const (
	// FixedWindow counts requests per window floor(now/window) and forgets
	// everything when the window ends.
	FixedWindow Algorithm = "fixed_window"

	// SlidingTail weights the previous window's count by the part of it that
	// still lies inside a window-long interval ending now, rounded down, and
	// adds the current window's count.
	SlidingTail Algorithm = "sliding_tail"

	// GCRA is the generic cell rate algorithm: a token bucket of Burst
	// units that refills one unit every Window/Units, kept as one instant
	// (the theoretical arrival time) instead of a count and a timer.
	GCRA Algorithm = "gcra"

	// Concurrency limits the units of a key's requests in flight at once:
	// a request holds its cost from admission until it is released.
	Concurrency Algorithm = "concurrency"
)

// Valid reports whether a names a known algorithm.
func (a Algorithm) Valid() bool {
	return a == FixedWindow || a == SlidingTail || a == SlidingWindow || a == GCRA || a == Concurrency
}

// Windowed reports whether a counts in windows, so that a zone needs a
// window and its period usage can be observed.
func (a Algorithm) Windowed() bool { return a == FixedWindow || a == SlidingTail }

// Rate is how many cost units may be taken per Window: the limit, over
// the window. For GCRA, Burst is how many may be taken at once (0: Units).
// For SlidingWindow, Buckets is how many sub-windows the window is cut
// into. For Concurrency, Units is how many may be held at once and Window is
// the hold: how long a shared store keeps units whose holder never
// released them (an instance that died).
//
// The windows of FixedWindow and SlidingTail are those of Calendar if it
// is set (Window is then 0), and otherwise of length Window, aligned to
// the epoch; WindowAt and WindowOf tell them either way.
type Rate struct {
	Units    int64
	Window   time.Duration
	Calendar *Calendar
	Burst    int64
	// Buckets is how many sub-windows a sliding window cuts Window into
	// (0: DefaultBuckets).
	Buckets int
}

// MaxBucket bounds a GCRA bucket's depth, Burst×Window/Units, in
// milliseconds: 2^50 ms is 35,000 years, and it keeps every instant the
// algorithm computes (now plus at most two bucket depths) below 2^53 ms,
// where the Redis script's doubles still count exact milliseconds.
const MaxBucket = 1 << 50

// Validate refuses rates the arithmetic cannot honour.
func (l Rate) Validate() error {
	if l.Units <= 0 {
		return fmt.Errorf("limit must be positive, got %d", l.Units)
	}
	if l.Calendar == nil && l.Window < time.Millisecond {
		return fmt.Errorf("window must be at least 1ms, got %s", l.Window)
	}
	if l.Burst < 0 {
		return fmt.Errorf("burst must be positive, got %d", l.Burst)
	}
	if err := l.validateBuckets(); err != nil {
		return err
	}
	if l.Burst > 0 {
		if q, _ := mulDivMod(l.Burst, l.Window.Milliseconds(), l.Units); q > MaxBucket {
			return fmt.Errorf("burst %d over limit %d per %s is a bucket deeper than 2^50 ms", l.Burst, l.Units, l.Window)
		}
	}
	return nil
}

// WindowAt returns the window of l that holds the instant ms.
func (l Rate) WindowAt(ms int64) Span {
	if l.Calendar != nil {
		return l.Calendar.At(ms)
	}
	w := l.Window.Milliseconds()
	idx := WindowIndex(ms, w)
	return Span{Index: idx, Start: idx * w, End: (idx + 1) * w}
}

// WindowOf returns the window of l with index idx.
func (l Rate) WindowOf(idx int64) Span {
	if l.Calendar != nil {
		return l.Calendar.Of(idx)
	}
	w := l.Window.Milliseconds()
	return Span{Index: idx, Start: idx * w, End: (idx + 1) * w}
}

// Counts is what a store keeps for one key: three numbers, which the
// store keeps as they are without reading them (the memory store in a
// slot, the Redis store as the fields w, c and p of the key's hash, whose
// names these are). What they stand for is the key's algorithm's, so its
// code reads and makes them through a view of its own:
//   - fixed_window and sliding_tail: WindowCounts (Windows);
//   - gcra: its theoretical arrival time (see gcraTAT; TATMillis and
//     TATLimit read its parts);
//   - concurrency: the units held (Held).
//
// A sliding_window key keeps a Ring instead.
type Counts struct {
	W int64
	C int64
	P int64
}

// WindowCounts are a windowed key's counts, and a key's costs in flight
// (see TakeInFlight): Current is the cost taken in the window with index
// Window (Rate.WindowAt: floor(now/window), or a calendar period's),
// Previous the cost taken in the window before it.
type WindowCounts struct {
	Window   int64
	Current  int64
	Previous int64
}

// Windows reads c as a windowed key's counts.
func (c Counts) Windows() WindowCounts {
	return WindowCounts{Window: c.W, Current: c.C, Previous: c.P}
}

// Counts is w as a store keeps it.
func (w WindowCounts) Counts() Counts {
	return Counts{W: w.Window, C: w.Current, P: w.Previous}
}

// Held reads c as a concurrency key's counts: the units its requests hold.
func (c Counts) Held() int64 { return c.C }

// heldCounts is what a concurrency key holding units keeps.
func heldCounts(units int64) Counts { return Counts{C: units} }

// Decision is the answer for one request.
type Decision struct {
	Allowed bool
	Limit   int64
	// Used is the weighted cost counted against the limit, including this
	// request when it was allowed.
	Used int64
	// Remaining is Limit-Used, never below zero.
	Remaining int64
	// Reset is when the current window ends.
	Reset time.Time
	// RetryAt is, for a rejected request, the earliest instant a request of
	// the same cost would be allowed if nothing else were counted meanwhile.
	// It is the zero time for an allowed request, and for a request whose
	// cost exceeds the limit, which can never be allowed, it is Reset.
	RetryAt time.Time
	// Rolled tells that the key's stored counts were of an earlier window
	// than the request's: this request rolls the key into a new window,
	// and Finished is what the key used in the last window it was taken
	// in. Stores write the roll only with an allowed request, so across a
	// fleet exactly one allowed request reports each finished window.
	Rolled   bool
	Finished int64
	// Window is the index of the window the request was decided in, in
	// the clock of the store that decided it: what Release needs to
	// release the cost from the same window, and InFlightWindow to tell
	// which of a key's costs in flight it was. A sliding window's is the
	// sub-window's; a gcra decision's, the window's of the rate (which
	// its TAT does not need); a concurrency decision has none.
	Window int64
	// BanEnds is, for a request rejected in a zone with a ban, when the
	// key's ban ends (and RetryAt and Reset with it); the zero time
	// otherwise. BanStarted tells that this rejection began the ban.
	BanEnds    time.Time
	BanStarted bool
	// InFlight tells, for a request rejected in a zone that bans and
	// whose costs may be released (count_status), that the key's
	// settled count had room for it: only the costs of its requests
	// still in flight filled the limit (see Settled). Such a refusal
	// begins no ban, and, as a concurrency zone's, frees up when those
	// requests end, at no known instant: its RetryAt is the instant it
	// was decided.
	InFlight bool
}

// Ban returns d as a rejection while the key is banned until ends: not
// allowed, nothing remaining, and a retry only once the ban is over,
// which is also when the key's limit is next worth trying (Reset).
func (d Decision) Ban(ends time.Time, started bool) Decision {
	d.Allowed = false
	d.Remaining = 0
	d.Used = d.Limit
	d.Reset, d.RetryAt, d.BanEnds, d.BanStarted, d.InFlight = ends, ends, ends, started, false
	return d
}

// RefusedInFlight returns the rejection d, decided at now, as one due
// only to costs still in flight (see InFlight).
func (d Decision) RefusedInFlight(now time.Time) Decision {
	d.RetryAt, d.InFlight = now, true
	return d
}

// Decide rolls c forward to now, decides whether a request of the given cost
// fits in l and returns the decision with the counts to store: c rolled
// forward, plus cost when the request was allowed. A rejected request adds
// nothing.
func Decide(alg Algorithm, counts Counts, now time.Time, l Rate, cost int64) (Decision, Counts) {
	switch alg {
	case GCRA:
		return decideGCRA(counts, now, l, cost)
	case Concurrency:
		return decideConcurrency(counts, now, l, cost)
	}
	c := counts.Windows()
	nowMs := now.UnixMilli()
	win := l.WindowAt(nowMs)
	switch {
	case c.Window > win.Index+1:
		// Counted more than a window ahead of the clock: the zone's window
		// grew in a reload, and c.Window counts windows of the old, shorter
		// length. Deciding as of that window would reset centuries from
		// now; the counts start afresh, as they do when the window shrinks
		// (the old index is then far behind).
		c = WindowCounts{}
	case c.Window > win.Index:
		// The counts were written in the next window: a clock stepped
		// back, or another request read the time after this one but
		// took first. Decide as of the start of their window rather
		// than forget what it counted.
		win = l.WindowOf(c.Window)
		nowMs = win.Start
	}
	idx := win.Index
	rolled, finished := c.Window != 0 && c.Window < idx, c.Current
	c = Roll(c, idx)

	used := c.Current
	if alg == SlidingTail {
		// The previous window weighs by the share of this one still to
		// run: (end-now)/length, the windows' lengths being the
		// calendar's (a month after a longer one, a day of 23 hours).
		share, _ := mulDivMod(c.Previous, win.End-nowMs, win.Length()) // at most Previous
		used = addCapped(used, share)
	}

	d := Decision{Limit: l.Units, Reset: time.UnixMilli(win.End), Rolled: rolled, Window: idx}
	if rolled {
		d.Finished = finished
	}
	if fits(used, cost, l.Units) {
		d.Allowed = true
		used += cost
		c.Current += cost
	} else {
		d.RetryAt = time.UnixMilli(retryAt(alg, c, l, win, cost))
	}
	d.Used = used
	d.Remaining = max(l.Units-used, 0)
	return d, c.Counts()
}

// Release returns the counts of a key after the cost of a request that d
// allowed is released: the request is done and should not count
// (count_status), or, for concurrency, no longer holds its units. A
// windowed cost comes off the window it was taken in, d.Window, whether
// that is still the current window or has become the previous one; a cost
// taken in an older window no longer counts and is left alone. A GCRA cost moves
// the TAT back by cost×window/limit, for the limit d was decided against,
// as if the request had never come. No count goes below zero.
func Release(alg Algorithm, counts Counts, d Decision, l Rate, cost int64) Counts {
	switch alg {
	case Concurrency:
		return releaseHeld(counts, cost)
	case GCRA:
		if counts == (Counts{}) || d.Limit <= 0 {
			return counts // the key is gone: nothing to release
		}
		tat := gcraTAT(counts, d.Limit).sub(span(cost, l.Window.Milliseconds(), d.Limit), d.Limit)
		return gcraCounts(tat, d.Limit)
	}
	c := counts.Windows()
	switch c.Window {
	case d.Window:
		c.Current = max(c.Current-cost, 0)
	case d.Window + 1:
		c.Previous = max(c.Previous-cost, 0)
	}
	return c.Counts()
}

// Roll moves counts kept for window c.Window <= idx to the window with
// index idx: the old current window becomes the previous one if it is
// adjacent, and anything older is forgotten. (Decide never rolls counts
// backwards.)
func Roll(c WindowCounts, idx int64) WindowCounts {
	switch c.Window {
	case idx:
		return c
	case idx - 1:
		return WindowCounts{Window: idx, Previous: c.Current}
	default:
		return WindowCounts{Window: idx}
	}
}

// retryAt returns the first millisecond at which a request of the given cost
// would be allowed, given counts c for window win of l and nothing else
// counted.
func retryAt(alg Algorithm, c WindowCounts, l Rate, win Span, cost int64) int64 {
	limit := l.Units
	if cost > limit || alg == FixedWindow {
		return win.End
	}
	if fits(c.Current, cost, limit) {
		// Allowed later in this window, once the previous window's share
		// has decayed far enough.
		return win.Start + decayedAt(c.Previous, limit-cost-c.Current, win.Length())
	}
	// The current window alone is too full: wait until its count, carried
	// into the next window as the previous one, has decayed, over the
	// next window's own length.
	next := l.WindowOf(win.Index + 1)
	return next.Start + decayedAt(c.Current, limit-cost, next.Length())
}

// decayedAt returns the smallest elapsed time e (ms into a window of length
// w) at which floor(prev*(w-e)/w) <= room, for room >= 0. That holds iff
// prev*(w-e) < (room+1)*w, i.e. w-e <= floor(((room+1)*w-1)/prev).
func decayedAt(prev, room, w int64) int64 {
	if prev <= room {
		return 0
	}
	hi, lo := bits.Mul64(uint64(room+1), uint64(w))
	// (room+1)*w - 1 as a 128-bit value; (room+1)*w >= 1 so no underflow.
	if lo == 0 {
		hi--
	}
	lo--
	q, _ := bits.Div64(hi, lo, uint64(prev)) // hi < prev because room+1 <= prev
	return w - int64(q)
}

// fits reports whether used+cost <= limit, for counts of up to 2^63-1,
// whose sum int64 may not hold.
func fits(used, cost, limit int64) bool {
	return used <= limit && cost <= limit-used
}

// addCapped returns a+b, for a, b >= 0, or math.MaxInt64 if the sum is
// more: a count stops there (a zone priced in money counts up to 2^63-1
// picodollars), and past it it is over any limit anyway.
func addCapped(a, b int64) int64 {
	if b > math.MaxInt64-a {
		return math.MaxInt64
	}
	return a + b
}

// mulDivMod returns a·b/d and a·b mod d, for a, b >= 0 and d > 0, with
// the product formed in 128 bits. A quotient past int64 is returned as
// math.MaxInt64.
func mulDivMod(a, b, d int64) (int64, int64) {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(d) {
		return math.MaxInt64, 0
	}
	q, r := bits.Div64(hi, lo, uint64(d))
	if q > math.MaxInt64 {
		return math.MaxInt64, 0
	}
	return int64(q), int64(r)
}

// WindowIndex returns the index of the window of length w (ms) that holds
// the instant ms (since the epoch): floor(ms/w), rounding down for instants
// before the epoch too.
func WindowIndex(ms, w int64) int64 {
	q := ms / w
	if ms%w != 0 && (ms < 0) != (w < 0) {
		q--
	}
	return q
}
