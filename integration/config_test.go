package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/d61b427a/caddy-rate-limit/internal/badconfig"
)

// TestBadConfigRefusedAtLoadKeepsOldConfig posts each bad Caddyfile to the
// admin API and checks that the running config keeps serving, counters and
// all.
func TestBadConfigRefusedAtLoadKeepsOldConfig(t *testing.T) {
	startCaddy(t, `
`+siteAddr+` {
	rate_limit {
		zone good {
			limit 2
			window 1h
		}
	}
	respond "good"
}
`)
	resp, _ := do(t, http.MethodGet, siteURL+"/")
	status(t, resp, http.StatusOK)
	for _, c := range badconfig.Caddyfiles {
		code, body := reload(t, badconfig.Site(c.Block))
		if code == http.StatusOK {
			t.Fatalf("%s: loaded", c.Name)
		}
		// The error as Caddy wrote it, not as JSON escapes it.
		var answer struct{ Error string }
		if err := json.Unmarshal([]byte(body), &answer); err != nil {
			t.Fatalf("%s: %d %s, want Caddy's JSON error", c.Name, code, body)
		}
		badconfig.AssertNames(t, answer.Error, c.Directive, c.Value)
	}
	resp, body := do(t, http.MethodGet, siteURL+"/")
	status(t, resp, http.StatusOK)
	if body != "good" {
		t.Fatalf("old config replaced: %q", body)
	}
	resp, _ = do(t, http.MethodGet, siteURL+"/")
	status(t, resp, http.StatusTooManyRequests)
}

func TestJSONConfig(t *testing.T) {
	startCaddy(t, `{
	"apps": {"http": {"http_port": `+fmt.Sprint(sitePort)+`, "servers": {"srv": {
		"listen": ["`+siteListen+`"],
		"routes": [{"handle": [
			{
				"handler": "rate_limit",
				"headers": "both",
				"store": {"backend": "memory", "max_keys": 1000},
				"zones": [{
					"name": "json_zone",
					"match": [{"path": ["/limited"]}],
					"key": "{http.request.header.X-Api-Key}",
					"limit": [ "{http.request.header.X-Quota}", 2 ],
					"window": "1h",
					"algorithm": "fixed_window",
					"cost": {"POST": 2}
				}]
			},
			{"handler": "static_response", "body": "ok"}
		]}]
	}}}}
}`)
	resp, _ := do(t, http.MethodPost, siteURL+"/limited", "X-Api-Key: k")
	status(t, resp, http.StatusOK)
	if resp.Header.Get("RateLimit-Policy") != `"json_zone";q=2;w=3600` {
		t.Fatalf("headers %v", resp.Header)
	}
	resp, _ = do(t, http.MethodGet, siteURL+"/limited", "X-Api-Key: k")
	status(t, resp, http.StatusTooManyRequests)
	resp, _ = do(t, http.MethodGet, siteURL+"/other", "X-Api-Key: k")
	status(t, resp, http.StatusOK)
}
