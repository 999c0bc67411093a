package ratelimit

import (
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the module's Prometheus collectors. They are created once
// per process and registered with the registry of every config that uses
// the handler (Caddy makes a new registry on each load), so counts
// survive reloads. Labels are bounded sets (zone and result, store,
// shedder and class), never a key: a label per key would grow without end.
var metrics = struct {
	once          sync.Once
	requests      *prometheus.CounterVec
	storeErrors   *prometheus.CounterVec
	storeDuration *prometheus.HistogramVec
	periodUsage   *prometheus.HistogramVec
	shedAmount    *prometheus.GaugeVec
	shedTotal     *prometheus.CounterVec
}{}

// Values of the result label.
const (
	resultAllowed = iota
	resultRejected
	resultDelayed
	resultDryRun
	resultCount
)

var resultNames = [resultCount]string{"allowed", "rejected", "delayed", "dry_run"}

// registerMetrics creates the collectors on first use and registers them
// with registry.
func registerMetrics(registry *prometheus.Registry) error {
	const ns, sub = "caddy", "http_rate_limit"
	metrics.once.Do(func() {
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
				"(histogram_quantile(0.999, ...)). Observed by the instance whose charge rolls the key into a new window.",
			Buckets: []float64{.05, .1, .25, .5, .75, .9, .95, .99, 1, 1.25, 1.5, 2, 5},
		}, []string{"zone"})
		metrics.shedAmount = prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "shed_amount",
			Help: "A load shedder's amount A: at or below 0 nothing is shed; at 1 all but its first class are.",
		}, []string{"shedder"})
		metrics.shedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "shed_total",
			Help: "Requests a load shedder shed (or, in dry run, would have shed), by class.",
		}, []string{"shedder", "class"})
	})
	for _, c := range []prometheus.Collector{metrics.requests, metrics.storeErrors, metrics.storeDuration, metrics.periodUsage, metrics.shedAmount, metrics.shedTotal} {
		if err := registry.Register(c); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
			return err
		}
	}
	return nil
}
