// Package storage is the contract between the rate_limit handler and the
// stores that keep its counters: Store and Request, the admin side
// (Admin, Override, ZoneDial, KeyState), the rule that bounds keys
// (BoundKey), what a store may offer beyond Store (Refuser,
// LocalFallback, Fleet, Sweeper, MetricsDisabler), which the handler
// finds by type assertion, and the small pieces every store needs
// alike. A store is a Caddy guest module in the
// http.handlers.rate_limit.stores namespace, in a package of its own
// (storage/memory, storage/redis), so other stores can be plugged in
// without touching the handler; storage/storetest is the suite every
// store passes. This package imports no store.
package storage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"sync"
	"time"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
)

// Namespace is the Caddy module namespace of stores.
const Namespace = "http.handlers.rate_limit.stores"

// Request takes Cost units of Key's budget in Zone. Key is a value
// bounded by BoundKey, which the handler may put behind a tag of the
// alternative of the zone's key it came from (8 hex digits and '|'), so
// that alternatives never share a counter: at most MaxKeyLen+9 bytes, no
// brace. Stores keep it as it is.
type Request struct {
	Zone      string
	Key       string
	Algorithm algorithms.Algorithm
	Rate      algorithms.Rate
	Cost      int64
	// Holder tells apart, for a concurrency request, the requests of this
	// process that hold units of one key at once: a shared store keeps
	// each holder with its own hold, and Finish names it.
	Holder uint64
	// Ban, if set, bans the key for that long the first time this zone
	// rejects it: until the ban ends, every request of the key in the
	// zone is rejected, whatever its counts. Stores honour a ban only for
	// requests that carry one, so a zone whose ban is removed (or a dry
	// run) is never refused by one. With Releasable, only the key's
	// settled count may begin a ban (see TracksInFlight).
	Ban time.Duration
	// Releasable tells that the handler may release the cost once the
	// request is done (count_status): the key's counts can fall before
	// time frees them, so a store may not take one rejection as standing
	// for the next (a remote store's cache of rejections), unless the key
	// is banned.
	Releasable bool
	// Counted, in a Finish of a request that KeepsInFlight, tells that
	// its response was one the zone counts: its cost stays taken, and
	// is only no longer in flight.
	Counted bool
	// Reservation tells that Cost is a reservation (cost_from), which
	// the request's Finish trues up once its response is done (TrueUp),
	// or keeps (Counted) if the response showed no cost: until then the
	// store keeps it in flight (KeepsInFlight), so that the admin API
	// can show, for the whole fleet on a shared store, the units
	// reserved by requests not done yet (KeyState.InFlight).
	Reservation bool
	// Actual, in a Finish of a request whose Cost was a reservation
	// (cost_from), is the cost its response showed: the store keeps
	// Actual in place of Cost. Cost-Actual is released if Actual is
	// less; if Actual is more, the difference is taken past the limit
	// (debt), and the key is refused until its window has room again.
	// TrueUp tells that Actual is set; without it a Finish releases the
	// whole Cost, as for count_status.
	TrueUp bool
	Actual int64
	// Wide tells that the zone's limits and counts run past 2^31, up to
	// 2^63-1: a zone priced in money, which counts picodollars. Only
	// fixed_window and sliding_tail zones are wide. A store keeps a wide
	// key's counts at 64 bits, exactly, apart from other keys, so a key
	// is always wide or never.
	Wide bool
}

// TracksInFlight reports whether a store keeps q's cost, once allowed,
// as in flight until its Finish, which the handler then calls whatever
// the response (with Counted if its cost stays). Only a zone that bans
// and releases costs needs to: a request it rejects begins a ban only
// if the key's settled count, the costs kept after their responses,
// leaves it no room (algorithms.Settled); one refused only for costs
// still in flight is marked so (Decision.InFlight), and bans nothing.
func (q Request) TracksInFlight() bool {
	return q.Releasable && q.Ban > 0 && q.Cost > 0
}

// KeepsInFlight reports whether a store keeps q's cost, once allowed, as
// in flight until its Finish, which the handler then calls whatever the
// response: a request that TracksInFlight, and a Reservation (which is
// Releasable: its true-up may release part of it). Only
// TracksInFlight changes decisions: the reservation of a zone without a
// ban is kept in flight to be shown (KeyState.InFlight), and decided as
// any cost.
func (q Request) KeepsInFlight() bool {
	return q.TracksInFlight() || q.Reservation && q.Releasable && q.Cost > 0
}

// Finishing returns what a Finish of q, an allowed request, does to its
// key's counts: the units it releases, and the units it takes past the
// limit (the debt). With TrueUp the store keeps Actual (a negative one
// counts as 0) in place of Cost, whether or not Counted is set: it
// releases Cost-Actual, or takes Actual-Cost as a debt. Without, a
// Counted cost stays and any other is released whole. A concurrency
// request releases its whole cost whatever else q says: once done it
// holds nothing, and no zone reads a concurrency cost from a response.
//
// Which window each lands in is the algorithm's: a release comes off the
// window the cost was taken in (algorithms.Release), a debt lands in the
// window of the moment it is taken (algorithms.Debt).
func (q Request) Finishing() (release, debt int64) {
	switch {
	case q.Algorithm == algorithms.Concurrency:
		return q.Cost, 0
	case q.TrueUp:
		actual := max(q.Actual, 0)
		return max(q.Cost-actual, 0), max(actual-q.Cost, 0)
	case q.Counted:
		return 0, 0
	}
	return q.Cost, 0
}

// Store keeps counters per zone and key.
type Store interface {
	// Take decides every request in reqs and writes one decision per
	// request into decisions, which has the same length. Only if every
	// request is allowed are they all taken; otherwise nothing is, so a
	// request rejected by one zone consumes nothing in the others. A
	// non-nil error means no decision was made; a remote store whose
	// answer timed out may still have taken the request.
	Take(ctx context.Context, reqs []Request, decisions []algorithms.Decision) error

	// Finish ends the accounting of the allowed requests in reqs, with
	// decisions their decisions from Take (same length). It releases a
	// concurrency request's units, once Caddy is done with it, and another
	// request's cost when it is done and should not count (count_status),
	// from the window it was taken in (algorithms.Release). A request
	// whose cost was a reservation is trued up (TrueUp): the store keeps
	// its Actual cost instead, releasing the difference or taking it past
	// the limit as a debt (see Finishing), which is why this is not called
	// a release: a release never gives back more than was taken, nor takes.
	// A request that KeepsInFlight is finished when it is done, whatever
	// its response: its cost stops being in flight, and is released unless
	// it is Counted or trued up. Finish is called at most once per allowed
	// request, when ctx, the request's, may be done (its client gone): a
	// store finishes all the same, keeping ctx's values only. A shared store that cannot
	// be reached keeps the units until their hold ends, and the costs
	// until their window does: never more permissive.
	Finish(ctx context.Context, reqs []Request, decisions []algorithms.Decision) error

	// Released returns a channel closed at this instance's next Finish,
	// so a request held by max_delay for units can try again at once.
	// Units released elsewhere (another instance, a hold ending) close
	// it not; waiters on a shared store also try again from time to time.
	Released() <-chan struct{}
}

// Refuser is a store that can tell, from what it holds in this process
// and without a round trip, that a request would be refused now: its
// key's ban, which the memory store keeps and the Redis store
// remembers from the rejection that answered it, and the other
// rejections a shared store remembers until their retry instant (the
// Redis store's deny cache). The handler asks before it reads a
// request's body, so that a key already refused costs no body read.
type Refuser interface {
	// Refused reports whether Take would reject q now, and so any
	// request of q's zone and key with its rate that costs more than
	// q.Cost, and if it would, the rejection. It takes nothing and
	// begins no ban. A store that does not know answers false.
	Refused(q Request) (algorithms.Decision, bool)
}

// LocalFallback is a store that can fail (Redis) and offers a local
// fallback for while it does: a Store that decides in this instance's
// memory (on_store_error local).
type LocalFallback interface {
	Local() Store
}

// Fleet is a store shared by a fleet of instances (Redis), which knows how
// many there are: N, the instances that announced themselves lately.
type Fleet interface {
	Instances() int
}

// Sweeper is a store that sweeps out, on an interval, the keys whose
// counts no longer matter: the memory store, whose keys nothing else
// expires. A handler with sweep_interval asks it for that interval,
// after the store's Provision; 0 withdraws the request. A store whose
// keys expire on their own (Redis) has no interval to set.
type Sweeper interface {
	SetSweepInterval(d time.Duration)
}

// MetricsDisabler is a store that adds series of its own to the
// rate-limit metrics (Redis: its leases' units), which a handler with
// disable_metrics turns off after the store's Provision: the handler
// leaves out its own series, but only the store knows of the store's.
type MetricsDisabler interface {
	DisableMetrics()
}

// MaxKeyLen is the longest key every store keeps as it is.
const MaxKeyLen = 64

// BoundKey is the one rule that bounds keys, for every store. A key that
// is empty, longer than MaxKeyLen bytes, starts with '#' or contains a
// brace becomes '#' and 32 hex digits of its SHA-256. So a hostile key (a
// megabyte header, say) cannot bloat a store, nor break out of a Redis
// Cluster hash tag, nor, since a key kept as it is never starts with '#',
// take over the counter of a hashed one.
//
// Every request's key comes through here, so the braces are looked for
// with IndexByte: strings.ContainsAny builds a set of bytes on each call.
func BoundKey(key string) string {
	if len(key) > 0 && len(key) <= MaxKeyLen && key[0] != '#' &&
		strings.IndexByte(key, '{') < 0 && strings.IndexByte(key, '}') < 0 {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "#" + hex.EncodeToString(sum[:16])
}

// ReleaseSignal is what a store's Released returns from: it wakes the
// requests waiting for concurrency units. Wait returns a channel that the
// next Signal closes. The zero value is ready to use.
type ReleaseSignal struct {
	mu sync.Mutex
	ch chan struct{}
}

// Wait returns a channel that the next Signal closes.
func (r *ReleaseSignal) Wait() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ch == nil {
		r.ch = make(chan struct{})
	}
	return r.ch
}

// Signal closes the channel Wait returned, waking its waiters.
func (r *ReleaseSignal) Signal() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ch != nil {
		close(r.ch)
		r.ch = nil
	}
}
