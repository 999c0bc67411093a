package redis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

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
	finishes []slotQueue[*finishPart]
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
	// that owed holds what it admitted, not yet taken in Redis (the
	// catch-up). mirrors tells that a
	// handler has the fallback, so that what Redis admits is counted in
	// it too; it stays on for the client's life, across reloads that
	// drop the fallback (a memory take a zone, until the client closes).
	local      local
	localUsed  atomic.Bool
	owed       owedTable
	catchingUp atomic.Bool // a catchUp runs
	mirrors    atomic.Bool

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
	c := &client{rdb: goredis.NewUniversalClient(&withCheck), batchers: make([]slotQueue[*callPart], 1), finishes: make([]slotQueue[*finishPart], 1),
		closed: make(chan struct{}), cluster: opts.IsClusterMode, logger: logger, now: time.Now}
	if opts.IsClusterMode {
		c.batchers = make([]slotQueue[*callPart], clusterSlots)
		c.finishes = make([]slotQueue[*finishPart], clusterSlots)
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
