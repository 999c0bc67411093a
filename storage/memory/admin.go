package memory

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// admin holds the memory store's zone dials, and counts its per-key
// overrides, which the shards hold beside the counts of their keys (see
// shard). It lives in the shared counters, so both outlive config
// reloads; they are local to this Caddy instance, as the counters are.
type admin struct {
	mu    sync.Mutex
	dials storage.DialTable
	// overrides counts the overrides the shards hold, expired ones
	// included until the sweep removes them, against MaxOverrides.
	overrides atomic.Int64
}

// MaxOverrides bounds the per-key limit overrides the memory store keeps
// at once. They are set through the admin API, not by traffic, but each
// takes memory until it is removed or its ttl ends.
const MaxOverrides = 100_000

// override returns the override in force for key in zone at now.
func (c *counters) override(zone, key string, now time.Time) (storage.Override, bool) {
	h := c.keyHash(zone, key)
	s := &c.shards[shardOf(h)]
	s.mu.Lock()
	o, ok := s.overrides[h]
	s.mu.Unlock()
	return o, ok && o.Active(now)
}

// KeyState implements storage.Admin.
func (m *Store) KeyState(_ context.Context, zone, key string, rate algorithms.Rate) (storage.KeyState, error) {
	now := m.counters.now()
	var st storage.KeyState
	var ok bool
	if st.Counts, ok = m.counters.inspect(zone, key, rate); !ok {
		st.Ring, _ = m.counters.inspectRing(zone, key, rate)
	}
	if o, ok := m.counters.override(zone, key, now); ok {
		st.Override = &o
	}
	if ends, ok := m.counters.banEnds(zone, key, now); ok {
		st.BanEnds = time.UnixMilli(ends)
	}
	if p, ok := m.counters.inFlight(zone, key); ok {
		st.InFlight = algorithms.InFlightUnits(p, now, rate)
	}
	return st, nil
}

// ResetKey implements storage.Admin: it forgets the key's counts and lifts its
// ban.
func (m *Store) ResetKey(_ context.Context, zone, key string) error {
	m.counters.reset(zone, key)
	return nil
}

// SetOverride implements storage.Admin. A new override is refused with
// storage.ErrTooManyOverrides when the store keeps MaxOverrides already;
// one that replaces a key's override always takes its place.
func (m *Store) SetOverride(_ context.Context, zone, key string, o storage.Override) error {
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
			return fmt.Errorf("zone %q: %w: the memory store keeps at most %d; remove some, or give them a ttl", zone, storage.ErrTooManyOverrides, MaxOverrides)
		}
		if s.overrides == nil {
			s.overrides = make(map[uint64]storage.Override)
		}
	}
	s.overrides[h] = o
	return nil
}

// DeleteOverride implements storage.Admin.
func (m *Store) DeleteOverride(_ context.Context, zone, key string) error {
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

// SetZoneDial implements storage.Admin.
func (m *Store) SetZoneDial(_ context.Context, zone string, d storage.ZoneDial) error {
	a := &m.counters.admin
	a.mu.Lock()
	defer a.mu.Unlock()
	a.dials.Set(zone, d)
	return nil
}

// DeleteZoneDial implements storage.Admin.
func (m *Store) DeleteZoneDial(_ context.Context, zone string) error {
	a := &m.counters.admin
	a.mu.Lock()
	defer a.mu.Unlock()
	a.dials.Remove(zone)
	return nil
}

// ZoneDial implements storage.Admin.
func (m *Store) ZoneDial(zone string) (storage.ZoneDial, bool) {
	return m.counters.admin.dials.Get(zone)
}

var _ storage.Admin = (*Store)(nil)
