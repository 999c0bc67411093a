package redis

import (
	"context"
	"time"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// This file coalesces concurrent releases into shared release calls, as
// batch.go does for takes: while a release call is in flight for a slot,
// the releases for that slot queue, and the next call sends them all. A
// concurrency zone releases everything it takes and a zone with
// count_status most of it, so without this such a zone would cost Redis a
// script call per request for its releases alone, where its takes share
// one.

// The release script's arguments for each key, at these offsets from
// the key's first, releaseArgs in all: the ARG_* of scripts/release.lua,
// which a test holds to these. The algorithm ("k" for a cost that stays
// whole); where the cost was taken and the units released (a gcra
// release: its span); the holder (concurrency); the limit the cost was
// decided against; the window and cost in flight (a zone that keeps its
// costs in flight); the units to take past the limit (a true-up's debt);
// the zone's window; gcra's burst or a sliding window's buckets; and the
// script's clock ("" for the server's).
const (
	relAlgorithm = iota
	relAt
	relUnits
	relHolder
	relLimit
	relInFlightWindow
	relInFlightCost
	relDebt
	relWindow
	relExtra
	relNow
	releaseArgs
)

// appendReleaseArgs appends to dst the release script's arguments that
// settle the take d of q: release units of it from the window d was
// decided in, in the script's clock, or take debt units past the limit
// in the window of the script's clock (clock, in ms; 0 for the server's),
// and end its time in flight if its zone keeps costs in flight. With
// neither, only that. A debt in a calendar period is given the periods
// around local, the store's clock (see scriptWindow).
func appendReleaseArgs(dst []any, q storage.Request, d algorithms.Decision, release, debt, clock int64, local time.Time) []any {
	a := [releaseArgs]any{
		relAlgorithm: scriptAlgorithmOf(q), relAt: 0, relUnits: 0, relHolder: "", relLimit: 0,
		relInFlightWindow: "", relInFlightCost: 0, relDebt: 0, relWindow: 0, relExtra: "", relNow: "",
	}
	if q.KeepsInFlight() {
		a[relInFlightWindow], a[relInFlightCost] = algorithms.InFlightWindow(q.Algorithm, d, q.Rate), q.Cost
	}
	if clock != 0 {
		a[relNow] = clock
	}
	switch {
	case q.Algorithm == algorithms.Concurrency:
		a[relUnits], a[relHolder] = release, holderName(q)
	case debt > 0:
		// Bounded as algorithms.Debt bounds it, for the limit d was
		// decided against: more would change nothing, and the script's
		// numbers are exact only below 2^53.
		rate := q.Rate
		if d.Limit > 0 {
			rate.Units = d.Limit
		}
		a[relDebt], a[relLimit], a[relWindow] = min(debt, algorithms.MostDebt(q.Algorithm, rate)), rate.Units, scriptWindow(rate, local)
		switch q.Algorithm {
		case algorithms.GCRA:
			a[relExtra] = rate.BurstFor(rate.Units)
		case algorithms.SlidingWindow:
			a[relExtra] = rate.BucketsOr()
		}
	case release == 0 && q.Wide:
		a[relAlgorithm] = "K"
	case release == 0:
		a[relAlgorithm] = "k"
	case q.Algorithm == algorithms.GCRA:
		ms, frac := algorithms.Interval(release, q.Rate.Window, d.Limit)
		a[relAt], a[relUnits], a[relLimit] = ms, frac, d.Limit
	default:
		a[relAt], a[relUnits] = d.Window, release
	}
	return append(dst, a[:]...)
}

// appendReleaseKeys appends to dst the release script's keys for p: each
// zone's counters, and a concurrency zone's holders after them, which the
// script touches too (see scripts/release.lua).
func appendReleaseKeys(dst []string, p *releasePart) []string {
	for i, k := range p.keys {
		dst = append(dst, k)
		if p.args[releaseArgs*i+relAlgorithm] == scriptAlgorithm(algorithms.Concurrency) {
			dst = append(dst, holdersKey(k))
		}
	}
	return dst
}

// slotParts puts keys, and the arguments appendArgs appends for key i,
// into release parts: one per cluster slot, or one in all on a single
// server. groups[k] are the indexes of part k's keys.
func (c *client) slotParts(keys []string, appendArgs func(dst []any, i int) []any) (parts []*releasePart, groups [][]int) {
	if c.cluster {
		groups = tagGroups(keys)
	} else {
		all := make([]int, len(keys))
		for i := range all {
			all[i] = i
		}
		groups = [][]int{all}
	}
	parts = make([]*releasePart, len(groups))
	for k, g := range groups {
		p := &releasePart{keys: make([]string, 0, len(g)), args: make([]any, 0, releaseArgs*len(g))}
		for _, i := range g {
			p.keys = append(p.keys, keys[i])
			p.args = appendArgs(p.args, i)
		}
		parts[k] = p
	}
	return parts, groups
}

// A releasePart is the releases of one Release, one lease sweep or one
// rejected cluster request, in one slot.
type releasePart struct {
	keys []string
	args []any // releaseArgs per key (see scripts/release.lua)
	// done is closed once err is set.
	done chan struct{}
	err  error
}

// releaseQueue returns the release queue for key's slot: one per cluster
// slot, or one for a single server.
func (c *client) releaseQueue(key string) *slotQueue[*releasePart] {
	if len(c.releases) == 1 {
		return &c.releases[0]
	}
	return &c.releases[keySlot(key)]
}

// release releases p in the next release call for its slot, each call
// bounded by timeout, and returns once that call has answered. If a call
// is in flight, p queues for the call after it; if not, p's goroutine
// sends the call itself (see slotQueue). A queued p waits for at most the
// call in flight and its own, or a few more if over maxBatch queued ahead
// of it: a release is not dropped because its request has ended.
func (c *client) release(p *releasePart, timeout time.Duration) error {
	q := c.releaseQueue(p.keys[0])
	p.done = make(chan struct{})
	if !q.push(p) {
		<-p.done
		return p.err
	}
	// p is first in the queue, so this call takes it.
	send := func(batch []*releasePart) { c.sendReleases(batch, timeout) }
	if q.lead(send) {
		go q.drain(send)
	}
	return p.err
}

// sendReleases releases a batch of queued parts in one call, bounded by
// timeout.
func (c *client) sendReleases(batch []*releasePart, timeout time.Duration) {
	var keys []string
	args := batch[0].args
	if len(batch) > 1 {
		args = nil
		for _, p := range batch {
			args = append(args, p.args...)
		}
	}
	for _, p := range batch {
		keys = appendReleaseKeys(keys, p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	err := releaseScript.Run(ctx, c.rdb, keys, args...).Err()
	cancel()
	for _, p := range batch {
		p.err = err
		close(p.done)
	}
}
