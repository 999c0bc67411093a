package ratelimit

import (
	"fmt"
	"net/http"
	"strconv"
	"testing"
)

// TestZoneStatus: a zone's rejections answer with its status (default
// 429), with Retry-After and the limit headers, whatever the algorithm;
// handle_errors shapes them as it does a 429; the app never sees them.
func TestZoneStatus(t *testing.T) {
	a := newApp(t)
	tc := startCaddy(t, fmt.Sprintf(`
:9080 {
	rate_limit /fixed* {
		zone status_fixed {
			key {header.X-Client}
			limit 1
			window 1h
			algorithm fixed_window
			status 503
		}
	}
	rate_limit /sliding* {
		zone status_sliding {
			key {header.X-Client}
			limit 1
			window 1h
			algorithm sliding_tail
			status 418
		}
	}
	rate_limit /default* {
		zone status_default {
			key {header.X-Client}
			limit 1
			window 1h
		}
	}
	reverse_proxy %s
	handle_errors 503 418 {
		respond "shaped {http.error.status_code} ({http.rate_limit.zone}), retry in {http.response.header.Retry-After}s" {http.error.status_code}
	}
}
`, a.url))
	for _, c := range []struct {
		path, zone string
		status     int
		shaped     bool
	}{
		{"/fixed", "status_fixed", http.StatusServiceUnavailable, true},
		{"/sliding", "status_sliding", http.StatusTeapot, true},
		{"/default", "status_default", http.StatusTooManyRequests, false},
	} {
		t.Run(c.zone, func(t *testing.T) {
			resp, body := do(t, tc, http.MethodGet, siteURL+c.path, "X-Client: c")
			status(t, resp, http.StatusOK)
			if body != "app" {
				t.Fatalf("first request: %q", body)
			}
			hits := a.hits.Load()
			resp, body = do(t, tc, http.MethodGet, siteURL+c.path, "X-Client: c")
			status(t, resp, c.status)
			ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
			if err != nil || ra < 1 {
				t.Fatalf("Retry-After %q", resp.Header.Get("Retry-After"))
			}
			if resp.Header.Get("X-RateLimit-Remaining") != "0" {
				t.Fatalf("limit headers lost: %v", resp.Header)
			}
			if c.shaped {
				if want := fmt.Sprintf("shaped %d (%s), retry in %ds", c.status, c.zone, ra); body != want {
					t.Fatalf("body %q, want %q", body, want)
				}
			}
			if a.hits.Load() != hits {
				t.Fatal("the app saw a rejected request")
			}
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
