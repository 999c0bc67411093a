package shed

import "time"

// params are the settings that move a shedder's amount.
type params struct {
	good, bad   float64
	after, full time.Duration
}

// floor is the lowest amount, and the first: -after/full.
func (p params) floor() float64 {
	return -p.after.Seconds() / p.full.Seconds()
}

// step is one move of the shedding amount: the amount that follows a
// after dt at utilization u. It is the formula of Shed's doc comment and
// nothing else, so that it can be tested with made-up times.
//
// At u = bad the formula's f is 0, for every bad below 1; with bad = 1
// its last case would divide by zero, so there f is 0 at u = 1 (as it is
// at u = bad below 1) and 1 above (its limit).
func step(p params, a, u float64, dt time.Duration) float64 {
	var f float64
	switch {
	case u < p.good:
		f = u/p.good - 1
	case u < p.bad:
		f = 0
	case p.bad >= 1:
		if u > p.bad {
			f = 1
		}
	default:
		f = (u - p.bad) / (1 - p.bad)
	}
	a += clamp(f, -1, 1) * max(dt, 0).Seconds() / p.full.Seconds()
	return clamp(a, p.floor(), 1)
}

// dropChance is the probability that a request of class i of n classes
// (0 the most important) is shed at amount a. Counted from the least
// important (j = k - i, k = n - 1), it is clamp(a*k - j, 0, 1): never for
// the first class, nothing at all with one class or at a <= 0.
func dropChance(a float64, n, i int) float64 {
	k := n - 1
	j := k - i
	return clamp(a*float64(k)-float64(j), 0, 1)
}

func clamp(v, lo, hi float64) float64 {
	return min(max(v, lo), hi)
}
