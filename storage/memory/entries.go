package memory

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/d61b427a/caddy-rate-limit/internal/promreg"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// entries reports how many entries the memory store's per-key structures
// hold, as caddy_http_rate_limit_store_entries{store="memory", kind}: its
// keys, bans, overrides and keys with costs in flight (see
// storage.EntriesDesc), and beside them the bounds of the first three
// (storage.EntriesBoundDesc); keys in flight have none of their own. The counts are read when the metrics are scraped,
// one shard lock at a time, so scraping costs requests no more than a
// take. They are the counters Caddy's configs share; a store of its own
// (New) is no config's, and is not counted.
type entries struct{ desc, bound *prometheus.Desc }

var entriesCollector = &entries{desc: storage.EntriesDesc("memory"), bound: storage.EntriesBoundDesc("memory")}

func (e *entries) Describe(ch chan<- *prometheus.Desc) { ch <- e.desc; ch <- e.bound }

func (e *entries) Collect(ch chan<- prometheus.Metric) {
	var n entryCounts
	keysBound := 0
	pool.Range(func(_, v any) bool {
		c := v.(*counters)
		e := c.entries()
		n.keys += e.keys
		n.bans += e.bans
		n.overrides += e.overrides
		n.inFlight += e.inFlight
		keysBound += shardCount * int(c.maxPerShard.Load())
		return true
	})
	for _, m := range []struct {
		kind string
		n    int
	}{{"keys", n.keys}, {"bans", n.bans}, {"overrides", n.overrides}, {"in_flight", n.inFlight}} {
		ch <- prometheus.MustNewConstMetric(e.desc, prometheus.GaugeValue, float64(m.n), m.kind)
	}
	if keysBound == 0 {
		return // no config uses the store
	}
	// A shard holds as many bans as keys.
	for _, m := range []struct {
		kind string
		n    int
	}{{"keys", keysBound}, {"bans", keysBound}, {"overrides", MaxOverrides}} {
		ch <- prometheus.MustNewConstMetric(e.bound, prometheus.GaugeValue, float64(m.n), m.kind)
	}
}

// registerEntries registers the entries collector with registry, if any.
func registerEntries(registry *prometheus.Registry) error {
	return promreg.Register(registry, entriesCollector)
}
