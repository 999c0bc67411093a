package ratelimit

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/d61b427a/caddy-rate-limit/storage/memory"
)

// TestMholtOptionsInJSON: the handler options go under the same names in
// JSON, log_key as the log_keys on it stands for. (The Caddyfile's forms
// are in testdata/caddyfile_adapt: handler_options, mholt_names;
// TestBadJSONRefused refuses distributed and storage in JSON, with what to
// write instead.)
func TestMholtOptionsInJSON(t *testing.T) {
	h := provisionHandler(t, `{"jitter":0.2,"sweep_interval":"1m","log_key":true,"disable_metrics":true,
		"zones":[{"name":"unit_json_options","limit":1,"window":"1h"}]}`)
	if h.Jitter != 0.2 || h.SweepInterval != caddy.Duration(time.Minute) || h.LogKeys != "on" || !h.showKeys || !h.DisableMetrics || h.random == nil {
		t.Fatalf("options not read: %+v", h)
	}
}

// TestSweepIntervalReachesTheStore: sweep_interval asks the memory store,
// which every config shares, for its interval; the shortest asked for is
// in force while its config runs, and the default once it is cleaned up.
// (The store's own tests show that a sweep at that interval empties the
// slots of expired keys.)
func TestSweepIntervalReachesTheStore(t *testing.T) {
	// The config that asks is provisioned in a context of its own, whose
	// end cleans up its modules, as Caddy's does when a config is replaced.
	var asking Handler
	if err := json.Unmarshal([]byte(`{"sweep_interval":"50ms","zones":[{"name":"unit_sweep","limit":5,"window":"100ms"}]}`), &asking); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	if err := asking.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	defer asking.Cleanup()
	mem := asking.store.(*memory.Store)
	if got := mem.SweepInterval(); got != 50*time.Millisecond {
		t.Fatalf("interval in force %s, want the config's 50ms", got)
	}
	other := provisionHandler(t, `{"zones":[{"name":"unit_sweep_default","limit":5,"window":"1m"}]}`)
	if got := mem.SweepInterval(); got != 50*time.Millisecond {
		t.Fatalf("a config without sweep_interval moved it to %s", got)
	}
	cancel()
	if got := other.store.(*memory.Store).SweepInterval(); got != memory.DefaultSweepInterval {
		t.Fatalf("after the config that asked went: %s, want the default %s", got, memory.DefaultSweepInterval)
	}
}

// TestHandlerJSONStaysStrict: reading mholt/caddy-ratelimit's fields
// beside the handler's keeps the decoding as strict as Caddy's own: a
// misspelt field, of the handler or of a zone, is refused, not dropped.
func TestHandlerJSONStaysStrict(t *testing.T) {
	for _, c := range []struct{ config, field string }{
		{`{"log_kyes":"on","zones":[{"name":"z","limit":1,"window":"1s"}]}`, "log_kyes"},
		{`{"zones":[{"name":"z","limit":1,"window":"1s","windw":"1m"}]}`, "windw"},
	} {
		var h Handler
		err := json.Unmarshal([]byte(c.config), &h)
		if err == nil || !strings.Contains(err.Error(), `unknown field "`+c.field+`"`) {
			t.Errorf("%s: %v, want %s refused as an unknown field", c.config, err, c.field)
		}
	}
	var h Handler
	if err := json.Unmarshal([]byte(`{"log_key":false,"log_keys":"off","zones":[{"name":"z","limit":1,"window":"1s"}]}`), &h); err != nil || h.LogKeys != "off" {
		t.Fatalf("log_key false beside log_keys off: %v, log_keys %q", err, h.LogKeys)
	}
}
