package redis

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/algorithms/vectors"
	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// release releases reqs, concurrency requests, whose decisions do not
// matter to a release.
func release(s storage.Store, reqs ...storage.Request) error {
	return s.Finish(context.Background(), reqs, make([]algorithms.Decision, len(reqs)))
}

// holderKey names the sorted set of a concurrency key's holders, as the
// scripts derive it from the counter key: <prefix>{<tag>}h{<key>}:<zone>.
func (r *Store) holderKey(zone, key string) string {
	counter := r.counterKey(zone, key)
	tag := counter[len(r.KeyPrefix) : strings.IndexByte(counter, '}')+1]
	return r.KeyPrefix + tag + "h{" + key + "}:" + zone
}

// TestRedisHolderSetNamedApart: a concurrency key's holder set is named
// so that no zone's counters can share its name. Zone names may hold a
// colon: a set named after the counter key plus a suffix such as ":h"
// would be zone "conc:h"'s counters, and Redis would refuse the hash
// commands on it (WRONGTYPE).
func TestRedisHolderSetNamedApart(t *testing.T) {
	s := redistest.Standalone(t)
	r := newRedisStore(t, new(Store), s.URL())
	ctx := context.Background()
	held := storage.Request{Zone: "conc", Key: "k", Algorithm: algorithms.Concurrency,
		Rate: algorithms.Rate{Units: 3, Window: time.Minute}, Cost: 1, Holder: 1}
	d := make([]algorithms.Decision, 1)
	if err := r.Take(ctx, []storage.Request{held}, d); err != nil || !d[0].Allowed {
		t.Fatalf("concurrency take: %+v, %v", d[0], err)
	}
	if n, _ := s.Do("ZCARD", r.holderKey("conc", "k")); n != "1" {
		t.Fatalf("%s holders in %s, want 1", n, r.holderKey("conc", "k"))
	}
	for _, alg := range []algorithms.Algorithm{algorithms.FixedWindow, algorithms.SlidingTail, algorithms.GCRA} {
		other := storage.Request{Zone: "conc:h", Key: "k", Algorithm: alg,
			Rate: algorithms.Rate{Units: 10, Window: time.Minute}, Cost: 1}
		if err := r.Take(ctx, []storage.Request{other}, d); err != nil || !d[0].Allowed {
			t.Fatalf("zone conc:h, %s: %+v, %v", alg, d[0], err)
		}
		if err := r.ResetKey(ctx, "conc:h", "k"); err != nil {
			t.Fatal(err)
		}
	}
	if err := release(r, held); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.Do("ZCARD", r.holderKey("conc", "k")); n != "0" {
		t.Fatalf("%s holders left", n)
	}
}

// TestRedisConcurrencyHold: units of a holder that never releases (its
// instance died) are released when the hold ends, and its late release
// releases nothing twice.
func TestRedisConcurrencyHold(t *testing.T) {
	s := redistest.Standalone(t)
	r := newRedisStore(t, new(Store), s.URL())
	rate := algorithms.Rate{Units: 2, Window: time.Second} // a hold of 1s
	dead := storage.Request{Zone: "conc", Key: "k", Algorithm: algorithms.Concurrency, Rate: rate, Cost: 2, Holder: 1}
	alive := storage.Request{Zone: "conc", Key: "k", Algorithm: algorithms.Concurrency, Rate: rate, Cost: 1, Holder: 2}
	t0 := vectors.Start
	if d := redisTake(t, r, t0, dead)[0]; !d.Allowed {
		t.Fatal(d)
	}
	if d := redisTake(t, r, t0.Add(999*time.Millisecond), alive)[0]; d.Allowed {
		t.Fatal("allowed while the dead holder's hold runs")
	}
	if d := redisTake(t, r, t0.Add(time.Second), alive)[0]; !d.Allowed || d.Remaining != 1 {
		t.Fatalf("after the hold: %+v", d)
	}
	if err := release(r, dead); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.Do("HGET", r.counterKey("conc", "k"), "c"); n != "1" {
		t.Fatalf("held %s after the dead holder's late release, want 1", n)
	}
}

// TestRedisReleaseManyZones: a request holding units in several zones
// releases them all in one script call on one server, and in one call
// per hash tag on a cluster, where its keys lie in different slots.
func TestRedisReleaseManyZones(t *testing.T) {
	reqs := []storage.Request{
		{Zone: "conc1", Key: "a", Algorithm: algorithms.Concurrency, Rate: algorithms.Rate{Units: 2, Window: time.Minute}, Cost: 1, Holder: 1},
		{Zone: "conc2", Key: "b", Algorithm: algorithms.Concurrency, Rate: algorithms.Rate{Units: 2, Window: time.Minute}, Cost: 1, Holder: 1},
		{Zone: "conc3", Key: "a", Algorithm: algorithms.Concurrency, Rate: algorithms.Rate{Units: 2, Window: time.Minute}, Cost: 1, Holder: 1},
		{Zone: "window", Key: "a", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 2, Window: time.Minute}, Cost: 1},
	}
	check := func(t *testing.T, r *Store, nodes []*redistest.Server, calls int) {
		t.Helper()
		d := make([]algorithms.Decision, len(reqs))
		if err := r.Take(context.Background(), reqs, d); err != nil {
			t.Fatal(err)
		}
		evalsha := func() int {
			n := 0
			for _, s := range nodes {
				calls, err := s.ScriptCalls()
				if err != nil {
					t.Fatal(err)
				}
				n += calls
			}
			return n
		}
		// Loaded first, so that the release's calls are EVALSHA alone.
		if err := finishScript.Load(context.Background(), r.client.rdb).Err(); err != nil {
			t.Fatal(err)
		}
		before := evalsha()
		// The handler releases the zones that hold units: the first three.
		if err := release(r, reqs[:3]...); err != nil {
			t.Fatal(err)
		}
		if n := evalsha() - before; n != calls {
			t.Errorf("%d script calls for the release, want %d", n, calls)
		}
		for _, q := range reqs[:3] {
			for _, s := range nodes {
				if n, _ := s.Do("ZCARD", r.holderKey(q.Zone, q.Key)); n != "0" && n != "" {
					t.Errorf("zone %s: %s holders left", q.Zone, n)
				}
				if c, _ := s.Do("HGET", r.counterKey(q.Zone, q.Key), "c"); c != "0" && c != "" {
					t.Errorf("zone %s: %s units held after the release", q.Zone, c)
				}
			}
		}
	}
	t.Run("standalone", func(t *testing.T) {
		s := redistest.Standalone(t)
		check(t, newRedisStore(t, new(Store), s.URL()), []*redistest.Server{s}, 1)
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.NewCluster(t, 3)
		check(t, newRedisStore(t, &Store{Cluster: true}, c.URLs()...), c.Nodes, 2)
	})
}

// TestRedisScriptsDeclareHolders: the take and finish scripts are handed
// a concurrency key's holder set in KEYS, right after its counters: a
// script must declare every key it touches, since Redis Cluster routes a
// call, and Redis replicates its effects, by them. The server's slow log,
// set to log every command, shows the calls as the server got them.
func TestRedisScriptsDeclareHolders(t *testing.T) {
	s := redistest.Standalone(t)
	r := newRedisStore(t, new(Store), s.URL())
	for _, cmd := range [][]string{{"CONFIG", "SET", "slowlog-log-slower-than", "0"}, {"CONFIG", "SET", "slowlog-max-len", "1000"}, {"SLOWLOG", "RESET"}} {
		if _, err := s.Do(cmd...); err != nil {
			t.Fatal(err)
		}
	}
	q := storage.Request{Zone: "conc", Key: "k", Algorithm: algorithms.Concurrency, Rate: algorithms.Rate{Units: 3, Window: time.Minute}, Cost: 1, Holder: 1}
	d := make([]algorithms.Decision, 1)
	if err := r.Take(context.Background(), []storage.Request{q}, d); err != nil || !d[0].Allowed {
		t.Fatalf("take: %+v, %v", d[0], err)
	}
	if err := release(r, q); err != nil {
		t.Fatal(err)
	}
	entries, err := r.client.rdb.SlowLogGet(context.Background(), -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{r.counterKey("conc", "k"), r.holderKey("conc", "k")}
	for _, script := range []struct {
		name, src string
	}{{"take", takeSource}, {"release", finishSource}} {
		sha := goredis.NewScript(script.src).Hash()
		calls := 0
		for _, e := range entries {
			a := e.Args
			if len(a) < 3 || !(strings.EqualFold(a[0], "evalsha") && a[1] == sha || strings.EqualFold(a[0], "eval") && strings.HasPrefix(script.src, a[1][:min(len(a[1]), 64)])) {
				continue
			}
			calls++
			n, err := strconv.Atoi(a[2])
			if err != nil || 3+n > len(a) || !slices.Equal(a[3:3+n], want) {
				t.Errorf("%s script called with %q, want KEYS %q", script.name, a, want)
			}
		}
		if calls == 0 {
			t.Errorf("no call of the %s script in the slow log", script.name)
		}
	}
}
