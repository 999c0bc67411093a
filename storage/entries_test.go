package storage

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// entriesOf is a store's collector of store_entries, as each store has
// one: one series per kind.
type entriesOf struct {
	desc, bound *prometheus.Desc
	kinds       []string
}

func (e entriesOf) Describe(ch chan<- *prometheus.Desc) { ch <- e.desc; ch <- e.bound }

func (e entriesOf) Collect(ch chan<- prometheus.Metric) {
	for i, k := range e.kinds {
		ch <- prometheus.MustNewConstMetric(e.desc, prometheus.GaugeValue, float64(i), k)
		ch <- prometheus.MustNewConstMetric(e.bound, prometheus.GaugeValue, 100, k)
	}
}

// TestEntriesOfTwoStores: the collectors of two stores, each describing
// its series with EntriesDesc and EntriesBoundDesc, register in one
// registry (as when one Caddy config uses both stores) and gather into
// one family of entries and one of bounds, labelled by store and kind.
func TestEntriesOfTwoStores(t *testing.T) {
	reg := prometheus.NewRegistry()
	for _, c := range []entriesOf{
		{EntriesDesc("memory"), EntriesBoundDesc("memory"), []string{"keys", "bans"}},
		{EntriesDesc("redis"), EntriesBoundDesc("redis"), []string{"leases"}},
	} {
		if err := reg.Register(c); err != nil {
			t.Fatalf("registering the %v collector: %v", c.kinds, err)
		}
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"caddy_http_rate_limit_store_entries", "caddy_http_rate_limit_store_entries_bound"}
	if len(families) != len(want) {
		t.Fatalf("gathered %v, want the families %v", families, want)
	}
	for i, f := range families {
		if f.GetName() != want[i] {
			t.Fatalf("gathered %v, want the families %v", families, want)
		}
		got := map[string]bool{}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			got[labels["store"]+"/"+labels["kind"]] = true
		}
		for _, series := range []string{"memory/keys", "memory/bans", "redis/leases"} {
			if !got[series] {
				t.Errorf("%s: no series for %s among %v", f.GetName(), series, got)
			}
		}
	}
}
