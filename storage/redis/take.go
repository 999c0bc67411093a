package redis

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// This file is the Redis store's take protocol: the calls of the take
// script, and how zones in different cluster slots are taken all or
// nothing. How keys are named is in keys.go, how the scripts are
// assembled in scripts.go, the end of a request's accounting in
// finish.go.

// Take implements storage.Store.
func (r *Store) Take(ctx context.Context, reqs []storage.Request, decisions []algorithms.Decision) error {
	if len(reqs) == 0 {
		return nil
	}
	if err := checkRequests(reqs); err != nil {
		return err
	}
	c, own, err := r.acquire()
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	defer r.end(own)
	names, err := r.keyNames(ctx, c)
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	keys := make([]string, len(reqs))
	for i, q := range reqs {
		keys[i] = names.counter(q.Zone, q.Key)
	}
	var clock int64
	if r.scriptClock != nil {
		clock = r.scriptClock().UnixMilli()
	}
	now := r.now()
	leasing := r.Lease && clock == 0
	if leasing && c.leases.take(keys, reqs, decisions, now) {
		c.mirror(reqs, decisions)
		return nil
	}
	if clock == 0 && c.denies.lookup(keys, reqs, decisions, now) {
		return nil
	}
	if err := c.breaker.allow(now); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	// A decision that takes concurrency units is not given up when the
	// client goes away: the script may have taken them, and only an
	// answer tells the handler to release the units. Its timeout still
	// bounds it; units a timed-out call took wait for their hold to end.
	base := ctx
	if takesUnits(reqs) {
		base = context.WithoutCancel(ctx)
	}
	// The timeout is a deadline rather than a context of its own: most
	// decisions under load share a call (batch.go), whose context
	// the deadline bounds, and a timer for each request cost more than
	// its script call did. It is read off the real clock, not r.now,
	// which tests skew.
	deadline := time.Now().Add(time.Duration(r.Timeout))
	var leases *leaseAnswer
	if leasing && (!r.Cluster || sameTag(keys)) {
		if wants := c.leases.wants(keys, reqs, now); wants != nil {
			leases = &leaseAnswer{wants: wants}
		}
	}
	t := takeCall{c: c, deadline: deadline, clock: clock, keys: keys, reqs: reqs, decisions: decisions, leases: leases}
	if err := r.takeAll(base, t); err != nil {
		if leases != nil {
			c.leases.leaseFailed(keys, leases.wants)
		}
		c.breaker.done(err, failureCounts(ctx, err), r.now())
		c.rereadSlots()
		return fmt.Errorf("redis: %w", err)
	}
	r.afterTake(t)
	return nil
}

// checkRequests refuses a request the store cannot decide exactly: a
// wide zone of another algorithm than fixed_window or sliding_tail, and
// numbers past what the take script counts exactly.
func checkRequests(reqs []storage.Request) error {
	for _, q := range reqs {
		if q.Wide && q.Algorithm != algorithms.FixedWindow && q.Algorithm != algorithms.SlidingTail {
			return fmt.Errorf("zone %q: wide counts only for fixed_window and sliding_tail, got %s", q.Zone, q.Algorithm)
		}
		// A wide zone's counts are exact to 2^63-1 (take_wide.lua).
		if !q.Wide && (q.Rate.Units > maxExact || q.Cost > maxExact) || q.Cost < 0 || q.Rate.Window.Milliseconds() > maxExact ||
			q.Algorithm == algorithms.GCRA && (q.Rate.Units > math.MaxInt32 || q.Rate.Burst > math.MaxInt32) {
			return fmt.Errorf("zone %q: limit, burst, cost or window too large for the Redis store", q.Zone)
		}
		if err := q.Rate.Validate(); err != nil {
			return fmt.Errorf("zone %q: %w", q.Zone, err)
		}
	}
	return nil
}

// afterTake does what a take's answer from Redis asks for, beside its
// decisions: it closes the breaker, starts the catch-up of what the
// local fallback admitted alone, counts the take in the fallback's
// memory, keeps the leases it brought and remembers its rejections.
func (r *Store) afterTake(t takeCall) {
	c, keys, reqs, decisions := t.c, t.keys, t.reqs, t.decisions
	now := r.now()
	if c.breaker.failures.Load() != 0 {
		// The first answer after failures: a cluster may have failed over
		// meanwhile, after the last time its slots were read.
		c.rereadSlots()
	}
	c.breaker.done(nil, true, now)
	if owed := c.answered(); owed != nil {
		go c.catchUp(owed)
	}
	c.mirror(reqs, decisions)
	if t.leases != nil {
		c.leases.leased(keys, reqs, t.leases, decisions, now, r.leaseSeries)
	}
	if t.clock == 0 {
		c.denies.store(keys, reqs, decisions, now)
	}
}

// Refused implements storage.Refuser: a rejection the deny cache
// remembers, a ban's or another's, stands for q as it would in Take,
// where the cache answers before Redis is asked. Where Take asks the
// lease table first, a request that could take from a lease is not
// answered here, nor is any while the take script runs on a test's
// clock, when Take keeps no cache.
func (r *Store) Refused(q storage.Request) (algorithms.Decision, bool) {
	if r.scriptClock != nil || r.Lease && q.Algorithm != algorithms.Concurrency && q.Ban == 0 && !q.KeepsInFlight() {
		return algorithms.Decision{}, false
	}
	names := r.watcher().names.Load()
	if names == nil {
		// The fleet's secret is not known yet, so no rejection was
		// remembered under the key's name.
		return algorithms.Decision{}, false
	}
	c, own, err := r.acquire()
	if err != nil {
		return algorithms.Decision{}, false
	}
	defer r.end(own)
	return c.denies.find(names.counter(q.Zone, q.Key), q, r.now())
}

// leaseAnswer is what a call that wants leases (wants, one per zone; 0
// for none) brings back for them: each zone's units leased and, for a
// gcra zone, the whole ms of the TAT its request left, before the lease,
// in the script's clock, which is shift behind the local one.
type leaseAnswer struct {
	wants, leased []int64
	tats          []int64
	shift         time.Duration
}

// failureCounts reports whether err, from a take made under ctx,
// counts against Redis in the circuit breaker. A client that went away says
// nothing about Redis, and neither does a wait for a free connection: a
// burst of traffic must not trip the breaker and so lift every limit.
func failureCounts(ctx context.Context, err error) bool {
	return ctx.Err() == nil && !errors.Is(err, goredis.ErrPoolTimeout)
}

// takeCall is what one Take asks of the take script: the client that
// calls it, the deadline of its answer, the script's clock (0 for the
// server's), the requests with their keys and the decisions to fill,
// and the leases it wants (nil for none).
type takeCall struct {
	c         *client
	deadline  time.Time
	clock     int64
	keys      []string
	reqs      []storage.Request
	decisions []algorithms.Decision
	leases    *leaseAnswer
}

// takeAll runs the take script over t's requests. On one server or a
// sentinel's master that is one call for all zones. On a cluster, zones
// whose keys lie in different slots are decided one group of keys at a
// time; see takeSlotGroups. A call that wants leases (t.leases not nil)
// is one call: its keys share a slot.
func (r *Store) takeAll(ctx context.Context, t takeCall) error {
	if !r.Cluster || sameTag(t.keys) {
		return r.runTake(ctx, t, true)
	}
	return r.takeSlotGroups(ctx, t)
}

// sameTag reports whether all keys share one hash tag, and so one slot.
func sameTag(keys []string) bool {
	for _, k := range keys[1:] {
		if hashTag(k) != hashTag(keys[0]) {
			return false
		}
	}
	return true
}

// tagGroups groups the indexes of keys by hash tag, in the order the tags
// first appear: the keys one script call may touch together on a cluster.
func tagGroups(keys []string) [][]int {
	var groups [][]int
	var tags []string
	for i, k := range keys {
		tag := hashTag(k)
		g := slices.Index(tags, tag)
		if g < 0 {
			g = len(groups)
			tags = append(tags, tag)
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

func hashTag(key string) string {
	open := strings.IndexByte(key, '{')
	end := strings.IndexByte(key[open:], '}')
	return key[open : open+end+1]
}

// takeSlotGroups keeps the all-or-nothing rule on a cluster, where one
// script cannot reach keys in different slots. Keys are grouped by hash
// tag and each group is decided by one atomic script call, in order. Each
// group takes its zones only if they all allow the request; once a group
// rejects, the remaining groups only decide, and every group already
// taken is released by a second script that is atomic in its slot. Until
// that release lands, a concurrent request for the same key may see the
// take and be rejected; no request is ever allowed beyond a limit.
//
// Once a group has rejected the request, Redis errors no longer make it a
// store error, which on_store_error allow would let through: a group that
// cannot be reached is reported as not rejecting, and a release that
// fails is logged and leaves its take in place (counting too much, never
// too little).
func (r *Store) takeSlotGroups(ctx context.Context, t takeCall) error {
	c, keys, reqs, decisions := t.c, t.keys, t.reqs, t.decisions
	groups := tagGroups(keys)

	var releases []*finishPart
	rejected := false
	var firstErr error
	for gi, g := range groups {
		gKeys := make([]string, len(g))
		gReqs := make([]storage.Request, len(g))
		gDec := make([]algorithms.Decision, len(g))
		for j, i := range g {
			gKeys[j], gReqs[j] = keys[i], reqs[i]
		}
		group := t
		group.keys, group.reqs, group.decisions, group.leases = gKeys, gReqs, gDec, nil
		err := r.runTake(ctx, group, !rejected)
		if err != nil && rejected {
			for _, rest := range groups[gi:] {
				for _, i := range rest {
					decisions[i] = algorithms.Decision{Allowed: true}
				}
			}
			break
		}
		if err != nil {
			firstErr = err
			break
		}
		allowed := true
		for j, i := range g {
			decisions[i] = gDec[j]
			allowed = allowed && gDec[j].Allowed
		}
		if !allowed {
			rejected = true
			continue
		}
		if !rejected {
			args := make([]any, 0, finishArgs*len(gReqs))
			for j, q := range gReqs {
				args = appendFinishArgs(args, q, gDec[j], q.Cost, 0, 0, time.Time{})
			}
			releases = append(releases, &finishPart{keys: gKeys, args: args})
		}
	}
	if !rejected && firstErr == nil {
		return nil
	}
	// Undo the takes with a fresh budget: the decision's own timeout may
	// be what ended it.
	for _, p := range releases {
		if err := c.finish(p, time.Duration(r.Timeout)); err != nil {
			if n, ok := c.releaseLog.Allow(time.Now()); ok {
				r.logger.Error("releasing a request rejected in another cluster slot failed; what it took stays",
					zap.Int("zones", len(p.keys)), zap.Error(err), zap.Int64("failures_since_last_log", n))
			}
		}
	}
	return firstErr
}

// The take script's arguments for each zone of an entry, at these offsets
// from the zone's first, zoneArgs in all: the ARG_* of scripts/take.lua,
// which a test holds to these.
const (
	argAlgorithm = iota
	argLimit
	argWindow
	argCost
	argExtra
	argLease
	argBan
	argInFlight
	zoneArgs
)

// The take script's answer for each zone, at these offsets from the
// zone's first value, zoneValues in all: the OUT_* of scripts/take.lua,
// which a test holds to these. The key's counts as stored before the
// entry, the take script's w, c and p (algorithms.Counts' W, C and P; a
// sliding window answers the sub-window decided in, what the key used
// before the entry and the first rejection's retry instant instead);
// whether the zone allows the entry's first request not allowed (1/0);
// the limit it was decided against; the units leased; the key's ban as
// stored before the entry; and 1 if the zone refused that request only
// for its costs in flight.
const (
	outW = iota
	outC
	outP
	outAllows
	outLimit
	outLeased
	outBan
	outInFlight
	zoneValues
)

// runTake decides t's requests, whose keys all lie in one slot, in one
// script call (shared with concurrent requests; see batch.go) by its
// deadline, taking them only if take, and fills its decisions, and its
// leases with the units leased.
func (r *Store) runTake(ctx context.Context, call takeCall, take bool) error {
	c, reqs, decisions, clock, leases := call.c, call.reqs, call.decisions, call.clock, call.leases
	t := &callPart{keys: call.keys, reqs: reqs, take: take, deadline: call.deadline, local: r.now()}
	if leases != nil {
		t.wants = leases.wants
	}
	var err error
	if clock != 0 {
		// A test's clock holds for its own call only.
		c.callAlone(ctx, clock, t)
		err = t.err
	} else {
		err = c.take(ctx, t)
	}
	if err != nil {
		return err
	}
	serverNow := t.now
	// Decisions are computed in the clock the script used, then moved to
	// the local clock, so Retry-After and the deny cache are right even
	// when this machine's clock disagrees with Redis's.
	var shift time.Duration
	if clock == 0 {
		shift = r.now().Sub(time.UnixMilli(serverNow))
	}
	if leases != nil {
		leases.leased, leases.tats, leases.shift = make([]int64, len(reqs)), make([]int64, len(reqs)), shift
	}
	for i, q := range reqs {
		v := t.vals[zoneValues*i:]
		d, next := decideAgain(q, v, serverNow)
		// The script's verdict is what was written; it equals Decide's by
		// construction (and by test), but the store must report what it did.
		d.Allowed = v[outAllows] == 1
		switch {
		case d.Allowed || q.Ban == 0 || !d.BanEnds.IsZero():
		case q.Cost > algorithms.Capacity(q.Algorithm, q.Rate, d.Limit):
			// A cost that could never pass bans nobody.
		case v[outInFlight] == 1:
			// Refused only for costs in flight: no ban.
			d = d.RefusedInFlight(time.UnixMilli(serverNow))
		default:
			// This rejection banned the key, as the script did.
			d = d.Ban(time.UnixMilli(serverNow+q.Ban.Milliseconds()), true)
		}
		d.Reset = d.Reset.Add(shift)
		if !d.RetryAt.IsZero() {
			d.RetryAt = d.RetryAt.Add(shift)
		}
		if !d.BanEnds.IsZero() {
			d.BanEnds = d.BanEnds.Add(shift)
		}
		decisions[i] = d
		if leases != nil {
			leases.leased[i] = v[outLeased]
			if q.Algorithm == algorithms.GCRA {
				// The TAT the request left, before the lease.
				leases.tats[i] = algorithms.Counts{W: next[0], C: next[1], P: next[2]}.TATMillis()
			}
		}
	}
	return nil
}

// decideAgain runs algorithms.Decide, as the take script did, for one zone
// of q at now (ms of the script's clock), from v, that zone's values in
// the script's answer (see take.lua): the counters as stored before q,
// the limit the script used, the request's or a per-key override, and
// the key's ban, which rejects q while it lasts. It returns the decision
// and the zone's values at outW, outC and outP as q left them.
func decideAgain(q storage.Request, v []int64, now int64) (algorithms.Decision, [3]int64) {
	rate := q.Rate
	rate.Units = v[outLimit]
	if q.Algorithm == algorithms.SlidingWindow {
		d, next := decideRingAgain(rate, v, q.Cost)
		if q.Ban > 0 && v[outBan] > now {
			return d.Ban(time.UnixMilli(v[outBan]), false), [3]int64{v[outW], v[outC], v[outP]}
		}
		return d, next
	}
	counts := algorithms.Counts{W: v[outW], C: v[outC], P: v[outP]}
	d, next := algorithms.Decide(q.Algorithm, counts, time.UnixMilli(now), rate, q.Cost)
	if q.Ban > 0 && v[outBan] > now {
		return d.Ban(time.UnixMilli(v[outBan]), false), [3]int64{counts.W, counts.C, counts.P}
	}
	return d, [3]int64{next.W, next.C, next.P}
}

// decideRingAgain is decideAgain for a sliding window, from what the take
// script answers for one at outW, outC and outP: the sub-window decided
// in, what the key used before the request and, for a rejection, the
// retry instant (ms of the script's clock). It returns them as taking
// cost left them.
func decideRingAgain(rate algorithms.Rate, v []int64, cost int64) (algorithms.Decision, [3]int64) {
	n, w := rate.BucketsOr(), rate.Window.Milliseconds()
	idx, used, retry := v[outW], v[outC], v[outP]
	d := algorithms.Decision{Limit: rate.Units, Window: idx, Reset: time.UnixMilli(algorithms.SubWindowStart(idx+1+int64(n), w, n))}
	switch {
	case used+cost <= rate.Units:
		d.Allowed = true
		used += cost
	case cost > rate.Units:
		d.RetryAt = d.Reset
	default:
		d.RetryAt = time.UnixMilli(retry)
	}
	d.Used, d.Remaining = used, max(rate.Units-used, 0)
	return d, [3]int64{idx, used, retry}
}

// takesUnits reports whether reqs hold concurrency units once taken.
func takesUnits(reqs []storage.Request) bool {
	for _, q := range reqs {
		if q.Algorithm == algorithms.Concurrency {
			return true
		}
	}
	return false
}
