package redis

import (
	"context"
	"fmt"
	"time"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// This file coalesces concurrent calls of the finish script into shared
// calls, as batch.go does for takes: while a finish call is in flight for
// a slot, the parts for that slot queue, and the next call sends them
// all. A concurrency zone releases everything it takes and a zone with
// count_status most of it, so without this such a zone would cost Redis a
// script call per request for its finishes alone, where its takes share
// one.

// The finish script's arguments for each key, at these offsets from
// the key's first, finishArgs in all: the ARG_* of scripts/finish.lua,
// which a test holds to these. The algorithm ("k" for a cost that stays
// whole); where the cost was taken and the units released (a gcra
// release: its span); the holder (concurrency); the limit the cost was
// decided against; the window and cost in flight (a zone that keeps its
// costs in flight); the units to take past the limit (a true-up's debt);
// the zone's window; gcra's burst or a sliding window's buckets; and the
// script's clock ("" for the server's).
const (
	finAlgorithm = iota
	finAt
	finUnits
	finHolder
	finLimit
	finInFlightWindow
	finInFlightCost
	finDebt
	finWindow
	finExtra
	finNow
	finishArgs
)

// appendFinishArgs appends to dst the finish script's arguments that
// finish the take d of q: release units of it from the window d was
// decided in, in the script's clock, or take debt units past the limit
// in the window of the script's clock (clock, in ms; 0 for the server's),
// and end its time in flight if its zone keeps costs in flight. With
// neither, only that. A debt in a calendar period is given the periods
// around local, the store's clock (see scriptWindow).
func appendFinishArgs(dst []any, q storage.Request, d algorithms.Decision, release, debt, clock int64, local time.Time) []any {
	a := [finishArgs]any{
		finAlgorithm: scriptAlgorithmOf(q), finAt: 0, finUnits: 0, finHolder: "", finLimit: 0,
		finInFlightWindow: "", finInFlightCost: 0, finDebt: 0, finWindow: 0, finExtra: "", finNow: "",
	}
	if q.KeepsInFlight() {
		a[finInFlightWindow], a[finInFlightCost] = algorithms.InFlightWindow(q.Algorithm, d, q.Rate), q.Cost
	}
	if clock != 0 {
		a[finNow] = clock
	}
	switch {
	case q.Algorithm == algorithms.Concurrency:
		a[finUnits], a[finHolder] = release, holderName(q)
	case debt > 0:
		// Bounded as algorithms.Debt bounds it, for the limit d was
		// decided against: more would change nothing, and the script's
		// numbers are exact only below 2^53.
		rate := q.Rate
		if d.Limit > 0 {
			rate.Units = d.Limit
		}
		a[finDebt], a[finLimit], a[finWindow] = min(debt, algorithms.MostDebt(q.Algorithm, rate)), rate.Units, scriptWindow(rate, local)
		switch q.Algorithm {
		case algorithms.GCRA:
			a[finExtra] = rate.BurstFor(rate.Units)
		case algorithms.SlidingWindow:
			a[finExtra] = rate.BucketsOr()
		}
	case release == 0 && q.Wide:
		a[finAlgorithm] = "K"
	case release == 0:
		a[finAlgorithm] = "k"
	case q.Algorithm == algorithms.GCRA:
		ms, frac := algorithms.Interval(release, q.Rate.Window, d.Limit)
		a[finAt], a[finUnits], a[finLimit] = ms, frac, d.Limit
	default:
		a[finAt], a[finUnits] = d.Window, release
	}
	return append(dst, a[:]...)
}

// appendFinishKeys appends to dst the finish script's keys for p: each
// zone's counters, and a concurrency zone's holders after them, which the
// script touches too (see scripts/finish.lua).
func appendFinishKeys(dst []string, p *finishPart) []string {
	for i, k := range p.keys {
		dst = append(dst, k)
		if p.args[finishArgs*i+finAlgorithm] == scriptAlgorithm(algorithms.Concurrency) {
			dst = append(dst, holdersKey(k))
		}
	}
	return dst
}

// slotParts puts keys, and the arguments appendArgs appends for key i,
// into finish parts: one per cluster slot, or one in all on a single
// server. groups[k] are the indexes of part k's keys.
func (c *client) slotParts(keys []string, appendArgs func(dst []any, i int) []any) (parts []*finishPart, groups [][]int) {
	if c.cluster {
		groups = tagGroups(keys)
	} else {
		all := make([]int, len(keys))
		for i := range all {
			all[i] = i
		}
		groups = [][]int{all}
	}
	parts = make([]*finishPart, len(groups))
	for k, g := range groups {
		p := &finishPart{keys: make([]string, 0, len(g)), args: make([]any, 0, finishArgs*len(g))}
		for _, i := range g {
			p.keys = append(p.keys, keys[i])
			p.args = appendArgs(p.args, i)
		}
		parts[k] = p
	}
	return parts, groups
}

// A finishPart is the finish script's work for one Finish, one lease
// sweep, one catch-up call or one rejected cluster request, in one slot.
type finishPart struct {
	keys []string
	args []any // finishArgs per key (see scripts/finish.lua)
	// done is closed once err is set.
	done chan struct{}
	err  error
}

// finishQueue returns the finish queue for key's slot: one per cluster
// slot, or one for a single server.
func (c *client) finishQueue(key string) *slotQueue[*finishPart] {
	if len(c.finishes) == 1 {
		return &c.finishes[0]
	}
	return &c.finishes[keySlot(key)]
}

// finish runs p in the next finish call for its slot, each call
// bounded by timeout, and returns once that call has answered. If a call
// is in flight, p queues for the call after it; if not, p's goroutine
// sends the call itself (see slotQueue). A queued p waits for at most the
// call in flight and its own, or a few more if over maxBatch queued ahead
// of it: a part is not dropped because its request has ended.
func (c *client) finish(p *finishPart, timeout time.Duration) error {
	q := c.finishQueue(p.keys[0])
	p.done = make(chan struct{})
	if !q.push(p) {
		<-p.done
		return p.err
	}
	// p is first in the queue, so this call takes it.
	send := func(batch []*finishPart) { c.sendFinishes(batch, timeout) }
	if q.lead(send) {
		go q.drain(send)
	}
	return p.err
}

// sendFinishes runs a batch of queued parts in one call, bounded by
// timeout.
func (c *client) sendFinishes(batch []*finishPart, timeout time.Duration) {
	var keys []string
	args := batch[0].args
	if len(batch) > 1 {
		args = nil
		for _, p := range batch {
			args = append(args, p.args...)
		}
	}
	for _, p := range batch {
		keys = appendFinishKeys(keys, p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	err := finishScript.Run(ctx, c.rdb, keys, args...).Err()
	cancel()
	for _, p := range batch {
		p.err = err
		close(p.done)
	}
}

// Finish implements storage.Store: each concurrency request leaves its
// key's holders, and each other request is finished (storage.Request.Finishing):
// its cost, or what its true-up does not keep of it, is released, or its
// true-up's debt taken past the limit (finish.lua), in one script call
// for all of them (one per hash tag on a cluster), atomic in its slot and
// shared with the releases of concurrent requests. A request the script
// finds no longer holding (its hold ended) is released already. With
// leases, a windowed cost this instance holds a lease of its key for, in
// the same window, is released into the lease instead, without a call:
// the lease has it taken again or releases it with its other units. A
// cost kept in flight (a reservation, which takes no lease) is always
// finished in Redis, where its time in flight ends.
// The store's timeout bounds each call, whether or not ctx has ended.
func (r *Store) Finish(_ context.Context, reqs []storage.Request, decisions []algorithms.Decision) error {
	// The leases are the acquired client's, as for Take: a reloaded
	// config's own client may be closed, its leases no longer released.
	c, own, err := r.acquire()
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	defer r.end(own)
	var names *keyNames
	var keys []string
	var held []toFinish
	now := r.now()
	var clock int64
	if r.scriptClock != nil {
		clock = r.scriptClock().UnixMilli()
	}
	for i, q := range reqs {
		release, debt := q.Finishing()
		if release == 0 && debt == 0 && !q.KeepsInFlight() && q.Algorithm != algorithms.Concurrency {
			continue // the cost stays whole: nothing to finish
		}
		if names == nil {
			if names, err = r.keyNames(context.Background(), c); err != nil {
				return fmt.Errorf("redis: %w", err)
			}
		}
		key := names.counter(q.Zone, q.Key)
		// A cost in flight ends in Redis, where it is kept.
		if r.Lease && !q.KeepsInFlight() && release > 0 && c.leases.release(key, q, decisions[i], release, now) {
			continue
		}
		keys = append(keys, key)
		held = append(held, toFinish{q, decisions[i], release, debt})
	}
	if len(keys) == 0 {
		return nil
	}
	// The request's client may be gone; what it took is finished anyway,
	// in a call shared with the finishes of other requests (see
	// finish.go). A slot that fails does not keep the others'.
	parts, groups := c.slotParts(keys, func(dst []any, i int) []any {
		h := &held[i]
		return appendFinishArgs(dst, h.q, h.d, h.release, h.debt, clock, now)
	})
	var failed error
	for k, p := range parts {
		if err := c.finish(p, time.Duration(r.Timeout)); err != nil && failed == nil {
			failed = fmt.Errorf("redis: finishing zone %q: %w", held[groups[k][0]].q.Zone, err)
		}
	}
	c.released.Signal()
	return failed
}

// toFinish is a request Finish sends to Redis: q, allowed with d, and
// the units to release or take past the limit there.
type toFinish struct {
	q             storage.Request
	d             algorithms.Decision
	release, debt int64
}

// Released implements storage.Store: closed at the next release by this
// instance. Releases by other instances and ended holds are seen only by
// trying again.
func (r *Store) Released() <-chan struct{} {
	return r.client.released.Wait()
}
