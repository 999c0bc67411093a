package redis

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/internal/promtest"
	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
	"github.com/d61b427a/caddy-rate-limit/internal/wait"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// gauges gathers the store's collectors of state and entries into
// "name{kind}" → value (kind empty for the series without one).
func gauges(t *testing.T) map[string]float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	for _, c := range []prometheus.Collector{stateCollector, entriesCollector} {
		if err := reg.Register(c); err != nil {
			t.Fatal(err)
		}
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			kind := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" {
					kind = l.GetValue()
				}
			}
			got[f.GetName()+"{"+kind+"}"] = m.GetGauge().GetValue()
		}
	}
	return got
}

// TestRedisStateMetrics: the store reports its timeout, its breaker open
// while Redis does not answer (and closed once it does again), the
// bounds of its entries, and counts the requests its local fallback
// decided, unless its handler has disable_metrics.
func TestRedisStateMetrics(t *testing.T) {
	s := redistest.Standalone(t)
	r := newRedisStore(t, &Store{Timeout: caddy.Duration(50 * time.Millisecond)}, s.URL())
	req := storage.Request{Zone: "z", Key: "k", Algorithm: algorithms.SlidingTail, Rate: algorithms.Rate{Units: 1000, Window: time.Minute}, Cost: 1}
	take := func() error {
		return r.Take(context.Background(), []storage.Request{req}, make([]algorithms.Decision, 1))
	}
	if err := take(); err != nil {
		t.Fatal(err)
	}
	g := gauges(t)
	for name, want := range map[string]float64{
		"caddy_http_rate_limit_store_timeout_seconds{}":      0.05,
		"caddy_http_rate_limit_store_breaker_open{}":         0,
		"caddy_http_rate_limit_store_entries_bound{leases}":  maxLeaseRecords,
		"caddy_http_rate_limit_store_entries_bound{denials}": denyCacheShards * denyShardSize,
		"caddy_http_rate_limit_store_entries_bound{owed}":    maxOwed,
	} {
		if got, ok := g[name]; !ok || got != want {
			t.Errorf("%s = %v (reported: %t), want %v", name, got, ok, want)
		}
	}

	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	for range breakerThreshold {
		if err := take(); err == nil {
			t.Fatal("a paused Redis answered")
		}
	}
	if err := take(); !errors.Is(err, errBreakerOpen) {
		t.Fatalf("breaker not open: %v", err)
	}
	if open := gauges(t)["caddy_http_rate_limit_store_breaker_open{}"]; open != 1 {
		t.Errorf("breaker_open = %v with the breaker open, want 1", open)
	}
	decided := promtest.Counter(t, metrics.fallback, nil)
	if err := r.Local().Take(context.Background(), []storage.Request{req}, make([]algorithms.Decision, 1)); err != nil {
		t.Fatal(err)
	}
	if got := promtest.Counter(t, metrics.fallback, nil); got != decided+1 {
		t.Errorf("fallback decisions %v after one, want %v", got, decided+1)
	}
	// A handler with disable_metrics leaves its fallback's decisions
	// uncounted.
	r.DisableMetrics()
	if err := r.Local().Take(context.Background(), []storage.Request{req}, make([]algorithms.Decision, 1)); err != nil {
		t.Fatal(err)
	}
	if got := promtest.Counter(t, metrics.fallback, nil); got != decided+1 {
		t.Errorf("fallback decisions %v after one with disable_metrics, want %v still", got, decided+1)
	}

	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "decisions succeed again", func() bool { return take() == nil })
	if open := gauges(t)["caddy_http_rate_limit_store_breaker_open{}"]; open != 0 {
		t.Errorf("breaker_open = %v once Redis answers again, want 0", open)
	}
}
