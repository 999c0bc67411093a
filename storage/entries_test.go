package storage

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// entriesOf is a store's collector of store_entries, as each store has
// one: one series per kind.
type entriesOf struct {
	desc  *prometheus.Desc
	kinds []string
}

func (e entriesOf) Describe(ch chan<- *prometheus.Desc) { ch <- e.desc }

func (e entriesOf) Collect(ch chan<- prometheus.Metric) {
	for i, k := range e.kinds {
		ch <- prometheus.MustNewConstMetric(e.desc, prometheus.GaugeValue, float64(i), k)
	}
}

// TestEntriesOfTwoStores: the collectors of two stores, each describing
// its series with EntriesDesc, register in one registry (as when one
// Caddy config uses both stores) and gather into one family, labelled by
// store and kind.
func TestEntriesOfTwoStores(t *testing.T) {
	reg := prometheus.NewRegistry()
	for _, c := range []entriesOf{
		{EntriesDesc("memory"), []string{"keys", "bans"}},
		{EntriesDesc("redis"), []string{"leases"}},
	} {
		if err := reg.Register(c); err != nil {
			t.Fatalf("registering the %v collector: %v", c.kinds, err)
		}
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(families) != 1 || families[0].GetName() != "caddy_http_rate_limit_store_entries" {
		t.Fatalf("gathered %v, want one family caddy_http_rate_limit_store_entries", families)
	}
	got := map[string]bool{}
	for _, m := range families[0].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		got[labels["store"]+"/"+labels["kind"]] = true
	}
	for _, want := range []string{"memory/keys", "memory/bans", "redis/leases"} {
		if !got[want] {
			t.Errorf("no series for %s among %v", want, got)
		}
	}
}
