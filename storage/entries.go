package storage

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/d61b427a/caddy-rate-limit/internal/promreg"
)

// EntriesDesc describes caddy_http_rate_limit_store_entries{store, kind}
// for the store named store: how many entries each of its per-key
// structures holds (the memory store's keys, bans, overrides and keys
// with costs in flight; the Redis store's lease records and cached
// denials). Each is bounded whatever the number of distinct keys clients
// send, and this is where an operator (and the test that floods a Caddy
// with a million keys) sees it.
//
// Each store reports its own kinds through a collector of its own, read
// when the metrics are scraped. The store is a constant label, so the
// stores' collectors can share a registry: Prometheus takes series of one
// name from several collectors when their help and label names agree,
// which this one description makes sure of.
func EntriesDesc(store string) *prometheus.Desc {
	return prometheus.NewDesc(
		prometheus.BuildFQName(promreg.Namespace, promreg.Subsystem, "store_entries"),
		"Entries this instance's stores hold, by store and kind: memory keys, bans, overrides and keys with costs in flight (in_flight); Redis lease records (leases) and cached denials (denials). Each is bounded whatever the number of distinct keys.",
		[]string{"kind"}, prometheus.Labels{"store": store},
	)
}
