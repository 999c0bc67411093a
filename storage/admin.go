package storage

import (
	"context"
	"errors"
	"maps"
	"sync/atomic"
	"time"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
)

// Override is a per-key limit set through the admin API. It wins over the
// zone's limit alternatives and over a dial's limit until it expires.
type Override struct {
	Limit int64 `json:"limit"`
	// Expires is when the override ends; the zero time means never.
	Expires time.Time `json:"expires,omitzero"`
}

// Active reports whether o is in force at now.
func (o Override) Active(now time.Time) bool {
	return o.Limit > 0 && (o.Expires.IsZero() || now.Before(o.Expires))
}

// KeyState is what a store holds for one zone and key.
type KeyState struct {
	// Counts are the key's counts as stored (zero for an unseen key), not
	// rolled forward to now.
	Counts algorithms.Counts
	// Ring is, for a sliding_window key, its ring as stored.
	Ring algorithms.Ring
	// Override is the per-key limit in force, if any.
	Override *Override
	// BanEnds is when the key's ban ends, in the local clock; the zero
	// time if it is not banned.
	BanEnds time.Time
	// InFlight is the cost of the key's requests still in flight, for a
	// zone whose store keeps them (Request.KeepsInFlight): those taken in
	// the zone's current window or the one before, on every instance
	// that shares the store. A cost taken earlier is forgotten, as the
	// settled count forgets it (algorithms.TakeInFlight): its request
	// has run for over a window, or its instance never said it ended.
	InFlight int64
}

// ErrTooManyOverrides is what an Admin's SetOverride wraps when it refuses
// a new override because it keeps as many as it can (the admin API
// answers 507 Insufficient Storage). The error says the bound.
var ErrTooManyOverrides = errors.New("too many per-key limit overrides")

// Modes of a dial.
const (
	ModeEnforce = "enforce"
	ModeDryRun  = "dry_run"
	ModeOff     = "off"
)

// ZoneDial is a zone-wide setting made through the admin API: a mode (enforce,
// dry_run or off) and a limit that replaces the zone's limit alternatives
// for every key without an override. Either may be unset.
type ZoneDial struct {
	Mode  string `json:"mode,omitempty"`
	Limit int64  `json:"limit,omitempty"`
	// Expires is when the dial ends; the zero time means never.
	Expires time.Time `json:"expires,omitzero"`
}

// Active reports whether d is in force at now.
func (d ZoneDial) Active(now time.Time) bool {
	return (d.Mode != "" || d.Limit > 0) && (d.Expires.IsZero() || now.Before(d.Expires))
}

// Admin is what the admin API asks of a store. With a shared store (Redis)
// a change made through any instance applies on every instance that shares
// it within a second: each instance rereads the dials in the background,
// and forgets its cached rejections of a key that was reset or given an
// override.
type Admin interface {
	// KeyState returns what the store holds for key in zone, whose
	// windows are rate's (its Window or Calendar, and Buckets; its Units
	// are not read): the memory store needs them to read a window's index
	// and a sliding window's ring back (it keeps indexes in 32 bits), and
	// both stores to tell which costs in flight still count.
	KeyState(ctx context.Context, zone, key string, rate algorithms.Rate) (KeyState, error)
	// ResetKey forgets key's counts in zone and lifts its ban.
	ResetKey(ctx context.Context, zone, key string) error
	// SetOverride sets a per-key limit; DeleteOverride removes it.
	SetOverride(ctx context.Context, zone, key string, o Override) error
	DeleteOverride(ctx context.Context, zone, key string) error
	// SetZoneDial sets zone's dial; DeleteZoneDial returns the zone to its config.
	SetZoneDial(ctx context.Context, zone string, d ZoneDial) error
	DeleteZoneDial(ctx context.Context, zone string) error
	// ZoneDial returns the dial in force for zone. It is asked on every
	// request, so it answers from memory.
	ZoneDial(zone string) (ZoneDial, bool)
}

// DialTable holds a store's zone dials, which Admin.ZoneDial answers from
// on every request without a lock: the map is replaced, never changed.
// Writers serialise their changes themselves. The zero value is empty.
type DialTable struct {
	m atomic.Pointer[map[string]ZoneDial]
}

// Get returns zone's dial, if the table holds one.
func (t *DialTable) Get(zone string) (ZoneDial, bool) {
	m := t.m.Load()
	if m == nil {
		return ZoneDial{}, false
	}
	d, ok := (*m)[zone]
	return d, ok
}

// Set replaces the table with a copy in which zone has dial d.
func (t *DialTable) Set(zone string, d ZoneDial) {
	next := make(map[string]ZoneDial)
	if old := t.m.Load(); old != nil {
		maps.Copy(next, *old)
	}
	next[zone] = d
	t.m.Store(&next)
}

// Remove replaces the table with a copy without zone.
func (t *DialTable) Remove(zone string) {
	old := t.m.Load()
	if old == nil {
		return
	}
	next := maps.Clone(*old)
	delete(next, zone)
	if len(next) == 0 {
		// No dial left: requests are back to a nil check.
		t.m.Store(nil)
		return
	}
	t.m.Store(&next)
}

// Replace puts m in the table; m must not change afterwards.
func (t *DialTable) Replace(m map[string]ZoneDial) {
	t.m.Store(&m)
}
