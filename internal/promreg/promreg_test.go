package promreg

import (
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestOnceMakesOnceRegistersEverywhere: the collectors are made by the
// first call only, whatever its registry (none, as for a store used
// outside a config), and every registry they are registered with, a
// second time too, collects the same counts.
func TestOnceMakesOnceRegistersEverywhere(t *testing.T) {
	made := 0
	var c prometheus.Counter
	register := Once(func() []prometheus.Collector {
		made++
		c = prometheus.NewCounter(prometheus.CounterOpts{Name: "promreg_test_total", Help: "A test counter."})
		return []prometheus.Collector{c}
	})
	if err := register(nil); err != nil {
		t.Fatal(err)
	}
	c.Add(2)
	first, second := prometheus.NewRegistry(), prometheus.NewRegistry()
	for _, r := range []*prometheus.Registry{first, second, first} {
		if err := register(r); err != nil {
			t.Fatal(err)
		}
	}
	if made != 1 {
		t.Fatalf("collectors made %d times, want once", made)
	}
	if !slices.Contains(Collectors(), prometheus.Collector(c)) {
		t.Fatal("Collectors does not return the collector registered")
	}
	for _, r := range []*prometheus.Registry{first, second} {
		families, err := r.Gather()
		if err != nil {
			t.Fatal(err)
		}
		if len(families) != 1 || families[0].GetName() != "promreg_test_total" || len(families[0].GetMetric()) != 1 {
			t.Fatalf("registry collects %v, want promreg_test_total alone", families)
		}
		if got := families[0].GetMetric()[0].GetCounter().GetValue(); got != 2 {
			t.Fatalf("count %v, want the 2 counted before any registry", got)
		}
	}
}
