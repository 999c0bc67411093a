package storage

import (
	"context"
	_ "embed"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
)

// This file is what an instance knows of the fleet sharing its Redis: how
// many instances there are (N), which each announces once a second, and
// the local fallback that divides every limit among them while Redis
// cannot answer (on_store_error local).

// instanceTTL is how long an instance's announcement counts: it announces
// itself once a second, in the round trip that rereads the dials.
const instanceTTL = 5 * time.Second

// fleet is the number of live instances this instance last read.
type fleet struct {
	n atomic.Int64
}

// instances is N, at least 1: before the first reading, or with Redis
// out of reach since, this instance counts itself.
func (f *fleet) instances() int64 {
	return max(f.n.Load(), 1)
}

func (r *Redis) instancesKey() string { return r.KeyPrefix + "instances" }

// announce queues, in a refresh's pipeline, this instance's announcement
// and the count of live instances.
func announce(ctx context.Context, p redis.Pipeliner, key string) *redis.Cmd {
	return p.Eval(ctx, announceSource, []string{key}, processID, instanceTTL.Milliseconds())
}

// Instances returns N, the live instances sharing the store, as this
// instance last read it (at least 1).
func (r *Redis) Instances() int {
	return int(r.client.fleet.instances())
}

// Local returns the store that decides in this instance's memory, with
// every limit divided among the instances last seen (max(1, limit/N)),
// for on_store_error local. Its counts are dropped when Redis answers
// again.
func (r *Redis) Local() Store {
	return localStore{r.client}
}

// localStore is the Redis store's local fallback.
type localStore struct{ c *redisClient }

// Take implements Store.
func (s localStore) Take(_ context.Context, reqs []Request, decisions []algorithms.Decision) error {
	n := s.c.fleet.instances()
	shares := make([]Request, len(reqs))
	for i, q := range reqs {
		q.Rate.Units = max(1, q.Rate.Units/n)
		if q.Rate.Burst > 0 {
			q.Rate.Burst = max(1, q.Rate.Burst/n)
		}
		shares[i] = q
	}
	s.c.localUsed.Store(true)
	return takeMemory(s.c.localCounters(), shares, decisions)
}

// Release implements Store.
func (s localStore) Release(_ context.Context, reqs []Request, decisions []algorithms.Decision) error {
	s.c.localCounters().release(reqs, decisions)
	return nil
}

// Released implements Store.
func (s localStore) Released() <-chan struct{} {
	return s.c.localCounters().released.wait()
}

// local holds the counters of the local fallback, made on first use.
type local struct {
	once     sync.Once
	counters *memoryCounters
}

// localCounters returns the local fallback's counters.
func (c *redisClient) localCounters() *memoryCounters {
	c.local.once.Do(func() {
		c.local.counters = newMemoryCounters(DefaultMaxKeys, time.Now)
	})
	return c.local.counters
}

// answered drops the local fallback's counts once Redis answers again:
// decisions are Redis's again at once.
func (c *redisClient) answered() {
	if c.localUsed.Load() && c.localUsed.CompareAndSwap(true, false) {
		c.localCounters().clear()
	}
}

var (
	//go:embed scripts/announce.lua
	announceSource string
)
