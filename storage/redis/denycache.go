package redis

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// This file is the deny cache: rejections remembered until their retry
// instant, so that a key over its limit is answered without a round trip
// to Redis until time frees it.

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
