package storage

import (
	"context"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/algorithms/vectors"
	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
)

// TestRedisNeverOver: the sliding window's promise, on Redis.
func TestRedisNeverOver(t *testing.T) {
	s := redistest.Standalone(t)
	r := newRedisStore(t, new(Redis), s.URL())
	vectors.NeverOver(t, func(key string, rate algorithms.Rate, a vectors.Arrival) algorithms.Decision {
		return redisTake(t, r, a.At, Request{Zone: "never_over", Key: key, Algorithm: algorithms.SlidingWindow, Rate: rate, Cost: a.Cost})[0]
	})
}

// TestRedisRing: a sliding window's ring in Redis: a cost given back
// comes off its sub-window, the admin API reads the ring, and a reset
// forgets it.
func TestRedisRing(t *testing.T) {
	s := redistest.Standalone(t)
	r := newRedisStore(t, new(Redis), s.URL())
	req := Request{Zone: "rr", Key: "k", Algorithm: algorithms.SlidingWindow, Rate: algorithms.Rate{Units: 2, Window: time.Minute, Buckets: 6}, Cost: 1}
	first := redisTake(t, r, time.Time{}, req)[0]
	redisTake(t, r, time.Time{}, req)
	if err := r.Release(context.Background(), []Request{req}, []algorithms.Decision{first}); err != nil {
		t.Fatal(err)
	}
	st, err := r.KeyState(context.Background(), "rr", "k", time.Minute)
	if err != nil || st.Ring.Buckets != 6 || st.Ring.Used() != 1 || st.Ring.Index != first.Window {
		t.Fatalf("key state %+v (%v), want a ring of 6 buckets holding 1 in sub-window %d", st.Ring, err, first.Window)
	}
	if d := redisTake(t, r, time.Time{}, req)[0]; !d.Allowed || d.Remaining != 0 {
		t.Fatalf("after giving one back: %+v, want allowed with none left", d)
	}
	if err := r.ResetKey(context.Background(), "rr", "k"); err != nil {
		t.Fatal(err)
	}
	if d := redisTake(t, r, time.Time{}, req)[0]; !d.Allowed || d.Remaining != 1 {
		t.Fatalf("after a reset: %+v, want allowed with 1 left", d)
	}
}
