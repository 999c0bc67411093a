package vectors

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
)

// An Arrival is one request of a drawn sequence: its instant and cost.
type Arrival struct {
	At   time.Time
	Cost int64
}

// Arrivals draws a sequence of requests against rate, in time order, from
// Start on, with the traffic a client can choose: bursts just before and
// at sub-window and window edges, idle gaps of up to three windows, random
// costs, and a long stretch of steady demand at twice the limit (from
// Start+SteadyFrom to Start+SteadyTo), which shows how much an algorithm
// admits under demand beyond its limit.
func Arrivals(seed uint64, rate algorithms.Rate) []Arrival {
	rng := rand.New(rand.NewPCG(seed, 28))
	w := rate.Window.Milliseconds()
	n := int64(rate.BucketsOr())
	var out []Arrival
	cost := func() int64 { return 1 + rng.Int64N(min(3, rate.Units)) }
	at := func(ms int64) time.Time { return Start.Add(time.Duration(ms) * time.Millisecond) }
	// Bursts and gaps, for 40 windows.
	for t := int64(0); t < 40*w; {
		switch rng.IntN(4) {
		case 0: // a burst around the next sub-window edge
			edge := algorithms.SubWindowStart(algorithms.SubWindow(t, w, int(n))+1, w, int(n))
			for range 1 + rng.IntN(int(2*rate.Units)) {
				out = append(out, Arrival{at(edge - 1 + rng.Int64N(2)), cost()})
			}
			t = edge + 1
		case 1: // a burst around the next window edge
			edge := (t/w + 1) * w
			for range 1 + rng.IntN(int(2*rate.Units)) {
				out = append(out, Arrival{at(edge - 1 + rng.Int64N(2)), cost()})
			}
			t = edge + 1
		case 2: // an idle gap
			t += rng.Int64N(3 * w)
		default: // a few requests at random
			for range 1 + rng.IntN(int(rate.Units)) {
				t += 1 + rng.Int64N(max(w/int64(rate.Units), 1))
				out = append(out, Arrival{at(t), cost()})
			}
		}
	}
	// Steady demand at twice the limit, for 20 windows.
	step := max(w/(2*rate.Units), 1)
	for t := SteadyFrom(rate); t < SteadyTo(rate); t += step {
		out = append(out, Arrival{at(t), 1})
	}
	slices.SortStableFunc(out, func(a, b Arrival) int { return a.At.Compare(b.At) })
	return out
}

// SteadyFrom and SteadyTo bound, in ms from Start, the stretch of steady
// demand in Arrivals.
func SteadyFrom(rate algorithms.Rate) int64 { return 45 * rate.Window.Milliseconds() }
func SteadyTo(rate algorithms.Rate) int64   { return 65 * rate.Window.Milliseconds() }

// Admitted plays arrivals through take and returns those allowed.
func Admitted(arrivals []Arrival, take func(a Arrival) algorithms.Decision) []Arrival {
	var out []Arrival
	for _, a := range arrivals {
		if take(a).Allowed {
			out = append(out, a)
		}
	}
	return out
}

// MostInAnyWindow returns the most units that admitted, in time order,
// hold in any interval [s, s+window).
func MostInAnyWindow(admitted []Arrival, window time.Duration) int64 {
	var most, sum int64
	j := 0
	for _, a := range admitted {
		sum += a.Cost
		for admitted[j].At.Add(window).Compare(a.At) <= 0 {
			sum -= admitted[j].Cost
			j++
		}
		most = max(most, sum)
	}
	return most
}

// SteadyRate returns the units admitted per window, on average, in the
// stretch of steady demand: over a whole number of cycles of n+1
// sub-windows (a sliding window's period under steady demand), from the
// first sub-window that starts two windows into the stretch (before it,
// what came earlier still counts).
func SteadyRate(admitted []Arrival, rate algorithms.Rate) float64 {
	w, n := rate.Window.Milliseconds(), rate.BucketsOr()
	first := algorithms.SubWindow(SteadyFrom(rate)+2*w, w, n) + 1
	cycles := (SteadyTo(rate) - algorithms.SubWindowStart(first, w, n)) * int64(n) / (int64(n+1) * w)
	fromMs, toMs := algorithms.SubWindowStart(first, w, n), algorithms.SubWindowStart(first+cycles*int64(n+1), w, n)
	from, to := Start.Add(time.Duration(fromMs)*time.Millisecond), Start.Add(time.Duration(toMs)*time.Millisecond)
	var units int64
	for _, a := range admitted {
		if !a.At.Before(from) && a.At.Before(to) {
			units += a.Cost
		}
	}
	return float64(units) * float64(w) / float64(toMs-fromMs)
}

// PropertyRates are the limits the property is checked for: few and many
// units, few and many buckets, a window not cut evenly.
var PropertyRates = []algorithms.Rate{
	{Units: 3, Window: time.Minute, Buckets: 6},
	{Units: 10, Window: 10 * time.Second},
	{Units: 100, Window: time.Second, Buckets: 2},
	{Units: 60, Window: time.Minute, Buckets: 60},
	{Units: 7, Window: time.Second, Buckets: 3},
}

// PropertySeeds is how many sequences are drawn for each rate.
const PropertySeeds = 4

// NeverOver checks the sliding window's promise through take, a store
// deciding for key (a fresh key per sequence): for every rate and drawn
// sequence, no interval of one window holds more than the limit, and
// under steady demand beyond the limit at least limit×n/(n+1) units are
// admitted per window on average.
func NeverOver(t *testing.T, take func(key string, rate algorithms.Rate, a Arrival) algorithms.Decision) {
	t.Helper()
	for _, rate := range PropertyRates {
		for seed := range uint64(PropertySeeds) {
			key := sequenceKey(rate, seed)
			admitted := Admitted(Arrivals(seed, rate), func(a Arrival) algorithms.Decision { return take(key, rate, a) })
			if most := MostInAnyWindow(admitted, rate.Window); most > rate.Units {
				t.Errorf("%s: %d units in one window of %s, over the limit of %d", key, most, rate.Window, rate.Units)
			}
			n := float64(rate.BucketsOr())
			if got, least := SteadyRate(admitted, rate), float64(rate.Units)*n/(n+1); got < least {
				t.Errorf("%s: %.2f units a window under steady demand, want at least %.2f", key, got, least)
			}
		}
	}
}

// WorstRatio plays every drawn sequence of each rate through take and returns
// the most units any window held, as a share of the limit, and the least
// units admitted per window under steady demand, as a share of the limit:
// for algorithms that make no promise, to report.
func WorstRatio(rates []algorithms.Rate, take func(key string, rate algorithms.Rate, a Arrival) algorithms.Decision) (most, steady float64) {
	steady = 1e9
	for _, rate := range rates {
		for seed := range uint64(PropertySeeds) {
			key := sequenceKey(rate, seed)
			admitted := Admitted(Arrivals(seed, rate), func(a Arrival) algorithms.Decision { return take(key, rate, a) })
			most = max(most, float64(MostInAnyWindow(admitted, rate.Window))/float64(rate.Units))
			steady = min(steady, SteadyRate(admitted, rate)/float64(rate.Units))
		}
	}
	return most, steady
}

// fmt2 names a drawn sequence, as a key.
func sequenceKey(rate algorithms.Rate, seed uint64) string {
	return rate.Window.String() + "/" + itoa(rate.Units) + "/" + itoa(int64(rate.BucketsOr())) + "/" + itoa(int64(seed))
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
