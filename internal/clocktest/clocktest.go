// Package clocktest is a clock that a test sets, for the code that reads
// the time through a func() time.Time: a test reaches a window's end, a
// token's expiry or a ban's end without waiting for it.
package clocktest

import (
	"sync"
	"time"
)

// Clock is a time that moves only when the test moves it. It is safe for
// concurrent use.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// New returns a clock that reads start.
func New(start time.Time) *Clock {
	return &Clock{t: start}
}

// Now returns the clock's time; pass c.Now where a func() time.Time is
// wanted.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Set moves the clock to t, forwards or back.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// Add moves the clock by d.
func (c *Clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}
