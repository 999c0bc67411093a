package ratelimit_test

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

func init() {
	caddy.RegisterModule(eventRecorder{})
}

// eventRecorder is an event handler that keeps what it is handed, so a
// test can see the events a config's rate limiter emitted.
type eventRecorder struct{}

func (eventRecorder) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "events.handlers.rate_limit_test_recorder",
		New: func() caddy.Module { return eventRecorder{} },
	}
}

var recorded struct {
	sync.Mutex
	events []caddy.Event
}

func (eventRecorder) Handle(_ context.Context, e caddy.Event) error {
	recorded.Lock()
	defer recorded.Unlock()
	recorded.events = append(recorded.events, e)
	return nil
}

// recordedEvents returns the rate_limit_exceeded events recorded so far.
func recordedEvents() []caddy.Event {
	recorded.Lock()
	defer recorded.Unlock()
	var out []caddy.Event
	for _, e := range recorded.events {
		if e.Name() == "rate_limit_exceeded" {
			out = append(out, e)
		}
	}
	return out
}

// startCaddyWithEvents loads sites, as startCaddy does, with an events
// app that hands every event to eventRecorder.
func startCaddyWithEvents(t *testing.T, sites string) {
	t.Helper()
	integration(t)
	adapted, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(globalOptions+sites), nil)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(adapted, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["apps"].(map[string]any)["events"] = map[string]any{
		"subscriptions": []any{map[string]any{
			"events":   []string{"rate_limit_exceeded"},
			"handlers": []any{map[string]any{"handler": "rate_limit_test_recorder"}},
		}},
	}
	config, _ := json.Marshal(cfg)
	recorded.Lock()
	recorded.events = nil
	recorded.Unlock()
	startCaddyWith(t, string(config), "json")
}

// TestExceededEvents: a flood of 10,000 rejected requests from one key in
// one window emits one rate_limit_exceeded event, with the zone, the key,
// the client's address and the seconds to wait; another key has its own;
// a zone with log_keys off leaves the key out; a banned key's event says
// when its ban ends.
func TestExceededEvents(t *testing.T) {
	startCaddyWithEvents(t, `
:9080 {
	rate_limit {
		zone ev_flood {
			key {header.X-Client}
			limit 1
			window 1h
		}
	}
	respond "ok"
}
:9081 {
	rate_limit {
		log_keys off
		zone ev_hidden {
			key {header.X-Client}
			limit 1
			window 1h
			ban 1h
		}
	}
	respond "ok"
}
`)
	hc := &http.Client{}
	send := func(url, client string) int {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Header.Set("X-Client", client)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	rejected := 0
	for range 10_001 {
		if send(siteURL, "flood") == http.StatusTooManyRequests {
			rejected++
		}
	}
	if rejected != 10_000 {
		t.Fatalf("%d rejected, want 10,000", rejected)
	}
	events := recordedEvents()
	if len(events) != 1 {
		t.Fatalf("%d events for 10,000 rejections of one key in one window, want 1", len(events))
	}
	d := events[0].Data
	if ra := d["retry_after"].(int64); d["zone"] != "ev_flood" || d["key"] != "flood" || d["remote_ip"] != "127.0.0.1" || ra < 1 || ra > 3600 {
		t.Fatalf("event data %v, want zone ev_flood, key flood, remote_ip 127.0.0.1 and retry_after up to the window's end", d)
	}
	send(siteURL, "other")
	send(siteURL, "other")
	if n := len(recordedEvents()); n != 2 {
		t.Fatalf("%d events after another key's rejection, want 2", n)
	}
	send("http://localhost:9081/", "secret")
	send("http://localhost:9081/", "secret")
	events = recordedEvents()
	if len(events) != 3 {
		t.Fatalf("%d events after the hidden zone's rejection, want 3", len(events))
	}
	d = events[2].Data
	if _, ok := d["key"]; ok || d["zone"] != "ev_hidden" || d["ban_ends"] == nil {
		t.Fatalf("hidden zone's event data %v, want no key and the ban's end", d)
	}
}
