package algorithms

import (
	"fmt"
	"time"
)

// SlidingWindow cuts the window W into n sub-windows of W/n (buckets),
// aligned to the epoch, and counts each. At t, a key uses the sum of the
// counts of the current sub-window and the n before it: the n+1
// sub-windows that overlap [t-W, t]. A request is allowed iff that sum
// plus its cost is within the limit.
//
// Counting the oldest sub-window whole, though only part of it lies
// inside [t-W, t], is what makes the promise: every unit admitted at s is
// counted at every t < s+W (its sub-window is among the n+1 until at
// least s+W), so no interval of length W ever holds more than the limit,
// on one instance or across a fleet. The price: a unit is counted for up
// to W + W/n, so under demand beyond the limit the key is admitted at
// least limit × n/(n+1) per W on average, where an exact log of every
// request (memory per request, not per key) would admit the limit.
//
// Sub-window k starts at ceil(k×W/n) ms: W need not be a multiple of n.
const SlidingWindow Algorithm = "sliding_window"

// Bounds and default of a sliding window's buckets, n.
const (
	MinBuckets     = 2
	MaxBuckets     = 60
	DefaultBuckets = 10
)

// Ring is what a store keeps for a sliding_window key: the counts of the
// sub-windows Index-n to Index, sub-window k's at Counts[k mod (n+1)], for
// n = Buckets. An empty Ring (Buckets 0) holds nothing.
type Ring struct {
	Index   int64
	Buckets int
	Counts  [MaxBuckets + 1]int64
}

// BucketsOr returns the rate's buckets, or DefaultBuckets if unset.
func (l Rate) BucketsOr() int {
	if l.Buckets == 0 {
		return DefaultBuckets
	}
	return l.Buckets
}

// validateBuckets refuses buckets a sliding window cannot cut: at least a
// millisecond each.
func (l Rate) validateBuckets() error {
	if l.Buckets == 0 {
		return nil
	}
	if l.Buckets < MinBuckets || l.Buckets > MaxBuckets {
		return fmt.Errorf("buckets must be from %d to %d, got %d", MinBuckets, MaxBuckets, l.Buckets)
	}
	if l.Window.Milliseconds() < int64(l.Buckets) {
		return fmt.Errorf("window %s is shorter than %d buckets of 1ms", l.Window, l.Buckets)
	}
	return nil
}

// SubWindow returns the index of the sub-window that holds the instant ms
// for a window of w ms cut in n: floor(ms×n/w).
func SubWindow(ms, w int64, n int) int64 {
	return WindowIndex(ms*int64(n), w)
}

// SubWindowStart returns when sub-window k starts, in ms: ceil(k×w/n).
func SubWindowStart(k, w int64, n int) int64 {
	return -WindowIndex(-k*w, int64(n))
}

// Roll moves r forward to sub-window idx >= r.Index for n buckets: the
// counts of sub-windows that are no longer among the n+1 are dropped. A
// ring kept for another n (the zone's buckets changed) is folded into the
// current sub-window whole: it then counts for longer than it would have,
// never shorter.
func (r Ring) Roll(idx int64, n int) Ring {
	if r.Buckets != n {
		total := r.Used()
		r = Ring{Index: idx, Buckets: n}
		r.Counts[idx%int64(n+1)] = total
		return r
	}
	if idx-r.Index >= int64(n+1) {
		return Ring{Index: idx, Buckets: n}
	}
	for k := r.Index + 1; k <= idx; k++ {
		r.Counts[k%int64(n+1)] = 0
	}
	r.Index = idx
	return r
}

// Used returns what the ring counts against the limit: the sum of its
// sub-windows.
func (r *Ring) Used() int64 {
	var used int64
	for _, c := range r.Counts[:r.Buckets+1] {
		used += c
	}
	return used
}

// DecideRing rolls r forward to now, decides whether a request of the
// given cost fits in l, and returns the decision with the ring to store:
// r rolled forward, plus cost in the current sub-window when the request
// was allowed. Reset is when every unit counted now has left: the end of
// the current sub-window plus W. A rejected request's RetryAt is the
// start of the first sub-window at which enough old counts have left.
func DecideRing(r Ring, now time.Time, l Rate, cost int64) (Decision, Ring) {
	n, w := l.BucketsOr(), l.Window.Milliseconds()
	idx := SubWindow(now.UnixMilli(), w, n)
	switch {
	case r.Buckets == n && r.Index > idx+int64(n):
		// Counted more than a window ahead of the clock: the zone's window
		// grew in a reload, and r.Index counts shorter sub-windows. The
		// counts start afresh, as when the window shrinks. (A ring of
		// another n is folded by Roll, whatever its index.)
		r = Ring{}
	case r.Buckets == n && r.Index > idx:
		// Counted in a later sub-window than the clock says (it stepped
		// back): decide as of that sub-window, forgetting nothing.
		idx = r.Index
	}
	r = r.Roll(idx, n)
	used := r.Used()
	d := Decision{Limit: l.Units, Window: idx, Reset: time.UnixMilli(SubWindowStart(idx+1+int64(n), w, n))}
	switch {
	case used+cost <= l.Units:
		d.Allowed = true
		used += cost
		r.Counts[idx%int64(n+1)] += cost
	case cost > l.Units:
		d.RetryAt = d.Reset
	default:
		// When sub-window k starts, sub-window k-n-1 leaves; its count
		// is at (k-n-1) mod (n+1) = k mod (n+1). By k = idx+n+1 all have.
		left := used
		for k := idx + 1; ; k++ {
			left -= r.Counts[k%int64(n+1)]
			if left+cost <= l.Units {
				d.RetryAt = time.UnixMilli(SubWindowStart(k, w, n))
				break
			}
		}
	}
	d.Used = used
	d.Remaining = max(l.Units-used, 0)
	return d, r
}

// ReleaseRing returns r after the cost of a request that d allowed is
// released from the sub-window it was taken in, d.Window, if that
// still counts. No count goes below zero.
func ReleaseRing(r Ring, d Decision, cost int64) Ring {
	n := int64(r.Buckets)
	if r.Buckets == 0 || d.Window > r.Index || r.Index-d.Window > n {
		return r
	}
	i := d.Window % (n + 1)
	r.Counts[i] = max(r.Counts[i]-cost, 0)
	return r
}
