package redis

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/d61b427a/caddy-rate-limit/internal/promreg"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// metrics are the Redis store's own Prometheus collectors: its leases and
// the fleet it sees (and the entries it holds, below). They are made by
// the process's first registerMetrics and registered with the registry of
// every config that uses the store (see promreg.Once). Labels are bounded
// sets (zone and outcome, store), never a key.
var metrics struct {
	leaseUnits *prometheus.CounterVec
	instances  *prometheus.GaugeVec
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
	return []prometheus.Collector{metrics.leaseUnits, metrics.instances, entriesCollector}
})

// entries reports how many entries the Redis store's per-key structures
// in this process hold, as caddy_http_rate_limit_store_entries{store=
// "redis", kind}: its lease records, cached denials and the keys whose
// local fallback admissions wait for the catch-up (owed), summed over the
// clients (see storage.EntriesDesc). They are read when the metrics are
// scraped.
type entries struct{ desc *prometheus.Desc }

var entriesCollector = &entries{desc: storage.EntriesDesc("redis")}

func (e *entries) Describe(ch chan<- *prometheus.Desc) { ch <- e.desc }

func (e *entries) Collect(ch chan<- prometheus.Metric) {
	var leases, denials, owed int
	clients.Range(func(_, v any) bool {
		c := v.(*client)
		leases += c.leases.records()
		denials += int(c.denies.size.Load())
		owed += c.owed.size()
		return true
	})
	ch <- prometheus.MustNewConstMetric(e.desc, prometheus.GaugeValue, float64(leases), "leases")
	ch <- prometheus.MustNewConstMetric(e.desc, prometheus.GaugeValue, float64(denials), "denials")
	ch <- prometheus.MustNewConstMetric(e.desc, prometheus.GaugeValue, float64(owed), "owed")
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
