package ratelimit

import (
	"hash/maphash"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/d61b427a/caddy-rate-limit/internal/promreg"
)

// metrics are the handler's Prometheus collectors, made by the process's
// first registerMetrics and registered with the registry of every config
// that uses the handler (see promreg.Once). Labels are bounded sets (zone
// and result, store), never a key: a label per key would grow without end.
var metrics struct {
	requests      *prometheus.CounterVec
	storeErrors   *prometheus.CounterVec
	storeDuration *prometheus.HistogramVec
	periodUsage   *prometheus.HistogramVec
	bans          *prometheus.CounterVec
	costUnits     *prometheus.CounterVec
}

// Values of the result label.
const (
	resultAllowed = iota
	resultRejected
	resultDelayed
	resultDryRun
	resultCount
)

var resultNames = [resultCount]string{"allowed", "rejected", "delayed", "dry_run"}

// registerMetrics makes the collectors on its first call and registers
// them with registry.
var registerMetrics = promreg.Once(func() []prometheus.Collector {
	const ns, sub = promreg.Namespace, promreg.Subsystem
	metrics.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "requests_total",
		Help: "Requests counted against a zone, by result: allowed, rejected, delayed (held by max_delay, then allowed) or dry_run (would have been rejected).",
	}, []string{"zone", "result"})
	metrics.storeErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "store_errors_total",
		Help: "Decisions the store could not answer; on_store_error applied.",
	}, []string{"store"})
	metrics.storeDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: ns, Subsystem: sub, Name: "store_duration_seconds",
		Help:    "How long a remote store took to answer one decision.",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
	}, []string{"store"})
	metrics.periodUsage = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: ns, Subsystem: sub, Name: "period_usage_ratio",
		Help: "Once per key and finished window, the share of its limit the key used: how close users run to their limits " +
			"(histogram_quantile(0.999, ...)). Observed by the instance whose take rolls the key into a new window.",
		Buckets: []float64{.05, .1, .25, .5, .75, .9, .95, .99, 1, 1.25, 1.5, 2, 5},
	}, []string{"zone"})
	metrics.bans = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "bans_total",
		Help: "Keys a zone with a ban banned: counted by the instance whose rejection began the ban.",
	}, []string{"zone"})
	metrics.costUnits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "cost_units_total",
		Help: "Cost units of the requests of zones that read costs from responses (cost_from), by kind: reserved at admission, then, once the responses were done, " +
			"taken (what they cost, or their reservation if it could not be read), released (reserved beyond that) and debt (taken beyond the reservation); " +
			"unit is what a unit is: tokens (cost_from usage), picodollars (cost_from usage price) or units (cost_from header).",
	}, []string{"zone", "kind", "unit"})
	return []prometheus.Collector{metrics.requests, metrics.storeErrors, metrics.storeDuration, metrics.periodUsage, metrics.bans, metrics.costUnits}
})

// zoneSeries returns a zone's series: its caddy_http_rate_limit_requests_total
// counters by result, looked up once so that counting costs one atomic
// add, its caddy_http_rate_limit_period_usage_ratio, and, for a zone that
// bans, its caddy_http_rate_limit_bans_total. With metricsOff
// (disable_metrics) they are collected by no registry, so the zone leaves
// no series behind, not even at zero; nor does a zone without a ban leave
// a bans series.
func zoneSeries(zone string, metricsOff, bans bool) (results [resultCount]prometheus.Counter, usage prometheus.Observer, banned prometheus.Counter) {
	if metricsOff {
		for i := range results {
			results[i] = unregisteredCounter()
		}
		return results, discardObserver, unregisteredCounter()
	}
	for i := range results {
		results[i] = metrics.requests.WithLabelValues(zone, resultNames[i])
	}
	banned = unregisteredCounter()
	if bans {
		banned = metrics.bans.WithLabelValues(zone)
	}
	return results, metrics.periodUsage.WithLabelValues(zone), banned
}

// costSeries returns a cost_from zone's caddy_http_rate_limit_cost_units_total
// counters by kind, whose units are unit (one per zone, so the label adds
// no series); with metricsOff they are collected by no registry.
func costSeries(zone, unit string, metricsOff bool) (units [costKinds]prometheus.Counter) {
	for i := range units {
		if metricsOff {
			units[i] = unregisteredCounter()
		} else {
			units[i] = metrics.costUnits.WithLabelValues(zone, costKindNames[i], unit)
		}
	}
	return units
}

// storeSeries returns a store's series: its error counter, and its latency
// histogram (nil for the memory store: timing an in-memory decision would
// cost more than it tells). With metricsOff the counter is collected by no
// registry.
func storeSeries(store string, metricsOff bool) (errors prometheus.Counter, latency prometheus.Observer) {
	if metricsOff {
		return unregisteredCounter(), nil
	}
	if store != "memory" {
		latency = metrics.storeDuration.WithLabelValues(store)
	}
	return metrics.storeErrors.WithLabelValues(store), latency
}

// unregisteredCounter is a counter no registry collects: what a handler with
// disable_metrics counts into, so that counting stays one atomic add with
// no branch.
func unregisteredCounter() prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: "rate_limit_unregistered"})
}

var discardObserver = prometheus.ObserverFunc(func(float64) {})

// exceededEvent is the Caddy event a zone emits for the first rejection of
// a key in a window (the name mholt/caddy-ratelimit uses).
const exceededEvent = "rate_limit_exceeded"

// exceededKeys remembers, for a zone, the window in which keys last had
// an event, so that a key emits one event per window however many of its
// requests are rejected: a flood must not flood the event handlers.
//
// It is a fixed table of exceededSlots slots, allocated at the zone's
// first event, each an atomic word set with compare-and-swap: rejected
// requests take no lock, and a flood of new keys costs no more memory. A
// key's slot is picked by a keyed hash of the key, and holds 31 more bits
// of that hash beside the low 32 bits of the window. A key alone in its
// slot emits exactly one event per window. Keys that share a slot
// overwrite each other's mark, so a key may emit a second event in its
// window after another key's rejection took its slot: extra events, never
// a missing one, unless two keys share both the slot and the 31 more bits
// (odds of 1 in 2 billion for a pair sharing a slot, and no one can aim
// at it without the seed, which never leaves the process).
type exceededKeys struct {
	slots atomic.Pointer[[exceededSlots]atomic.Uint64]
}

// exceededSlots is the size of a zone's table: 8,192 slots, 64 KiB.
const exceededSlots = 1 << 13

// exceededSeed keys the hash that places keys in the table.
var exceededSeed = maphash.MakeSeed()

// first reports whether key has had no event in window yet, and notes
// that it has now. Of requests of one key that come at once, one is first.
func (e *exceededKeys) first(key string, window int64) bool {
	slots := e.slots.Load()
	if slots == nil {
		slots = new([exceededSlots]atomic.Uint64)
		if !e.slots.CompareAndSwap(nil, slots) {
			slots = e.slots.Load()
		}
	}
	h := maphash.String(exceededSeed, key)
	slot := &slots[h%exceededSlots]
	// The hash's top 32 bits, the lowest of them set so that no mark is
	// an empty slot's, and the window's low 32.
	mark := (h|1<<32)&^(1<<32-1) | uint64(uint32(window))
	for {
		old := slot.Load()
		if old == mark {
			return false
		}
		if slot.CompareAndSwap(old, mark) {
			return true
		}
	}
}

// windowIndex is the index of the zone's window that holds now: its
// calendar period's, or now cut in windows of its period.
func (z *Zone) windowIndex(now time.Time) int64 {
	if z.calendar != nil {
		return z.calendar.At(now.UnixMilli()).Index
	}
	return now.UnixNano() / int64(max(z.period, time.Millisecond))
}

// emitExceeded emits rate_limit_exceeded for the rejection c of r at now,
// if anything listens and it is the key's first in the zone's current
// window. The event carries the zone, the key (as its hash unless
// log_keys is on) and the alternative of the zone's key it came from,
// the client's address, the seconds to wait, and, for a banned key,
// when its ban ends.
func (h *Handler) emitExceeded(r *http.Request, c *zoneCheck, retryAfter int64, now time.Time) {
	if h.events == nil || !h.events.ShouldEmit(exceededEvent) {
		return
	}
	if !c.zone.events.first(c.req.Key, c.zone.windowIndex(now)) {
		return
	}
	_, from := keyFrom(c.req.Key)
	data := map[string]any{
		"zone":        c.zone.Name,
		"key":         shownKey(c.req.Key, h.showKeys),
		"from":        from,
		"remote_ip":   remoteIP(r),
		"retry_after": retryAfter,
	}
	if !c.decision.BanEnds.IsZero() {
		data["ban_ends"] = c.decision.BanEnds
	}
	h.events.Emit(h.ctx, exceededEvent, data)
}

// remoteIP is the address of the connection's far end.
func remoteIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
