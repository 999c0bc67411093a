package redis

import (
	"context"
	_ "embed"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/storage"
	"github.com/d61b427a/caddy-rate-limit/storage/memory"
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

func (r *Store) instancesKey() string { return r.KeyPrefix + "instances" }

// announce queues, in a refresh's pipeline, this instance's announcement
// and the count of live instances.
func announce(ctx context.Context, p goredis.Pipeliner, key string) *goredis.Cmd {
	return p.Eval(ctx, announceSource, []string{key}, processID, instanceTTL.Milliseconds())
}

// Instances returns N, the live instances sharing the store, as this
// instance last read it (at least 1).
func (r *Store) Instances() int {
	return int(r.client.fleet.instances())
}

// Local returns the store that decides in this instance's memory, with
// every limit divided among the instances last seen (max(1, limit/N)),
// for on_store_error local. Its counts are dropped when Redis answers
// again.
func (r *Store) Local() storage.Store {
	return localStore{r.client}
}

// localStore is the Redis store's local fallback.
type localStore struct{ c *client }

// Take implements storage.Store: it decides in this instance's memory,
// with every limit divided among the instances.
func (s localStore) Take(ctx context.Context, reqs []storage.Request, decisions []algorithms.Decision) error {
	n := s.c.fleet.instances()
	shares := make([]storage.Request, len(reqs))
	for i, q := range reqs {
		q.Rate.Units = max(1, q.Rate.Units/n)
		if q.Rate.Burst > 0 {
			q.Rate.Burst = max(1, q.Rate.Burst/n)
		}
		shares[i] = q
	}
	s.c.localUsed.Store(true)
	return s.c.localMemory().Take(ctx, shares, decisions)
}

// Release implements storage.Store.
func (s localStore) Release(ctx context.Context, reqs []storage.Request, decisions []algorithms.Decision) error {
	return s.c.localMemory().Release(ctx, reqs, decisions)
}

// Released implements storage.Store.
func (s localStore) Released() <-chan struct{} {
	return s.c.localMemory().Released()
}

// local holds the local fallback's memory store, made on first use.
type local struct {
	once  sync.Once
	store *memory.Store
}

// localMemory returns the local fallback's memory store: one of its own,
// apart from the one Caddy's configs share (whose counts are whole
// limits'), with the memory store's default bound.
func (c *client) localMemory() *memory.Store {
	c.local.once.Do(func() {
		c.local.store = memory.New(0, time.Now)
	})
	return c.local.store
}

// answered drops the local fallback's counts once Redis answers again:
// decisions are Redis's again at once.
func (c *client) answered() {
	if c.localUsed.Load() && c.localUsed.CompareAndSwap(true, false) {
		c.localMemory().Clear()
	}
}

var (
	//go:embed scripts/announce.lua
	announceSource string
)
