package integration

import (
	"fmt"
	"net/http"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
	"github.com/d61b427a/caddy-rate-limit/internal/wait"
)

func TestReloadKeepsCounters(t *testing.T) {
	site := `
` + siteAddr + ` {
	rate_limit {
		zone reload {
			limit 3
			window 1h
		}
	}
	respond "%s"
}
`
	startCaddy(t, fmt.Sprintf(site, "v1"))
	for i := 0; i < 2; i++ {
		resp, _ := do(t, http.MethodGet, siteURL+"/")
		status(t, resp, http.StatusOK)
	}
	if code, body := reload(t, fmt.Sprintf(site, "v2")); code != http.StatusOK {
		t.Fatalf("reload: %d %s", code, body)
	}
	resp, body := do(t, http.MethodGet, siteURL+"/")
	status(t, resp, http.StatusOK)
	if body != "v2" {
		t.Fatalf("new config not serving: %q", body)
	}
	resp, _ = do(t, http.MethodGet, siteURL+"/")
	status(t, resp, http.StatusTooManyRequests)
}

// TestMemoryCountersGoWithTheLastConfig: the memory store's counters
// outlive a reload to another config that uses the store, and go with the
// last config that uses it: a key limited before is fresh once a config
// uses the store again. (storage/memory's TestMemorySharedAcrossProvisions
// shows its sweeper stopping then.)
func TestMemoryCountersGoWithTheLastConfig(t *testing.T) {
	limited := func(limit int, body string) string {
		return fmt.Sprintf(`
`+siteAddr+` {
	rate_limit {
		zone last_config {
			limit %d
			window 1h
		}
	}
	respond %q
}
`, limit, body)
	}
	served := func(want int, wantBody string) {
		t.Helper()
		resp, body := do(t, http.MethodGet, siteURL+"/")
		if resp.StatusCode != want || want == http.StatusOK && body != wantBody {
			t.Fatalf("%d %q, want %d %q", resp.StatusCode, body, want, wantBody)
		}
	}
	startCaddy(t, limited(1, "v1"))
	served(http.StatusOK, "v1")
	served(http.StatusTooManyRequests, "")

	// A limit of 2 leaves the key one more request: the one v1 took is
	// still counted.
	mustReload(t, limited(2, "v2"))
	served(http.StatusOK, "v2")
	served(http.StatusTooManyRequests, "")

	mustReload(t, siteAddr+" {\n\trespond \"plain\"\n}\n")
	served(http.StatusOK, "plain")
	mustReload(t, limited(1, "v3"))
	served(http.StatusOK, "v3")
}

// TestRedisReloadsUnderLoad reloads, under load, between two configs that
// differ only in the Redis store's timeout, so each reload moves to
// another shared client and lets go of the old one. Requests of the old
// config still running must finish on open connections: no store error
// (no 503 with on_store_error deny, no uncounted request with allow),
// and afterwards as many Redis connections and goroutines as before.
func TestRedisReloadsUnderLoad(t *testing.T) {
	const reloads = 30
	for _, mode := range []string{"deny", "allow"} {
		t.Run(mode, func(t *testing.T) {
			s := redistest.Standalone(t)
			site := func(timeout string) string {
				return redisSite("address "+s.URL()+"\ntimeout "+timeout, 1_000_000, "on_store_error "+mode)
			}
			// The timeouts are generous so that a busy machine causes no
			// store error; the reloads change them, and so the client.
			startCaddy(t, site("5s"))
			get(t, siteURL+"/", "warm")
			baseClients, err := s.Clients("caddy-rate-limit")
			if err != nil {
				t.Fatal(err)
			}
			baseGoroutines := runtime.NumGoroutine()

			l := startLoad(t, 16, "load")
			l.progress(t, 200)
			for i := range reloads {
				timeout := "5s"
				if i%2 == 0 {
					timeout = "6s"
				}
				if code, body := reload(t, site(timeout)); code != 200 {
					t.Fatalf("reload %d: %d %s", i, code, body)
				}
				l.progress(t, 50)
			}
			byStatus, failed, lastErr := l.end()
			counted, err := s.Do("HGET", counterKey(t, s, "per_client", clientKey("load")), "c")
			if err != nil {
				t.Fatal(err)
			}
			n, _ := strconv.Atoi(counted)
			t.Logf("%d reloads under load: answers by status %v, %d without an answer (last: %v), %d counted in Redis", reloads, byStatus, failed, lastErr, n)
			if byStatus[http.StatusServiceUnavailable] != 0 {
				t.Errorf("%d × 503: store errors during reloads", byStatus[http.StatusServiceUnavailable])
			}
			// A request that got no answer may or may not have been counted.
			if ok := byStatus[http.StatusOK]; n < ok || n > ok+failed {
				t.Errorf("Redis counted %d requests; %d were answered 200 and %d got no answer: every allowed request must be counted once", n, ok, failed)
			}

			// A config with a client of its own, used by one request at a
			// time: every client before it must be closed.
			if code, body := reload(t, site("7s")); code != 200 {
				t.Fatal(code, body)
			}
			get(t, siteURL+"/", "settle")
			wait.For(t, fmt.Sprintf("the Redis connections (%d at the start) and the goroutines (%d) to come back", baseClients, baseGoroutines), func() bool {
				nc, _ := s.Clients("caddy-rate-limit")
				return nc <= baseClients && runtime.NumGoroutine() <= baseGoroutines+2
			})
		})
	}
}

// TestRedisReloads reloads the config 100 times through the admin API and
// checks that the Redis connections and the goroutines are where they
// started: configs share one client, and the last one to go closes it.
func TestRedisReloads(t *testing.T) {
	s := redistest.Standalone(t)
	other := redistest.Standalone(t)
	store := "address " + s.URL()
	startCaddy(t, redisSite(store, 1000, ""))
	get(t, siteURL+"/", "warm")

	clients := func(s *redistest.Server) int {
		n, err := s.Clients("caddy-rate-limit")
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	baseClients := clients(s)
	baseGoroutines := runtime.NumGoroutine()
	if baseClients < 1 {
		t.Fatalf("%d Redis clients before reloading", baseClients)
	}

	const reloads = 100
	for i := range reloads {
		if code, body := reload(t, redisSite(store, 1000+i, "")); code != 200 {
			t.Fatalf("reload %d: %d %s", i, code, body)
		}
		if code := get(t, siteURL+"/", "reload"); code != 200 {
			t.Fatalf("request after reload %d: %d", i, code)
		}
	}
	if c, err := s.Do("HGET", counterKey(t, s, "per_client", clientKey("reload")), "c"); err != nil || c != strconv.Itoa(reloads) {
		t.Fatalf("counter after %d reloads: %q %v, want %d: counts survive reloads", reloads, c, err, reloads)
	}
	var nc, ng int
	wait.For(t, "the Redis clients and goroutines to come back", func() bool {
		nc, ng = clients(s), runtime.NumGoroutine()
		return nc <= baseClients && ng <= baseGoroutines+2
	})
	t.Logf("after %d reloads: %d Redis clients (started with %d), %d goroutines (started with %d)", reloads, nc, baseClients, ng, baseGoroutines)

	// Moving to another Redis closes the old connections; moving away
	// from Redis closes the rest.
	if code, body := reload(t, redisSite("address "+other.URL(), 1000, "")); code != 200 {
		t.Fatal(code, body)
	}
	get(t, siteURL+"/", "moved")
	wait.For(t, "the Redis connections to settle", func() bool { return clients(s) == 0 && clients(other) >= 1 })
	if code, body := reload(t, `
`+siteAddr+` {
	respond "ok"
}
`); code != 200 {
		t.Fatal(code, body)
	}
	wait.For(t, "the Redis connections to settle", func() bool { return clients(other) == 0 })
}

// TestReloadLongerWindow: a reload that makes a zone's window longer
// starts its keys afresh, for every windowed algorithm. The old counts'
// window index counts the shorter windows, so it lies far ahead of the
// new one; taken for a clock that stepped back, it once left a key at its
// limit rejected with a reset centuries away.
func TestReloadLongerWindow(t *testing.T) {
	integration(t)
	site := `
` + siteAddr + ` {
	rate_limit {
		zone longer {
			algorithm %s
			limit 2
			window %s
		}
	}
	respond "ok"
}
`
	for i, alg := range []string{"fixed_window", "sliding_tail", "sliding_window"} {
		t.Run(alg, func(t *testing.T) {
			if i == 0 {
				startCaddy(t, fmt.Sprintf(site, alg, "1m"))
			} else if code, body := reload(t, fmt.Sprintf(site, alg, "1m")); code != http.StatusOK {
				t.Fatalf("reload: %d %s", code, body)
			}
			// Take the key's limit (a fixed window may roll over between
			// these, which takes it all the same by the third).
			for range 3 {
				do(t, http.MethodGet, siteURL+"/")
			}
			if code, body := reload(t, fmt.Sprintf(site, alg, "1h")); code != http.StatusOK {
				t.Fatalf("reload: %d %s", code, body)
			}
			for n := 1; n <= 3; n++ {
				resp, _ := do(t, http.MethodGet, siteURL+"/")
				want := http.StatusOK
				if n == 3 {
					want = http.StatusTooManyRequests
				}
				status(t, resp, want)
				// The reset is a Unix time, at most a window and a
				// sub-window (6 min) away; Retry-After is in seconds.
				reset, err := strconv.ParseInt(resp.Header.Get("X-RateLimit-Reset"), 10, 64)
				if in := reset - time.Now().Unix(); err != nil || in < 0 || in > 3960 {
					t.Fatalf("request %d after the reload: X-RateLimit-Reset %q, want within 3960 s", n, resp.Header.Get("X-RateLimit-Reset"))
				}
				if n == 3 {
					if retry, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || retry < 1 || retry > 3960 {
						t.Fatalf("Retry-After %q, want 1 to 3960 seconds", resp.Header.Get("Retry-After"))
					}
				}
			}
		})
	}
}
