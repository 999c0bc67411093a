package ratelimit_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
)

// TestRedisFleetExact runs 3 Caddy processes on one Redis, on a 3-master
// Redis Cluster and behind a Sentinel, and sends 150 concurrent requests
// for one key with limit 30: exactly 30 pass.
func TestRedisFleetExact(t *testing.T) {
	exact := func(t *testing.T, urls []string, client string) {
		t.Helper()
		codes := burst(urls, client, 150)
		if codes[200] != 30 || codes[429] != 120 {
			t.Fatalf("client %s: answers by status %v, want exactly 30 × 200 and 120 × 429", client, codes)
		}
	}

	t.Run("standalone", func(t *testing.T) {
		s := redistest.Standalone(t)
		fleet := urls(startFleet(t, 3, "address "+s.URL(), perClient(30), ""))
		if _, err := s.Do("CONFIG", "RESETSTAT"); err != nil {
			t.Fatal(err)
		}
		exact(t, fleet, "one")
		stats, err := s.CommandStats()
		if err != nil {
			t.Fatal(err)
		}
		total := 0
		for _, n := range stats {
			total += n
		}
		scripts := stats["evalsha"] + stats["eval"]
		t.Logf("150 requests, 30 allowed: %d scripts run (%d EVALSHA), %d commands in all (%v)", scripts, stats["evalsha"], total-stats["config"], stats)
		if scripts > 150 {
			t.Errorf("%d scripts for 150 requests: more than one per request", scripts)
		}
	})

	t.Run("cluster", func(t *testing.T) {
		c := redistest.NewCluster(t, 3)
		fleet := urls(startFleet(t, 3, "address "+strings.Join(c.URLs(), " ")+"\ncluster", perClient(30), ""))
		// One key on each node, all three bursts at once.
		byNode := map[int]string{}
		for i := 0; len(byNode) < len(c.Nodes); i++ {
			key := "client-" + strconv.Itoa(i)
			node, err := c.NodeFor(key)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := byNode[node]; !ok {
				byNode[node] = key
			}
		}
		var wg sync.WaitGroup
		for _, key := range byNode {
			wg.Go(func() { exact(t, fleet, key) })
		}
		wg.Wait()
		for node, key := range byNode {
			if n, err := c.Nodes[node].Do("HGET", "rl:{"+key+"}:fleet", "c"); err != nil || n != "30" {
				t.Errorf("node %d holds %q for %s (%v), want 30", node, n, key, err)
			}
		}
	})

	t.Run("sentinel", func(t *testing.T) {
		s := redistest.NewSentinel(t, "fleet")
		fleet := urls(startFleet(t, 3, "address "+s.Sentinel.URL()+"\nsentinel fleet", perClient(30), ""))
		exact(t, fleet, "one")
		if n, err := s.Master.Do("HGET", "rl:{one}:fleet", "c"); err != nil || n != "30" {
			t.Fatalf("master holds %q (%v), want 30", n, err)
		}
	})
}

// TestRedisConcurrencyFleet: two instances sharing Redis, standalone and
// cluster, hold limit 2 between them exactly: 6 requests at once through
// a slow upstream, 2 served and 4 rejected; every unit comes back, also
// after 1,000 requests with random client aborts.
func TestRedisConcurrencyFleet(t *testing.T) {
	zone := "\t\t\tkey {header.X-Client}\n\t\t\tlimit 2\n\t\t\talgorithm concurrency\n\t\t\tlease 1m"
	// holders counts the holders Redis keeps for key (nil on a cluster,
	// whose nodes the test does not ask).
	run := func(t *testing.T, store string, holders func(key string) string) {
		g := newGate(t)
		fleet := startFleet(t, 2, store, zone, g.url)
		answers := sendAll(context.Background(), urls(fleet), "c1", 6)
		g.waitArrivals(t, 2)
		for range 4 {
			if r := <-answers; r.err != nil || r.status != http.StatusTooManyRequests || r.retryAfter != "1" {
				t.Fatalf("rejection: %+v, want 429 with Retry-After 1", r)
			}
		}
		g.open(2)
		for range 2 {
			if r := <-answers; r.status != http.StatusOK {
				t.Fatalf("served: %+v", r)
			}
		}
		if n := g.arrived.Load(); n != 2 {
			t.Fatalf("%d requests reached the upstream, want 2", n)
		}
		waitUsed(t, fleet[0].admin, "fleet", "c1", 0)

		j := newJittery(t)
		fleet = startFleet(t, 2, store, zone, j.url)
		var whileHeld func()
		if holders != nil {
			whileHeld = func() {
				if n := holders("leak"); n != "1" {
					t.Fatalf("%s holders in Redis while one request is served, want 1", n)
				}
			}
		}
		leakCheck(t, j, urls(fleet), fleet[1].admin, "fleet", "leak", whileHeld)
		if holders != nil {
			if n := holders("leak"); n != "0" {
				t.Fatalf("%s holders left in Redis", n)
			}
		}
	}
	t.Run("standalone", func(t *testing.T) {
		s := redistest.Standalone(t)
		run(t, "address "+s.URL(), func(key string) string {
			n, err := s.Do("ZCARD", "rl:{"+key+"}h:fleet")
			if err != nil {
				t.Fatal(err)
			}
			return n
		})
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.NewCluster(t, 3)
		run(t, "address "+strings.Join(c.URLs(), " ")+"\ncluster", nil)
	})
}

// TestRedisGCRAFleetExact: three instances on one Redis, standalone and
// cluster, share one bucket of 30: 150 requests at once, exactly 30 pass.
func TestRedisGCRAFleetExact(t *testing.T) {
	run := func(t *testing.T, store string) {
		a := newApp(t)
		fleet := startFleet(t, 3, store, perClient(30)+"\n\t\t\talgorithm gcra", a.url)
		codes := burst(urls(fleet), "one", 150)
		if codes[200] != 30 || codes[429] != 120 {
			t.Fatalf("answers by status %v, want exactly 30 × 200 and 120 × 429", codes)
		}
		if n := a.hits.Load(); n != 30 {
			t.Fatalf("the app saw %d requests, want 30", n)
		}
	}
	t.Run("standalone", func(t *testing.T) {
		run(t, "address "+redistest.Standalone(t).URL())
	})
	t.Run("cluster", func(t *testing.T) {
		run(t, "address "+strings.Join(redistest.NewCluster(t, 3).URLs(), " ")+"\ncluster")
	})
}

// TestRedisFleetUsageShedder is the fleet usage load shedder of
// docs/load-shedding.md: a
// concurrency zone on a literal key, matched to the traffic that may be
// shed, with status 503, on two instances sharing Redis. With limit 3,
// 8 non-critical requests at once get 3 served and 5 × 503 with
// Retry-After, and critical requests, which the zone does not match, go
// through while the 3 still hold every unit.
func TestRedisFleetUsageShedder(t *testing.T) {
	s := redistest.Standalone(t)
	g := newGate(t)
	zone := "\t\t\tmatch {\n\t\t\t\tnot path /critical*\n\t\t\t}\n\t\t\tkey fleet\n\t\t\talgorithm concurrency\n\t\t\tlimit 3\n\t\t\tstatus 503"
	fleet := startFleet(t, 2, "address "+s.URL(), zone, g.url)

	answers := sendAll(context.Background(), urls(fleet), "any", 8)
	g.waitArrivals(t, 3)
	for range 5 {
		if r := <-answers; r.err != nil || r.status != http.StatusServiceUnavailable || r.retryAfter != "1" {
			t.Fatalf("shed: %+v, want 503 with Retry-After 1", r)
		}
	}
	if n := keyState(t, fleet[1].admin, "fleet", "fleet").Used; n != 3 {
		t.Fatalf("%d units held fleet-wide, want 3", n)
	}

	var critical []string
	for _, in := range fleet {
		critical = append(critical, strings.TrimSuffix(in.url, "/work")+"/critical/charge")
	}
	criticalAnswers := sendAll(context.Background(), critical, "any", 4)
	g.waitArrivals(t, 7) // all 4 reach the app while the fleet is full
	g.open(7)
	for range 4 {
		if r := <-criticalAnswers; r.status != http.StatusOK {
			t.Fatalf("critical: %+v, want 200", r)
		}
	}
	for range 3 {
		if r := <-answers; r.status != http.StatusOK {
			t.Fatalf("served: %+v, want 200", r)
		}
	}
	waitUsed(t, fleet[0].admin, "fleet", "fleet", 0)
}

// TestAdminAPIFleet: with two Caddy instances sharing Redis, a change made
// through one instance's admin endpoint applies on the other within a
// second: a dial, a key reset (clearing the other's cached rejection) and a
// per-key override.
func TestAdminAPIFleet(t *testing.T) {
	s := redistest.Standalone(t)
	fleet := startFleet(t, 2, "address "+s.URL(), perClient(2), "")
	site, admin := fleet[0].url, fleet[1].admin // requests to one, changes through the other
	get := func(key string) int { return getURL(t, site, key) }
	// eventually sends requests until one is answered want; how long that
	// took (the instances reread the store once a second) is logged.
	eventually := func(key string, want int) {
		t.Helper()
		start := time.Now()
		waitFor(t, fmt.Sprintf("key %s to be answered %d", key, want), func() bool { return get(key) == want })
		t.Logf("key %s: %d after %v", key, want, time.Since(start).Round(time.Millisecond))
	}
	change := func(method, path, body string, want int) {
		t.Helper()
		if code, resp := adminJSON(t, admin, method, path, body); code != want {
			t.Fatalf("%s %s: %d %s", method, path, code, resp)
		}
	}
	for range 3 {
		get("f")
	}
	if code := get("f"); code != http.StatusTooManyRequests {
		t.Fatalf("exhausted key: %d", code)
	}

	change(http.MethodPut, "/rate_limit/zones/fleet/dial", `{"mode": "off"}`, 200)
	eventually("f", http.StatusOK)
	change(http.MethodDelete, "/rate_limit/zones/fleet/dial", "", http.StatusNoContent)
	eventually("f", http.StatusTooManyRequests)

	change(http.MethodDelete, "/rate_limit/zones/fleet/keys/f", "", http.StatusNoContent)
	eventually("f", http.StatusOK)
	get("f")
	if code := get("f"); code != http.StatusTooManyRequests {
		t.Fatalf("after a reset, the limit of 2 still holds: %d", code)
	}

	change(http.MethodPut, "/rate_limit/zones/fleet/keys/f/limit", `{"limit": 4, "ttl": "1h"}`, 200)
	eventually("f", http.StatusOK)
	get("f")
	if code := get("f"); code != http.StatusTooManyRequests {
		t.Fatalf("the override of 4 holds: %d", code)
	}
}
