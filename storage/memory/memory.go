// Package memory is the rate_limit store that keeps counters in this
// Caddy process (module http.handlers.rate_limit.stores.memory), the
// default store.
package memory

import (
	"context"
	"fmt"
	"hash/maphash"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

func init() {
	caddy.RegisterModule(Store{})
}

// DefaultMaxKeys bounds the memory store when max_keys is not set.
const DefaultMaxKeys = 1_000_000

// Store keeps counters in this Caddy process. It is the default store.
//
// Every config that uses it shares one set of counters, which outlives
// config reloads, so a reload through the admin API loses no counts. The
// store is split into 64 shards, each with its own lock, and is bounded:
// each shard holds its share of max_keys (rounded up) and, when full,
// forgets a key not used lately (CLOCK, an approximation of least
// recently used), so eviction can begin a little before the store as a
// whole holds max_keys. Keys whose windows have passed are swept in the
// background, every DefaultSweepInterval unless a config asks for another
// interval (SetSweepInterval).
//
// A key's slot and key take 28 bytes in a table between 7/16 and 7/8 full
// (see table), a sliding window's too for the default 10 buckets of
// counts under 256 (see ring.go), a wide key's (a zone priced in money,
// counted at 64 bits) 40, whatever the length of the key,
// because the store keeps not the zone and key but a 64-bit hash of them,
// keyed with a seed drawn at random when the process starts. Two keys
// that hashed alike would share a counter, but that is not a risk in
// practice: without the seed, which never leaves the process, no one can
// choose keys that collide, and the odds of an accidental collision among
// a million keys are about n²/2⁶⁵ = 2.7e-8.
type Store struct {
	// The most keys (zone and key pairs) kept at once. Default (and 0):
	// 1,000,000.
	// All configs and handlers share one store: the value of the most
	// recently provisioned one still running that sets it applies, so a
	// config that fails to load leaves the bound as it was, and a handler
	// that does not set it leaves another's in force.
	MaxKeys int `json:"max_keys,omitempty"`

	counters *counters
	// sweepInterval is the interval this config asks for (0: none); see
	// SetSweepInterval.
	sweepInterval time.Duration
	// own tells that counters are this store's alone (New), not
	// the ones Caddy's configs share.
	own bool
}

// New returns a memory store with counters of its own, apart from the
// ones Caddy's configs share, bounded to maxKeys (0: DefaultMaxKeys),
// that reads the time from now: for a handler used, or tested, without
// Caddy, whose caller sets the clock, and for another store that decides
// in this process while it cannot (the Redis store's local fallback).
// Cleanup stops its sweeper.
func New(maxKeys int, now func() time.Time) *Store {
	if maxKeys <= 0 {
		maxKeys = DefaultMaxKeys
	}
	return &Store{MaxKeys: maxKeys, counters: newCounters(maxKeys, now), own: true}
}

// CaddyModule returns the Caddy module information.
func (Store) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  storage.Namespace + ".memory",
		New: func() caddy.Module { return new(Store) },
	}
}

// pool holds the one process-wide set of counters while any config
// uses it.
var pool = caddy.NewUsagePool()

const poolKey = "memory"

// Provision attaches the shared counters. It refuses a negative bound
// itself, since Caddy validates only after provisioning.
func (m *Store) Provision(ctx caddy.Context) error {
	if err := m.Validate(); err != nil {
		return err
	}
	if err := registerEntries(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("registering metrics: %w", err)
	}
	val, _, err := pool.LoadOrNew(poolKey, func() (caddy.Destructor, error) {
		return newCounters(DefaultMaxKeys, time.Now), nil
	})
	if err != nil {
		return err
	}
	m.counters = val.(*counters)
	m.counters.addUser(m)
	return nil
}

// Validate refuses a negative bound (0 means the default).
func (m *Store) Validate() error {
	if err := checkMaxKeys(m.MaxKeys); err != nil {
		return fmt.Errorf("store memory: max_keys: %w", err)
	}
	return nil
}

func checkMaxKeys(n int) error {
	if n < 0 {
		return fmt.Errorf("want a positive number of keys (0: the default, %d), got %d", DefaultMaxKeys, n)
	}
	return nil
}

// Cleanup lets go of the shared counters; the last user stops the sweeper.
func (m *Store) Cleanup() error {
	if m.counters == nil {
		return nil
	}
	if m.own {
		return m.counters.Destruct()
	}
	m.counters.removeUser(m)
	_, err := pool.Delete(poolKey)
	return err
}

// Take implements storage.Store, refusing limits and costs the counters
// cannot hold.
func (m *Store) Take(_ context.Context, reqs []storage.Request, decisions []algorithms.Decision) error {
	for _, r := range reqs {
		switch {
		case r.Cost < 0:
			return fmt.Errorf("zone %q: cost %d is negative", r.Zone, r.Cost)
		case r.Wide && r.Algorithm != algorithms.FixedWindow && r.Algorithm != algorithms.SlidingTail:
			return fmt.Errorf("zone %q: wide counts only for fixed_window and sliding_tail, got %s", r.Zone, r.Algorithm)
		case !r.Wide && (r.Rate.Units > maxCount || r.Cost > maxCount):
			return fmt.Errorf("zone %q: limit or cost too large for the memory store (at most %d)", r.Zone, maxCount)
		}
		if err := r.Rate.Validate(); err != nil {
			return fmt.Errorf("zone %q: %w", r.Zone, err)
		}
	}
	m.counters.take(reqs, decisions)
	return nil
}

// Refused implements storage.Refuser: a request of a banned key is
// refused whatever it costs. The store's other decisions depend on the
// cost, and are made by Take, as cheaply.
func (m *Store) Refused(q storage.Request) (algorithms.Decision, bool) {
	return m.counters.refused(q)
}

// Finish implements storage.Store: it ends the accounting of what Take
// took for reqs, and wakes requests waiting for concurrency units.
func (m *Store) Finish(_ context.Context, reqs []storage.Request, decisions []algorithms.Decision) error {
	m.counters.finish(reqs, decisions)
	return nil
}

// Released implements storage.Store: the channel is closed at the next
// Finish, the moment units may have been released.
func (m *Store) Released() <-chan struct{} {
	return m.counters.released.Wait()
}

// UnmarshalCaddyfile sets up the store from Caddyfile tokens:
//
//	store memory {
//		max_keys <n>
//	}
func (m *Store) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // store name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := false
	for d.NextBlock(0) {
		switch d.Val() {
		case "max_keys":
			if seen {
				return d.Err("store memory: max_keys: repeated (want it once)")
			}
			seen = true
			if !d.NextArg() {
				return d.ArgErr()
			}
			n, err := strconv.Atoi(d.Val())
			if err != nil {
				return d.Errf("store memory: max_keys: want an integer, got %q", d.Val())
			}
			if err := checkMaxKeys(n); err != nil {
				return d.Errf("store memory: max_keys: %v", err)
			}
			m.MaxKeys = n
			if d.NextArg() {
				return d.ArgErr()
			}
		default:
			return d.Errf("store memory: unknown subdirective %q (want max_keys)", d.Val())
		}
	}
	return nil
}

const shardCount = 64

// DefaultSweepInterval is how often expired keys are removed in the
// background when no config asks for another interval (see
// Store.SetSweepInterval).
const DefaultSweepInterval = 10 * time.Second

// maxCount bounds limits and costs the memory store accepts, but for wide
// requests (storage.Request.Wide). Decide adds a cost to a count only
// while the count stays within the limit, and a true-up's debt takes it at
// most to twice the limit (algorithms.MostDebt), so no count exceeds
// 2×maxCount, and 32 bits (unsigned) hold every count. The handler never
// takes more (its limits and costs are at most math.MaxInt32 too, but a
// zone priced in money's, which are wide).
const maxCount = math.MaxInt32

// slot is one key's counters in a shard's table, beside its key
// (the keyed hash of zone and key; see Store and table). It holds no
// pointers, so the collector never scans a table, and it is 20 bytes:
// 28 with its key.
type slot struct {
	// w, c and p are algorithms.Counts' W, C and P; C and P fit in 32
	// bits since they never exceed 2×maxCount. w keeps the low 32 bits of
	// W (a window index, or a GCRA key's TAT in ms), and counts finds the
	// rest from expires: the whole would take 8 bytes and, with its
	// alignment, make the slot 32.
	w, c, p uint32
	// expires is when the counts stop mattering, in Unix seconds rounded
	// up (see expiry): the sweep runs every few seconds, so milliseconds
	// would buy nothing, and 32 bits last until 2106.
	expires uint32
	// ref is CLOCK's reference bit: set when the key is requested again,
	// cleared when the hand passes it.
	ref bool
	// kind is what decided the counts, which says how counts reads w
	// back: slotWindowed, slotGCRA or slotConcurrency.
	kind uint8
}

const (
	slotWindowed = iota
	slotGCRA
	slotConcurrency
)

func slotKind(a algorithms.Algorithm) uint8 {
	switch a {
	case algorithms.GCRA:
		return slotGCRA
	case algorithms.Concurrency:
		return slotConcurrency
	}
	return slotWindowed
}

// wideSlot is a wide key's counters (storage.Request.Wide), kept whole:
// a zone priced in money counts picodollars, up to 2^63-1, which a slot's
// 32 bits do not hold. Wide keys have a table of their own, so that every
// other key keeps its 20-byte slot; only fixed_window and sliding_tail
// keys are wide, and W is their window index. 32 bytes, 40 with its key.
type wideSlot struct {
	w, c, p int64
	expires uint32
	ref     bool
}

// set stores counts decided by alg, which matter until expires.
func (e *slot) set(c algorithms.Counts, alg algorithms.Algorithm, expires uint32, ref bool) {
	*e = slot{w: uint32(c.W), c: uint32(c.C), p: uint32(c.P),
		expires: expires, ref: ref, kind: slotKind(alg)}
}

// counts returns the slot's counts, for the windows of rate l. The expiry
// that expiry derived from the whole Counts.W places it within a second:
// a GCRA key's TAT lies in the second before it, and for windowed counts,
// the end of the window after theirs does, so their index is at most
// 1000/w + 1 below the expiry's, for windows of w ms. Of the numbers
// with the slot's low 32 bits, the one nearest that is W. A calendar
// period's index, periods since 1970, fits in the 32 bits whole.
// (Counts read for another window than they were kept for, after a
// reload changed it, come out with an index far from the clock's, all
// but surely, and Decide starts them afresh. A concurrency key's W is
// always 0.)
func (e *slot) counts(l algorithms.Rate) algorithms.Counts {
	c := algorithms.Counts{C: int64(e.c), P: int64(e.p)}
	switch {
	case e.kind == slotGCRA:
		c.W = nearest(e.w, int64(e.expires)*1000-1000)
	case e.kind == slotWindowed && l.Calendar != nil:
		c.W = nearest(e.w, 0)
	case e.kind == slotWindowed:
		c.W = nearest(e.w, algorithms.WindowIndex(int64(e.expires)*1000, l.Window.Milliseconds())-2)
	}
	return c
}

// nearest returns the number whose low 32 bits are low that is nearest
// to near: it is exact while the number sought is within 2^31 of near.
func nearest(low uint32, near int64) int64 {
	return near + int64(int32(low-uint32(near)))
}

// shard holds a 64th of the keys, each in the table for its kind
// of counts, under one lock. The tables are bounded together: the shard
// holds at most its share of max_keys in all.
type shard struct {
	mu     sync.Mutex
	counts table[slot, *slot]
	wide   table[wideSlot, *wideSlot]
	rings  ringTables
	// bans holds the banned keys' bans (see banQueue).
	bans banQueue
	// overrides holds the per-key limits set through the admin API of
	// the keys in this shard, by key hash; nil when there is none, so
	// that a take reads no more than that for them. They are changed
	// under the shard's lock, which a take of the key holds anyway: no
	// lock of their own for requests to wait on.
	overrides map[uint64]storage.Override
	// inFlight holds, by key hash, the costs in flight of keys of zones
	// that keep them (storage.Request.KeepsInFlight): those that ban and
	// release costs, whose settled count they give (see
	// algorithms.Settled), and the reservations of cost_from zones, which
	// the admin API shows. It holds a key only while such requests are in
	// flight, so apart from the slots, which it would make 8 bytes larger
	// for every key.
	inFlight map[uint64]algorithms.WindowCounts
	// Pad to a multiple of a cache line (64 bytes), so that locking one
	// shard does not steal the line of its neighbour from another CPU.
	_ [640 - 632]byte
}

// keys returns how many keys the shard holds.
func (s *shard) keys() int { return s.counts.n + s.wide.n + s.rings.keys() }

// entryCounts are what the store's shards hold, counted one shard lock
// at a time (see entries, the gauge that reports them).
type entryCounts struct{ keys, bans, overrides, inFlight int }

// entries counts what the shards hold now, expired or not.
func (c *counters) entries() entryCounts {
	var e entryCounts
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		e.keys += s.keys()
		e.bans += s.bans.len()
		e.overrides += len(s.overrides)
		e.inFlight += len(s.inFlight)
		s.mu.Unlock()
	}
	return e
}

// makeRoom evicts while the shard holds bound keys or more, from the
// table a new key goes in first (evictFirst), then from the others.
// Eviction stops early if every key is pinned: the shard then holds more
// than its bound until units are released.
func (s *shard) makeRoom(bound int, now uint32, evictFirst func(uint32) bool) {
	for s.keys() >= bound {
		if !evictFirst(now) && !s.counts.evict(now) && !s.wide.evict(now) && !s.rings.evict(now) {
			return
		}
	}
}

type counters struct {
	seed   maphash.Seed
	now    func() time.Time
	shards [shardCount]shard

	// maxPerShard bounds each shard; read on every take, so atomic
	// rather than behind one lock that all shards would share.
	maxPerShard atomic.Int64

	// users are the configs using the counters, oldest first; the newest
	// sets the bound.
	usersMu sync.Mutex
	users   []*Store

	// admin holds the dials set through the admin API, and counts the
	// overrides the shards hold.
	admin admin

	// released wakes the requests that max_delay holds for concurrency
	// units.
	released storage.ReleaseSignal

	// sweepEvery is the sweep interval in force, in nanoseconds, and
	// resweep tells the sweeper that it changed (see updateSweepInterval).
	sweepEvery atomic.Int64
	resweep    chan struct{}

	stop chan struct{}
	done chan struct{}
}

func newCounters(maxKeys int, now func() time.Time) *counters {
	c := &counters{
		seed:    maphash.MakeSeed(),
		now:     now,
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
		resweep: make(chan struct{}, 1),
	}
	c.sweepEvery.Store(int64(DefaultSweepInterval))
	c.setMaxKeys(maxKeys)
	go c.sweepLoop()
	return c
}

// addUser adds m as the newest user of the counters: its max_keys, if set,
// is the bound.
func (c *counters) addUser(m *Store) {
	c.usersMu.Lock()
	defer c.usersMu.Unlock()
	c.users = append(c.users, m)
	c.updateMaxKeys()
}

// removeUser forgets m: the bound is the newest remaining user's that sets
// one.
func (c *counters) removeUser(m *Store) {
	c.usersMu.Lock()
	defer c.usersMu.Unlock()
	c.users = slices.DeleteFunc(c.users, func(u *Store) bool { return u == m })
	c.updateMaxKeys()
	c.updateSweepInterval()
}

// updateMaxKeys puts in force the max_keys of the newest user that sets
// one, or DefaultMaxKeys. The caller holds usersMu.
func (c *counters) updateMaxKeys() {
	for _, u := range slices.Backward(c.users) {
		if u.MaxKeys > 0 {
			c.setMaxKeys(u.MaxKeys)
			return
		}
	}
	c.setMaxKeys(DefaultMaxKeys)
}

// setMaxKeys bounds each shard to its share of n keys, rounded up.
func (c *counters) setMaxKeys(n int) {
	c.maxPerShard.Store(int64(max(1, (n-1)/shardCount+1)))
}

// Destruct stops the sweeper; the UsagePool calls it when the last config
// using the memory store is cleaned up.
func (c *counters) Destruct() error {
	close(c.stop)
	<-c.done
	return nil
}

// keyHash returns the keyed hash that stands for zone and key. It hashes
// the pair as a value, as a Go map keyed by it would (each string's
// length and bytes in turn), not their concatenation, so ("ab", "c") and
// ("a", "bc") are different inputs whatever bytes names hold. It is never
// 0, which marks an empty slot. Its low bits pick the shard and its top
// bits the home slot in the shard's table.
func (c *counters) keyHash(zone, key string) uint64 {
	return max(maphash.Comparable(c.seed, zoneKey{zone, key}), 1)
}

type zoneKey struct{ zone, key string }

func shardOf(h uint64) int { return int(h % shardCount) }

// take decides and, if all are allowed, takes reqs atomically: the shards
// of all keys are locked together, in index order so that concurrent takes
// cannot deadlock. Limits and costs must be within maxCount.
func (c *counters) take(reqs []storage.Request, decisions []algorithms.Decision) {
	var hashBuf [4]uint64
	hashes := hashBuf[:0]
	var lockBuf [4]int
	locks := lockBuf[:0]
	ringed := false
	for i := range reqs {
		r := &reqs[i]
		h := c.keyHash(r.Zone, r.Key)
		hashes = append(hashes, h)
		locks = append(locks, shardOf(h))
		ringed = ringed || r.Algorithm == algorithms.SlidingWindow
	}
	slices.Sort(locks)
	locks = slices.Compact(locks)
	for _, i := range locks {
		c.shards[i].mu.Lock()
	}
	defer func() {
		for _, i := range locks {
			c.shards[i].mu.Unlock()
		}
	}()

	// Read the clock under the locks, so that no request decides with a
	// time older than one that took for the same key before it.
	now := c.now()
	allowed := true
	var countsBuf [4]algorithms.Counts
	next := countsBuf[:0]
	// The rings of sliding_window requests, which are too big to keep on
	// the stack for every take: pooled, and only for takes that have one.
	var rings *[]pendingRing
	if ringed {
		rings = ringScratch.Get().(*[]pendingRing)
		defer ringScratch.Put(rings)
		*rings = slices.Grow((*rings)[:0], len(reqs))[:len(reqs)]
	}
	for i := range reqs {
		r := &reqs[i]
		var p *pendingRing
		if r.Algorithm == algorithms.SlidingWindow {
			p = &(*rings)[i]
		}
		d, n := c.shards[shardOf(hashes[i])].decide(hashes[i], r, now, p)
		decisions[i] = d
		next = append(next, n)
		allowed = allowed && d.Allowed
	}
	bound := int(c.maxPerShard.Load())
	if !allowed {
		c.banFirstRejections(reqs, decisions, hashes, now.UnixMilli(), bound)
		return
	}
	c.takeAllowed(reqs, decisions, hashes, next, rings, now.UnixMilli(), bound)
}

// decide decides r, of the key whose hash is h, at now, against its
// per-key override if one is in force: a sliding window from its ring,
// which p keeps with the ring as taking r would leave it, another
// algorithm from its counts, which it returns as taking r would leave
// them. A rejection only costs in flight caused is marked so
// (inFlightOnly), and a ban in force rejects r.
func (s *shard) decide(h uint64, r *storage.Request, now time.Time, p *pendingRing) (algorithms.Decision, algorithms.Counts) {
	rate := r.Rate
	if s.overrides != nil {
		if o, ok := s.overrides[h]; ok && o.Active(now) {
			rate.Units = o.Limit
		}
	}
	var d algorithms.Decision
	var n algorithms.Counts
	if r.Algorithm == algorithms.SlidingWindow {
		var ring algorithms.Ring
		ring, p.was = s.rings.find(h, rate.Window.Milliseconds())
		d, p.ring = algorithms.DecideRing(ring, now, rate, r.Cost)
		d = s.inFlightOnly(h, r, rate, d, algorithms.Counts{}, &ring, now)
	} else {
		// A key requested is in use, allowed or not: a key being
		// refused must not be the one evicted, or its counts would
		// be lost.
		counts, _ := s.lookup(h, r.Wide, rate, true)
		d, n = algorithms.Decide(r.Algorithm, counts, now, rate, r.Cost)
		d = s.inFlightOnly(h, r, rate, d, counts, nil, now)
	}
	if r.Ban > 0 {
		if ends, ok := s.bans.ends(h); ok && ends > now.UnixMilli() {
			d = d.Ban(time.UnixMilli(ends), false)
		}
	}
	return d, n
}

// inFlightOnly returns d, r's decision at now, marked as refused only
// for costs in flight (Decision.RefusedInFlight) if it is a rejection
// that the key's settled count would have allowed: its counts, or its
// ring if ring is not nil, less the costs of its requests still in
// flight. Such a rejection bans nothing. Only a request that
// TracksInFlight is looked at.
func (s *shard) inFlightOnly(h uint64, r *storage.Request, rate algorithms.Rate, d algorithms.Decision, counts algorithms.Counts, ring *algorithms.Ring, now time.Time) algorithms.Decision {
	if d.Allowed || !r.TracksInFlight() {
		return d
	}
	inFlight, ok := s.inFlight[h]
	if !ok {
		return d
	}
	var settled algorithms.Decision
	if ring != nil {
		settled, _ = algorithms.DecideRing(algorithms.SettledRing(*ring, inFlight, now, rate), now, rate, r.Cost)
	} else {
		settled, _ = algorithms.Decide(r.Algorithm, algorithms.Settled(r.Algorithm, counts, inFlight, now, rate), now, rate, r.Cost)
	}
	if settled.Allowed {
		d = d.RefusedInFlight(time.UnixMilli(now.UnixMilli()))
	}
	return d
}

// banFirstRejections bans, at nowMs, the keys of reqs whose zones ban
// and rejected them now for the first time, unless only costs in flight
// filled the limit, or the cost could never pass.
func (c *counters) banFirstRejections(reqs []storage.Request, decisions []algorithms.Decision, hashes []uint64, nowMs int64, bound int) {
	for i := range reqs {
		r := &reqs[i]
		if d := decisions[i]; r.Ban > 0 && !d.Allowed && d.BanEnds.IsZero() && !d.InFlight &&
			r.Cost <= algorithms.Capacity(r.Algorithm, r.Rate, d.Limit) {
			ends := nowMs + r.Ban.Milliseconds()
			c.shards[shardOf(hashes[i])].bans.set(hashes[i], ends, bound)
			decisions[i] = d.Ban(time.UnixMilli(ends), true)
		}
	}
}

// takeAllowed stores what taking reqs, all allowed, leaves: each key's
// next counts, or its ring, and its cost in flight for a zone that keeps
// them.
func (c *counters) takeAllowed(reqs []storage.Request, decisions []algorithms.Decision, hashes []uint64, next []algorithms.Counts, rings *[]pendingRing, nowMs int64, bound int) {
	nowSec := unixSeconds(nowMs)
	for i := range reqs {
		r := &reqs[i]
		// Storing one request may move the slots of another in the same
		// shard (by growing or evicting), so each store looks up again.
		s := &c.shards[shardOf(hashes[i])]
		if r.KeepsInFlight() {
			s.takeInFlight(hashes[i], algorithms.InFlightWindow(r.Algorithm, decisions[i], r.Rate), r.Cost)
		}
		if r.Algorithm == algorithms.SlidingWindow {
			p := &(*rings)[i]
			s.storeRing(hashes[i], p.ring, ringExpiry(p.ring, r.Rate.Window.Milliseconds()), p.was, bound, nowSec)
			continue
		}
		s.store(hashes[i], next[i], r, expiry(r, next[i]), bound, nowSec)
	}
}

// lookup returns the counts kept for the key with hash h, in the wide
// table or the other, for the windows of rate l, and whether any are;
// with use, it marks the key used, for eviction.
func (s *shard) lookup(h uint64, wide bool, l algorithms.Rate, use bool) (algorithms.Counts, bool) {
	if wide {
		j, ok := s.wide.lookup(h)
		if !ok {
			return algorithms.Counts{}, false
		}
		e := &s.wide.slots[j]
		e.ref = e.ref || use
		return algorithms.Counts{W: e.w, C: e.c, P: e.p}, true
	}
	j, ok := s.counts.lookup(h)
	if !ok {
		return algorithms.Counts{}, false
	}
	e := &s.counts.slots[j]
	e.ref = e.ref || use
	return e.counts(l), true
}

// takeInFlight adds cost, taken in window, to the costs in flight of the
// key with hash h.
func (s *shard) takeInFlight(h uint64, window, cost int64) {
	if s.inFlight == nil {
		s.inFlight = make(map[uint64]algorithms.WindowCounts)
	}
	s.inFlight[h] = algorithms.TakeInFlight(s.inFlight[h], window, cost)
}

// endInFlight takes cost, taken in window, off the costs in flight of the
// key with hash h, forgetting them once none is left.
func (s *shard) endInFlight(h uint64, window, cost int64) {
	p, ok := s.inFlight[h]
	if !ok {
		return
	}
	if p = algorithms.EndInFlight(p, window, cost); p.Current == 0 && p.Previous == 0 {
		delete(s.inFlight, h)
		return
	}
	s.inFlight[h] = p
}

// ringScratch holds the rings a take decides before it stores them.
var ringScratch = sync.Pool{New: func() any { return new([]pendingRing) }}

// pendingRing is a ring a take decided, and the table it was found in.
type pendingRing struct {
	ring algorithms.Ring
	was  int
}

// expiry is when counts stop mattering, in Unix seconds rounded up.
// Windowed counts matter until the end of the next window (a calendar
// period's own end): a sliding tail
// weighs the current window as its previous one, and the first take in
// the next window reports what the current one came to (the period usage
// metric), as the Redis store does. A GCRA key matters until its TAT,
// when its bucket is full again, as if it had never been seen. Units held
// by a concurrency key matter until they are released: such a slot is
// pinned.
func expiry(r *storage.Request, c algorithms.Counts) uint32 {
	switch r.Algorithm {
	case algorithms.GCRA:
		return unixSeconds(c.TATMillis() + 1 + 999)
	case algorithms.Concurrency:
		return pinned
	}
	return unixSeconds(r.Rate.WindowOf(c.Windows().Window+1).End + 999)
}

// pinned is the expiry of a slot that neither the sweep nor eviction may
// take: a concurrency key with units held.
const pinned = math.MaxUint32

// unixSeconds returns the whole seconds in ms, clamped to 32 bits.
func unixSeconds(ms int64) uint32 {
	return uint32(min(max(algorithms.WindowIndex(ms, 1000), 0), math.MaxUint32))
}

// store writes counts for h. A new key first makes room: it evicts while
// the shard holds bound keys. A new key starts with its reference bit
// clear: it earns a second chance only by being requested again, so a
// flood of one-off keys (an attacker rotating addresses, say) evicts its
// own keys before those of clients that keep coming back, and a shard in
// which every key is referenced, where CLOCK would take whichever key the
// hand reaches first however recently used, stays rare.
func (s *shard) store(h uint64, counts algorithms.Counts, r *storage.Request, expires uint32, bound int, now uint32) {
	if r.Wide {
		i, ok := slotFor(s, &s.wide, h, bound, now)
		s.wide.slots[i] = wideSlot{w: counts.W, c: counts.C, p: counts.P, expires: expires, ref: ok}
		return
	}
	i, ok := slotFor(s, &s.counts, h, bound, now)
	s.counts.slots[i].set(counts, r.Algorithm, expires, ok) // and take has set ref when ok
}

// slotFor returns the index of h's slot in t, one of s's tables, and
// whether h was there; a new key first makes room in s, evicting from t
// first, while s holds bound keys.
func slotFor[S any, P slotPtr[S]](s *shard, t *table[S, P], h uint64, bound int, now uint32) (int, bool) {
	if i, ok := t.lookup(h); ok {
		return i, true
	}
	s.makeRoom(bound, now, t.evict)
	return t.add(h), false
}

// finish ends the accounting of what Take took for reqs, allowed with
// decisions (storage.Request.Finishing): it releases a concurrency request's units and
// another's cost (algorithms.Release), or the part of a reservation its
// true-up does not keep, takes a true-up's debt (algorithms.Debt), and
// ends the costs in flight of those it keeps them for, whatever stays. A concurrency key whose units are all released is forgotten;
// other keys keep their expiry, unless a debt moves it later.
func (c *counters) finish(reqs []storage.Request, decisions []algorithms.Decision) {
	bound := int(c.maxPerShard.Load())
	for i, r := range reqs {
		h := c.keyHash(r.Zone, r.Key)
		s := &c.shards[shardOf(h)]
		s.mu.Lock()
		if r.KeepsInFlight() {
			s.endInFlight(h, algorithms.InFlightWindow(r.Algorithm, decisions[i], r.Rate), r.Cost)
		}
		switch release, debt := r.Finishing(); {
		case release > 0:
			s.release(h, r, decisions[i], release)
		case debt > 0:
			// Read under the lock, as take reads it.
			s.debt(h, r, decisions[i], debt, c.now(), bound)
		}
		s.mu.Unlock()
	}
	c.released.Signal()
}

// release releases cost of r, allowed with d, from the counts of the key
// with hash h.
func (s *shard) release(h uint64, r storage.Request, d algorithms.Decision, cost int64) {
	switch {
	case r.Algorithm == algorithms.SlidingWindow:
		s.rings.release(h, r.Rate.Window.Milliseconds(), d, cost)
	case r.Wide:
		if j, ok := s.wide.lookup(h); ok {
			e := &s.wide.slots[j]
			n := algorithms.Release(r.Algorithm, algorithms.Counts{W: e.w, C: e.c, P: e.p}, d, r.Rate, cost)
			e.w, e.c, e.p = n.W, n.C, n.P
		}
	default:
		j, ok := s.counts.lookup(h)
		if !ok {
			return
		}
		e := &s.counts.slots[j]
		n := algorithms.Release(r.Algorithm, e.counts(r.Rate), d, r.Rate, cost)
		switch {
		case r.Algorithm == algorithms.Concurrency && n.Held() == 0:
			s.counts.remove(j)
		case r.Algorithm == algorithms.Concurrency:
			e.set(n, r.Algorithm, e.expires, e.ref) // still pinned
		default:
			// A GCRA TAT moved back matters less long; windowed
			// counts keep their window, and so their expiry. Either
			// way the expiry stays the one counts reads window by.
			e.set(n, r.Algorithm, expiry(&r, n), e.ref)
		}
	}
}

// debt takes units of r, allowed with d, past the limit at now, in the
// counts of the key with hash h (algorithms.Debt, DebtRing), for the
// limit d was decided against. A key whose counts are no longer kept
// (swept since, its window over) has the debt as its first count, and so
// makes room as a take does, in a shard of bound keys.
func (s *shard) debt(h uint64, r storage.Request, d algorithms.Decision, units int64, now time.Time, bound int) {
	rate := r.Rate
	if d.Limit > 0 {
		rate.Units = d.Limit
	}
	w := rate.Window.Milliseconds()
	nowSec := unixSeconds(now.UnixMilli())
	if r.Algorithm == algorithms.SlidingWindow {
		ring, was := s.rings.find(h, w)
		ring = algorithms.DebtRing(ring, now, rate, units)
		s.storeRing(h, ring, ringExpiry(ring, w), was, bound, nowSec)
		return
	}
	counts, _ := s.lookup(h, r.Wide, rate, false)
	n := algorithms.Debt(r.Algorithm, counts, now, rate, units)
	s.store(h, n, &r, expiry(&r, n), bound, nowSec)
}

// inspect returns the counts kept for zone and key as stored, not rolled
// forward to now (algorithms.Roll does that), and whether any are kept;
// inspectRing returns a sliding_window key's ring. Both read them for the
// windows of rate l. Looking does not count as use for eviction.
func (c *counters) inspect(zone, key string, l algorithms.Rate) (algorithms.Counts, bool) {
	h := c.keyHash(zone, key)
	s := &c.shards[shardOf(h)]
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.lookup(h, false, l, false); ok {
		return c, true
	}
	return s.lookup(h, true, l, false)
}

func (c *counters) inspectRing(zone, key string, l algorithms.Rate) (algorithms.Ring, bool) {
	h := c.keyHash(zone, key)
	s := &c.shards[shardOf(h)]
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rings.inspect(h, l.Window.Milliseconds())
}

// inFlight returns the costs in flight kept for zone and key, as
// stored (see shard.inFlight), and whether any are kept.
func (c *counters) inFlight(zone, key string) (algorithms.WindowCounts, bool) {
	h := c.keyHash(zone, key)
	s := &c.shards[shardOf(h)]
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.inFlight[h]
	return p, ok
}

// banEnds returns when the ban of zone and key ends, in ms, if it is
// banned at now.
func (c *counters) banEnds(zone, key string, now time.Time) (int64, bool) {
	h := c.keyHash(zone, key)
	s := &c.shards[shardOf(h)]
	s.mu.Lock()
	defer s.mu.Unlock()
	ends, ok := s.bans.ends(h)
	return ends, ok && ends > now.UnixMilli()
}

// refused returns the rejection of q by its key's ban, if the key is
// banned and q's zone bans, as take would answer it: against the
// override in force, if any, and with the clock read under the lock.
func (c *counters) refused(q storage.Request) (algorithms.Decision, bool) {
	if q.Ban <= 0 {
		return algorithms.Decision{}, false
	}
	h := c.keyHash(q.Zone, q.Key)
	s := &c.shards[shardOf(h)]
	s.mu.Lock()
	defer s.mu.Unlock()
	now := c.now()
	ends, ok := s.bans.ends(h)
	if !ok || ends <= now.UnixMilli() {
		return algorithms.Decision{}, false
	}
	limit := q.Rate.Units
	if o, ok := s.overrides[h]; ok && o.Active(now) {
		limit = o.Limit
	}
	return algorithms.Decision{Limit: limit}.Ban(time.UnixMilli(ends), false), true
}

// reset forgets the counts of zone and key and lifts its ban, and reports
// whether anything was kept. The costs of its requests still in flight
// stay until those requests end: the counts hold none of them now, so
// they keep the key's settled count from looking higher than it is.
func (c *counters) reset(zone, key string) bool {
	h := c.keyHash(zone, key)
	s := &c.shards[shardOf(h)]
	s.mu.Lock()
	defer s.mu.Unlock()
	banned := s.bans.remove(h)
	counted := s.counts.forget(h)
	wide := s.wide.forget(h)
	ringed := s.rings.forget(h)
	return counted || wide || ringed || banned
}

func (c *counters) sweepLoop() {
	defer close(c.done)
	t := time.NewTicker(time.Duration(c.sweepEvery.Load()))
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-c.resweep:
			t.Reset(time.Duration(c.sweepEvery.Load()))
		case <-t.C:
			c.sweep()
		}
	}
}

// sweep removes entries whose windows have passed, one shard at a time so
// that requests wait at most for one shard's sweep.
func (c *counters) sweep() {
	now := unixSeconds(c.now().UnixMilli())
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		c.admin.overrides.Add(int64(-s.sweep(now)))
		s.mu.Unlock()
	}
}

// sweep removes the shard's entries, bans and overrides that expired by
// now (see table.sweep), and reports how many overrides it removed.
// Bans expire from the top of their heap, touching only those that
// ended; overrides are walked, but the store keeps at most MaxOverrides,
// about 1,600 a shard, and most shards have none.
func (s *shard) sweep(now uint32) (overrides int) {
	s.counts.sweep(now)
	s.wide.sweep(now)
	s.rings.sweep(now)
	s.bans.expire(int64(now) * 1000)
	for h, o := range s.overrides {
		if !o.Expires.IsZero() && o.Expires.Unix() < int64(now) {
			delete(s.overrides, h)
			overrides++
		}
	}
	if len(s.overrides) == 0 {
		s.overrides = nil
	}
	return overrides
}

// Interface guards
var (
	_ storage.Store         = (*Store)(nil)
	_ storage.Refuser       = (*Store)(nil)
	_ storage.Sweeper       = (*Store)(nil)
	_ caddy.Provisioner     = (*Store)(nil)
	_ caddy.Validator       = (*Store)(nil)
	_ caddy.CleanerUpper    = (*Store)(nil)
	_ caddyfile.Unmarshaler = (*Store)(nil)
)
