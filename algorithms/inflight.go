package algorithms

import "time"

// A zone that releases a request's cost after its response unless the
// response's status is counted (count_status) takes the cost at
// admission, so that concurrent attempts can never use more than the
// limit. A browser that loads a page's eight assets with the right
// password then fills a limit of five with costs that will all be released.
// If that zone also bans, only its settled count, the costs kept after
// their responses, may begin a ban: a request the limit refuses while the
// settled count alone has room for it was refused only for costs in
// flight, and waits instead.
//
// So a store keeps, beside such a key's counts, the costs of its requests
// still in flight, as Counts of their own in windows of the zone's window,
// as a fixed window counts: Current is the costs taken in window Window
// and not yet done, Previous those taken in window Window-1. A cost taken
// earlier has left the key's counts, whatever the algorithm (a sliding
// tail counts a window's costs until the next window ends; a sliding
// window's sub-windows leave sooner; a gcra take has drained from the
// bucket within a window when the burst is at most the limit, as by
// default), so it is forgotten: a cost a store took and never heard back
// about (an instance that died, an answer lost) stops weighing on the
// settled count within two windows. Settled takes the costs still
// remembered off the counts, the newest first; a request in flight for so
// long that its cost has left the counts then makes the settled count
// lower, never higher, than it is, so no ban is begun for it.

// InFlightWindow returns the window (of the rate's window) in which the
// cost of a request that d allowed was taken, as its key's costs in flight
// count it: d.Window, or for a sliding window the window that holds its
// sub-window.
func InFlightWindow(alg Algorithm, d Decision, l Rate) int64 {
	if alg == SlidingWindow {
		return WindowIndex(d.Window, int64(l.BucketsOr()))
	}
	return d.Window
}

// TakeInFlight returns a key's costs in flight p after a request taken in
// window adds cost to them.
func TakeInFlight(p WindowCounts, window, cost int64) WindowCounts {
	switch {
	case p.Window < window:
		p = Roll(p, window)
		p.Current += cost
	case p.Window == window:
		p.Current += cost
	case p.Window == window+1:
		p.Previous += cost
	}
	return p
}

// EndInFlight returns a key's costs in flight p once a request taken in
// window, whose cost was cost, is done: its cost comes off the window it
// was taken in, if that is still remembered. No count goes below zero.
func EndInFlight(p WindowCounts, window, cost int64) WindowCounts {
	switch p.Window {
	case window:
		p.Current = max(p.Current-cost, 0)
	case window + 1:
		p.Previous = max(p.Previous-cost, 0)
	}
	return p
}

// Settled returns a key's counts c, as stored, less the costs p of its
// requests in flight, as stored: the counts the key would have if those
// requests had not come, for Decide to judge. Windowed costs come off the
// windows they were taken in; a gcra TAT moves back by the costs in
// flight, as Release moves it, for the limit l.Units.
func Settled(alg Algorithm, counts Counts, p WindowCounts, now time.Time, l Rate) Counts {
	if alg == GCRA {
		units := InFlightUnits(p, now, l)
		if units == 0 {
			return counts
		}
		return Release(GCRA, counts, Decision{Limit: l.Units}, l, units)
	}
	c := counts.Windows()
	if p.Window > c.Window {
		// Costs in flight taken in a later window than the counts': the
		// counts were forgotten (a reset), and hold none of them.
		return counts
	}
	p = Roll(p, c.Window)
	return WindowCounts{Window: c.Window, Current: max(c.Current-p.Current, 0), Previous: max(c.Previous-p.Previous, 0)}.Counts()
}

// SettledRing returns a sliding window key's ring r, as stored, less the
// costs p of its requests in flight, taken off the newest sub-windows
// first: those of requests still in flight are the most recent.
func SettledRing(r Ring, p WindowCounts, now time.Time, l Rate) Ring {
	units := InFlightUnits(p, now, l)
	n := int64(r.Buckets)
	for k := r.Index; units > 0 && r.Buckets > 0 && k > r.Index-n-1; k-- {
		i := k % (n + 1)
		off := min(r.Counts[i], units)
		r.Counts[i] -= off
		units -= off
	}
	return r
}

// InFlightUnits returns the costs in flight p, as stored, remembers at
// now, for the rate's window: those taken in now's window or the one
// before.
func InFlightUnits(p WindowCounts, now time.Time, l Rate) int64 {
	if idx := l.WindowAt(now.UnixMilli()).Index; p.Window < idx {
		p = Roll(p, idx)
	}
	return addCapped(p.Current, p.Previous)
}
