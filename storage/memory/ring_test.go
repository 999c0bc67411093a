package memory

import (
	"testing"
	"time"
	"unsafe"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// TestMemoryRingBucketsChange: a zone whose buckets change from the
// small ring's to the wide one's and back keeps every unit counted, in
// whichever table the key is.
func TestMemoryRingBucketsChange(t *testing.T) {
	c, clock := newTestCounters(t, DefaultMaxKeys)
	req := func(buckets int) storage.Request {
		return storage.Request{Zone: "rb", Key: "k", Algorithm: algorithms.SlidingWindow, Rate: algorithms.Rate{Units: 5, Window: time.Minute, Buckets: buckets}, Cost: 1}
	}
	for _, n := range []int{10, 60, 2, 30} {
		if d := take1(c, req(n)); !d.Allowed {
			t.Fatalf("%d buckets: %+v", n, d)
		}
		clock.Add(time.Second)
	}
	if d := take1(c, req(10)); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("fifth of five: %+v, want allowed with none left", d)
	}
	if d := take1(c, req(60)); d.Allowed {
		t.Fatalf("sixth of five, in the other table: %+v, want rejected", d)
	}
	if n := c.len(); n != 1 {
		t.Fatalf("%d keys held, want the one", n)
	}
}

// TestMemoryRingsBounded: rings count towards max_keys with the other
// keys, and are evicted like them.
func TestMemoryRingsBounded(t *testing.T) {
	c, _ := newTestCounters(t, 10*shardCount)
	for i := range 5000 {
		alg := algorithms.SlidingWindow
		if i%2 == 0 {
			alg = algorithms.FixedWindow
		}
		take1(c, storage.Request{Zone: "rk", Key: ipKey(i), Algorithm: alg, Rate: algorithms.Rate{Units: 5, Window: time.Minute}, Cost: 1})
	}
	if n := c.len(); n > 10*shardCount {
		t.Fatalf("%d keys held, bound %d", n, 10*shardCount)
	}
}

// TestMemoryRingWidens: a ring whose count outgrows 16 bits moves to the
// table of 32-bit counts, losing nothing; a ring of more than 10 buckets
// lives in a wide table.
func TestMemoryRingWidens(t *testing.T) {
	c, _ := newTestCounters(t, DefaultMaxKeys)
	req := storage.Request{Zone: "rw", Key: "k", Algorithm: algorithms.SlidingWindow, Rate: algorithms.Rate{Units: 100_000, Window: time.Minute}, Cost: 60_000}
	h := c.keyHash("rw", "k")
	s := &c.shards[shardOf(h)]
	where := func() int {
		_, kind := s.rings.find(h, req.Rate.Window.Milliseconds())
		return kind
	}
	req.Cost = 200
	take1(c, req)
	if k := where(); k != ringSmall8 {
		t.Fatalf("a count of 200 is in table %d, want the small 8-bit one", k)
	}
	req.Cost = 59_800
	take1(c, req)
	if k := where(); k != ringSmall16 {
		t.Fatalf("a count of 60,000 is in table %d, want the small 16-bit one", k)
	}
	req.Cost = 30_000
	take1(c, req)
	if k := where(); k != ringSmall32 {
		t.Fatalf("a count of 90,000 is in table %d, want the small 32-bit one", k)
	}
	req.Cost = 10_001
	if d := take1(c, req); d.Allowed || d.Remaining != 10_000 {
		t.Fatalf("over the limit after widening: %+v, want rejected with 10,000 left", d)
	}
	wide := storage.Request{Zone: "rw", Key: "w", Algorithm: algorithms.SlidingWindow, Rate: algorithms.Rate{Units: 5, Window: time.Minute, Buckets: 30}, Cost: 1}
	take1(c, wide)
	hw := c.keyHash("rw", "w")
	if _, kind := c.shards[shardOf(hw)].rings.find(hw, wide.Rate.Window.Milliseconds()); kind != ringWide8 {
		t.Fatalf("a ring of 30 buckets is in table %d, want the wide 8-bit one", kind)
	}
	if n := c.len(); n != 2 {
		t.Fatalf("%d keys held, want 2", n)
	}
}

// TestMemoryRingSlotSizes: the common ring, 10 buckets of counts under
// 256, is a 20-byte slot (28 with its key); with counts up to 65,535, 32.
func TestMemoryRingSlotSizes(t *testing.T) {
	if n := unsafe.Sizeof(ringSlot[uint8]{}); n != 20 {
		t.Fatalf("ringSlot[uint8] is %d bytes, want 20", n)
	}
	if n := unsafe.Sizeof(ringSlot[uint16]{}); n != 32 {
		t.Fatalf("ringSlot[uint16] is %d bytes, want 32", n)
	}
}

// TestMemoryRingIndexRoundTrip: a slot keeps 32 bits of a ring's index
// and finds the rest from its expiry and the window, for sub-windows from
// 1 ms to hours, at instants from 1970 to 2100.
func TestMemoryRingIndexRoundTrip(t *testing.T) {
	for _, w := range []time.Duration{2 * time.Millisecond, 60 * time.Millisecond, time.Second, 997 * time.Millisecond, time.Minute, 24 * time.Hour} {
		for _, n := range []int{2, 10, 60} {
			if w.Milliseconds() < int64(n) {
				continue
			}
			for _, at := range roundTripInstants {
				rate := algorithms.Rate{Units: 5, Window: w, Buckets: n}
				_, want := algorithms.DecideRing(algorithms.Ring{}, at, rate, 1)
				var small ringSlot[uint8]
				var wide wideRingSlot[uint32]
				expires := ringExpiry(want, w.Milliseconds())
				small.set(want, expires, true)
				wide.set(want, expires, false)
				got := []algorithms.Ring{wide.ring(w.Milliseconds())}
				if n < smallRing {
					got = append(got, small.ring(w.Milliseconds()))
				}
				for _, got := range got {
					if got.Index != want.Index || got.Buckets != n || got.Used() != 1 {
						t.Fatalf("window %s, %d buckets, at %s: read back index %d buckets %d used %d, want %d %d 1",
							w, n, at, got.Index, got.Buckets, got.Used(), want.Index, n)
					}
				}
				if !small.referenced() || wide.referenced() {
					t.Fatalf("reference bits: %v %v, want true false", small.referenced(), wide.referenced())
				}
			}
		}
	}
}
