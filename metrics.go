package ratelimit

import (
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
