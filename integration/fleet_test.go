package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
	"github.com/d61b427a/caddy-rate-limit/internal/wait"
)

// TestRedisFleetExact runs 3 Caddy processes on one Redis, on a 3-master
// Redis Cluster and behind a Sentinel, and sends 150 concurrent requests
// for one key with limit 30: exactly 30 pass.
func TestRedisFleetExact(t *testing.T) {
	exact := func(t *testing.T, urls []string, client string) {
		t.Helper()
		codes := burst(urls, 150, "X-Client: "+client)
		if codes[200] != 30 || codes[429] != 120 {
			t.Fatalf("client %s: answers by status %v, want exactly 30 × 200 and 120 × 429", client, codes)
		}
	}

	t.Run("standalone", func(t *testing.T) {
		s := redistest.Standalone(t)
		fleet := urls(startFleet(t, 3, fleetSpec{store: "address " + s.URL(), zone: perClient(30)}))
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
		fleet := urls(startFleet(t, 3, fleetSpec{store: "address " + strings.Join(c.URLs(), " ") + "\ncluster", zone: perClient(30)}))
		// One key on each node, all three bursts at once.
		byNode := map[int]string{}
		for i := 0; len(byNode) < len(c.Nodes); i++ {
			key := "client-" + strconv.Itoa(i)
			if _, node := clusterCounterKey(t, c, "fleet", clientKey(key)); byNode[node] == "" {
				byNode[node] = key
			}
		}
		var wg sync.WaitGroup
		for _, key := range byNode {
			wg.Go(func() { exact(t, fleet, key) })
		}
		wg.Wait()
		for node, key := range byNode {
			name, _ := clusterCounterKey(t, c, "fleet", clientKey(key))
			if n, err := c.Nodes[node].Do("HGET", name, "c"); err != nil || n != "30" {
				t.Errorf("node %d holds %q for %s (%v), want 30", node, n, key, err)
			}
		}
	})

	t.Run("sentinel", func(t *testing.T) {
		s := redistest.NewSentinel(t, "fleet")
		fleet := urls(startFleet(t, 3, fleetSpec{store: "address " + s.Sentinel.URL() + "\nsentinel fleet", zone: perClient(30)}))
		exact(t, fleet, "one")
		if n, err := s.Master.Do("HGET", counterKey(t, s.Master, "fleet", clientKey("one")), "c"); err != nil || n != "30" {
			t.Fatalf("master holds %q (%v), want 30", n, err)
		}
	})
}

// TestRedisConcurrencyFleet: two instances sharing Redis, standalone and
// cluster, hold limit 2 between them exactly: 6 requests at once through
// a slow upstream, 2 served and 4 rejected; every unit is released, also
// after 1,000 requests with random client aborts.
func TestRedisConcurrencyFleet(t *testing.T) {
	zone := "\t\t\tkey {header.X-Client}\n\t\t\tlimit 2\n\t\t\talgorithm concurrency\n\t\t\thold 1m"
	// holders counts the holders Redis keeps for key (nil on a cluster,
	// whose nodes the test does not ask).
	run := func(t *testing.T, store string, holders func(key string) string) {
		g := newGate(t)
		fleet := startFleet(t, 2, fleetSpec{store: store, zone: zone, upstream: g.url})
		answers := sendAll(context.Background(), urls(fleet), 6, "X-Client: c1")
		g.waitArrivals(t, 2)
		for range 4 {
			if r := receive(t, "an answer", answers); r.err != nil || r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") != "1" {
				t.Fatalf("rejection: %+v, want 429 with Retry-After 1", r)
			}
		}
		g.open(2)
		for range 2 {
			if r := receive(t, "an answer", answers); r.status != http.StatusOK {
				t.Fatalf("served: %+v", r)
			}
		}
		if n := g.arrived.Load(); n != 2 {
			t.Fatalf("%d requests reached the upstream, want 2", n)
		}
		waitUsed(t, fleet[0].admin, "fleet", "c1", 0)

		j := newJittery(t)
		fleet = startFleet(t, 2, fleetSpec{store: store, zone: zone, upstream: j.url})
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
			// The holders' set is named as the counters' hash, with an h
			// after the tag.
			counter := counterKey(t, s, "fleet", clientKey(key))
			tag := strings.IndexByte(counter, '}') + 1
			n, err := s.Do("ZCARD", counter[:tag]+"h"+counter[tag:])
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

// TestRedisFleetSharesOneLimit: three instances on one Redis, standalone and
// cluster, share one gcra bucket of 30, or one sliding window of 30: 150
// requests at once, exactly 30 pass.
func TestRedisFleetSharesOneLimit(t *testing.T) {
	for _, alg := range []string{"gcra", "sliding_window"} {
		t.Run(alg, func(t *testing.T) { testFleetExact(t, alg) })
	}
}

func testFleetExact(t *testing.T, alg string) {
	run := func(t *testing.T, store string) {
		a := newApp(t)
		fleet := startFleet(t, 3, fleetSpec{store: store, zone: perClient(30) + "\n\t\t\talgorithm " + alg, upstream: a.url})
		codes := burst(urls(fleet), 150, "X-Client: one")
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
	fleet := startFleet(t, 2, fleetSpec{store: "address " + s.URL(), zone: zone, upstream: g.url})

	answers := sendAll(context.Background(), urls(fleet), 8, "X-Client: any")
	g.waitArrivals(t, 3)
	for range 5 {
		if r := receive(t, "an answer", answers); r.err != nil || r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") != "1" {
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
	criticalAnswers := sendAll(context.Background(), critical, 4, "X-Client: any")
	g.waitArrivals(t, 7) // all 4 reach the app while the fleet is full
	g.open(7)
	for range 4 {
		if r := receive(t, "an answer", criticalAnswers); r.status != http.StatusOK {
			t.Fatalf("critical: %+v, want 200", r)
		}
	}
	for range 3 {
		if r := receive(t, "an answer", answers); r.status != http.StatusOK {
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
	fleet := startFleet(t, 2, fleetSpec{store: "address " + s.URL(), zone: perClient(2)})
	site, admin := fleet[0].url, fleet[1].admin // requests to one, changes through the other
	// eventually sends requests until one is answered want; how long that
	// took (the instances reread the store once a second) is logged.
	eventually := func(key string, want int) {
		t.Helper()
		start := time.Now()
		wait.For(t, fmt.Sprintf("key %s to be answered %d", key, want), func() bool { return get(t, site, key) == want })
		t.Logf("key %s: %d after %v", key, want, time.Since(start).Round(time.Millisecond))
	}
	change := func(method, path, body string, want int) {
		t.Helper()
		if code, resp := adminJSON(t, admin, method, path, body); code != want {
			t.Fatalf("%s %s: %d %s", method, path, code, resp)
		}
	}
	for range 3 {
		get(t, site, "f")
	}
	if code := get(t, site, "f"); code != http.StatusTooManyRequests {
		t.Fatalf("exhausted key: %d", code)
	}

	change(http.MethodPut, "/rate_limit/zones/fleet/dial", `{"mode": "off"}`, 200)
	eventually("f", http.StatusOK)
	change(http.MethodDelete, "/rate_limit/zones/fleet/dial", "", http.StatusNoContent)
	eventually("f", http.StatusTooManyRequests)

	change(http.MethodDelete, "/rate_limit/zones/fleet/keys/f", "", http.StatusNoContent)
	eventually("f", http.StatusOK)
	get(t, site, "f")
	if code := get(t, site, "f"); code != http.StatusTooManyRequests {
		t.Fatalf("after a reset, the limit of 2 still holds: %d", code)
	}

	change(http.MethodPut, "/rate_limit/zones/fleet/keys/f/limit", `{"limit": 4, "ttl": "1h"}`, 200)
	eventually("f", http.StatusOK)
	get(t, site, "f")
	if code := get(t, site, "f"); code != http.StatusTooManyRequests {
		t.Fatalf("the override of 4 holds: %d", code)
	}
}

// waitForFleet waits until every instance counts all of them.
func waitForFleet(t *testing.T, fleet []instance) {
	t.Helper()
	for _, in := range fleet {
		wait.For(t, fmt.Sprintf("%s to count %d instances", in.admin, len(fleet)), func() bool {
			z, _ := zoneState(t, in.admin, "fleet")
			return z.Instances == len(fleet)
		})
	}
}

// drain sends requests for key to the instances, from workers clients
// on each, each until it has been refused misses times in a row (by then
// its instance has no lease left for the key, and the store nothing), and
// returns how many each instance admitted.
func drain(t *testing.T, fleet []instance, key string, workers, misses int) []int64 {
	t.Helper()
	admitted := make([]int64, len(fleet))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, in := range fleet {
		for range workers {
			wg.Go(func() {
				// A transport of its own: closing its idle connections at
				// the end must not break another worker's request.
				hc := &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}
				defer hc.CloseIdleConnections()
				for refused := 0; refused < misses; {
					req, _ := http.NewRequest(http.MethodGet, in.url, nil)
					req.Header.Set("X-Client", key)
					resp, err := hc.Do(req)
					if err != nil {
						t.Error(err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					switch resp.StatusCode {
					case http.StatusOK:
						mu.Lock()
						admitted[i]++
						mu.Unlock()
						refused = 0
					case http.StatusTooManyRequests:
						refused++
					default:
						t.Errorf("%s: status %d", in.url, resp.StatusCode)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	return admitted
}

func sum(ns []int64) int64 {
	var total int64
	for _, n := range ns {
		total += n
	}
	return total
}

// TestRedisFleetLeases: three instances with lease on, on one Redis and on
// a 3-master cluster. A key that every instance requests beyond its limit
// is admitted no more than its limit, and at least 98% of it; Redis counts
// exactly what was admitted. A burst of 150 at once admits no more than
// the limit either, and once the leases have been released Redis counts
// what was admitted. Every instance counts the fleet (N = 3).
func TestRedisFleetLeases(t *testing.T) {
	const limit = 300
	run := func(t *testing.T, store string, counted func(key string) int64) {
		fleet := startFleet(t, 3, fleetSpec{store: store + "\nlease on", zone: perClient(limit)})
		waitForFleet(t, fleet)

		admitted := drain(t, fleet, "hot", 4, 20)
		total := sum(admitted)
		t.Logf("admitted %v, %d of %d", admitted, total, limit)
		if total > limit || total < limit*98/100 {
			t.Fatalf("%d admitted, want at most %d and at least 98%% of it", total, limit)
		}
		if c := counted("hot"); c != total {
			t.Fatalf("Redis counts %d, %d were admitted", c, total)
		}

		codes := burst(urls(fleet), 450, "X-Client: burst")
		t.Logf("a burst of 450 for a limit of %d: %v", limit, codes)
		if codes[200] > limit || codes[200]+codes[429] != 450 {
			t.Fatalf("a burst of 450: %v", codes)
		}
		wait.For(t, "the leases of the burst to be released", func() bool { return counted("burst") == int64(codes[200]) })

		var leased, taken int
		for _, in := range fleet {
			if got := metricValue(t, in.admin, `caddy_http_rate_limit_fleet_instances{store="redis"}`); got != "3" {
				t.Errorf("%s: fleet_instances %q, want 3", in.admin, got)
			}
			leased += metricCount(t, in.admin, `caddy_http_rate_limit_lease_units_total{outcome="leased",zone="fleet"}`)
			taken += metricCount(t, in.admin, `caddy_http_rate_limit_lease_units_total{outcome="taken",zone="fleet"}`)
		}
		t.Logf("lease units: %d leased, %d taken", leased, taken)
		if taken == 0 || leased < taken {
			t.Fatalf("lease units: %d leased, %d taken; want leases taken from, none before leased", leased, taken)
		}
	}
	t.Run("standalone", func(t *testing.T) {
		s := redistest.Standalone(t)
		run(t, "address "+s.URL(), func(key string) int64 { return hashCount(t, s, counterKey(t, s, "fleet", clientKey(key))) })
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.NewCluster(t, 3)
		run(t, "address "+strings.Join(c.URLs(), " ")+"\ncluster", func(key string) int64 {
			name, node := clusterCounterKey(t, c, "fleet", clientKey(key))
			return hashCount(t, c.Nodes[node], name)
		})
	})
}

// TestRedisFleetSlidingWindowLeases: a sliding_window zone with lease on,
// three instances on one Redis, leases taken from only in the sub-window
// they were counted in. A key every instance requests beyond its limit is
// admitted no more than its limit, and at least 98% of it; the app sees
// exactly the admitted requests; once the leases have been released, the
// key's ring in Redis counts exactly them.
func TestRedisFleetSlidingWindowLeases(t *testing.T) {
	const limit = 300
	s := redistest.Standalone(t)
	a := newApp(t)
	fleet := startFleet(t, 3, fleetSpec{store: "address " + s.URL() + "\nlease on",
		zone: perClient(limit) + "\n\t\t\talgorithm sliding_window", upstream: a.url})
	waitForFleet(t, fleet)
	total := sum(drain(t, fleet, "hot", 4, 20))
	if total > limit || total < limit*98/100 {
		t.Fatalf("%d admitted, want at most %d and at least 98%% of it", total, limit)
	}
	if n := a.hits.Load(); n != total {
		t.Fatalf("the app saw %d requests, %d were admitted", n, total)
	}
	ring := func() int64 {
		v, err := s.Do("HGET", counterKey(t, s, "fleet", clientKey("hot")), "r")
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		for c := range strings.SplitSeq(v, ",") {
			k, _ := strconv.ParseInt(c, 10, 64)
			n += k
		}
		return n
	}
	wait.For(t, "the leases to be released", func() bool { return ring() == total })
}

// hashCount reads the c field of a counter hash on s.
func hashCount(t *testing.T, s *redistest.Server, key string) int64 {
	t.Helper()
	v, err := s.Do("HGET", key, "c")
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.ParseInt(v, 10, 64)
	return n
}

// TestRedisFleetHotKeyCalls: with lease on, a hot key is decided mostly
// from leases: far fewer script calls than requests. (bench/load.sh
// measures how few under load.)
func TestRedisFleetHotKeyCalls(t *testing.T) {
	s := redistest.Standalone(t)
	fleet := startFleet(t, 3, fleetSpec{store: "address " + s.URL() + "\nlease on", zone: perClient(1_000_000)})
	waitForFleet(t, fleet)
	if _, err := s.Do("CONFIG", "RESETSTAT"); err != nil {
		t.Fatal(err)
	}
	const each = 500
	var wg sync.WaitGroup
	for _, in := range fleet {
		wg.Go(func() {
			for range each {
				if got := get(t, in.url, "hot"); got != http.StatusOK {
					t.Errorf("%s: %d", in.url, got)
					return
				}
			}
		})
	}
	wg.Wait()
	calls, err := s.ScriptCalls()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d requests of one key in %d script calls", 3*each, calls)
	if calls*10 > 3*each {
		t.Fatalf("%d script calls for %d requests of one key: leases decide too few", calls, 3*each)
	}
}

// TestRedisFleetLocalFallback: three instances with on_store_error local.
// While Redis is down (killed) or hangs (SIGSTOP), on one server and on a
// 3-master cluster, each instance admits its share, floor(30/3) = 10, of a
// key's limit, with the same headers; once Redis answers again the
// fleet's limit holds at once. Store errors are logged with counts, not a
// line a request. Neither edge of the outage counts afresh: a key whose
// instances used their shares through Redis before it is refused by
// each during it, and a key the instances admitted alone during it is
// taken in Redis after (the catch-up), and refused.
func TestRedisFleetLocalFallback(t *testing.T) {
	t.Run("standalone", func(t *testing.T) {
		s := redistest.Standalone(t)
		testLocalFallback(t, "address "+s.URL(), []outage{
			{"killed", s.Kill, s.Restart},
			{"paused", func() { must(t, s.Pause()) }, s.Resume},
		})
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.NewCluster(t, 3)
		pause := func() {
			for _, n := range c.Nodes {
				must(t, n.Pause())
			}
		}
		resume := func() error {
			for _, n := range c.Nodes {
				if err := n.Resume(); err != nil {
					return err
				}
			}
			return nil
		}
		testLocalFallback(t, "address "+strings.Join(c.URLs(), " ")+"\ncluster", []outage{{"paused", pause, resume}})
	})
}

// An outage is how a test takes Redis away (start) and brings it back.
type outage struct {
	name  string
	start func()
	end   func() error
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func testLocalFallback(t *testing.T, store string, outages []outage) {
	fleet := startFleet(t, 3, fleetSpec{store: store + "\ntimeout 250ms", options: "on_store_error local", zone: perClient(30)})
	waitForFleet(t, fleet)

	// shares checks that each instance admits exactly 10 for key, told
	// the limit is 10, and logs how long the slowest request took.
	shares := func(t *testing.T, key string) int {
		t.Helper()
		sent := 0
		for _, in := range fleet {
			var slowest time.Duration
			for i := range 11 {
				start := time.Now()
				resp, _ := do(t, http.MethodGet, in.url, "X-Client: "+key)
				slowest = max(slowest, time.Since(start))
				sent++
				want := http.StatusOK
				if i == 10 {
					want = http.StatusTooManyRequests
				}
				if resp.StatusCode != want || resp.Header.Get("X-RateLimit-Limit") != "10" {
					t.Fatalf("%s, request %d for %s during the outage: %d, limit %q; want %d against this instance's 10",
						in.url, i+1, key, resp.StatusCode, resp.Header.Get("X-RateLimit-Limit"), want)
				}
			}
			t.Logf("%s: the slowest request during the outage took %v", in.url, slowest)
		}
		return sent
	}
	// fleetWide waits until every instance has announced itself again (a
	// Redis that restarted forgot them), so that a local decision is told
	// 10 again, not 30 = 30/1; then until each is told the fleet's limit
	// of 30 (Redis decides), and logs how long that took.
	fleetWide := func(t *testing.T, since time.Time) {
		t.Helper()
		waitForFleet(t, fleet)
		for i, in := range fleet {
			wait.For(t, in.url+" to take in Redis again", func() bool {
				resp, _ := do(t, http.MethodGet, in.url, fmt.Sprintf("X-Client: probe-%d-%d", i, time.Now().UnixNano()))
				return resp.StatusCode == http.StatusOK && resp.Header.Get("X-RateLimit-Limit") == "30"
			})
		}
		t.Logf("fleet-wide decisions again %v after Redis came back", time.Since(since).Round(time.Millisecond))
	}
	// exact sends 40 requests for key, in turn to each instance: the
	// fleet's 30 pass.
	exact := func(t *testing.T, key string) {
		t.Helper()
		passed := 0
		for i := range 40 {
			if get(t, fleet[i%3].url, key) == http.StatusOK {
				passed++
			}
		}
		if passed != 30 {
			t.Fatalf("after Redis came back, %d of 40 requests for %s passed, want the fleet's 30", passed, key)
		}
	}

	// useShares has each instance admit 10 for key through Redis, the
	// fleet's 30: each has used its share.
	useShares := func(t *testing.T, key string) {
		t.Helper()
		for _, in := range fleet {
			for i := range 10 {
				if code := get(t, in.url, key); code != http.StatusOK {
					t.Fatalf("%s, request %d for %s before the outage: %d, want 200", in.url, i+1, key, code)
				}
			}
		}
	}
	// used checks that each instance refuses key during the outage:
	// what Redis admitted for it there counts against its share.
	used := func(t *testing.T, key string) {
		t.Helper()
		for _, in := range fleet {
			resp, _ := do(t, http.MethodGet, in.url, "X-Client: "+key)
			if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("X-RateLimit-Limit") != "10" {
				t.Fatalf("%s, for %s, whose share it used before the outage: %d, limit %q; want 429 against this instance's 10",
					in.url, key, resp.StatusCode, resp.Header.Get("X-RateLimit-Limit"))
			}
		}
	}
	// owed is how many keys an instance keeps for the catch-up.
	const owed = `caddy_http_rate_limit_store_entries{kind="owed",store="redis"}`
	// keeps checks that each instance keeps one key (the outage's) for
	// the catch-up; caughtUp, once Redis is back, waits until Redis
	// counts the 30 the instances admitted for it during the outage and
	// they keep none, then checks that each refuses it.
	keeps := func(t *testing.T) {
		t.Helper()
		for _, in := range fleet {
			if n := metricCount(t, in.admin, owed); n != 1 {
				t.Fatalf("%s keeps %d keys for the catch-up during the outage, want 1", in.url, n)
			}
		}
	}
	caughtUp := func(t *testing.T, key string) {
		t.Helper()
		wait.For(t, "Redis to count what the instances admitted alone for "+key, func() bool {
			return keyState(t, fleet[0].admin, "fleet", key).Used >= 30
		})
		for _, in := range fleet {
			wait.For(t, in.url+" to have caught Redis up with what it kept", func() bool { return metricCount(t, in.admin, owed) == 0 })
		}
		for _, in := range fleet {
			if code := get(t, in.url, key); code != http.StatusTooManyRequests {
				t.Fatalf("%s, for %s after the outage: %d, want 429: the fleet admitted its 30 during the outage", in.url, key, code)
			}
		}
	}

	sent := 0
	for i, o := range outages {
		t.Run(o.name, func(t *testing.T) {
			// Each instance divides by 3 (a Redis that restarted forgot
			// the fleet, and learns it again within a second).
			waitForFleet(t, fleet)
			useShares(t, fmt.Sprintf("spent-%d", i))
			o.start()
			used(t, fmt.Sprintf("spent-%d", i))
			sent += shares(t, fmt.Sprintf("outage-%d", i))
			keeps(t)
			if err := o.end(); err != nil {
				t.Fatal(err)
			}
			fleetWide(t, time.Now())
			caughtUp(t, fmt.Sprintf("outage-%d", i))
			exact(t, fmt.Sprintf("after-%d", i))
		})
	}
	lines := 0
	for _, in := range fleet {
		lines += len(logLines(in.log, "rate limit store error"))
	}
	t.Logf("%d store error lines for %d requests during the outages", lines, sent)
	if lines == 0 || lines >= sent {
		t.Fatalf("%d store error lines for %d requests: want the errors logged, with counts, not a line a request", lines, sent)
	}
}

// TestRedisFleetInstanceDiesHoldingLease: an instance killed while it
// holds a lease takes its untaken units with it: they stay counted in
// Redis, so the fleet admits that many fewer in the window, and never
// more than the limit. The loss is at most one lease: a 2N-th of what was
// left when it was taken, plus the requests the dying instance had
// taken units for but never answered.
func TestRedisFleetInstanceDiesHoldingLease(t *testing.T) {
	const limit, workers = 600, 4
	s := redistest.Standalone(t)
	fleet := startFleet(t, 3, fleetSpec{store: "address " + s.URL() + "\nlease on", zone: perClient(limit)})
	waitForFleet(t, fleet)

	// The first instance serves the key until it has admitted 100, and
	// is killed under load.
	var dying atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			hc := &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}
			defer hc.CloseIdleConnections()
			for {
				select {
				case <-stop:
					return
				default:
				}
				req, _ := http.NewRequest(http.MethodGet, fleet[0].url, nil)
				req.Header.Set("X-Client", "k")
				resp, err := hc.Do(req)
				if err != nil {
					return // killed
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					dying.Add(1)
				}
			}
		})
	}
	wait.For(t, "the first instance to admit 100", func() bool { return dying.Load() >= 100 })
	if err := fleet[0].proc.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	close(stop)
	wg.Wait()

	rest := drain(t, fleet[1:], "k", workers, 20)
	admitted := dying.Load() + sum(rest)
	c := hashCount(t, s, counterKey(t, s, "fleet", clientKey("k")))
	lost := c - admitted
	t.Logf("admitted %d (%d by the instance killed, %v by the others); Redis counts %d: %d lost with the instance", admitted, dying.Load(), rest, c, lost)
	if admitted > limit || c != limit {
		t.Fatalf("admitted %d, Redis counts %d; want at most %d admitted, and the window full", admitted, c, limit)
	}
	if most := int64(limit/(2*3) + workers); lost < 0 || lost > most {
		t.Fatalf("%d units lost with the instance, want at most a lease (a sixth of %d) and its %d requests in flight", lost, limit, workers)
	}
}
