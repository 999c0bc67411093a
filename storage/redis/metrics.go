package redis

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/d61b427a/caddy-rate-limit/internal/promreg"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// metrics are the Redis store's own Prometheus collectors: its leases,
// the fleet it sees and the decisions its local fallback made (and the
// entries it holds and the state of its connections, below). They are
// made by the process's first registerMetrics and registered with the
// registry of every config that uses the store (see promreg.Once). Labels are bounded
// sets (zone and outcome, store), never a key.
var metrics struct {
	leaseUnits *prometheus.CounterVec
	instances  *prometheus.GaugeVec
	fallback   prometheus.Counter
}

// Values of the outcome label of lease_units_total.
const (
	leaseLeased = iota
	leaseTaken
	leaseReleased
	leaseReleasedToLease
	leaseOutcomes
)

var leaseOutcomeNames = [leaseOutcomes]string{"leased", "taken", "released", "released_to_lease"}

// registerMetrics makes the collectors on its first call and registers
// them, and the entries collector, with registry, if any.
var registerMetrics = promreg.Once(func() []prometheus.Collector {
	const ns, sub = promreg.Namespace, promreg.Subsystem
	metrics.leaseUnits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "lease_units_total",
		Help: "Units of a zone's limits that this instance leased from Redis (leased), took from its leases for requests without a call (taken), released back to Redis untaken (released), and had released into a lease instead of Redis by requests that did not count (released_to_lease, count_status).",
	}, []string{"zone", "outcome"})
	metrics.instances = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "fleet_instances",
		Help: "The live instances sharing the store, as this instance last read them: those that announced themselves in the last 5 seconds.",
	}, []string{"store"})
	metrics.fallback = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "store_fallback_decisions_total",
		Help:        "Requests the local fallback (on_store_error local) decided, each limit divided among the instances, because the store could not.",
		ConstLabels: prometheus.Labels{"store": "redis"},
	})
	return []prometheus.Collector{metrics.leaseUnits, metrics.instances, metrics.fallback, entriesCollector, stateCollector}
})

// entries reports how many entries the Redis store's per-key structures
// in this process hold, as caddy_http_rate_limit_store_entries{store=
// "redis", kind}: its lease records, cached denials and the keys whose
// local fallback admissions wait for the catch-up (owed), summed over the
// clients (see storage.EntriesDesc), and beside them their bounds, summed
// the same way (storage.EntriesBoundDesc). They are read when the metrics
// are scraped.
type entries struct{ desc, bound *prometheus.Desc }

var entriesCollector = &entries{desc: storage.EntriesDesc("redis"), bound: storage.EntriesBoundDesc("redis")}

func (e *entries) Describe(ch chan<- *prometheus.Desc) { ch <- e.desc; ch <- e.bound }

func (e *entries) Collect(ch chan<- prometheus.Metric) {
	var leases, denials, owed, n int
	clients.Range(func(_, v any) bool {
		c := v.(*client)
		leases += c.leases.records()
		denials += int(c.denies.size.Load())
		owed += c.owed.size()
		n++
		return true
	})
	ch <- prometheus.MustNewConstMetric(e.desc, prometheus.GaugeValue, float64(leases), "leases")
	ch <- prometheus.MustNewConstMetric(e.desc, prometheus.GaugeValue, float64(denials), "denials")
	ch <- prometheus.MustNewConstMetric(e.desc, prometheus.GaugeValue, float64(owed), "owed")
	if n == 0 {
		return
	}
	ch <- prometheus.MustNewConstMetric(e.bound, prometheus.GaugeValue, float64(n*maxLeaseRecords), "leases")
	ch <- prometheus.MustNewConstMetric(e.bound, prometheus.GaugeValue, float64(n*denyCacheShards*denyShardSize), "denials")
	ch <- prometheus.MustNewConstMetric(e.bound, prometheus.GaugeValue, float64(n*maxOwed), "owed")
}

// state reports, when the metrics are scraped, what an alert on the store
// needs beside its errors and latency: how many of the process's Redis
// connections (one per distinct address and timeout) have their circuit
// breaker open, and the configured timeout, against which the latency's
// p99 is read. With connections of several timeouts it reports the
// smallest, the first that slow answers reach.
type state struct{ breakerOpen, timeout *prometheus.Desc }

var stateCollector = &state{
	breakerOpen: prometheus.NewDesc(prometheus.BuildFQName(promreg.Namespace, promreg.Subsystem, "store_breaker_open"),
		"The store's connections whose circuit breaker is open: after consecutive failures the store is not called, and on_store_error decides, until a probe succeeds.",
		nil, prometheus.Labels{"store": "redis"}),
	timeout: prometheus.NewDesc(prometheus.BuildFQName(promreg.Namespace, promreg.Subsystem, "store_timeout_seconds"),
		"The store's timeout: how long a decision waits for it before on_store_error decides (the smallest, if connections differ).",
		nil, prometheus.Labels{"store": "redis"}),
}

func (s *state) Describe(ch chan<- *prometheus.Desc) { ch <- s.breakerOpen; ch <- s.timeout }

func (s *state) Collect(ch chan<- prometheus.Metric) {
	var open, n int
	var timeout time.Duration
	clients.Range(func(_, v any) bool {
		c := v.(*client)
		if c.breaker.failures.Load() >= breakerThreshold {
			open++
		}
		if n == 0 || c.timeout < timeout {
			timeout = c.timeout
		}
		n++
		return true
	})
	if n == 0 {
		return
	}
	ch <- prometheus.MustNewConstMetric(s.breakerOpen, prometheus.GaugeValue, float64(open))
	ch <- prometheus.MustNewConstMetric(s.timeout, prometheus.GaugeValue, timeout.Seconds())
}

// leaseSeries are one zone's series of lease_units_total, by outcome,
// looked up once; a nil *leaseSeries counts nothing (disable_metrics).
type leaseSeries [leaseOutcomes]prometheus.Counter

func newLeaseSeries(zone string) *leaseSeries {
	var s leaseSeries
	for i := range s {
		s[i] = metrics.leaseUnits.WithLabelValues(zone, leaseOutcomeNames[i])
	}
	return &s
}

func (s *leaseSeries) add(outcome int, units int64) {
	if s != nil && units > 0 {
		s[outcome].Add(float64(units))
	}
}
