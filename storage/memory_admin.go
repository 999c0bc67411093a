package storage

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// memoryAdmin holds the memory store's per-key overrides and zone dials.
// It lives in the shared counters, so both outlive config reloads; they
// are local to this Caddy instance, as the counters are.
type memoryAdmin struct {
	mu        sync.Mutex
	overrides map[memoryKey]Override
	// count is len(overrides), read on every take so that a store without
	// overrides pays one atomic load for them.
	count atomic.Int64
	dials dialTable
}

// override returns the override in force for key in zone at now.
func (a *memoryAdmin) override(zone, key string, now time.Time) (Override, bool) {
	if a.count.Load() == 0 {
		return Override{}, false
	}
	a.mu.Lock()
	o, ok := a.overrides[memoryKey{zone, key}]
	a.mu.Unlock()
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
	if o, ok := m.counters.admin.override(zone, key, now); ok {
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

// SetOverride implements Admin.
func (m *Memory) SetOverride(_ context.Context, zone, key string, o Override) error {
	a := &m.counters.admin
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.overrides == nil {
		a.overrides = make(map[memoryKey]Override)
	}
	a.overrides[memoryKey{zone, key}] = o
	a.count.Store(int64(len(a.overrides)))
	return nil
}

// DeleteOverride implements Admin.
func (m *Memory) DeleteOverride(_ context.Context, zone, key string) error {
	a := &m.counters.admin
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.overrides, memoryKey{zone, key})
	a.count.Store(int64(len(a.overrides)))
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
