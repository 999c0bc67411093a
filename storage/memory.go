package storage

import (
	"context"
	"fmt"
	"hash/maphash"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
)

func init() {
	caddy.RegisterModule(Memory{})
}

// DefaultMaxKeys bounds the memory store when max_keys is not set.
const DefaultMaxKeys = 1_000_000

// Memory keeps counters in this Caddy process. It is the default store.
//
// Every config that uses it shares one set of counters, which outlives
// config reloads, so a reload through the admin API loses no counts. The
// store is split into 64 shards, each with its own lock, and is bounded:
// each shard holds its share of max_keys (rounded up) and, when full,
// forgets its least recently used key, so eviction can begin a little
// before the store as a whole holds max_keys. Keys whose windows have
// passed are swept in the background.
type Memory struct {
	// The most keys (zone and key pairs) kept at once. Default (and 0):
	// 1,000,000.
	// All configs share one store; the value of the most recently loaded
	// config still running applies, so a config that fails to load leaves
	// the bound as it was.
	MaxKeys int `json:"max_keys,omitempty"`

	counters *memoryCounters
}

// CaddyModule returns the Caddy module information.
func (Memory) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  Namespace + ".memory",
		New: func() caddy.Module { return new(Memory) },
	}
}

// memoryPool holds the one process-wide set of counters while any config
// uses it.
var memoryPool = caddy.NewUsagePool()

const memoryPoolKey = "memory"

// Provision attaches the shared counters. It refuses a negative bound
// itself, since Caddy validates only after provisioning.
func (m *Memory) Provision(caddy.Context) error {
	if err := m.Validate(); err != nil {
		return err
	}
	if m.MaxKeys == 0 {
		m.MaxKeys = DefaultMaxKeys
	}
	val, _, err := memoryPool.LoadOrNew(memoryPoolKey, func() (caddy.Destructor, error) {
		return newMemoryCounters(m.MaxKeys, time.Now), nil
	})
	if err != nil {
		return err
	}
	m.counters = val.(*memoryCounters)
	m.counters.use(m)
	return nil
}

// Validate refuses a negative bound (0 means the default).
func (m *Memory) Validate() error {
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
func (m *Memory) Cleanup() error {
	if m.counters == nil {
		return nil
	}
	m.counters.release(m)
	_, err := memoryPool.Delete(memoryPoolKey)
	return err
}

// Take implements Store.
func (m *Memory) Take(_ context.Context, reqs []Request, decisions []algorithms.Decision) error {
	m.counters.take(reqs, decisions)
	return nil
}

// UnmarshalCaddyfile sets up the store from Caddyfile tokens:
//
//	store memory {
//		max_keys <n>
//	}
func (m *Memory) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
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

const memoryShards = 64

// sweepEvery is how often expired keys are removed in the background.
const sweepEvery = 10 * time.Second

type memoryKey struct{ zone, key string }

type memoryEntry struct {
	id      memoryKey
	counts  algorithms.Counts
	expires int64 // Unix ms after which the counts can no longer matter
	// prev and next link the shard's entries from most to least recently used.
	prev, next *memoryEntry
}

type memoryShard struct {
	mu      sync.Mutex
	entries map[memoryKey]*memoryEntry
	// head is the most recently used entry, tail the least.
	head, tail *memoryEntry
}

type memoryCounters struct {
	seed   maphash.Seed
	now    func() time.Time
	shards [memoryShards]memoryShard

	// maxPerShard bounds each shard; read on every charge, so atomic
	// rather than behind one lock that all shards would share.
	maxPerShard atomic.Int64

	// users are the configs using the counters, oldest first; the newest
	// sets the bound.
	usersMu sync.Mutex
	users   []*Memory

	stop chan struct{}
	done chan struct{}
}

func newMemoryCounters(maxKeys int, now func() time.Time) *memoryCounters {
	c := &memoryCounters{
		seed: maphash.MakeSeed(),
		now:  now,
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
	for i := range c.shards {
		c.shards[i].entries = make(map[memoryKey]*memoryEntry)
	}
	c.setMaxKeys(maxKeys)
	go c.sweepLoop()
	return c
}

// use makes m's max_keys the bound while m is the newest config using
// the counters.
func (c *memoryCounters) use(m *Memory) {
	c.usersMu.Lock()
	defer c.usersMu.Unlock()
	c.users = append(c.users, m)
	c.setMaxKeys(m.MaxKeys)
}

// release forgets m, and puts back the bound of the newest config still
// using the counters.
func (c *memoryCounters) release(m *Memory) {
	c.usersMu.Lock()
	defer c.usersMu.Unlock()
	c.users = slices.DeleteFunc(c.users, func(u *Memory) bool { return u == m })
	if len(c.users) > 0 {
		c.setMaxKeys(c.users[len(c.users)-1].MaxKeys)
	}
}

// setMaxKeys bounds each shard to its share of n keys, rounded up.
func (c *memoryCounters) setMaxKeys(n int) {
	c.maxPerShard.Store(int64(max(1, (n-1)/memoryShards+1)))
}

// Destruct stops the sweeper; the UsagePool calls it when the last config
// using the memory store is cleaned up.
func (c *memoryCounters) Destruct() error {
	close(c.stop)
	<-c.done
	return nil
}

func (c *memoryCounters) shardOf(id memoryKey) int {
	// The zone's hash is mixed in so one key in several zones spreads over
	// shards.
	h := maphash.String(c.seed, id.key) ^ maphash.String(c.seed, id.zone)*0x9e3779b97f4a7c15
	return int(h % memoryShards)
}

// take decides and, if all are allowed, charges reqs atomically: the shards
// of all keys are locked together, in index order so that concurrent takes
// cannot deadlock.
func (c *memoryCounters) take(reqs []Request, decisions []algorithms.Decision) {
	var buf [4]int
	shards := buf[:0]
	for _, r := range reqs {
		shards = append(shards, c.shardOf(memoryKey{r.Zone, r.Key}))
	}
	var lockBuf [4]int
	locks := append(lockBuf[:0], shards...)
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
	// time older than one that charged the same key before it.
	now := c.now()
	allowed := true
	var countsBuf [4]algorithms.Counts
	next := countsBuf[:0]
	for i, r := range reqs {
		var counts algorithms.Counts
		if e := c.shards[shards[i]].entries[memoryKey{r.Zone, r.Key}]; e != nil {
			counts = e.counts
		}
		d, n := algorithms.Decide(r.Algorithm, counts, now, r.Rate, r.Cost)
		decisions[i] = d
		next = append(next, n)
		allowed = allowed && d.Allowed
	}
	if !allowed {
		return
	}
	bound := int(c.maxPerShard.Load())
	for i, r := range reqs {
		c.shards[shards[i]].store(memoryKey{r.Zone, r.Key}, next[i], expiry(r, next[i]), bound)
	}
}

// expiry is when counts stop mattering: the end of the current window for a
// fixed window, of the next one for a sliding tail, which still weighs the
// current window as its previous one.
func expiry(r Request, c algorithms.Counts) int64 {
	w := r.Rate.Window.Milliseconds()
	end := (c.Window + 1) * w
	if r.Algorithm == algorithms.SlidingTail {
		end += w
	}
	return end
}

// store writes counts for id, making id the most recently used entry and
// evicting the least recently used ones beyond bound.
func (s *memoryShard) store(id memoryKey, counts algorithms.Counts, expires int64, bound int) {
	e := s.entries[id]
	if e == nil {
		e = &memoryEntry{id: id}
		s.entries[id] = e
	} else {
		s.unlink(e)
	}
	e.counts, e.expires = counts, expires
	s.pushFront(e)
	for len(s.entries) > bound {
		oldest := s.tail
		s.unlink(oldest)
		delete(s.entries, oldest.id)
	}
}

func (s *memoryShard) pushFront(e *memoryEntry) {
	e.prev, e.next = nil, s.head
	if s.head != nil {
		s.head.prev = e
	}
	s.head = e
	if s.tail == nil {
		s.tail = e
	}
}

func (s *memoryShard) unlink(e *memoryEntry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		s.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		s.tail = e.prev
	}
	e.prev, e.next = nil, nil
}

func (c *memoryCounters) sweepLoop() {
	defer close(c.done)
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
			c.sweep()
		}
	}
}

// sweep removes entries whose windows have passed, one shard at a time so
// that requests wait at most for one shard's sweep.
func (c *memoryCounters) sweep() {
	now := c.now().UnixMilli()
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		for id, e := range s.entries {
			if e.expires <= now {
				s.unlink(e)
				delete(s.entries, id)
			}
		}
		s.mu.Unlock()
	}
}

// Interface guards
var (
	_ Store                 = (*Memory)(nil)
	_ caddy.Provisioner     = (*Memory)(nil)
	_ caddy.Validator       = (*Memory)(nil)
	_ caddy.CleanerUpper    = (*Memory)(nil)
	_ caddyfile.Unmarshaler = (*Memory)(nil)
)
