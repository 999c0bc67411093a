package shed

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/d61b427a/caddy-rate-limit/internal/promreg"
)

// metrics are the shedders' Prometheus collectors. They are created once
// per process and registered with the registry of every config that uses
// a shedder (Caddy makes a new registry on each load), so counts survive
// reloads. Their labels are the shedder's name and class.
var metrics = struct {
	once   sync.Once
	amount *prometheus.GaugeVec
	total  *prometheus.CounterVec
}{}

// registerMetrics creates the collectors on first use and registers them
// with registry.
func registerMetrics(registry *prometheus.Registry) error {
	const ns, sub = promreg.Namespace, promreg.Subsystem
	metrics.once.Do(func() {
		metrics.amount = prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "shed_amount",
			Help: "A load shedder's amount A: at or below 0 nothing is shed; at 1 all but its first class are.",
		}, []string{"shedder"})
		metrics.total = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "shed_total",
			Help: "Requests a load shedder shed (or, in dry run, would have shed), by class.",
		}, []string{"shedder", "class"})
	})
	return promreg.Register(registry, metrics.amount, metrics.total)
}
