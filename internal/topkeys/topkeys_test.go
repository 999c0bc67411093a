package topkeys

import (
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/internal/wait"
)

// TestTopKeysFindsHeavyHitters: among 100,000 keys seen once or twice,
// the few heavy ones are found, in order, each count overstated by at
// most the error the summary reports and never understated, in at most
// topTracked entries.
func TestTopKeysFindsHeavyHitters(t *testing.T) {
	tk := New(time.Hour)
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
		tk.Add(k, 1, rejected)
		c := truth[k]
		c[0]++
		if rejected {
			c[1]++
		}
		truth[k] = c
	}
	if n := tk.tracked(); n > topTracked {
		t.Fatalf("%d keys tracked, want at most %d", n, topTracked)
	}
	keys, bound := tk.Top(3)
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

// tracked counts the keys the current summaries track.
func (t *Keys) tracked() int {
	n := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		n += int(s.current.n)
		s.mu.Unlock()
	}
	return n
}

// TestTopKeysForgetsOldPeriods: a key not seen for two periods is gone;
// one seen in the period before still counts.
func TestTopKeysForgetsOldPeriods(t *testing.T) {
	tk := New(time.Hour)
	tk.Add("old", 1, true)
	tk.turn()
	tk.Add("recent", 1, false)
	if keys, _ := tk.Top(10); len(keys) != 2 || keys[0].Key != "old" {
		t.Fatalf("one period on: %+v, want old (rejected) then recent", keys)
	}
	tk.turn()
	if keys, _ := tk.Top(10); len(keys) != 1 || keys[0].Key != "recent" {
		t.Fatalf("two periods on: %+v, want recent alone", keys)
	}
	tk.turn()
	if keys, _ := tk.Top(10); len(keys) != 0 {
		t.Fatalf("long after: %+v, want none", keys)
	}
}

// TestTopKeysTimerTurns: a timer turns the periods while the zone has
// traffic, and stops once a whole period went by without a request; the
// next request starts it again.
func TestTopKeysTimerTurns(t *testing.T) {
	tk := New(10 * time.Millisecond)
	for round := range 2 {
		tk.Add("k", 1, false)
		if !tk.turning.Load() {
			t.Fatalf("round %d: no timer after a request", round)
		}
		wait.For(t, "the key to be forgotten", func() bool {
			keys, _ := tk.Top(10)
			return len(keys) == 0
		})
		wait.For(t, "the timer to stop", func() bool { return !tk.turning.Load() })
	}
}

// TestTopKeysSummaryInvariants: through a skewed stream of keys, each
// shard's summary keeps Space-Saving's promises, checked against the true
// counts after every request: each tracked key's count is at least its
// true count and at most err more; a key not tracked by a full summary
// has at most as many requests as the least count tracked (the one the
// heap keeps at its top); the counts add up to the shard's requests; and
// the index finds every tracked key.
func TestTopKeysSummaryInvariants(t *testing.T) {
	tk := New(time.Hour)
	rng := rand.New(rand.NewPCG(7, 11))
	zipf := rand.NewZipf(rng, 1.1, 2, 999)
	truth := map[string]int64{}
	var perShard [topShards]int64
	for step := range 20_000 {
		k := fmt.Sprint("key-", zipf.Uint64())
		tk.Add(k, 1, rng.IntN(4) == 0)
		truth[k]++
		h := maphash.String(topSeed, k)
		perShard[h%topShards]++
		if step%97 != 0 && step < 19_000 {
			continue
		}
		for i := range tk.shards {
			checkSummary(t, &tk.shards[i].current, perShard[i], truth, i)
		}
	}
}

// checkSummary checks the promises TestTopKeysSummaryInvariants names for
// the summary s of shard, which counted requests in all.
func checkSummary(t *testing.T, s *topSummary, requests int64, truth map[string]int64, shard int) {
	t.Helper()
	var sum int64
	least := int64(-1)
	tracked := map[string]bool{}
	for i, e := range s.entries[:s.n] {
		sum += e.count
		tracked[e.key] = true
		if slot, ok := s.find(e.hash); !ok || s.index[slot]-1 != uint8(i) {
			t.Fatalf("shard %d: entry %d (%s) not found by the index", shard, i, e.key)
		}
		if e.count < truth[e.key] || e.count-e.err > truth[e.key] {
			t.Fatalf("shard %d: %s counted %d with error %d, true %d", shard, e.key, e.count, e.err, truth[e.key])
		}
		if e.rejected > e.count {
			t.Fatalf("shard %d: %s has more rejections than requests", shard, e.key)
		}
		if least < 0 || e.count < least {
			least = e.count
		}
	}
	if sum != requests {
		t.Fatalf("shard %d: counts add up to %d, %d requests", shard, sum, requests)
	}
	if s.n == 0 {
		return
	}
	if got := s.entries[s.heap[0]].count; got != least {
		t.Fatalf("shard %d: the heap's top has %d requests, the least is %d", shard, got, least)
	}
	if s.n < topPerShard {
		return
	}
	for k, n := range truth {
		if !tracked[k] && maphash.String(topSeed, k)%topShards == uint64(shard) && n > least {
			t.Fatalf("shard %d: %s not tracked with %d requests, more than the least tracked, %d", shard, k, n, least)
		}
	}
}

// BenchmarkTopKeysAdd: what a request costs the summary, for a key it
// tracks and for keys it must make room for, one request at a time and
// from every CPU at once (_parallel), as a zone's requests come.
func BenchmarkTopKeysAdd(b *testing.B) {
	keys := make([]string, 1<<20)
	for i := range keys {
		keys[i] = fmt.Sprint("key-", i)
	}
	b.Run("tracked", func(b *testing.B) {
		tk := New(time.Hour)
		for b.Loop() {
			tk.Add("203.0.113.9", 1, false)
		}
	})
	b.Run("100k_keys", func(b *testing.B) {
		tk := New(time.Hour)
		i := 0
		for b.Loop() {
			tk.Add(keys[i%100_000], 1, false)
			i++
		}
	})
	b.Run("tracked_parallel", func(b *testing.B) {
		tk := New(time.Hour)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				tk.Add("203.0.113.9", 1, false)
			}
		})
	})
	b.Run("rotating_parallel", func(b *testing.B) {
		tk := New(time.Hour)
		var next atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			// Each goroutine its own run of the keys, each key new.
			i := int(next.Add(1)) * 7919
			for pb.Next() {
				tk.Add(keys[i%len(keys)], 1, false)
				i++
			}
		})
	})
}
