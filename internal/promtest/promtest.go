// Package promtest reads a metric's value in tests, from the collector
// itself rather than from a running Caddy's /metrics.
package promtest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Counter returns the value of c's counter series whose labels include
// every name and value in labels, or 0 if c has no such series yet.
func Counter(t testing.TB, c prometheus.Collector, labels map[string]string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
	series:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for name, value := range labels {
				if have[name] != value {
					continue series
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}
