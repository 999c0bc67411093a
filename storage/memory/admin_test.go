package memory

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// TestMemoryOverrideSwept: an override decides its key's limit while in
// force, not once its ttl is over, and the sweep then removes it, so that
// the store holds none and counts none.
func TestMemoryOverrideSwept(t *testing.T) {
	c, clock := newTestCounters(t, DefaultMaxKeys)
	m := &Store{counters: c}
	ctx := context.Background()
	if err := m.SetOverride(ctx, "z", "short", storage.Override{Limit: 7, Expires: clock.Now().Add(2 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	if err := m.SetOverride(ctx, "z", "forever", storage.Override{Limit: 9}); err != nil {
		t.Fatal(err)
	}
	req := func(key string) storage.Request {
		return storage.Request{Zone: "z", Key: key, Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 3, Window: time.Minute}, Cost: 1}
	}
	if d := take1(c, req("short")); d.Limit != 7 {
		t.Fatalf("under the override: limit %d, want 7", d.Limit)
	}
	c.sweep()
	if n := c.entries().overrides; n != 2 {
		t.Fatalf("a sweep before the ttl ends kept %d overrides, want 2", n)
	}
	clock.Add(3 * time.Second)
	if d := take1(c, req("short")); d.Limit != 3 {
		t.Fatalf("after the ttl: limit %d, want the zone's 3", d.Limit)
	}
	c.sweep()
	if n, counted := c.entries().overrides, c.admin.overrides.Load(); n != 1 || counted != 1 {
		t.Fatalf("after the sweep: %d overrides kept, %d counted, want the one without a ttl", n, counted)
	}
	if st, _ := m.KeyState(ctx, "z", "short", algorithms.Rate{Window: time.Minute}); st.Override != nil {
		t.Fatalf("key state shows %+v, want no override", st.Override)
	}
	if err := m.DeleteOverride(ctx, "z", "forever"); err != nil {
		t.Fatal(err)
	}
	if n, counted := c.entries().overrides, c.admin.overrides.Load(); n != 0 || counted != 0 {
		t.Fatalf("after the last is removed: %d overrides kept, %d counted, want none", n, counted)
	}
	for i := range c.shards {
		if c.shards[i].overrides != nil {
			t.Fatalf("shard %d still has a map of overrides: takes would look in it", i)
		}
	}
	if d := take1(c, req("forever")); d.Limit != 3 {
		t.Fatalf("after the override is removed: limit %d, want the zone's 3", d.Limit)
	}
}

// TestMemoryOverridesBounded: the store keeps at most MaxOverrides; past
// that a new override is refused with ErrTooManyOverrides, while a key's
// override can still be replaced, and removing one makes room.
func TestMemoryOverridesBounded(t *testing.T) {
	c, _ := newTestCounters(t, DefaultMaxKeys)
	m := &Store{counters: c}
	ctx := context.Background()
	for i := range MaxOverrides {
		if err := m.SetOverride(ctx, "z", strconv.Itoa(i), storage.Override{Limit: 5}); err != nil {
			t.Fatalf("override %d: %v", i, err)
		}
	}
	if err := m.SetOverride(ctx, "z", "one more", storage.Override{Limit: 5}); !errors.Is(err, storage.ErrTooManyOverrides) {
		t.Fatalf("one past the bound: %v, want storage.ErrTooManyOverrides", err)
	}
	if err := m.SetOverride(ctx, "z", "0", storage.Override{Limit: 6}); err != nil {
		t.Fatalf("replacing an override: %v", err)
	}
	if err := m.DeleteOverride(ctx, "z", "1"); err != nil {
		t.Fatal(err)
	}
	if err := m.SetOverride(ctx, "z", "one more", storage.Override{Limit: 5}); err != nil {
		t.Fatalf("after one was removed: %v", err)
	}
	if n := c.entries().overrides; n != MaxOverrides {
		t.Fatalf("%d overrides kept, want %d", n, MaxOverrides)
	}
}

// BenchmarkMemoryTakeOverrides: takes from every CPU at once, each of a
// key of its own, with no override in the store, and with 1,000
// overrides in force on other keys and on the keys taken.
func BenchmarkMemoryTakeOverrides(b *testing.B) {
	rate := algorithms.Rate{Units: 1 << 30, Window: time.Minute}
	for _, overrides := range []bool{false, true} {
		name := "none"
		if overrides {
			name = "1000_in_force"
		}
		b.Run(name, func(b *testing.B) {
			c := newCounters(DefaultMaxKeys, time.Now)
			defer c.Destruct()
			m := &Store{counters: c}
			if overrides {
				for i := range 1000 {
					if err := m.SetOverride(context.Background(), "z", "client-"+strconv.Itoa(i), storage.Override{Limit: 1 << 30}); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportAllocs()
			var n atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				reqs := []storage.Request{{Zone: "z", Key: "client-" + strconv.Itoa(int(n.Add(1))), Algorithm: algorithms.SlidingTail, Rate: rate, Cost: 1}}
				d := make([]algorithms.Decision, 1)
				for pb.Next() {
					c.take(reqs, d)
				}
			})
		})
	}
}
