package shed

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/d61b427a/caddy-rate-limit/internal/promreg"
)

// metrics are the shedders' Prometheus collectors, made by the process's
// first registerMetrics and registered with the registry of every config
// that uses a shedder (see promreg.Once). Their labels are the shedder's
// name and class.
var metrics struct {
	amount *prometheus.GaugeVec
	total  *prometheus.CounterVec
}

// registerMetrics makes the collectors on its first call and registers
// them with registry.
var registerMetrics = promreg.Once(func() []prometheus.Collector {
	const ns, sub = promreg.Namespace, promreg.Subsystem
	metrics.amount = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "shed_amount",
		Help: "A load shedder's amount A: at or below 0 nothing is shed; at 1 all but its first class are.",
	}, []string{"shedder"})
	metrics.total = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "shed_total",
		Help: "Requests a load shedder shed (or, in dry run, would have shed), by class.",
	}, []string{"shedder", "class"})
	return []prometheus.Collector{metrics.amount, metrics.total}
})
