// Package promreg registers the module's Prometheus collectors. Each
// package that has collectors creates them once per process and
// registers them with the registry of every config that uses them: Caddy
// makes a new registry on each load, and counts must survive reloads.
package promreg

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Namespace and Subsystem name every metric of the module:
// caddy_http_rate_limit_*.
const (
	Namespace = "caddy"
	Subsystem = "http_rate_limit"
)

// Register registers cs with registry, if there is one (a store used
// outside a Caddy config has none); a collector already registered there
// is no error.
func Register(registry *prometheus.Registry, cs ...prometheus.Collector) error {
	if registry == nil {
		return nil
	}
	for _, c := range cs {
		if err := registry.Register(c); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
			return err
		}
	}
	return nil
}
