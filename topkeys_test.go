package ratelimit

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/internal/clocktest"
)

// TestTopKeysFindsHeavyHitters: among 100,000 keys seen once or twice,
// the few heavy ones are found, in order, each count overstated by at
// most the error the summary reports and never understated, in at most
// topTracked entries.
func TestTopKeysFindsHeavyHitters(t *testing.T) {
	clock := clocktest.New(time.Unix(1_800_000_000, 0))
	tk := &topKeys{now: clock.Now}
	rng := rand.New(rand.NewPCG(29, 1))
	truth := map[string][2]int64{}
	heavy := map[string]int{"ci-runner": 5000, "scraper": 3000, "script-50-workers": 2000}
	var stream []string
	for k, n := range heavy {
		for range n {
			stream = append(stream, k)
		}
	}
	for i := range 100_000 {
		stream = append(stream, fmt.Sprint("user-", i))
		if i%3 == 0 {
			stream = append(stream, fmt.Sprint("user-", i))
		}
	}
	rng.Shuffle(len(stream), func(i, j int) { stream[i], stream[j] = stream[j], stream[i] })
	for i, k := range stream {
		rejected := k == "ci-runner" && i%2 == 0
		tk.add(k, rejected)
		c := truth[k]
		c[0]++
		if rejected {
			c[1]++
		}
		truth[k] = c
	}
	if n := len(tk.current.entries); n > topTracked {
		t.Fatalf("%d keys tracked, want at most %d", n, topTracked)
	}
	keys, bound := tk.top(3)
	if len(keys) != 3 || keys[0].Key != "ci-runner" || keys[1].Key != "scraper" || keys[2].Key != "script-50-workers" {
		t.Fatalf("top 3 %+v, want ci-runner (the one rejected), then scraper, then script-50-workers", keys)
	}
	for _, k := range keys {
		want := truth[k.Key][0]
		if k.Requests < want || k.Requests > want+bound {
			t.Errorf("%s: %d requests reported, %d true, error bound %d", k.Key, k.Requests, want, bound)
		}
	}
	t.Logf("top 3 of %d requests over %d keys: %+v, error bound %d", len(stream), len(truth), keys, bound)
}

// TestTopKeysForgetsOldPeriods: a key not seen for two periods is gone;
// one seen in the period before still counts.
func TestTopKeysForgetsOldPeriods(t *testing.T) {
	clock := clocktest.New(time.Unix(1_800_000_000, 0))
	tk := &topKeys{now: clock.Now}
	tk.add("old", true)
	clock.Add(topPeriod)
	tk.add("recent", false)
	if keys, _ := tk.top(10); len(keys) != 2 || keys[0].Key != "old" {
		t.Fatalf("one period on: %+v, want old (rejected) then recent", keys)
	}
	clock.Add(topPeriod)
	if keys, _ := tk.top(10); len(keys) != 1 || keys[0].Key != "recent" {
		t.Fatalf("two periods on: %+v, want recent alone", keys)
	}
	clock.Add(2 * topPeriod)
	if keys, _ := tk.top(10); len(keys) != 0 {
		t.Fatalf("long after: %+v, want none", keys)
	}
}

// BenchmarkTopKeysAdd: what a request costs the summary, for a key it
// tracks and for keys it must make room for.
func BenchmarkTopKeysAdd(b *testing.B) {
	b.Run("tracked", func(b *testing.B) {
		tk := &topKeys{now: time.Now}
		for b.Loop() {
			tk.add("203.0.113.9", false)
		}
	})
	b.Run("100k_keys", func(b *testing.B) {
		tk := &topKeys{now: time.Now}
		keys := make([]string, 100_000)
		for i := range keys {
			keys[i] = fmt.Sprint("key-", i)
		}
		i := 0
		for b.Loop() {
			tk.add(keys[i%len(keys)], false)
			i++
		}
	})
}
