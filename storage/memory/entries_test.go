package memory

import (
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
)

// TestEntriesBound: beside what it holds, the store reports the bounds of
// its keys and bans (max_keys, rounded up to a multiple of the 64
// shards) and of its overrides, so that an alert can divide one by the
// other.
func TestEntriesBound(t *testing.T) {
	m := &Store{MaxKeys: 1000}
	if err := m.Provision(caddy.Context{}); err != nil {
		t.Fatal(err)
	}
	defer m.Cleanup()
	reg := prometheus.NewRegistry()
	if err := registerEntries(reg); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "caddy_http_rate_limit_store_entries_bound" {
			continue
		}
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "kind" {
					got[l.GetValue()] = s.GetGauge().GetValue()
				}
			}
		}
	}
	want := map[string]float64{"keys": 1024, "bans": 1024, "overrides": MaxOverrides}
	for kind, n := range want {
		if got[kind] != n {
			t.Errorf("bound of %s: %v, want %v (all: %v)", kind, got[kind], n, got)
		}
	}
	if len(got) != len(want) {
		t.Errorf("bounds %v, want exactly %v", got, want)
	}
}
