package redis

import (
	"context"
	_ "embed"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"go.uber.org/zap"

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

// announceScript is sent by its SHA1 (EVALSHA): every instance announces
// itself once a second, and the script's text is ten times the size of
// the rest of the refresh.
var announceScript = goredis.NewScript(announceSource)

// announce queues, in a refresh's pipeline, this instance's announcement
// and the count of live instances, by the script's SHA1. A pipeline
// cannot fall back within itself: announceAgain sends the script in full
// to a server that answered NOSCRIPT.
func announce(ctx context.Context, p goredis.Pipeliner, key string) *goredis.Cmd {
	return p.EvalSha(ctx, announceScript.Hash(), []string{key}, processID, instanceTTL.Milliseconds())
}

// announceAgain sends the announcement of a refresh whose EVALSHA found
// the server without the script (it restarted, or its scripts were
// flushed) with the script in full (EVAL), which the server then keeps
// for the next refresh's EVALSHA. It returns the announcement's command
// and the pipeline's error without the NOSCRIPT: the first error of its
// other commands.
func announceAgain(ctx context.Context, rdb goredis.Cmdable, key string, cmds []goredis.Cmder) (*goredis.Cmd, error) {
	live := announceScript.Eval(ctx, rdb, []string{key}, processID, instanceTTL.Milliseconds())
	for _, c := range cmds {
		if err := c.Err(); err != nil && !goredis.HasErrorPrefix(err, "NOSCRIPT") {
			return live, err
		}
	}
	return live, nil
}

// Instances returns N, the live instances sharing the store, as this
// instance last read it (at least 1).
func (r *Store) Instances() int {
	return int(r.client.fleet.instances())
}

// Local returns the store that decides in this instance's memory, with
// every limit divided among the instances last seen (max(1, limit/N)),
// for on_store_error local. From then on, what Redis admits for this
// instance is counted there too (mirror), and what it admits alone is
// taken in Redis once Redis answers again (owed; the catch-up).
func (r *Store) Local() storage.Store {
	r.client.mirrors.Store(true)
	return localStore{c: r.client, names: r.watcher(), owner: r}
}

// localStore is the Redis store's local fallback; names names a key's
// counters in Redis, where what it admits is taken by the catch-up.
// owner is the store whose handler decides with it: a handler with
// disable_metrics leaves its decisions uncounted.
type localStore struct {
	c     *client
	names *dialWatcher
	owner *Store
}

// Take implements storage.Store: it decides in this instance's memory,
// with every limit divided among the instances, and keeps what it
// admitted for the catch-up to take in Redis later.
func (s localStore) Take(ctx context.Context, reqs []storage.Request, decisions []algorithms.Decision) error {
	n := s.c.fleet.instances()
	shares := make([]storage.Request, len(reqs))
	for i, q := range reqs {
		q.Rate = share(q.Rate, n)
		shares[i] = q
	}
	if err := s.c.localMemory().Take(ctx, shares, decisions); err != nil {
		return err
	}
	if !s.owner.metricsOff {
		metrics.fallback.Inc()
	}
	if allAllowed(decisions) {
		s.c.owed.add(s.names, reqs, decisions, s.c.now())
		// After the add, so that an answer draining the table
		// meanwhile leaves the flag for the next one.
		s.c.localUsed.Store(true)
	}
	return nil
}

// share is this instance's share of rate among n instances: every limit
// divided by n, and at least 1.
func share(rate algorithms.Rate, n int64) algorithms.Rate {
	rate.Units = max(1, rate.Units/n)
	if rate.Burst > 0 {
		rate.Burst = max(1, rate.Burst/n)
	}
	return rate
}

func allAllowed(decisions []algorithms.Decision) bool {
	for _, d := range decisions {
		if !d.Allowed {
			return false
		}
	}
	return true
}

// Finish implements storage.Store.
func (s localStore) Finish(ctx context.Context, reqs []storage.Request, decisions []algorithms.Decision) error {
	return s.c.localMemory().Finish(ctx, reqs, decisions)
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

// mirror counts in the local fallback's memory what Redis has just
// admitted (reqs, decided by decisions), each zone against this
// instance's share of its limit, when a handler has a local fallback.
// An outage then begins from the share this instance has already spent
// in the window, not from nothing, and a fleet whose instances share
// the load keeps the limit in the window the outage begins in. A share
// already spent counts nothing more. The costs are counted plainly (no
// ban, no release, no time in flight): a cost Redis later releases
// (count_status, a true-up) stays counted here, so the fallback errs
// toward refusing. A concurrency zone's units in flight are not
// mirrored: they are released where they were taken.
func (c *client) mirror(reqs []storage.Request, decisions []algorithms.Decision) {
	if !c.mirrors.Load() || !allAllowed(decisions) {
		return
	}
	n := c.fleet.instances()
	mem := c.localMemory()
	var one [1]storage.Request
	var d [1]algorithms.Decision
	for _, q := range reqs {
		if q.Algorithm == algorithms.Concurrency || q.Cost == 0 {
			continue
		}
		one[0] = storage.Request{Zone: q.Zone, Key: q.Key, Algorithm: q.Algorithm, Rate: share(q.Rate, n), Cost: q.Cost}
		_ = mem.Take(context.Background(), one[:], d[:]) // memory takes fail only for a bad rate, which Redis refused first
	}
}

// answered is called when Redis has answered, a take or the dial
// watcher's refresh: if the local fallback decided since Redis last
// answered, it returns what the fallback admitted, which Redis has not
// counted, for the catch-up to take (catchUp). The local counts stay: with the
// mirrored ones, they are what this instance admitted, for the next
// outage. A caller given a slice, even empty, must run catchUp with
// it, which lets the next catch-up begin.
func (c *client) answered() []owedKey {
	if !c.localUsed.Load() || !c.catchingUp.CompareAndSwap(false, true) {
		return nil // nothing admitted alone, or a catch-up under way
	}
	if !c.localUsed.CompareAndSwap(true, false) {
		c.catchingUp.Store(false)
		return nil
	}
	return c.owed.drain()
}

// catchUp takes in Redis, past the limit if need be, what the local
// fallback admitted (owed) and still counts at now: a debt, as a true-up
// takes one, so that the window an outage ends in does not count
// afresh. It runs in the background, in the server's clock, one at a
// time (answered), and for catchUpFor at most: what Redis has not taken
// by then, a part that keeps failing or one not tried yet, is kept for
// Redis's next answer. A call that failed after its script ran is
// taken twice, erring toward refusing.
func (c *client) catchUp(owed []owedKey) {
	defer c.catchingUp.Store(false)
	now := c.now()
	deadline := time.Now().Add(catchUpFor)
	var keys []string
	var debts []owedKey
	for _, o := range owed {
		if o.units = o.counting(now); o.units <= 0 {
			continue
		}
		names := o.names.names.Load()
		if names == nil {
			// The fleet's secret not read yet: the key has no name.
			c.owed.readd(o)
			c.localUsed.Store(true)
			continue
		}
		keys = append(keys, names.counter(o.q.Zone, o.q.Key))
		debts = append(debts, o)
	}
	// A call takes at most catchUpKeys keys, so that no one script
	// holds Redis for long.
	for len(keys) > 0 {
		n := min(len(keys), catchUpKeys)
		chunk := debts[:n]
		parts, groups := c.slotParts(keys[:n], func(dst []any, i int) []any {
			// No release, a debt against q's own limit, in no window of
			// a decision: only the debt's arguments are read.
			return appendFinishArgs(dst, chunk[i].q, algorithms.Decision{}, 0, chunk[i].units, 0, now)
		})
		for k, p := range parts {
			// A Redis just back may still hand out connections that
			// died with it, one failed call each: a failed part is
			// tried again until the deadline.
			err := errCatchUpLate
			for time.Now().Before(deadline) {
				if err = c.finish(p, catchUpTimeout); err == nil {
					break
				}
				time.Sleep(catchUpRetry)
			}
			if err != nil {
				for _, i := range groups[k] {
					c.owed.readd(chunk[i])
				}
				c.localUsed.Store(true)
				if n, ok := c.releaseLog.Allow(time.Now()); ok {
					c.logger.Warn("catching Redis up with what the local fallback admitted failed; kept for Redis's next answer",
						zap.Error(err), zap.Int64("failures_since_last_log", n))
				}
			}
		}
		keys, debts = keys[n:], debts[n:]
	}
}

// errCatchUpLate is a catch-up's part not tried before catchUp's
// deadline.
var errCatchUpLate = errors.New("not tried before the catch-up's deadline")

// catchUp takes at most catchUpKeys keys a call, each call bounded
// by catchUpTimeout (it is no request's), and gives up, until Redis's
// next answer, after catchUpFor, trying failed calls again catchUpRetry
// apart: longer than a pool of dead connections lasts (one failed call
// each, and go-redis keeps 10 a core).
const (
	catchUpKeys    = 256
	catchUpTimeout = time.Second
	catchUpFor     = 2 * time.Second
	catchUpRetry   = 50 * time.Millisecond
)

// maxOwed bounds the keys whose local admissions are kept for Redis: a
// flood of fresh keys during an outage cannot grow it. Past it, a new
// key's local admissions are not taken in Redis.
const maxOwed = 65_536

// owedTable is what the local fallback admitted since Redis last
// answered, per store's key names, zone and key.
type owedTable struct {
	mu sync.Mutex
	m  map[owedID]*owedKey
}

// owedID is a key of a zone, in the key names of a store (its prefix). The
// counters' name in Redis is found when they are caught up: the fleet's
// secret may not be known before.
type owedID struct {
	names     *dialWatcher
	zone, key string
}

// size returns the keys t holds.
func (t *owedTable) size() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

// owedKey is a key's units admitted by the local fallback: names names
// its counters in Redis; q is its last request, with the zone's whole
// limit; window the window (fixed, sliding_tail) they were admitted in;
// last the time of the latest.
type owedKey struct {
	names  *dialWatcher
	q      storage.Request
	units  int64
	window int64
	last   time.Time
}

// add keeps the costs of reqs, which the local fallback admitted at now
// (decisions), by their counters in Redis (as names names them), but a
// concurrency zone's: its units are released where they were taken.
func (t *owedTable) add(names *dialWatcher, reqs []storage.Request, decisions []algorithms.Decision, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, q := range reqs {
		if q.Algorithm != algorithms.Concurrency && q.Cost > 0 {
			t.keep(names, q, decisions[i].Window, q.Cost, now)
		}
	}
}

// readd keeps o again, for Redis's next answer.
func (t *owedTable) readd(o owedKey) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.keep(o.names, o.q, o.window, o.units, o.last)
}

// keep adds units of q, admitted at now in window, to what its counters
// owe, unless the table is full; a windowed key's units of an earlier
// window no longer count. t.mu is held.
func (t *owedTable) keep(names *dialWatcher, q storage.Request, window, units int64, now time.Time) {
	if t.m == nil {
		t.m = make(map[owedID]*owedKey)
	}
	id := owedID{names, q.Zone, q.Key}
	o, ok := t.m[id]
	switch {
	case !ok && len(t.m) >= maxOwed:
		return
	case !ok || o.window != window && q.Algorithm.Windowed():
		o = &owedKey{names: names, window: window}
		t.m[id] = o
	}
	o.q, o.last = q, now
	o.units += units
}

// drain returns what the table holds, and empties it.
func (t *owedTable) drain() []owedKey {
	t.mu.Lock()
	m := t.m
	t.m = nil
	t.mu.Unlock()
	owed := make([]owedKey, 0, len(m))
	for _, o := range m {
		owed = append(owed, *o)
	}
	return owed
}

// counting returns the units of o that still count against its key at
// now: in a fixed or sliding_tail window, all of them while it is the
// window they were admitted in, and none after (sliding_tail's weight
// of the window before is not taken); in a sliding window, all of
// them for a window after the latest; in gcra, what the bucket has not
// drained since the latest.
func (o owedKey) counting(now time.Time) int64 {
	w := o.q.Rate.Window.Milliseconds()
	switch {
	case o.q.Algorithm.Windowed():
		if o.q.Rate.WindowAt(now.UnixMilli()).Index != o.window {
			return 0
		}
		return o.units
	case o.q.Algorithm == algorithms.GCRA:
		drained := now.Sub(o.last).Milliseconds() * o.q.Rate.Units / max(w, 1)
		return max(o.units-drained, 0)
	default:
		if now.Sub(o.last) >= o.q.Rate.Window {
			return 0
		}
		return o.units
	}
}

var (
	//go:embed scripts/announce.lua
	announceSource string
)
