// Package logevery holds back log lines of one kind to at most one a
// second, counting those it held back, so that traffic (a flood of fresh
// keys banned, a dry run over its limit, a store outage) cannot flood
// the log.
package logevery

import (
	"sync/atomic"
	"time"
)

// Limiter lets a kind of log line through at most once a second. It
// takes no lock: one of the callers that come at once past the second
// gets the line. The zero Limiter lets the first line through.
type Limiter struct {
	next     atomic.Int64 // Unix ns before which lines are held back
	heldBack atomic.Int64
}

// Allow reports whether a line may be logged at now, and if so how many
// lines it stands for: itself and those held back since the last.
func (l *Limiter) Allow(now time.Time) (int64, bool) {
	t, next := now.UnixNano(), l.next.Load()
	if t < next || !l.next.CompareAndSwap(next, t+int64(time.Second)) {
		l.heldBack.Add(1)
		return 0, false
	}
	return l.heldBack.Swap(0) + 1, true
}
