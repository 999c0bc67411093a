package algorithms

import "time"

// decideConcurrency admits a request while the units its key holds, plus
// its cost, stay within the limit. The units stay held until Release.
// Nothing frees up at a known instant, so a rejection's RetryAt is now:
// no cache may hold it, and clients are told to retry in a second.
func decideConcurrency(c Counts, now time.Time, l Rate, cost int64) (Decision, Counts) {
	held := max(c.Held(), 0)
	d := Decision{Limit: l.Units, Reset: now}
	if held+cost <= l.Units {
		d.Allowed = true
		held += cost
	} else {
		d.RetryAt = now
	}
	d.Used = held
	d.Remaining = max(l.Units-held, 0)
	return d, heldCounts(held)
}

// releaseHeld returns the counts of a concurrency key after a request
// that held cost units is done. The count never goes below zero.
func releaseHeld(c Counts, cost int64) Counts {
	return heldCounts(max(c.Held()-cost, 0))
}
