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

// EntriesBoundDesc describes caddy_http_rate_limit_store_entries_bound
// {store, kind}: the most entries a kind of store_entries may hold, for
// the kinds that have a fixed bound. Reported beside the entries, it lets
// a dashboard draw how full a store is, and an alert fire on
// store_entries / store_entries_bound, without the operator copying each
// bound (max_keys, rounded up, or a constant of the code) into a query.
func EntriesBoundDesc(store string) *prometheus.Desc {
	return prometheus.NewDesc(
		prometheus.BuildFQName(promreg.Namespace, promreg.Subsystem, "store_entries_bound"),
		"The most entries a kind of store_entries may hold: memory keys and bans (max_keys, rounded up to a multiple of 64) and overrides; Redis leases, denials and owed.",
		[]string{"kind"}, prometheus.Labels{"store": store},
	)
}
