package storage

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/d61b427a/caddy-rate-limit/internal/promreg"
)

// entries reports how many entries each per-key structure of this
// process's stores holds, as caddy_http_rate_limit_store_entries{store,
// kind}: the memory store's keys, bans, overrides and keys with costs in
// flight; the Redis store's lease records and cached denials. Each is
// bounded whatever the number of distinct keys clients send, and this is
// where an operator (and the test that floods a Caddy with a million
// keys) sees it. The counts are read when the metrics are scraped, one
// shard lock at a time, so scraping costs requests no more than a take.
type entries struct{ desc *prometheus.Desc }

var entriesCollector = &entries{desc: prometheus.NewDesc(
	prometheus.BuildFQName(promreg.Namespace, promreg.Subsystem, "store_entries"),
	"Entries this instance's stores hold, by store and kind: memory keys, bans, overrides and keys with costs in flight (in_flight); Redis lease records (leases) and cached denials (denials). Each is bounded whatever the number of distinct keys.",
	[]string{"store", "kind"}, nil,
)}

func (e *entries) Describe(ch chan<- *prometheus.Desc) { ch <- e.desc }

func (e *entries) Collect(ch chan<- prometheus.Metric) {
	var mem memoryEntries
	var leases, denials int
	memoryPool.Range(func(_, v any) bool {
		e := v.(*memoryCounters).entries()
		mem.keys += e.keys
		mem.bans += e.bans
		mem.overrides += e.overrides
		mem.inFlight += e.inFlight
		return true
	})
	redisClients.Range(func(_, v any) bool {
		c := v.(*redisClient)
		leases += c.leases.records()
		denials += int(c.denies.size.Load())
		return true
	})
	for _, m := range []struct {
		store, kind string
		n           int
	}{
		{"memory", "keys", mem.keys}, {"memory", "bans", mem.bans}, {"memory", "overrides", mem.overrides}, {"memory", "in_flight", mem.inFlight},
		{"redis", "leases", leases}, {"redis", "denials", denials},
	} {
		ch <- prometheus.MustNewConstMetric(e.desc, prometheus.GaugeValue, float64(m.n), m.store, m.kind)
	}
}

// registerEntries registers the entries collector with registry, if any.
func registerEntries(registry *prometheus.Registry) error {
	return promreg.Register(registry, entriesCollector)
}
