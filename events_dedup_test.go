package ratelimit

import (
	"hash/maphash"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
)

// TestExceededKeysOncePerWindow: each of many keys is first once in a
// window and again in the next; of many requests of one key coming at
// once, exactly one is first.
func TestExceededKeysOncePerWindow(t *testing.T) {
	var e exceededKeys
	const keys = 1000
	for w := int64(1); w <= 3; w++ {
		for i := range keys {
			if !e.first(strconv.Itoa(i), w) {
				t.Fatalf("window %d: key %d not first", w, i)
			}
		}
	}
	// Alone in their slots, keys are never first twice in a window.
	alone := map[uint64]int{}
	for i := range keys {
		alone[maphash.String(exceededSeed, strconv.Itoa(i))%exceededSlots]++
	}
	for i := range keys {
		k := strconv.Itoa(i)
		if alone[maphash.String(exceededSeed, k)%exceededSlots] == 1 && e.first(k, 3) {
			t.Fatalf("key %d first twice in a window", i)
		}
	}

	// Requests of one key in one window from every CPU, let go at once,
	// window after window.
	const windows = 20_000
	procs := max(runtime.GOMAXPROCS(0), 2)
	var started, done atomic.Int64
	firsts := make([]atomic.Int64, windows)
	var wg sync.WaitGroup
	for range procs {
		wg.Go(func() {
			for w := range int64(windows) {
				for started.Load() <= w {
					runtime.Gosched()
				}
				if e.first("flood", 100+w) {
					firsts[w].Add(1)
				}
				done.Add(1)
			}
		})
	}
	for w := range int64(windows) {
		started.Store(w + 1) // window w goes
		for done.Load() < (w+1)*int64(procs) {
			runtime.Gosched()
		}
	}
	wg.Wait()
	for w := range firsts {
		if n := firsts[w].Load(); n != 1 {
			t.Fatalf("window %d: %d of %d requests at once first, want 1", w, n, procs)
		}
	}
}

// TestExceededKeysSharedSlot: two keys in one slot each get their event
// in a window, and may get another after the other key took the slot:
// a shared slot lets events through, never holds one back.
func TestExceededKeysSharedSlot(t *testing.T) {
	bySlot := map[uint64]string{}
	var a, b string
	for i := 0; a == ""; i++ {
		k := strconv.Itoa(i)
		slot := maphash.String(exceededSeed, k) % exceededSlots
		if other, ok := bySlot[slot]; ok {
			a, b = other, k
		}
		bySlot[slot] = k
	}
	var e exceededKeys
	for round := range 3 {
		if !e.first(a, 1) || !e.first(b, 1) {
			t.Fatalf("round %d: %s or %s, sharing a slot, not first after the other", round, a, b)
		}
	}
}

// BenchmarkExceededKeys: a zone's dedup of rejected requests from every
// CPU at once, for one key rejected over and over, and for a flood of
// keys each rejected once.
func BenchmarkExceededKeys(b *testing.B) {
	keys := make([]string, 1<<20)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
	}
	b.Run("one_key_parallel", func(b *testing.B) {
		var e exceededKeys
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				e.first("203.0.113.9", 1)
			}
		})
	})
	b.Run("rotating_parallel", func(b *testing.B) {
		var e exceededKeys
		var next atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			i := int(next.Add(1)) * 7919
			for pb.Next() {
				e.first(keys[i%len(keys)], 1)
				i++
			}
		})
	})
}
