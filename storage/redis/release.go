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

// releaseArgs is how many arguments the release script reads for each key.
const releaseArgs = 7

// appendReleaseArgs appends to dst the release script's seven arguments
// that release the take d of q, from the window d was decided in, in
// the script's clock, and end its time in flight if its zone keeps costs
// in flight; or, for a q that is Counted, only that.
func appendReleaseArgs(dst []any, q storage.Request, d algorithms.Decision) []any {
	var window any = ""
	var cost int64
	if q.TracksInFlight() {
		window, cost = algorithms.InFlightWindow(q.Algorithm, d, q.Rate), q.Cost
	}
	alg := scriptAlgorithm(q.Algorithm)
	switch {
	case q.Counted:
		return append(dst, "k", 0, 0, "", 0, window, cost)
	case q.Algorithm == algorithms.GCRA:
		ms, frac := algorithms.Interval(q.Cost, q.Rate.Window, d.Limit)
		return append(dst, alg, ms, frac, "", d.Limit, window, cost)
	case q.Algorithm == algorithms.Concurrency:
		return append(dst, alg, 0, q.Cost, holderName(q), 0, window, cost)
	}
	return append(dst, alg, d.Window, q.Cost, "", 0, window, cost)
}

// appendReleaseKeys appends to dst the release script's keys for p: each
// zone's counters, and a concurrency zone's holders after them, which the
// script touches too (see scripts/release.lua).
func appendReleaseKeys(dst []string, p *releasePart) []string {
	for i, k := range p.keys {
		dst = append(dst, k)
		if p.args[releaseArgs*i] == scriptAlgorithm(algorithms.Concurrency) {
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
