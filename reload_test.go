package ratelimit

import (
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestJSONConfig(t *testing.T) {
	tc := startCaddyWith(t, `{
	"admin": {"listen": "localhost:2999"},
	"apps": {"http": {"http_port": 9080, "servers": {"srv": {
		"listen": [":9080"],
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
}`, "json")
	resp, _ := do(t, tc, http.MethodPost, siteURL+"/limited", "X-Api-Key: k")
	status(t, resp, http.StatusOK)
	if resp.Header.Get("RateLimit-Policy") != `"json_zone";q=2;w=3600` {
		t.Fatalf("headers %v", resp.Header)
	}
	resp, _ = do(t, tc, http.MethodGet, siteURL+"/limited", "X-Api-Key: k")
	status(t, resp, http.StatusTooManyRequests)
	resp, _ = do(t, tc, http.MethodGet, siteURL+"/other", "X-Api-Key: k")
	status(t, resp, http.StatusOK)
}

func TestReloadKeepsCounters(t *testing.T) {
	site := `
:9080 {
	rate_limit {
		zone reload {
			limit 3
			window 1h
		}
	}
	respond "%s"
}
`
	tc := startCaddy(t, fmt.Sprintf(site, "v1"))
	for i := 0; i < 2; i++ {
		resp, _ := do(t, tc, http.MethodGet, siteURL+"/")
		status(t, resp, http.StatusOK)
	}
	if code, body := loadConfig(t, fmt.Sprintf(site, "v2")); code != http.StatusOK {
		t.Fatalf("reload: %d %s", code, body)
	}
	resp, body := do(t, tc, http.MethodGet, siteURL+"/")
	status(t, resp, http.StatusOK)
	if body != "v2" {
		t.Fatalf("new config not serving: %q", body)
	}
	resp, _ = do(t, tc, http.MethodGet, siteURL+"/")
	status(t, resp, http.StatusTooManyRequests)
}

// memorySweeperRunning reports whether the memory store's background sweep
// goroutine exists in this process.
func memorySweeperRunning() bool {
	buf := make([]byte, 1<<20)
	return strings.Contains(string(buf[:runtime.Stack(buf, true)]), "storage.(*memoryCounters).sweepLoop")
}

// TestMemoryStoreStopsWhenUnused: the memory store's sweeper runs while a
// config uses the store, survives a reload to another such config, and stops
// once a reload leaves no config using it.
func TestMemoryStoreStopsWhenUnused(t *testing.T) {
	limited := `
:9080 {
	rate_limit {
		zone sweeper {
			limit 5
			window 1h
		}
	}
	respond "%s"
}
`
	startCaddy(t, fmt.Sprintf(limited, "v1"))
	if !memorySweeperRunning() {
		t.Fatal("no sweeper while a config uses the memory store")
	}
	if code, body := loadConfig(t, fmt.Sprintf(limited, "v2")); code != http.StatusOK {
		t.Fatalf("reload: %d %s", code, body)
	}
	if !memorySweeperRunning() {
		t.Fatal("sweeper stopped across a reload that still uses the store")
	}
	if code, body := loadConfig(t, ":9080 {\n\trespond \"plain\"\n}\n"); code != http.StatusOK {
		t.Fatalf("reload: %d %s", code, body)
	}
	deadline := time.Now().Add(10 * time.Second)
	for memorySweeperRunning() {
		if time.Now().After(deadline) {
			t.Fatal("sweeper still running with no config using the memory store")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
