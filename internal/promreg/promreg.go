// Package promreg registers the module's Prometheus collectors. Each
// package that has collectors creates them once per process and
// registers them with the registry of every config that uses them: Caddy
// makes a new registry on each load, and counts must survive reloads.
package promreg

import (
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Namespace and Subsystem name every metric of the module:
// caddy_http_rate_limit_*.
const (
	Namespace = "caddy"
	Subsystem = "http_rate_limit"
)

// Once returns the function that registers a package's collectors: the
// first call in the process makes them with create, which also keeps them
// where the package counts into them; every call registers them with its
// registry, as Register does. Collectors made once outlive the registry
// of any one config, so a reload keeps their counts.
func Once(create func() []prometheus.Collector) func(*prometheus.Registry) error {
	made := sync.OnceValue(create)
	return func(registry *prometheus.Registry) error {
		return Register(registry, made()...)
	}
}

// Register registers cs with registry, if there is one (a store used
// outside a Caddy config has none); a collector already registered there
// is no error. It remembers cs for Collectors.
func Register(registry *prometheus.Registry, cs ...prometheus.Collector) error {
	for _, c := range cs {
		made.Store(c, struct{}{})
	}
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

// made holds every collector Register was given, as a set.
var made sync.Map

// Collectors returns every collector of the module registered so far in
// this process, whether or not it has series yet: the metrics the module
// exports, against which the shipped dashboard's and alerts' queries are
// checked (a vector with no series yet is not in a registry's Gather).
func Collectors() []prometheus.Collector {
	var cs []prometheus.Collector
	made.Range(func(c, _ any) bool {
		cs = append(cs, c.(prometheus.Collector))
		return true
	})
	return cs
}
