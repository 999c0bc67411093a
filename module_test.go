package ratelimit

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/d61b427a/caddy-rate-limit/internal/badconfig"
)

// TestBadJSONRefused covers mistakes only JSON can make (the Caddyfile
// parser already refuses them) at `caddy validate` and at POST /load.
func TestBadJSONRefused(t *testing.T) {
	cases := []struct {
		name, handler, directive, value string
	}{
		{"zero limit", `{"zones":[{"name":"z","limit":[0],"window":"1s"}]}`, "limit", "0"},
		{"no limit", `{"zones":[{"name":"z","window":"1s"}]}`, "limit", "missing"},
		{"negative window", `{"zones":[{"name":"z","limit":[1],"window":"-1s"}]}`, "window", "-1s"},
		{"algorithm", `{"zones":[{"name":"z","limit":[1],"window":"1s","algorithm":"leaky_bucket"}]}`, "algorithm", "leaky_bucket"},
		{"calendar period", `{"zones":[{"name":"z","limit":[1],"window":"fortnight"}]}`, "window", "fortnight"},
		{"calendar period with gcra", `{"zones":[{"name":"z","limit":[1],"window":"month","algorithm":"gcra"}]}`, "window", "fixed_window or sliding_tail"},
		{"time zone", `{"zones":[{"name":"z","limit":[1],"window":"month","timezone":"Mars/Olympus_Mons"}]}`, "timezone", "Mars/Olympus_Mons"},
		{"time zone without a calendar period", `{"zones":[{"name":"z","limit":[1],"window":"1h","timezone":"Europe/Paris"}]}`, "timezone", "Europe/Paris"},
		{"burst outside gcra", `{"zones":[{"name":"z","limit":[1],"window":"1s","burst":5}]}`, "burst", "sliding_tail"},
		{"hold outside concurrency", `{"zones":[{"name":"z","limit":[1],"window":"1s","algorithm":"gcra","hold":60000000000}]}`, "hold", "gcra"},
		{"lease (hold's old name) outside concurrency", `{"zones":[{"name":"z","limit":[1],"window":"1s","algorithm":"gcra","lease":60000000000}]}`, "lease", "gcra"},
		{"hold and its old name", `{"zones":[{"name":"z","limit":[1],"algorithm":"concurrency","hold":"1m","lease":"2m"}]}`, "lease", "hold"},
		{"concurrency window", `{"zones":[{"name":"z","limit":[1],"window":"1s","algorithm":"concurrency"}]}`, "window", "concurrency"},
		{"gcra bucket too deep", `{"zones":[{"name":"z","limit":[1],"window":"8760h","algorithm":"gcra","burst":2147483647}]}`, "burst", "2147483647"},
		{"duplicate", `{"zones":[{"name":"z","limit":[1],"window":"1s"},{"name":"z","limit":[1],"window":"1s"}]}`, "duplicate zone", `"z"`},
		{"cost method", `{"zones":[{"name":"z","limit":[1],"window":"1s","cost":{"get":2}}]}`, "unknown HTTP method", "get"},
		{"unnamed", `{"zones":[{"limit":[1],"window":"1s"}]}`, "zone", "name"},
		{"named .", `{"zones":[{"name":".","limit":[1],"window":"1s"}]}`, "name", `"."`},
		{"named ..", `{"zones":[{"name":"..","limit":[1],"window":"1s"}]}`, "name", `".."`},
		{"limit type", `{"zones":[{"name":"z","limit":[true],"window":"1s"}]}`, "limit", "true"},
		{"null zone", `{"zones":[null]}`, "zones", "null"},
		{"negative max_keys", `{"store":{"backend":"memory","max_keys":-5},"zones":[{"name":"z","limit":[1],"window":"1s"}]}`, "max_keys", "-5"},
		{"zone status", `{"zones":[{"name":"z","limit":[1],"window":"1s","status":302}]}`, "status", "302"},
		{"buckets", `{"zones":[{"name":"z","limit":[1],"window":"1s","algorithm":"sliding_window","buckets":100}]}`, "buckets", "100"},
		{"buckets outside sliding_window", `{"zones":[{"name":"z","limit":[1],"window":"1s","algorithm":"gcra","buckets":5}]}`, "buckets", "gcra"},
		{"count_status", `{"zones":[{"name":"z","limit":[1],"window":"1s","count_status":[401,700]}]}`, "count_status", "700"},
		{"count_status type", `{"zones":[{"name":"z","limit":[1],"window":"1s","count_status":[true]}]}`, "count_status", "true"},
		{"ban", `{"zones":[{"name":"z","limit":[1],"window":"1s","ban":"10ms"}]}`, "ban", "10ms"},
		{"ban concurrency", `{"zones":[{"name":"z","limit":[1],"algorithm":"concurrency","ban":"1h"}]}`, "ban", "concurrency"},
		{"shed classes", `{"shed":{"classes":[],"capacity":4}}`, "classes", "missing"},
		{"shed repeated class", `{"shed":{"classes":["a","a"],"capacity":4}}`, "classes", `"a"`},
		{"shed capacity", `{"shed":{"classes":["a"],"capacity":-1}}`, "capacity", "-1"},
		{"shed no capacity", `{"shed":{"classes":["a"]}}`, "capacity", "missing"},
		{"shed good", `{"shed":{"classes":["a"],"capacity":4,"good":1.2}}`, "good", "1.2"},
		{"shed good above bad", `{"shed":{"classes":["a"],"capacity":4,"good":0.6,"bad":0.5}}`, "good", "0.6"},
		{"shed after", `{"shed":{"classes":["a"],"capacity":4,"after":"-1s"}}`, "after", "-1s"},
		{"shed full", `{"shed":{"classes":["a"],"capacity":4,"full":"-2s"}}`, "full", "-2s"},
		{"shed status", `{"shed":{"classes":["a"],"capacity":4,"status":302}}`, "status", "302"},
		{"shedder name", `{"shed":{"name":"caf\u00e9","classes":["a"],"capacity":4}}`, "name", "caf"},
		{"mholt distributed", `{"distributed":{},"zones":[{"name":"z","limit":[1],"window":"1s"}]}`, "distributed", "store redis { address ... }"},
		{"mholt storage", `{"storage":{"module":"file_system","root":"/tmp/rl"},"zones":[{"name":"z","limit":[1],"window":"1s"}]}`, "storage", "store redis { address ... }"},
		{"jitter", `{"jitter":2,"zones":[{"name":"z","limit":[1],"window":"1s"}]}`, "jitter", "2"},
		{"sweep_interval", `{"sweep_interval":"-1s","zones":[{"name":"z","limit":[1],"window":"1s"}]}`, "sweep_interval", "-1s"},
		{"log_key and log_keys", `{"log_key":true,"log_keys":"on","zones":[{"name":"z","limit":[1],"window":"1s"}]}`, "log_key", "log_keys"},
		{"admin_changes", `{"admin_changes":"never","zones":[{"name":"z","limit":[1],"window":"1s"}]}`, "admin_changes", "never"},
		{"cost_from neither", `{"zones":[{"name":"z","limit":[100],"window":"1m","cost_from":{},"reserve":{"units":10}}]}`, "cost_from", "neither"},
		{"cost_from both", `{"zones":[{"name":"z","limit":[100],"window":"1m","cost_from":{"usage":"output","header":"X-Cost"},"reserve":{"units":10}}]}`, "cost_from", "not both"},
		{"cost_from usage", `{"zones":[{"name":"z","limit":[100],"window":"1m","cost_from":{"usage":"prompt"},"reserve":{"units":10}}]}`, "cost_from", "prompt"},
		{"cost_from without reserve", `{"zones":[{"name":"z","limit":[100],"window":"1m","cost_from":{"usage":"output"}}]}`, "reserve", "missing"},
		{"cost_from concurrency", `{"zones":[{"name":"z","limit":[100],"algorithm":"concurrency","cost_from":{"usage":"output"},"reserve":{"units":10}}]}`, "cost_from", "concurrency"},
		{"reserve both", `{"zones":[{"name":"z","limit":[100],"window":"1m","cost_from":{"usage":"output"},"reserve":{"units":10,"max_tokens":5}}]}`, "reserve", "not both"},
		{"reserve neither", `{"zones":[{"name":"z","limit":[100],"window":"1m","cost_from":{"usage":"output"},"reserve":{}}]}`, "reserve", "neither"},
		{"reserve negative", `{"zones":[{"name":"z","limit":[100],"window":"1m","cost_from":{"usage":"output"},"reserve":{"units":-1}}]}`, "reserve", "-1"},
		{"reserve without cost_from", `{"zones":[{"name":"z","limit":[100],"window":"1m","reserve":{"units":10}}]}`, "reserve", "cost_from"},
		{"usage_in_stream", `{"zones":[{"name":"z","limit":[100],"window":"1m","cost_from":{"usage":"output"},"reserve":{"units":10},"usage_in_stream":"yes"}]}`, "usage_in_stream", "yes"},
		{"usage_in_stream without cost_from", `{"zones":[{"name":"z","limit":[100],"window":"1m","usage_in_stream":"on"}]}`, "usage_in_stream", "cost_from usage"},
		{"zone name", `{"zones":[{"name":"z\u00f6ne","limit":[1],"window":"1s"}]}`, "name", "0xc3"},
		{"zone name with CR LF", `{"zones":[{"name":"a\r\nX-Injected: 1","limit":[1],"window":"1s"}]}`, "name", `zone "a\r\nX-Injected: 1"`},
		{"zone name with NUL", `{"zones":[{"name":"a\u0000b","limit":[1],"window":"1s"}]}`, "name", `zone "a\x00b"`},
		{"shedder name with LF", `{"shed":{"name":"a\nb","classes":["a"],"capacity":4}}`, "name", `"a\nb"`},
		{"body_memory", `{"body_memory":1024,"zones":[{"name":"z","limit":[1],"window":"1s"}]}`, "body_memory", "1024"},
		{"body_timeout", `{"body_timeout":"500ms","zones":[{"name":"z","limit":[1],"window":"1s"}]}`, "body_timeout", "500ms"},
		{"cost above the limit", `{"zones":[{"name":"z","limit":[10],"window":"1s","cost":{"*":11}}]}`, "cost", "11"},
		{"reserve above the burst", `{"zones":[{"name":"z","limit":[100],"window":"1s","algorithm":"gcra","burst":5,"cost_from":{"header":"X-Cost"},"reserve":{"units":6}}]}`, "reserve", "6"},
		{"price without usage price", `{"zones":[{"name":"z","limit":[100],"window":"1m","cost_from":{"usage":"total","price":[{"model":"*","input":"1","output":"1"}]},"reserve":{"max_tokens":10}}]}`, "price", "total"},
		{"usage price without lines", `{"zones":[{"name":"z","limit":["$1"],"window":"1m","cost_from":{"usage":"price"},"reserve":{"max_tokens":10}}]}`, "price", "none"},
		{"price model", `{"zones":[{"name":"z","limit":["$1"],"window":"1m","cost_from":{"usage":"price","price":[{"model":"a b","input":"1","output":"1"}]},"reserve":{"max_tokens":10}}]}`, "price", "a b"},
		{"price as a number", `{"zones":[{"name":"z","limit":["$1"],"window":"1m","cost_from":{"usage":"price","price":[{"model":"m","input":1e-9,"output":"1"}]},"reserve":{"max_tokens":10}}]}`, "input", "1e-9"},
		{"money limit as a number", `{"zones":[{"name":"z","limit":[50],"window":"1m","cost_from":{"usage":"price","price":[{"model":"*","input":"1","output":"1"}]},"reserve":{"max_tokens":10}}]}`, "limit", "50"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var h map[string]any
			if err := json.Unmarshal([]byte(c.handler), &h); err != nil {
				t.Fatal(err)
			}
			h["handler"] = "rate_limit"
			cfg := map[string]any{"apps": map[string]any{"http": map[string]any{"servers": map[string]any{
				"s": map[string]any{"listen": []string{"127.0.0.1:0"}, "routes": []any{map[string]any{"handle": []any{h}}}},
			}}}}
			raw, _ := json.Marshal(cfg)
			var parsed caddy.Config
			if err := json.Unmarshal(raw, &parsed); err != nil {
				t.Fatal(err)
			}
			err := caddy.Validate(&parsed)
			if err == nil {
				t.Fatal("validated")
			}
			badconfig.AssertNames(t, err.Error(), c.directive, c.value)
		})
	}
}

// TestZoneStatusJSON: the status of a JSON zone, and its default.
func TestZoneStatusJSON(t *testing.T) {
	h := provisionHandler(t, `{"zones":[{"name":"unit_status_json","limit":1,"window":"1h","status":503},{"name":"unit_status_json_default","limit":5,"window":"1h"}]}`)
	if h.Zones[1].Status != http.StatusTooManyRequests {
		t.Fatalf("default status %d", h.Zones[1].Status)
	}
	serve(t, h, t.Context(), http.MethodGet, "192.0.2.1")
	got := serve(t, h, t.Context(), http.MethodGet, "192.0.2.1")
	if got.status != http.StatusServiceUnavailable || got.reached || got.header.Get("Retry-After") == "" {
		t.Fatalf("status %d, reached %v, Retry-After %q", got.status, got.reached, got.header.Get("Retry-After"))
	}
}
