package storage

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// memoryAdmin holds the memory store's zone dials, and counts its per-key
// overrides, which the shards hold beside the counts of their keys (see
// memoryShard). It lives in the shared counters, so both outlive config
// reloads; they are local to this Caddy instance, as the counters are.
type memoryAdmin struct {
	mu    sync.Mutex
	dials dialTable
	// overrides counts the overrides the shards hold, expired ones
	// included until the sweep removes them, against MaxOverrides.
	overrides atomic.Int64
}

// MaxOverrides bounds the per-key limit overrides the memory store keeps
// at once. They are set through the admin API, not by traffic, but each
// takes memory until it is removed or its ttl ends.
const MaxOverrides = 100_000

// ErrTooManyOverrides is the memory store's answer to a new override when
// it keeps MaxOverrides already.
var ErrTooManyOverrides = fmt.Errorf("the memory store keeps at most %d per-key limit overrides; remove some, or give them a ttl", MaxOverrides)

// override returns the override in force for key in zone at now.
func (c *memoryCounters) override(zone, key string, now time.Time) (Override, bool) {
	h := c.keyHash(zone, key)
	s := &c.shards[shardOf(h)]
	s.mu.Lock()
	o, ok := s.overrides[h]
	s.mu.Unlock()
	return o, ok && o.Active(now)
}

// KeyState implements Admin.
func (m *Memory) KeyState(_ context.Context, zone, key string, window time.Duration) (KeyState, error) {
	now := m.counters.now()
	var st KeyState
	var ok bool
	if st.Counts, ok = m.counters.inspect(zone, key, window.Milliseconds()); !ok {
		st.Ring, _ = m.counters.inspectRing(zone, key, window.Milliseconds())
	}
	if o, ok := m.counters.override(zone, key, now); ok {
		st.Override = &o
	}
	if ends, ok := m.counters.banEnds(zone, key, now); ok {
		st.BanEnds = time.UnixMilli(ends)
	}
	return st, nil
}

// ResetKey implements Admin: it forgets the key's counts and lifts its
// ban.
func (m *Memory) ResetKey(_ context.Context, zone, key string) error {
	m.counters.reset(zone, key)
	return nil
}

// SetOverride implements Admin. A new override is refused with
// ErrTooManyOverrides when the store keeps MaxOverrides already; one that
// replaces a key's override always takes its place.
func (m *Memory) SetOverride(_ context.Context, zone, key string, o Override) error {
	c := m.counters
	h := c.keyHash(zone, key)
	s := &c.shards[shardOf(h)]
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.overrides[h]; !ok {
		// Counted before it is kept, so that overrides set at once in
		// other shards cannot all pass the bound.
		if c.admin.overrides.Add(1) > MaxOverrides {
			c.admin.overrides.Add(-1)
			return fmt.Errorf("zone %q: %w", zone, ErrTooManyOverrides)
		}
		if s.overrides == nil {
			s.overrides = make(map[uint64]Override)
		}
	}
	s.overrides[h] = o
	return nil
}

// DeleteOverride implements Admin.
func (m *Memory) DeleteOverride(_ context.Context, zone, key string) error {
	c := m.counters
	h := c.keyHash(zone, key)
	s := &c.shards[shardOf(h)]
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.overrides[h]; ok {
		delete(s.overrides, h)
		c.admin.overrides.Add(-1)
		if len(s.overrides) == 0 {
			s.overrides = nil
		}
	}
	return nil
}

// SetZoneDial implements Admin.
func (m *Memory) SetZoneDial(_ context.Context, zone string, d ZoneDial) error {
	a := &m.counters.admin
	a.mu.Lock()
	defer a.mu.Unlock()
	a.dials.set(zone, d)
	return nil
}

// DeleteZoneDial implements Admin.
func (m *Memory) DeleteZoneDial(_ context.Context, zone string) error {
	a := &m.counters.admin
	a.mu.Lock()
	defer a.mu.Unlock()
	a.dials.remove(zone)
	return nil
}

// ZoneDial implements Admin.
func (m *Memory) ZoneDial(zone string) (ZoneDial, bool) {
	return m.counters.admin.dials.get(zone)
}

var _ Admin = (*Memory)(nil)
