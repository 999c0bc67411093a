package storage

import (
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
)

// This file holds the Redis store's leases (`lease on`): units of a key's
// limit that one script call counts in Redis for this instance, which its
// later requests for the key then spend without a call.
//
// The rules that keep a fleet on leases from admitting more than exact
// decisions would:
//   - Every unit is counted in Redis (take.lua) before any request spends
//     it, and a lease is never larger than floor(room / 2N) of what the key
//     has left, so the last units of a window are decided one at a time.
//   - A windowed lease is spent only in the window it was counted in (a
//     sliding window's, in the sub-window). A
//     gcra lease's next unit is spent only while the key's bucket would
//     not have refilled past it: by the TAT that unit was counted at, so
//     that spending it later counts exactly as a charge at that instant.
//   - Unspent units go back (refund.lua) when the lease has gone unused
//     for leaseIdle, when it can no longer be spent (its window ended, or
//     its gcra deadline passed) and on shutdown; taking back what was
//     counted and never spent leaves Redis with the exact counts.
//   - A reset, an override or a dial (the admin epoch moved) drops every
//     lease unreturned: their units stay counted, which is never more
//     permissive, and a reset key starts afresh without them.
//
// An instance that dies holding a lease takes its unspent units with it:
// they stay counted until its window ends (gcra: until the bucket refills
// past them), so the fleet admits at most that many fewer in that window.

// Lease sizes: a key's first request on an instance takes no lease (an
// exact decision); its next asks for one unit more than its cost, and each
// lease that is spent before it is returned doubles the next, up to
// maxLease; one returned unspent halves it.
const (
	maxLease = 4096
	// leaseIdle is how long a lease may go unused before its units go
	// back.
	leaseIdle = 100 * time.Millisecond
	// leaseSweep is how often the returns are looked for.
	leaseSweep = 25 * time.Millisecond
	// leaseForget is how long a key's record of demand outlives its last
	// lease.
	leaseForget = 10 * time.Second
)

// A lease is what this instance holds of one zone and key.
type lease struct {
	zone string
	// rate and alg are what the requests that may spend it ask: a
	// request with another rate (a limit template that resolved
	// otherwise, a dial) goes to Redis.
	rate algorithms.Rate
	alg  algorithms.Algorithm
	// units are the unspent units; window is the window they were counted
	// in (windowed algorithms) and expires when it ends, in the local
	// clock.
	units   int64
	window  int64
	expires time.Time
	// gcra: the TAT at which the first leased unit was counted, in ms of
	// the local clock, and the limit it was counted for; unit k (from 0)
	// may be spent until tat + k·T.
	tat   int64
	limit int64
	// capacity is the zone's limit (gcra: its burst) as Redis decided it;
	// remaining what Redis reported left at the lease, counting the
	// leased units as left, and spent the units spent since; reset is the
	// window's end (gcra: when the bucket is full again).
	capacity  int64
	remaining int64
	spent     int64
	reset     time.Time
	lastUsed  time.Time
	// want is the lease the key's next call asks for; refilling tells
	// that one is being asked for.
	want      int64
	refilling bool
	series    *leaseSeries
}

// spendable reports whether the lease may pay for q at now.
func (l *lease) spendable(q Request, now time.Time) bool {
	if l.units < q.Cost || l.rate != q.Rate || l.alg != q.Algorithm {
		return false
	}
	if l.alg == algorithms.GCRA {
		return now.UnixMilli() <= l.deadline(l.spent)
	}
	return now.Before(l.expires)
}

// deadline is the last instant (ms, local clock) at which a gcra lease's
// unit k may be spent: the TAT it was counted at, rounded down.
func (l *lease) deadline(k int64) int64 {
	ms, _ := algorithms.Interval(k, l.rate.Window, l.limit)
	return l.tat + ms
}

// usable reports whether any of the lease's units may still be spent at
// now, for any request.
func (l *lease) usable(now time.Time) bool {
	if l.units == 0 {
		return false
	}
	if l.alg == algorithms.GCRA {
		return now.UnixMilli() <= l.deadline(l.spent)
	}
	return now.Before(l.expires)
}

// leaseTable holds this instance's leases, by counter key, for every
// config sharing a Redis client.
type leaseTable struct {
	mu sync.Mutex
	m  map[string]*lease
	// back are units to give back that a new lease of their key replaced.
	back []heldUnits
}

// heldUnits are a lease's units to give back, with its counter key.
type heldUnits struct {
	key string
	*lease
}

// spend pays for every request of reqs from its lease, all or none, and
// reports whether it did. decisions get what the requests would have been
// told by Redis: allowed, with the remaining that Redis reported at the
// lease less what this instance spent since.
func (t *leaseTable) spend(keys []string, reqs []Request, decisions []algorithms.Decision, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, q := range reqs {
		l := t.m[keys[i]]
		if l == nil || !l.spendable(q, now) {
			return false
		}
	}
	for i, q := range reqs {
		l := t.m[keys[i]]
		l.units -= q.Cost
		l.spent += q.Cost
		l.lastUsed = now
		remaining := max(l.remaining-l.spent, 0)
		decisions[i] = algorithms.Decision{Allowed: true, Limit: l.limit, Remaining: remaining, Used: l.capacity - remaining, Reset: l.reset, Window: l.window}
		l.series.add(leaseSpent, q.Cost)
	}
	return true
}

// asks returns, for a call that reqs make to Redis, the lease each zone
// asks for (nil for none): what its key's demand on this instance wants,
// for a key seen before and not being refilled already. A key seen for
// the first time asks for none, and is remembered. A request with a
// concurrency zone, which always asks Redis, asks for no lease: it could
// never spend one. Nor does one with a zone that bans: a ban must hold on
// every instance at once, so each of its requests asks Redis.
func (t *leaseTable) asks(keys []string, reqs []Request, now time.Time) []int64 {
	for _, q := range reqs {
		if q.Algorithm == algorithms.Concurrency || q.Ban > 0 {
			return nil
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	var asks []int64
	for i, q := range reqs {
		l := t.m[keys[i]]
		if l == nil {
			if t.m == nil {
				t.m = make(map[string]*lease)
			}
			t.m[keys[i]] = &lease{zone: q.Zone, rate: q.Rate, alg: q.Algorithm, want: 1, lastUsed: now}
			continue
		}
		if l.refilling {
			continue
		}
		if asks == nil {
			asks = make([]int64, len(reqs))
		}
		asks[i] = l.want
		l.refilling = true
	}
	return asks
}

// unasked marks the keys of a call that asked for leases (asks, from
// asks) and failed as no longer being refilled.
func (t *leaseTable) unasked(keys []string, asks []int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, k := range keys {
		if l := t.m[k]; l != nil && asks[i] > 0 {
			l.refilling = false
		}
	}
}

// granted records what a call that asked for leases brought (a): for each
// zone, with the decision of its request, the units granted and the
// counts Redis left, and the series that counts units. Units still held
// of an earlier lease in the same window are kept.
func (t *leaseTable) granted(keys []string, reqs []Request, a *leaseAnswer, decisions []algorithms.Decision, now time.Time, series func(zone string) *leaseSeries) {
	t.mu.Lock()
	defer t.mu.Unlock()
	asks, grants, counts, shift := a.asks, a.grants, a.counts, a.shift
	for i, q := range reqs {
		if asks[i] == 0 {
			continue
		}
		l := t.m[keys[i]]
		if l == nil {
			continue // dropped meanwhile (an admin change)
		}
		l.refilling = false
		g, d := grants[i], decisions[i]
		if !d.Allowed || g == 0 {
			continue
		}
		// Units still held are kept if they may be spent as part of the new
		// lease: a windowed lease's, in the same window. Others go back: a
		// gcra unit counted before this request must not be spent as late
		// as the new lease's.
		held := l.units
		if held > 0 && (!l.usable(now) || l.rate != q.Rate || l.alg != q.Algorithm ||
			q.Algorithm == algorithms.GCRA || l.window != counts[i].Window) {
			back := *l
			t.back = append(t.back, heldUnits{keys[i], &back})
			held = 0
		}
		l.rate, l.alg, l.limit, l.lastUsed = q.Rate, q.Algorithm, d.Limit, now
		l.units, l.spent = held+g, 0
		l.remaining = d.Remaining + held
		l.capacity = d.Limit
		l.series = series(q.Zone)
		if q.Algorithm == algorithms.GCRA {
			l.capacity = q.Rate.BurstFor(d.Limit)
			// The first leased unit was counted at the TAT the request
			// left (its whole ms, rounded down: spending by then is never
			// late); the bucket is full again once the lease's TAT has
			// passed.
			ms, _ := algorithms.Interval(g, q.Rate.Window, d.Limit)
			l.tat = time.UnixMilli(counts[i].Window).Add(shift).UnixMilli()
			l.reset = time.UnixMilli(counts[i].Window + ms + 1).Add(shift)
		} else if q.Algorithm == algorithms.SlidingWindow {
			// Spent only in the sub-window it was counted in: a unit
			// counted earlier than it is spent would leave the window
			// early.
			n, w := q.Rate.BucketsOr(), q.Rate.Window.Milliseconds()
			l.window = counts[i].Window
			l.expires = time.UnixMilli(algorithms.SubWindowStart(l.window+1, w, n)).Add(shift)
			l.reset = d.Reset
		} else {
			l.window = counts[i].Window
			l.expires, l.reset = d.Reset, d.Reset
		}
		if g >= asks[i] {
			l.want = min(2*l.want, maxLease)
		}
		l.series.add(leaseTaken, g)
	}
}

// giveBack puts the cost of q, allowed with d, back into this instance's
// lease of its key, and reports whether it did. It does if the lease may
// still be spent, by the same requests, in the window (a sliding window:
// the sub-window) q was charged in: a unit counted in Redis for that
// window is as good as a leased one, so the lease spends it again or returns it with the rest. A gcra
// cost is never put back: each leased unit stands for an instant of the
// bucket, and one charged at another instant is not interchangeable with
// them.
func (t *leaseTable) giveBack(key string, q Request, d algorithms.Decision, now time.Time) bool {
	if !q.Algorithm.Windowed() && q.Algorithm != algorithms.SlidingWindow {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	l := t.m[key]
	if l == nil || l.units+l.spent == 0 || l.window != d.Window || l.rate != q.Rate || l.alg != q.Algorithm || !now.Before(l.expires) {
		return false
	}
	l.units += q.Cost
	l.spent = max(l.spent-q.Cost, 0)
	l.series.add(leaseGivenBack, q.Cost)
	return true
}

// due takes out of the table the units to give back at now: those of
// leases unused for leaseIdle, or that can no longer be spent, and those
// a new lease replaced. It forgets the demand of keys long unused.
func (t *leaseTable) due(now time.Time) []heldUnits {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := t.back
	t.back = nil
	for k, l := range t.m {
		idle := now.Sub(l.lastUsed) >= leaseIdle
		if l.units > 0 && (idle || !l.usable(now)) {
			back := *l
			out = append(out, heldUnits{k, &back})
			if idle {
				l.want = max(1, l.want/2)
			}
			l.units = 0
		}
		if l.units == 0 && !l.refilling && now.Sub(l.lastUsed) >= leaseForget {
			delete(t.m, k)
		}
	}
	return out
}

// drop forgets every lease without giving its units back: the admin API
// changed a key, a limit or a dial.
func (t *leaseTable) drop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	clear(t.m)
}

// all takes out every unit held, for giving them back on shutdown.
func (t *leaseTable) all() []heldUnits {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := t.back
	t.back = nil
	for k, l := range t.m {
		if l.units > 0 {
			back := *l
			out = append(out, heldUnits{k, &back})
			l.units = 0
		}
	}
	return out
}

// returnLeases gives back the unspent units of leases, in refund calls
// shared with concurrent give-backs (see refund), one per cluster slot
// (one in all on a single server), each bounded by timeout. A lease's
// units go back as a charge of them in its window would (for gcra: at
// the limit it was counted against).
func (c *redisClient) returnLeases(held []heldUnits, timeout time.Duration) {
	if len(held) == 0 {
		return
	}
	keys := make([]string, len(held))
	for i, h := range held {
		keys[i] = h.key
	}
	parts, groups := c.slotParts(keys, func(dst []any, i int) []any {
		l := held[i].lease
		return appendRefundArgs(dst, Request{Algorithm: l.alg, Rate: l.rate, Cost: l.units}, algorithms.Decision{Limit: l.limit, Window: l.window})
	})
	for k, p := range parts {
		if err := c.refund(p, timeout); err != nil {
			// The units stay counted until their window ends: never
			// more permissive.
			c.logger.Warn("giving back leased rate limit units", zap.Int("keys", len(p.keys)), zap.Error(err))
			continue
		}
		for _, i := range groups[k] {
			held[i].series.add(leaseReturned, held[i].units)
		}
	}
}

// startLeases starts, once, the goroutine that gives back the units that
// are due; it gives back all of them when the client is closed.
func (c *redisClient) startLeases() {
	c.leasing.Do(func() {
		c.watching.Add(1)
		go func() {
			defer c.watching.Done()
			c.sweepLeases()
		}()
	})
}

func (c *redisClient) sweepLeases() {
	ticker := time.NewTicker(leaseSweep)
	defer ticker.Stop()
	for {
		select {
		case <-c.closed:
			c.returnLeases(c.leases.all(), time.Second)
			return
		case <-ticker.C:
			if due := c.leases.due(c.now()); len(due) > 0 {
				c.returnLeases(due, time.Second)
			}
		}
	}
}
