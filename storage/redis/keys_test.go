package redis

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/internal/race"
	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
	"github.com/d61b427a/caddy-rate-limit/internal/wait"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// counterKey names the counters of key in zone as r does, reading the
// fleet's secret first if r has not yet; it panics if Redis cannot say.
func (r *Store) counterKey(zone, key string) string {
	names, err := r.keyNames(context.Background(), r.client)
	if err != nil {
		panic(err)
	}
	return names.counter(zone, key)
}

// TestRedisTagSecret: the secret key names derive from is the fleet's. A
// store with a client of its own (another instance) names keys as the
// first does, and so does one made later (this instance restarted): the
// secret, which has no TTL, stays in Redis. Deleted (a FLUSHALL, a
// failover that lost its write), it is written anew by the first
// instance to come by, and every instance names keys with the new one at
// its next refresh: a key is then counted afresh, in one hash that both
// share.
func TestRedisTagSecret(t *testing.T) {
	s := redistest.Standalone(t)
	a := newRedisStore(t, &Store{KeyPrefix: "rl:"}, s.URL())
	b := newRedisStore(t, &Store{KeyPrefix: "rl:", PoolSize: 3}, s.URL())
	if a.client == b.client {
		t.Fatal("the two stores share a client, and so one reading of the secret")
	}
	if ttl, err := s.Do("PTTL", "rl:tag_secret"); err != nil || ttl != "-1" {
		t.Fatalf("the secret's PTTL: %s (%v), want -1 (no TTL)", ttl, err)
	}
	first := a.counterKey("z", "k")
	if other := b.counterKey("z", "k"); other != first {
		t.Fatalf("key k named %s by one instance, %s by the other", first, other)
	}
	a.Cleanup()
	restarted := newRedisStore(t, &Store{KeyPrefix: "rl:"}, s.URL())
	if restarted.client == a.client {
		t.Fatal("the restarted store kept the first one's client")
	}
	if again := restarted.counterKey("z", "k"); again != first {
		t.Fatalf("key k named %s after a restart, %s before", again, first)
	}

	req := storage.Request{Zone: "z", Key: "k", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 10, Window: time.Hour}, Cost: 1}
	redisTake(t, restarted, time.Time{}, req)
	if _, err := s.Do("DEL", "rl:tag_secret"); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	wait.For(t, "both instances to name key k with a new secret, the same", func() bool {
		moved := restarted.counterKey("z", "k")
		return moved != first && moved == b.counterKey("z", "k")
	})
	t.Logf("the instances agreed on a new secret %v after the old one was deleted", time.Since(deleted).Round(time.Millisecond))
	if secret, err := s.Do("GET", "rl:tag_secret"); err != nil || secret != b.watcher().names.Load().secret {
		t.Fatalf("the secret in Redis: %q (%v), want the one the instances use", secret, err)
	}
	redisTake(t, restarted, time.Time{}, req)
	redisTake(t, b, time.Time{}, req)
	if n, err := s.Do("HGET", b.counterKey("z", "k"), "c"); err != nil || n != "2" {
		t.Fatalf("key k's count under its new name: %q (%v), want 2, one from each instance", n, err)
	}
}

// counterName keeps TestKeyNamesCounter's names on the heap, as the
// store's are.
var counterName string

// TestKeyNamesCounter: a counter's name is the prefix, the first bytes of
// HMAC-SHA256(secret, key) as hex, the key and the zone, and naming it
// allocates the name alone: the store names every key of every decision.
func TestKeyNamesCounter(t *testing.T) {
	n := newKeyNames("rl:", "s3cret")
	mac := hmac.New(sha256.New, []byte("s3cret"))
	for _, key := range []string{"", "10.0.0.1", strings.Repeat("k", 300)} {
		mac.Reset()
		mac.Write([]byte(key))
		want := "rl:{" + hex.EncodeToString(mac.Sum(nil)[:tagBytes]) + "}{" + key + "}:zone"
		if got := n.counter("zone", key); got != want {
			t.Fatalf("counter(zone, %q) = %q, want %q", key, got, want)
		}
	}
	if race.Enabled {
		return // the race detector's instrumentation allocates
	}
	if allocs := testing.AllocsPerRun(100, func() { counterName = n.counter("zone", "203.0.113.7") }); allocs != 1 {
		t.Fatalf("naming a counter allocates %v times, want 1 (the name)", allocs)
	}
}
