package algorithms_test

import (
	"math"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/algorithms/vectors"
)

// TestVectors runs the shared table against Decide itself, with counts kept
// in a map the way the simplest store would.
func TestVectors(t *testing.T) {
	counts := map[string]algorithms.Counts{}
	vectors.Run(t, func(t *testing.T, now time.Time, c vectors.Case, key string, cost int64) algorithms.Decision {
		d, next := algorithms.Decide(c.Algorithm, counts[key], now, c.Rate, cost)
		counts[key] = next
		return d
	})
}

// TestRetryAtIsFirstAllowedInstant checks, for many states, that the retry
// instant is allowed and the millisecond before it is not.
func TestRetryAtIsFirstAllowedInstant(t *testing.T) {
	l := algorithms.Rate{Units: 7, Window: 3 * time.Second}
	start := vectors.Start
	for _, alg := range []algorithms.Algorithm{algorithms.SlidingTail, algorithms.FixedWindow} {
		for prev := int64(0); prev <= 7; prev++ {
			for cur := int64(0); cur <= 7; cur++ {
				for cost := int64(1); cost <= 7; cost++ {
					for _, at := range []time.Duration{0, time.Millisecond, 1499 * time.Millisecond, 2999 * time.Millisecond} {
						c := algorithms.Counts{Window: start.UnixMilli() / 3000, Current: cur, Previous: prev}
						now := start.Add(at)
						d, after := algorithms.Decide(alg, c, now, l, cost)
						if d.Allowed {
							continue
						}
						if after != c {
							t.Fatalf("%s prev=%d cur=%d cost=%d: rejection changed counts %+v -> %+v", alg, prev, cur, cost, c, after)
						}
						if !d.RetryAt.After(now) {
							t.Fatalf("%s prev=%d cur=%d cost=%d at %s: retry %s not after now", alg, prev, cur, cost, at, d.RetryAt.Sub(now))
						}
						if got, _ := algorithms.Decide(alg, c, d.RetryAt, l, cost); !got.Allowed {
							t.Fatalf("%s prev=%d cur=%d cost=%d at %s: not allowed at retry instant +%s", alg, prev, cur, cost, at, d.RetryAt.Sub(now))
						}
						before := d.RetryAt.Add(-time.Millisecond)
						if before.After(now) {
							if got, _ := algorithms.Decide(alg, c, before, l, cost); got.Allowed {
								t.Fatalf("%s prev=%d cur=%d cost=%d at %s: already allowed 1ms before retry", alg, prev, cur, cost, at)
							}
						}
					}
				}
			}
		}
	}
}

// TestHugeNumbersDoNotOverflow uses a limit near 2^31 and a window of a year,
// whose product overflows 64 bits.
func TestHugeNumbersDoNotOverflow(t *testing.T) {
	l := algorithms.Rate{Units: math.MaxInt32, Window: 365 * 24 * time.Hour}
	w := l.Window.Milliseconds()
	idx := vectors.Start.UnixMilli() / w
	now := time.UnixMilli(idx*w + w/2)
	c := algorithms.Counts{Window: idx - 1, Current: math.MaxInt32}
	d, _ := algorithms.Decide(algorithms.SlidingTail, c, now, l, 1)
	// half of the previous window is still inside: floor(MaxInt32/2) used
	if want := int64(math.MaxInt32/2) + 1; d.Used != want || !d.Allowed {
		t.Fatalf("used %d allowed %v, want %d allowed", d.Used, d.Allowed, want)
	}
}

func TestLimitValidate(t *testing.T) {
	for _, l := range []algorithms.Rate{{0, time.Second}, {-1, time.Second}, {1, 0}, {1, time.Microsecond}} {
		if l.Validate() == nil {
			t.Errorf("%+v accepted", l)
		}
	}
	if err := (algorithms.Rate{Units: 1, Window: time.Millisecond}).Validate(); err != nil {
		t.Error(err)
	}
}

func BenchmarkDecide(b *testing.B) {
	l := algorithms.Rate{Units: 1 << 30, Window: time.Minute}
	now := vectors.Start.Add(30 * time.Second)
	for _, alg := range []algorithms.Algorithm{algorithms.FixedWindow, algorithms.SlidingTail} {
		b.Run(string(alg), func(b *testing.B) {
			b.ReportAllocs()
			c := algorithms.Counts{Window: now.UnixMilli()/60000 - 1, Current: 1000}
			for b.Loop() {
				_, c = algorithms.Decide(alg, c, now, l, 1)
			}
		})
	}
}

// TestRolledReportsTheFinishedWindow: a decision that moves a key into a
// new window reports what the key used in the last window it was charged
// in; a new key and a key within its window report no roll.
func TestRolledReportsTheFinishedWindow(t *testing.T) {
	rate := algorithms.Rate{Units: 10, Window: time.Minute}
	start := time.UnixMilli(vectors.Start.UnixMilli() / 60000 * 60000)
	var c algorithms.Counts
	steps := []struct {
		at       time.Duration
		cost     int64
		rolled   bool
		finished int64
	}{
		{0, 3, false, 0},           // a new key
		{time.Second, 4, false, 0}, // same window: 7 used
		{time.Minute, 1, true, 7},  // next window: the last one used 7
		{time.Minute + time.Second, 1, false, 0},
		{5 * time.Minute, 2, true, 2}, // idle for windows: the last used one had 2
	}
	for i, s := range steps {
		d, next := algorithms.Decide(algorithms.SlidingTail, c, start.Add(s.at), rate, s.cost)
		if !d.Allowed || d.Rolled != s.rolled || d.Finished != s.finished {
			t.Fatalf("step %d: allowed %v rolled %v finished %d, want rolled %v finished %d", i, d.Allowed, d.Rolled, d.Finished, s.rolled, s.finished)
		}
		c = next
	}
}
