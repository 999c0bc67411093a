package redis

import (
	"context"
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
