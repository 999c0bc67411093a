package logevery

import (
	"fmt"
	"testing"
	"time"
)

// TestLimiter: a kind of line is logged at most once a second, each line
// counting those held back since the last one.
func TestLimiter(t *testing.T) {
	var l Limiter
	start := time.Unix(1000, 0)
	var counts []int64
	log := func(at time.Time) {
		if n, ok := l.Allow(at); ok {
			counts = append(counts, n)
		}
	}
	for i := range 100 { // 100 lines over 0.99 s
		log(start.Add(time.Duration(i) * 10 * time.Millisecond))
	}
	log(start.Add(time.Second)) // the 101st, a second on
	log(start.Add(1500 * time.Millisecond))
	if fmt.Sprint(counts) != "[1 100]" {
		t.Fatalf("lines counting %v, want [1 100]: the first at once, the next a second on with the 99 between", counts)
	}
}
