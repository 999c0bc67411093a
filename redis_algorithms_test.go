package ratelimit

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
)

// startZoneFleet starts n Caddy processes sharing the Redis store
// configured by store, each limiting /work by zone (a zone block's body)
// in front of upstream, and answering /ready itself. It returns the
// /work URLs and the admin endpoints.
func startZoneFleet(t *testing.T, n int, store, zone, upstream string) (urls, admins []string) {
	t.Helper()
	for range n {
		site, admin := freeLoopbackPort(t), freeLoopbackPort(t)
		startProcess(t, processGlobals(t, admin, site)+fmt.Sprintf(`http://127.0.0.1:%d {
	handle /ready {
		respond "ok"
	}
	rate_limit {
		store redis {
%s
			timeout 5s
		}
		on_store_error deny
		zone expensive {
%s
		}
	}
	reverse_proxy %s
}
`, site, store, zone, upstream), fmt.Sprintf("http://127.0.0.1:%d/ready", site))
		urls = append(urls, fmt.Sprintf("http://127.0.0.1:%d/work", site))
		admins = append(admins, fmt.Sprintf("http://127.0.0.1:%d", admin))
	}
	return urls, admins
}

// TestRedisConcurrencyFleet: two instances sharing Redis, standalone and
// cluster, hold limit 2 between them exactly: 6 requests at once through
// a slow upstream, 2 served and 4 rejected; every unit comes back, also
// after 1,000 requests with random client aborts.
func TestRedisConcurrencyFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("builds Caddy and runs a fleet")
	}
	zone := "\t\t\tkey {header.X-Client}\n\t\t\tlimit 2\n\t\t\talgorithm concurrency\n\t\t\tlease 1m"
	run := func(t *testing.T, store string) {
		g := newGate(t)
		urls, admins := startZoneFleet(t, 2, store, zone, g.url)
		answers := sendAll(context.Background(), urls, "c1", 6)
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
		waitUsed(t, admins[0], "expensive", "c1", 0)

		fast := jittery(t)
		urls, admins = startZoneFleet(t, 2, store, zone, fast)
		leakCheck(t, urls, admins[1], "leak")
	}
	t.Run("standalone", func(t *testing.T) {
		s := redistest.Standalone(t)
		run(t, "address "+s.URL())
		if n, _ := s.Do("ZCARD", "rl:{leak}h:expensive"); n != "0" {
			t.Fatalf("%s holders left in Redis", n)
		}
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.NewCluster(t, 3)
		run(t, "address "+strings.Join(c.URLs(), " ")+"\ncluster")
	})
}

// TestRedisGCRAFleetExact: three instances on one Redis, standalone and
// cluster, share one bucket of 30: 150 requests at once, exactly 30 pass.
func TestRedisGCRAFleetExact(t *testing.T) {
	if testing.Short() {
		t.Skip("builds Caddy and runs a fleet")
	}
	run := func(t *testing.T, store string) {
		a := newApp(t)
		urls, _ := startZoneFleet(t, 3, store,
			"\t\t\tkey {header.X-Client}\n\t\t\tlimit 30\n\t\t\twindow 1h\n\t\t\talgorithm gcra", a.url)
		codes := burst(t, urls, "one", 150)
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

// TestRedisFleetUsageShedder is the README's fleet usage load shedder: a
// concurrency zone on a literal key, matched to the traffic that may be
// shed, with status 503, on two instances sharing Redis. With limit 3,
// 8 non-critical requests at once get 3 served and 5 × 503 with
// Retry-After, and critical requests, which the zone does not match, go
// through while the 3 still hold every unit.
func TestRedisFleetUsageShedder(t *testing.T) {
	if testing.Short() {
		t.Skip("builds Caddy and runs a fleet")
	}
	s := redistest.Standalone(t)
	g := newGate(t)
	zone := "\t\t\tmatch {\n\t\t\t\tnot path /critical*\n\t\t\t}\n\t\t\tkey fleet\n\t\t\talgorithm concurrency\n\t\t\tlimit 3\n\t\t\tstatus 503"
	urls, admins := startZoneFleet(t, 2, "address "+s.URL(), zone, g.url)

	answers := sendAll(context.Background(), urls, "any", 8)
	g.waitArrivals(t, 3)
	for range 5 {
		if r := <-answers; r.err != nil || r.status != http.StatusServiceUnavailable || r.retryAfter != "1" {
			t.Fatalf("shed: %+v, want 503 with Retry-After 1", r)
		}
	}
	if n := keyUsed(t, admins[1], "expensive", "fleet"); n != 3 {
		t.Fatalf("%d units held fleet-wide, want 3", n)
	}

	var critical []string
	for _, u := range urls {
		critical = append(critical, strings.TrimSuffix(u, "/work")+"/critical/charge")
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
	waitUsed(t, admins[0], "expensive", "fleet", 0)
}
