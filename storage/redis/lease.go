package redis

import (
	"hash/maphash"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// This file holds the Redis store's leases (`lease on`): units of a key's
// limit that one script call counts in Redis for this instance, which its
// later requests for the key then take without a call.
//
// The rules that keep a fleet on leases from admitting more than exact
// decisions would:
//   - Every unit is counted in Redis (take.lua) before any request takes
//     it, and a lease is never larger than floor(room / 2N) of what the key
//     has left, so the last units of a window are decided one at a time.
//   - A windowed lease is taken from only in the window it was counted in
//     (a sliding window's, in the sub-window). A gcra lease's next unit is
//     taken only while the key's bucket would not have refilled past it:
//     by the TAT that unit was counted at, so that taking it later counts
//     exactly as a take at that instant.
//   - Untaken units are released (finish.lua) when the lease has gone
//     unused for leaseIdle, when it can no longer be taken from (its
//     window ended, or its gcra deadline passed) and on shutdown;
//     releasing what was counted and never taken leaves Redis with the
//     exact counts.
//   - A reset, an override or a dial (the admin epoch moved) drops every
//     lease unreleased: their units stay counted, which is never more
//     permissive, and a reset key starts afresh without them.
//
// An instance that dies holding a lease takes its untaken units with it:
// they stay counted until its window ends (gcra: until the bucket refills
// past them), so the fleet admits at most that many fewer in that window.

// Lease sizes: a key's first request on an instance takes no lease (an
// exact decision), nor do its later ones until one comes soon after the
// one before (see seenFilter); that one wants one unit more than its
// cost, and each lease that is all taken before it is released doubles
// the next, up to maxLease; one released untaken halves it.
const (
	maxLease = 4096
	// leaseIdle is how long a lease may go unused before its units are
	// released.
	leaseIdle = 100 * time.Millisecond
	// leaseSweep is how often the units to release are looked for.
	leaseSweep = 25 * time.Millisecond
	// leaseForget is how long a key's record of demand outlives its last
	// lease.
	leaseForget = 10 * time.Second
)

// The table's bounds. A lease is worth something only to a key requested
// more often than every leaseIdle, and maxLeaseRecords such keys make
// over 160,000 requests a second on one instance; a key without a record
// is decided by Redis, as without leases. A shard holds
// leaseShardRecords, which the sweep looks at under its lock in
// microseconds.
const (
	leaseShardBits    = 6
	leaseShards       = 1 << leaseShardBits
	maxLeaseRecords   = 1 << 14
	leaseShardRecords = maxLeaseRecords / leaseShards
	// leaseEvictProbe is how many of a full shard's least recently used
	// records a new one looks at for one to forget.
	leaseEvictProbe = 8
)

// A lease is what this instance holds of one zone and key: its record in
// the table.
type lease struct {
	key  string // the counter key
	zone string
	// rate and alg are what the requests that may take from it take
	// with: a request with another rate (a limit template that resolved
	// otherwise, a dial) goes to Redis.
	rate algorithms.Rate
	alg  algorithms.Algorithm
	// units are the untaken units; window is the window they were counted
	// in (windowed algorithms) and expires when it ends, in the local
	// clock.
	units   int64
	window  int64
	expires time.Time
	// gcra: the TAT at which the first leased unit was counted, in ms of
	// the local clock, and the limit it was counted for; unit k (from 0)
	// may be taken until tat + k·T.
	tat   int64
	limit int64
	// capacity is the zone's limit (gcra: its burst) as Redis decided it;
	// remaining what Redis reported left at the lease, counting the
	// leased units as left, and taken the units taken since; reset is the
	// window's end (gcra: when the bucket is full again).
	capacity  int64
	remaining int64
	taken     int64
	reset     time.Time
	lastUsed  time.Time
	// want is the lease the key's next call wants; leasing tells that a
	// call is leasing units for it.
	want    int64
	leasing bool
	series  *leaseSeries
	// prev and next link the record into its shard's lru; heldAt is its
	// place in the shard's held, plus one (0: not there).
	prev, next *lease
	heldAt     int
}

// takable reports whether q may take its cost from the lease at now. A
// cost kept in flight (storage.Request.KeepsInFlight) never is: Redis
// keeps it, in flight for every instance to see, until its release, so
// it is taken in Redis; a lease leased before its zone kept costs in
// flight (a reload) is not taken from, nor is a wide zone's cost (see
// wants).
func (l *lease) takable(q storage.Request, now time.Time) bool {
	if l.units < q.Cost || l.rate != q.Rate || l.alg != q.Algorithm || q.KeepsInFlight() || q.Wide {
		return false
	}
	if l.alg == algorithms.GCRA {
		return now.UnixMilli() <= l.deadline(l.taken)
	}
	return now.Before(l.expires)
}

// deadline is the last instant (ms, local clock) at which a gcra lease's
// unit k may be taken: the TAT it was counted at, rounded down.
func (l *lease) deadline(k int64) int64 {
	ms, _ := algorithms.Interval(k, l.rate.Window, l.limit)
	return l.tat + ms
}

// usable reports whether any of the lease's units may still be taken at
// now, for any request.
func (l *lease) usable(now time.Time) bool {
	if l.units == 0 {
		return false
	}
	if l.alg == algorithms.GCRA {
		return now.UnixMilli() <= l.deadline(l.taken)
	}
	return now.Before(l.expires)
}

// The table's bookkeeping is bounded whatever the number of distinct keys
// a flood brings, in memory and in the work of one request or one sweep:
//   - A key gets a record only when it is requested again within one or
//     two periods of leaseIdle (seenFilter): a key requested once costs a
//     slot of a fixed array, no record.
//   - The table keeps at most maxLeaseRecords records, in leaseShards
//     shards with a lock each. A full shard forgets its least recently
//     used record without units to make room, else the least recently
//     used not being leased, whose units are released with the next sweep.
//   - The sweep takes one shard's lock at a time, and looks only at the
//     shard's records holding units and at those long unused.

// leaseTable holds this instance's leases, by counter key, for every
// config sharing a Redis client. init readies it.
type leaseTable struct {
	seed   maphash.Seed
	seen   seenFilter
	shards [leaseShards]leaseShard
}

// leaseShard is one lock's share of the table.
type leaseShard struct {
	mu sync.Mutex
	m  map[string]*lease
	// lru links the records from the least recently used (lru.next) to
	// the most (lru.prev).
	lru lease
	// held are the records holding units, the only ones with units to
	// release.
	held []*lease
	// back are units to release that a new lease of their key, or a
	// record forgotten to make room, left behind.
	back []heldUnits
}

// heldUnits are a lease's units to release, with what releasing them
// needs: the counter key, and what they were counted as.
type heldUnits struct {
	key    string
	alg    algorithms.Algorithm
	rate   algorithms.Rate
	units  int64
	limit  int64
	window int64
	series *leaseSeries
}

// untaken is what l holds, to release.
func (l *lease) untaken() heldUnits {
	return heldUnits{key: l.key, alg: l.alg, rate: l.rate, units: l.units, limit: l.limit, window: l.window, series: l.series}
}

// seenSlots is the size of the first-seen filter: at 10 M distinct keys a
// minute, a key keeps its slot for about 0.4 s, more than the period in
// which its second request earns it a record.
const seenSlots = 1 << 16

// seenFilter tells, without a lock and in fixed memory, whether a key was
// requested in the current period of leaseIdle or the one before: a slot
// per key, picked by its hash's low bits, holds its hash's high bits and
// the period. A key whose slot another key took meanwhile is taken for
// unseen, and earns its record at a later request.
type seenFilter []atomic.Uint64

// saw marks the key of hash h as requested at now, and reports whether it
// had been lately.
func (f seenFilter) saw(h uint64, now time.Time) bool {
	const periodMask = 1<<16 - 1
	period := uint64(now.UnixMilli()/leaseIdle.Milliseconds()) & periodMask
	// The hash's high bits, never all zero as in an empty slot, and the
	// period.
	mark := h&^periodMask | 1<<16 | period
	old := f[h&(seenSlots-1)].Swap(mark)
	return old&^periodMask == mark&^periodMask && (period-old)&periodMask <= 1
}

func (t *leaseTable) init() {
	t.seed = maphash.MakeSeed()
	t.seen = make(seenFilter, seenSlots)
}

// hash is the key's hash: its top bits pick the key's shard, its low bits
// its slot in the seen filter.
func (t *leaseTable) hash(key string) uint64 {
	return maphash.String(t.seed, key)
}

func leaseShardOf(h uint64) int {
	return int(h >> (64 - leaseShardBits))
}

// shard is the key's shard.
func (t *leaseTable) shard(key string) *leaseShard {
	return &t.shards[leaseShardOf(t.hash(key))]
}

// touch makes l the shard's most recently used record.
func (s *leaseShard) touch(l *lease, now time.Time) {
	l.lastUsed = now
	if s.lru.prev == l {
		return // already (a hot key's record, taken from again and again)
	}
	if l.next != nil {
		l.prev.next, l.next.prev = l.next, l.prev
	}
	if s.lru.next == nil {
		s.lru.next, s.lru.prev = &s.lru, &s.lru
	}
	l.prev, l.next = s.lru.prev, &s.lru
	l.prev.next, s.lru.prev = l, l
}

// hold lists l among the records holding units, if it is not yet.
func (s *leaseShard) hold(l *lease) {
	if l.heldAt == 0 {
		s.held = append(s.held, l)
		l.heldAt = len(s.held)
	}
}

// unhold takes l off the records holding units.
func (s *leaseShard) unhold(l *lease) {
	if l.heldAt == 0 {
		return
	}
	last := s.held[len(s.held)-1]
	s.held[l.heldAt-1], last.heldAt = last, l.heldAt
	s.held[len(s.held)-1] = nil
	s.held = s.held[:len(s.held)-1]
	l.heldAt = 0
}

// forget removes l from the shard.
func (s *leaseShard) forget(l *lease) {
	s.unhold(l)
	l.prev.next, l.next.prev = l.next, l.prev
	l.prev, l.next = nil, nil
	delete(s.m, l.key)
}

// add makes a record for key and returns it, making room in a full shard,
// or returns nil if the records it looked at are all being leased.
func (s *leaseShard) add(key string, q storage.Request, now time.Time) *lease {
	if len(s.m) >= leaseShardRecords && !s.makeRoom() {
		return nil
	}
	if s.m == nil {
		s.m = make(map[string]*lease)
	}
	l := &lease{key: key, zone: q.Zone, rate: q.Rate, alg: q.Algorithm, want: 1}
	s.m[key] = l
	s.touch(l, now)
	return l
}

// makeRoom forgets one of the leaseEvictProbe least recently used
// records: the first without units, else the first not being leased,
// whose units are released with the next sweep. It reports whether it did.
func (s *leaseShard) makeRoom() bool {
	var victim *lease
	n := 0
	for l := s.lru.next; l != &s.lru && n < leaseEvictProbe; l, n = l.next, n+1 {
		if l.leasing {
			continue
		}
		if l.units == 0 {
			victim = l
			break
		}
		if victim == nil {
			victim = l
		}
	}
	if victim == nil {
		return false
	}
	if victim.units > 0 {
		s.back = append(s.back, victim.untaken())
	}
	s.forget(victim)
	return true
}

// lockAll locks a set of shards (bit i for shard i) in their order, so
// that requests locking several at once cannot deadlock.
func (t *leaseTable) lockAll(set uint64) {
	for rest := set; rest != 0; rest &= rest - 1 {
		t.shards[bits.TrailingZeros64(rest)].mu.Lock()
	}
}

func (t *leaseTable) unlockAll(set uint64) {
	for rest := set; rest != 0; rest &= rest - 1 {
		t.shards[bits.TrailingZeros64(rest)].mu.Unlock()
	}
}

// take takes every request of reqs from its lease, all or none, and
// reports whether it did. decisions get what the requests would have been
// told by Redis: allowed, with the remaining that Redis reported at the
// lease less what this instance took since.
func (t *leaseTable) take(keys []string, reqs []storage.Request, decisions []algorithms.Decision, now time.Time) bool {
	var buf [4]*leaseShard
	shards := buf[:0]
	var set uint64
	for _, k := range keys {
		i := leaseShardOf(t.hash(k))
		shards = append(shards, &t.shards[i])
		set |= 1 << i
	}
	t.lockAll(set)
	defer t.unlockAll(set)
	for i, q := range reqs {
		l := shards[i].m[keys[i]]
		if l == nil || !l.takable(q, now) {
			return false
		}
	}
	for i, q := range reqs {
		s := shards[i]
		s.takeFrom(s.m[keys[i]], q, &decisions[i], now)
	}
	return true
}

// takeFrom takes q's cost from l, which has room for it, and writes its
// decision into d.
func (s *leaseShard) takeFrom(l *lease, q storage.Request, d *algorithms.Decision, now time.Time) {
	l.units -= q.Cost
	l.taken += q.Cost
	s.touch(l, now)
	remaining := max(l.remaining-l.taken, 0)
	*d = algorithms.Decision{Allowed: true, Limit: l.limit, Remaining: remaining, Used: l.capacity - remaining, Reset: l.reset, Window: l.window}
	l.series.add(leaseTaken, q.Cost)
}

// wants returns, for a call that reqs make to Redis, the lease each zone
// wants (nil for none): what its key's demand on this instance wants, for
// a key with a record and not being leased already. A key gets a record
// when requested again soon after (seenFilter); until then it wants none.
// A request with a concurrency zone, which always takes in Redis, wants
// no lease: it could never take from one. Nor does one with a zone that
// bans: a ban must hold on every instance at once, so each of its
// requests takes in Redis. Nor one with a zone that keeps its cost in
// flight (a reservation, cost_from), which Redis keeps (see takable), nor
// one with a wide zone (priced in money), whose counts Redis keeps
// exactly past 2^53 and a lease does not.
func (t *leaseTable) wants(keys []string, reqs []storage.Request, now time.Time) []int64 {
	for _, q := range reqs {
		if q.Algorithm == algorithms.Concurrency || q.Ban > 0 || q.KeepsInFlight() || q.Wide {
			return nil
		}
	}
	var wants []int64
	for i, q := range reqs {
		h := t.hash(keys[i])
		s := &t.shards[leaseShardOf(h)]
		s.mu.Lock()
		l := s.m[keys[i]]
		if l == nil && t.seen.saw(h, now) {
			l = s.add(keys[i], q, now)
		}
		if l != nil && !l.leasing {
			if wants == nil {
				wants = make([]int64, len(reqs))
			}
			wants[i] = l.want
			l.leasing = true
		}
		s.mu.Unlock()
	}
	return wants
}

// leaseFailed marks the keys of a call that wanted leases (wants, from
// wants) and failed as no longer being leased.
func (t *leaseTable) leaseFailed(keys []string, wants []int64) {
	for i, k := range keys {
		if wants[i] == 0 {
			continue
		}
		s := t.shard(k)
		s.mu.Lock()
		if l := s.m[k]; l != nil {
			l.leasing = false
		}
		s.mu.Unlock()
	}
}

// leased records what a call that wanted leases brought (a): for each
// zone, with the decision of its request, the units leased and what the
// request left in Redis, and the series that counts units. Units still
// held of an earlier lease in the same window are kept.
func (t *leaseTable) leased(keys []string, reqs []storage.Request, a *leaseAnswer, decisions []algorithms.Decision, now time.Time, series func(zone string) *leaseSeries) {
	for i, q := range reqs {
		if a.wants[i] == 0 {
			continue
		}
		s := t.shard(keys[i])
		s.mu.Lock()
		if l := s.m[keys[i]]; l != nil { // else dropped meanwhile (an admin change)
			s.addLease(l, q, a, i, decisions[i], now, series)
		}
		s.mu.Unlock()
	}
}

// addLease records in l, the record of zone i of a call that wanted
// leases (a), the units the call leased for it.
func (s *leaseShard) addLease(l *lease, q storage.Request, a *leaseAnswer, i int, d algorithms.Decision, now time.Time, series func(zone string) *leaseSeries) {
	l.leasing = false
	units := a.leased[i]
	if !d.Allowed || units == 0 {
		return
	}
	// Units still held are kept if they may be taken as part of the new
	// lease: a windowed lease's, in the same window. Others are released:
	// a gcra unit counted before this request must not be taken as late
	// as the new lease's.
	held := l.units
	if held > 0 && (!l.usable(now) || l.rate != q.Rate || l.alg != q.Algorithm ||
		q.Algorithm == algorithms.GCRA || l.window != d.Window) {
		s.back = append(s.back, l.untaken())
		held = 0
	}
	l.rate, l.alg, l.limit = q.Rate, q.Algorithm, d.Limit
	s.touch(l, now)
	l.units, l.taken = held+units, 0
	s.hold(l)
	l.remaining = d.Remaining + held
	l.capacity = d.Limit
	l.series = series(q.Zone)
	if q.Algorithm == algorithms.GCRA {
		l.capacity = q.Rate.BurstFor(d.Limit)
		// The first leased unit was counted at the TAT the request
		// left (its whole ms, rounded down: taking it by then is never
		// late); the bucket is full again once the lease's TAT has
		// passed.
		ms, _ := algorithms.Interval(units, q.Rate.Window, d.Limit)
		l.tat = time.UnixMilli(a.tats[i]).Add(a.shift).UnixMilli()
		l.reset = time.UnixMilli(a.tats[i] + ms + 1).Add(a.shift)
	} else if q.Algorithm == algorithms.SlidingWindow {
		// Taken only in the sub-window it was counted in: a unit
		// counted earlier than it is taken would leave the window
		// early.
		n, w := q.Rate.BucketsOr(), q.Rate.Window.Milliseconds()
		l.window = d.Window
		l.expires = time.UnixMilli(algorithms.SubWindowStart(l.window+1, w, n)).Add(a.shift)
		l.reset = d.Reset
	} else {
		l.window = d.Window
		l.expires, l.reset = d.Reset, d.Reset
	}
	if units >= a.wants[i] {
		l.want = min(2*l.want, maxLease)
	}
	l.series.add(leaseLeased, units)
}

// release puts cost of q, allowed with d, back into this instance's
// lease of its key, and reports whether it did. It does if the lease may
// still be taken from, by the same requests, in the window (a sliding
// window: the sub-window) q was taken in: a unit counted in Redis for
// that window is as good as a leased one, so the lease has it taken again
// or releases it with the rest. A gcra cost is never put back: each
// leased unit stands for an instant of the bucket, and one taken at
// another instant is not interchangeable with them.
func (t *leaseTable) release(key string, q storage.Request, d algorithms.Decision, cost int64, now time.Time) bool {
	if !q.Algorithm.Windowed() && q.Algorithm != algorithms.SlidingWindow {
		return false
	}
	s := t.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.m[key]
	if l == nil || l.units+l.taken == 0 || l.window != d.Window || l.rate != q.Rate || l.alg != q.Algorithm || !now.Before(l.expires) {
		return false
	}
	l.units += cost
	l.taken = max(l.taken-cost, 0)
	s.hold(l)
	l.series.add(leaseReleasedToLease, cost)
	return true
}

// due takes out of the table the units to release at now: those of
// leases unused for leaseIdle, or that can no longer be taken from, and those
// left behind. It forgets the demand of keys long unused. It holds one
// shard's lock at a time.
func (t *leaseTable) due(now time.Time) []heldUnits {
	var out []heldUnits
	for i := range t.shards {
		out = t.shards[i].due(now, out)
	}
	return out
}

// due appends to out the shard's units to release at now. What it
// finds under the lock it gathers in the shard's own list, so the lock is
// held for the shard's work alone, not for copying out.
func (s *leaseShard) due(now time.Time, out []heldUnits) []heldUnits {
	s.mu.Lock()
	back := s.back
	s.back = nil
	// Backwards: unhold moves the last record into the place it empties.
	for i := len(s.held) - 1; i >= 0; i-- {
		l := s.held[i]
		idle := now.Sub(l.lastUsed) >= leaseIdle
		if l.units > 0 && (idle || !l.usable(now)) {
			back = append(back, l.untaken())
			if idle {
				l.want = max(1, l.want/2)
			}
			l.units = 0
		}
		if l.units == 0 {
			s.unhold(l)
		}
	}
	for l := s.lru.next; l != nil && l != &s.lru; {
		if l.units > 0 || l.leasing || now.Sub(l.lastUsed) < leaseForget {
			break
		}
		next := l.next
		s.forget(l)
		l = next
	}
	s.mu.Unlock()
	return append(out, back...)
}

// records counts the table's records, one shard lock at a time.
func (t *leaseTable) records() int {
	n := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}

// drop forgets every lease without releasing its units, and which keys
// were seen, so that each starts afresh: the admin API changed a key, a
// limit or a dial.
func (t *leaseTable) drop() {
	for i := range t.seen {
		t.seen[i].Store(0)
	}
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		clear(s.m)
		s.lru.prev, s.lru.next = nil, nil
		clear(s.held)
		s.held = s.held[:0]
		s.mu.Unlock()
	}
}

// all takes out every unit held, for releasing them on shutdown.
func (t *leaseTable) all() []heldUnits {
	var out []heldUnits
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		out = append(out, s.back...)
		s.back = nil
		for _, l := range s.held {
			if l.units > 0 {
				out = append(out, l.untaken())
				l.units = 0
			}
			l.heldAt = 0
		}
		clear(s.held)
		s.held = s.held[:0]
		s.mu.Unlock()
	}
	return out
}

// releaseLeases releases the untaken units of leases, in release calls
// shared with concurrent releases (see release), one per cluster slot
// (one in all on a single server), each bounded by timeout. A lease's
// units are released as a take of them in its window would be (for
// gcra: at the limit it was counted against).
func (c *client) releaseLeases(held []heldUnits, timeout time.Duration) {
	if len(held) == 0 {
		return
	}
	keys := make([]string, len(held))
	for i, h := range held {
		keys[i] = h.key
	}
	parts, groups := c.slotParts(keys, func(dst []any, i int) []any {
		h := held[i]
		return appendFinishArgs(dst, storage.Request{Algorithm: h.alg, Rate: h.rate, Cost: h.units}, algorithms.Decision{Limit: h.limit, Window: h.window}, h.units, 0, 0, time.Time{})
	})
	for k, p := range parts {
		if err := c.finish(p, timeout); err != nil {
			// The units stay counted until their window ends: never
			// more permissive.
			if n, ok := c.releaseLog.Allow(time.Now()); ok {
				c.logger.Warn("releasing leased rate limit units", zap.Int("keys", len(p.keys)), zap.Error(err),
					zap.Int64("failures_since_last_log", n))
			}
			continue
		}
		for _, i := range groups[k] {
			held[i].series.add(leaseReleased, held[i].units)
		}
	}
}

// startLeases readies the lease table and starts, once, the goroutine
// that releases the units that are due; it releases all of them when the
// client is closed.
func (c *client) startLeases() {
	c.leasing.Do(func() {
		c.leases.init()
		c.watching.Add(1)
		go func() {
			defer c.watching.Done()
			c.sweepLeases()
		}()
	})
}

func (c *client) sweepLeases() {
	ticker := time.NewTicker(leaseSweep)
	defer ticker.Stop()
	for {
		select {
		case <-c.closed:
			c.releaseLeases(c.leases.all(), time.Second)
			return
		case <-ticker.C:
			if due := c.leases.due(c.now()); len(due) > 0 {
				c.releaseLeases(due, time.Second)
			}
		}
	}
}
