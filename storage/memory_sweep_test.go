package storage

import (
	"context"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/algorithms/vectors"
)

// TestMemorySweepInterval: with a short sweep interval an expired key's
// slot is emptied within a few intervals; with the default (10 s) the same
// key, expired just as long, still holds its slot.
func TestMemorySweepInterval(t *testing.T) {
	expired := func(interval time.Duration) *memoryCounters {
		c, clock := newTestCounters(t, DefaultMaxKeys)
		if interval > 0 {
			m := &Memory{counters: c}
			c.addUser(m)
			m.SetSweepInterval(interval)
		}
		take1(c, Request{Zone: "z", Key: "k", Algorithm: algorithms.SlidingTail, Rate: algorithms.Rate{Units: 5, Window: time.Second}, Cost: 1})
		if n := c.len(); n != 1 {
			t.Fatalf("%d keys after one take", n)
		}
		// Counts are kept to the end of the next window: 2 s on, they
		// no longer matter.
		clock.set(vectors.Start.Add(3 * time.Second))
		return c
	}
	short, long := expired(20*time.Millisecond), expired(0)
	start := time.Now()
	for short.len() != 0 {
		if time.Since(start) > 5*time.Second {
			t.Fatal("the expired key still holds its slot 5 s on, with sweep_interval 20ms")
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("reclaimed after %s", time.Since(start))
	if n := long.len(); n != 1 && time.Since(start) < DefaultSweepInterval {
		t.Fatalf("%d keys with the default interval, want the expired key still held until the first sweep", n)
	}
}

// TestMemorySweepIntervalFollowsConfigs: the store is shared, so the
// shortest interval any config using it asks for applies (a config that
// does not ask has no say); a config that is
// cleaned up takes its request with it, and with none left the default
// applies again.
func TestMemorySweepIntervalFollowsConfigs(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	provision := func(d time.Duration) *Memory {
		m := new(Memory)
		if err := m.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		m.SetSweepInterval(d)
		return m
	}
	base := provision(0)
	defer base.Cleanup()
	if got := sweepInterval(base); got != DefaultSweepInterval {
		t.Fatalf("interval %s with no config asking, want the default %s", got, DefaultSweepInterval)
	}
	old := provision(time.Minute)
	if got := sweepInterval(base); got != time.Minute {
		t.Fatalf("interval %s, want 1m: a config that does not ask has no say", got)
	}
	next := provision(100 * time.Millisecond)
	if got := sweepInterval(base); got != 100*time.Millisecond {
		t.Fatalf("interval %s during a reload, want the shortest asked for, 100ms", got)
	}
	next.Cleanup()
	if got := sweepInterval(base); got != time.Minute {
		t.Fatalf("interval %s after the 100ms config went, want 1m again", got)
	}
	old.SetSweepInterval(time.Second)
	if got := sweepInterval(base); got != time.Second {
		t.Fatalf("interval %s, want 1s", got)
	}
	old.Cleanup()
	if got := sweepInterval(base); got != DefaultSweepInterval {
		t.Fatalf("interval %s with no config asking, want the default", got)
	}
}

func TestCheckSweepInterval(t *testing.T) {
	for d, ok := range map[time.Duration]bool{0: true, MinSweepInterval: true, time.Minute: true, time.Millisecond: false, -time.Second: false} {
		if err := CheckSweepInterval(d); (err == nil) != ok {
			t.Errorf("CheckSweepInterval(%s) = %v", d, err)
		}
	}
}

// sweepInterval returns the sweep interval in force.
func sweepInterval(m *Memory) time.Duration {
	return time.Duration(m.counters.sweepEvery.Load())
}
