package redis

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/internal/logevery"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// client is what configs using the same Redis share, and what outlives
// a config reload: the connections, the circuit breaker and the deny cache.
type client struct {
	rdb     goredis.UniversalClient
	breaker breaker
	// releaseLog bounds the lines of releases that failed (leased units
	// given back, a rejected cluster take undone) to one a second: in an
	// outage every key would write one.
	releaseLog logevery.Limiter
	denies     denyCache
	// batchers coalesce concurrent takes, and releases concurrent
	// releases: one per cluster slot, or one for a single server.
	batchers []slotQueue[*callPart]
	releases []slotQueue[*releasePart]
	// released wakes the requests waiting for concurrency units that a
	// config on this client released: every handler and config sharing
	// the connections, across reloads, as the memory store's does.
	released storage.ReleaseSignal

	// watchers reread the admin API's dials, one per key prefix, and
	// announce this instance; they, and the goroutine that releases
	// leases, stop when closed is closed.
	watchersMu sync.Mutex
	watchers   map[string]*dialWatcher
	watching   sync.WaitGroup
	closed     chan struct{}

	// fleet is N, the live instances sharing this Redis.
	fleet fleet
	// leases are this instance's leases (lease on), released by the
	// goroutine leasing starts.
	leases  leaseTable
	leasing sync.Once
	// local is the fallback of on_store_error local; localUsed tells
	// that owed holds what it admitted, not yet charged to Redis. mirrors tells that a
	// handler has the fallback, so that what Redis admits is counted in
	// it too; it stays on for the client's life, across reloads that
	// drop the fallback (a memory take a zone, until the client closes).
	local     local
	localUsed atomic.Bool
	owed      owedTable
	charging  atomic.Bool // a chargeOwed runs
	mirrors   atomic.Bool

	cluster bool
	// timeout is the store's timeout, which the connection was made
	// for; the metrics report it.
	timeout time.Duration
	logger  *zap.Logger
	// now is the local clock of the leases' sweeps.
	now func() time.Time
}

func newClient(opts *goredis.UniversalOptions, logger *zap.Logger) *client {
	if logger == nil {
		logger = zap.NewNop()
	}
	// Every connection checks its server's version first.
	withCheck := *opts
	withCheck.OnConnect = (&versionCheck{logger: logger}).onConnect
	c := &client{rdb: goredis.NewUniversalClient(&withCheck), batchers: make([]slotQueue[*callPart], 1), releases: make([]slotQueue[*releasePart], 1),
		closed: make(chan struct{}), cluster: opts.IsClusterMode, logger: logger, now: time.Now}
	if opts.IsClusterMode {
		c.batchers = make([]slotQueue[*callPart], clusterSlots)
		c.releases = make([]slotQueue[*releasePart], clusterSlots)
	}
	c.denies.init()
	return c
}

// Destruct releases the leases this instance holds and closes the
// connections; the UsagePool calls it when the last config using this
// Redis is cleaned up.
func (c *client) Destruct() error {
	close(c.closed)
	c.watching.Wait()
	if c.local.store != nil {
		c.local.store.Cleanup()
	}
	return c.rdb.Close()
}

// Circuit breaker settings: after breakerThreshold consecutive failures,
// Redis is not called for breakerCooldown; then one request probes it while
// the others keep failing fast, until the probe succeeds.
const (
	breakerThreshold = 3
	breakerCooldown  = time.Second
)

// rereadSlots has a cluster's client read its map of slots to nodes
// again, in the background (go-redis reads it once at a time). The
// client keeps its map until a node answers MOVED, or for seconds: after
// a failover the promoted replica is never asked, since the dead
// master's slots are still sent to the dead master, and every call for
// them fails until the map is read again. So a failed call rereads it,
// and so does the first call that succeeds after failures, since the
// reads during an outage see the cluster before its failover.
func (c *client) rereadSlots() {
	if cc, ok := c.rdb.(*goredis.ClusterClient); ok {
		cc.ReloadState(context.Background())
	}
}

// errBreakerOpen is returned while the breaker skips Redis.
var errBreakerOpen = errors.New("circuit breaker open")

type breaker struct {
	// failures counts consecutive failures; zero is the fast path.
	failures atomic.Int64

	mu        sync.Mutex
	openUntil time.Time
	probing   bool
	lastErr   error
}

// allow returns nil if Redis may be called now.
func (b *breaker) allow(now time.Time) error {
	if b.failures.Load() < breakerThreshold {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.failures.Load() < breakerThreshold {
		return nil
	}
	if now.Before(b.openUntil) || b.probing {
		return fmt.Errorf("%w after %d consecutive failures (last: %v)", errBreakerOpen, b.failures.Load(), b.lastErr)
	}
	b.probing = true
	return nil
}

// done records the outcome of a call that allow let through. A failure
// that says nothing about Redis (the client went away) is not counted.
func (b *breaker) done(err error, counts bool, now time.Time) {
	if err == nil {
		if b.failures.Load() != 0 {
			b.mu.Lock()
			b.failures.Store(0)
			b.probing = false
			b.mu.Unlock()
		}
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.probing = false
	if !counts {
		return
	}
	b.lastErr = err
	if b.failures.Add(1) >= breakerThreshold {
		b.openUntil = now.Add(breakerCooldown)
	}
}

// The deny cache holds at most denyCacheShards*denyShardSize keys.
const (
	denyCacheShards = 16
	denyShardSize   = 4096
)

// denyCache remembers rejections until their retry instant: until then a
// request of the same or a higher cost for the same key and limit would be
// rejected too, since counts only grow until time frees them. That does
// not hold for a zone whose costs may be released (count_status), whose
// rejections are remembered only when they ban the key; a banned key's
// requests are rejected whatever their cost.
type denyCache struct {
	seed   maphash.Seed
	size   atomic.Int64
	shards [denyCacheShards]denyShard
}

type denyShard struct {
	mu      sync.Mutex
	entries map[string]denyEntry
}

type denyEntry struct {
	algorithm algorithms.Algorithm
	limit     algorithms.Rate
	cost      int64
	decision  algorithms.Decision // times in the local clock
}

// holds reports whether the remembered rejection e stands for q.
func (e denyEntry) holds(q storage.Request) bool {
	if e.algorithm != q.Algorithm || e.limit != q.Rate {
		return false
	}
	if !e.decision.BanEnds.IsZero() {
		return q.Ban > 0
	}
	return q.Cost >= e.cost
}

func (c *denyCache) init() {
	c.seed = maphash.MakeSeed()
	for i := range c.shards {
		c.shards[i].entries = make(map[string]denyEntry)
	}
}

// clear forgets every cached rejection: the admin API reset a key or
// changed a limit, so they may no longer hold.
func (c *denyCache) clear() {
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		c.size.Add(-int64(len(s.entries)))
		clear(s.entries)
		s.mu.Unlock()
	}
}

func (c *denyCache) shard(key string) *denyShard {
	return &c.shards[maphash.String(c.seed, key)%denyCacheShards]
}

// lookup answers reqs from the cache if any of them is a known rejection,
// and reports whether it did. The zones it does not know about are
// reported as allowed with their full limit: the request is rejected
// anyway, and nothing is taken, as after any rejection.
func (c *denyCache) lookup(keys []string, reqs []storage.Request, decisions []algorithms.Decision, now time.Time) bool {
	if c.size.Load() == 0 {
		return false
	}
	hit := false
	for i, k := range keys {
		q := reqs[i]
		if d, ok := c.find(k, q, now); ok {
			decisions[i] = d
			hit = true
			continue
		}
		reset := now.Add(q.Rate.Window)
		if q.Rate.Calendar != nil {
			reset = time.UnixMilli(q.Rate.WindowAt(now.UnixMilli()).End)
		}
		decisions[i] = algorithms.Decision{
			Allowed:   true,
			Limit:     q.Rate.Units,
			Remaining: q.Rate.Units,
			Reset:     reset,
		}
	}
	return hit
}

// find returns the rejection the cache remembers for q, whose counter is
// key, if it stands for q at now.
func (c *denyCache) find(key string, q storage.Request, now time.Time) (algorithms.Decision, bool) {
	if c.size.Load() == 0 {
		return algorithms.Decision{}, false
	}
	s := c.shard(key)
	s.mu.Lock()
	e, ok := s.entries[key]
	if ok && !now.Before(e.decision.RetryAt) {
		delete(s.entries, key)
		c.size.Add(-1)
		ok = false
	}
	s.mu.Unlock()
	if !ok || !e.holds(q) {
		return algorithms.Decision{}, false
	}
	d := e.decision
	// The window may have ended since: report the current one's end.
	if !now.Before(d.Reset) {
		d.Reset = currentReset(q.Rate, d, now)
	}
	return d, true
}

// currentReset returns the end of the window of rate that holds now, for
// a rejection d whose window, d.Reset, has ended: d's windows moved on,
// in the local clock d is in. A calendar period's end is that of the
// period after d's that holds now, kept as far from Redis's clock as
// d.Reset was.
func currentReset(rate algorithms.Rate, d algorithms.Decision, now time.Time) time.Time {
	if rate.Calendar == nil {
		w := rate.Window
		return d.Reset.Add(w * (now.Sub(d.Reset)/w + 1))
	}
	shift := d.Reset.Sub(time.UnixMilli(rate.WindowOf(d.Window).End))
	return time.UnixMilli(rate.WindowAt(now.Add(-shift).UnixMilli()).End).Add(shift)
}

// store remembers the rejections among decisions.
func (c *denyCache) store(keys []string, reqs []storage.Request, decisions []algorithms.Decision, now time.Time) {
	for i, d := range decisions {
		if d.Allowed || !d.RetryAt.After(now) || reqs[i].Releasable && d.BanEnds.IsZero() {
			continue
		}
		s := c.shard(keys[i])
		s.mu.Lock()
		if _, ok := s.entries[keys[i]]; !ok {
			if len(s.entries) >= denyShardSize {
				// Full: forget an arbitrary entry (map order is random).
				for k := range s.entries {
					delete(s.entries, k)
					c.size.Add(-1)
					break
				}
			}
			c.size.Add(1)
		}
		d.BanStarted = false // begun once, by the request that Redis rejected
		s.entries[keys[i]] = denyEntry{algorithm: reqs[i].Algorithm, limit: reqs[i].Rate, cost: reqs[i].Cost, decision: d}
		s.mu.Unlock()
	}
}
