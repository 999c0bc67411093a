package memory

import (
	"fmt"
	"time"
)

// MinSweepInterval is the shortest sweep interval a config may ask for: a
// sweep locks each shard in turn and walks its whole table, so sweeping
// much more often would cost CPU and buy nothing.
const MinSweepInterval = 10 * time.Millisecond

// CheckSweepInterval refuses a sweep interval shorter than
// MinSweepInterval; 0 means no preference.
func CheckSweepInterval(d time.Duration) error {
	if d != 0 && d < MinSweepInterval {
		return fmt.Errorf("want a duration of at least %s, got %s", MinSweepInterval, d)
	}
	return nil
}

// SetSweepInterval implements storage.Sweeper: it asks for the keys whose
// counts no longer matter to be swept (their slots emptied, and a table
// left mostly empty shrunk) every d; 0 withdraws the request. Call it
// after Provision.
//
// The counters, and so the sweeper, are shared by every config using the
// memory store, and during a reload the old and the new config both use
// them. So the interval in force is the shortest that any config still
// using the store asks for, and DefaultSweepInterval if none asks: a
// short interval costs a little CPU, while a long one keeps expired
// keys' memory longer than a config wanted. When a config is cleaned up
// (replaced by a reload, or failed to load), its request goes with it.
func (m *Store) SetSweepInterval(d time.Duration) {
	c := m.counters
	c.usersMu.Lock()
	defer c.usersMu.Unlock()
	m.sweepInterval = d
	c.updateSweepInterval()
}

// SweepInterval is the sweep interval in force: the shortest any config
// using the store asks for, or DefaultSweepInterval.
func (m *Store) SweepInterval() time.Duration {
	return time.Duration(m.counters.sweepEvery.Load())
}

// updateSweepInterval puts in force the shortest interval the users ask
// for, or the default, and wakes the sweeper if that changed it. The
// caller holds usersMu.
func (c *counters) updateSweepInterval() {
	d := time.Duration(0)
	for _, u := range c.users {
		if u.sweepInterval > 0 && (d == 0 || u.sweepInterval < d) {
			d = u.sweepInterval
		}
	}
	if d == 0 {
		d = DefaultSweepInterval
	}
	if c.sweepEvery.Swap(int64(d)) == int64(d) {
		return
	}
	select {
	case c.resweep <- struct{}{}:
	default: // already told; it reads the latest interval
	}
}
