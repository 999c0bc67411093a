package integration

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/d61b427a/caddy-rate-limit/internal/race"
	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
)

// TestKeyFloodStaysBounded floods a real Caddy with 400,000 distinct keys,
// several times every bound, through every per-key structure on the
// request path, and shows by their counts that none grows with the keys:
//
//   - /mem: each key is taken in a memory zone (the store's keys, bound
//     by max_keys); every fifth comes twice, and is refused and banned at
//     its second request by a second zone (the bans, the
//     rate_limit_exceeded events' dedup), with three overrides in force;
//     both zones count the key in their top keys.
//   - /redis: each key takes in a Redis zone with lease on (a key seen once
//     leaves no lease record) and a zone with room for one request. The
//     last 100,000 keys come twice: the second request makes a lease
//     record (at most 16,384) and is refused by the second zone, which the
//     deny cache remembers (at most 65,536 entries). That zone is GCRA:
//     windows are cut on the epoch's hours for every instance, and a key
//     whose two requests fell either side of one would be admitted twice
//     by a windowed algorithm (the one request of the window before
//     weighs less than 1 and rounds down), as CI once saw.
//
// The counts come from caddy_http_rate_limit_store_entries and the admin
// API's top keys, what an operator sees.
func TestKeyFloodStaysBounded(t *testing.T) {
	integration(t)
	if race.Enabled {
		t.Skip("a flood of requests takes too long under the race detector; the structures' own tests run under it")
	}
	const (
		keys    = 400_000
		twice   = 100_000
		maxKeys = 40_000
		// The memory store's 64 shards each hold their share of
		// max_keys, rounded up.
		storeBound = (maxKeys + 63) / 64 * 64
	)
	s := redistest.Standalone(t)
	store := "store memory {\n\t\t\t\tmax_keys " + fmt.Sprint(maxKeys) + "\n\t\t\t}"
	startCaddy(t, withEvents(t, fmt.Sprintf(`
`+siteAddr+` {
	route /mem {
		rate_limit {
			%[1]s
			zone flood_keys {
				key {header.X-Key}
				limit 1000
				window 1h
			}
		}
		rate_limit {
			%[1]s
			zone flood_bans {
				key {header.X-Key}
				limit 1
				window 1h
				ban 1h
			}
		}
		respond "ok"
	}
	route /redis {
		rate_limit {
			%[2]s
			zone flood_leases {
				key {header.X-Key}
				limit 1000
				window 1h
			}
			zone flood_denials {
				key {header.X-Key}
				limit 1
				window 1h
				algorithm gcra
			}
		}
		respond "ok"
	}
}
`, store, redisStore("address "+s.URL()+"\nlease on"))))
	for i := range 3 {
		if code, body := adminJSON(t, adminURL, http.MethodPut, fmt.Sprintf("/rate_limit/zones/flood_keys/keys/vip-%d/limit", i), `{"limit": 5000, "ttl": "1h"}`); code != http.StatusOK {
			t.Fatalf("override: %d %s", code, body)
		}
	}

	// The top keys turn every 30 s, and forget a zone's keys a minute
	// after its last request: each zone is asked right after its flood. A
	// zone's summary tracks at most 128 keys, however many it sees: once
	// full, it makes room for a new key by dropping the one with the
	// fewest requests, whose count the new one inherits as its error, so
	// the answer's error, the most a count may be overstated, shows that
	// it did.
	topBounded := func(zones ...string) {
		for _, zone := range zones {
			a := topKeys(t, zone, "?n=128")
			t.Logf("zone %s: top keys show %d keys, counts overstated by %d at most", zone, len(a.Keys), a.Error)
			if len(a.Keys) < 1 || len(a.Keys) > 128 || a.Error < 1 {
				t.Errorf("zone %s's top keys show %d keys with error %d, want 1 to 128 keys, the summary full and making room (error above 0)", zone, len(a.Keys), a.Error)
			}
		}
	}
	// Every fifth key comes twice in a row: more keys are banned than
	// the store's bound.
	mem := flood(t, "/mem", keys, func(i int) int {
		if i%5 == 0 {
			return 2
		}
		return 1
	})
	// A key whose count the store evicted between its two requests
	// (max_keys is a tenth of the keys) is allowed twice: a few are.
	if mem[http.StatusOK]+mem[http.StatusTooManyRequests] != keys+keys/5 || mem[http.StatusTooManyRequests] < keys/5*99/100 {
		t.Fatalf("/mem answered %v, want %d requests allowed or refused, nearly every key that came twice refused and banned at its second request", mem, keys+keys/5)
	}
	topBounded("flood_keys", "flood_bans")
	// The keys that come twice come last, so that their records are
	// still there to count: a record unused for 10 s is forgotten.
	redis := flood(t, "/redis", keys, func(i int) int {
		if i >= keys-twice {
			return 2
		}
		return 1
	})
	if redis[http.StatusOK] != keys || redis[http.StatusTooManyRequests] != twice {
		t.Fatalf("/redis answered %v, want %d allowed and %d refused (the second request of a key)", redis, keys, twice)
	}
	topBounded("flood_leases", "flood_denials")

	entries := func(store, kind string) int {
		return metricCount(t, adminURL, fmt.Sprintf(`caddy_http_rate_limit_store_entries{kind=%q,store=%q}`, kind, store))
	}
	for _, c := range []struct {
		store, kind string
		least, most int
	}{
		// Every key was taken in flood_keys; the store keeps its bound.
		{"memory", "keys", 1, storeBound},
		// Bans are kept up to the store's bound too, the first to end
		// going first.
		{"memory", "bans", 1, storeBound},
		{"memory", "overrides", 3, 3},
		// The lease table: records only for keys requested twice, at most
		// 16,384 (docs/redis.md).
		{"redis", "leases", 1, 16_384},
		{"redis", "denials", 1, 65_536},
	} {
		n := entries(c.store, c.kind)
		t.Logf("%s %s: %d entries after %d keys", c.store, c.kind, n, keys)
		if n < c.least || n > c.most {
			t.Errorf("%s %s: %d entries, want %d to %d", c.store, c.kind, n, c.least, c.most)
		}
	}
	// One event per key and window: as many events as keys refused (each
	// key here is refused once), whatever the dedup table can hold.
	recorded.Lock()
	events := recorded.total
	recorded.Unlock()
	refused := mem[http.StatusTooManyRequests] + redis[http.StatusTooManyRequests]
	t.Logf("%d rate_limit_exceeded events for %d keys refused", events, refused)
	if events != refused {
		t.Errorf("%d events for %d keys refused once each, want one each", events, refused)
	}
}

// flood sends GET path with keys distinct X-Key values, key i repeat(i)
// times in a row, over pipelined connections (a few hundred requests in
// flight at once, as HTTP/1.1 allows, so that Redis calls are shared), and counts the answers by status.
func flood(t *testing.T, path string, keys int, repeat func(i int) int) map[int]int {
	t.Helper()
	const conns = 256
	var (
		mu       sync.Mutex
		byStatus = map[int]int{}
		wg       sync.WaitGroup
		errs     = make(chan error, conns)
	)
	for c := range conns {
		wg.Go(func() {
			conn, err := net.Dial("tcp", siteListen)
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close()
			sent := 0
			go func() {
				w := bufio.NewWriterSize(conn, 64<<10)
				for i := c; i < keys; i += conns {
					for range repeat(i) {
						fmt.Fprintf(w, "GET %s HTTP/1.1\r\nHost: localhost\r\nX-Key: flood-%d\r\n\r\n", path, i)
					}
				}
				w.Flush()
			}()
			for i := c; i < keys; i += conns {
				sent += repeat(i)
			}
			r := bufio.NewReaderSize(conn, 64<<10)
			local := map[int]int{}
			for range sent {
				resp, err := http.ReadResponse(r, nil)
				if err != nil {
					errs <- fmt.Errorf("connection %d: %w", c, err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				local[resp.StatusCode]++
			}
			mu.Lock()
			for k, v := range local {
				byStatus[k] += v
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	close(errs)
	var all []string
	for err := range errs {
		all = append(all, err.Error())
	}
	if len(all) > 0 {
		t.Fatalf("flooding %s: %s", path, strings.Join(all, "; "))
	}
	return byStatus
}
