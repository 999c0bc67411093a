package memory

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/algorithms/vectors"
	"github.com/d61b427a/caddy-rate-limit/internal/threadtime"
	"github.com/d61b427a/caddy-rate-limit/internal/wait"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// TestMemorySweepInterval: the sweeper sweeps on its own, at the interval
// in force. New counters have DefaultSweepInterval in force; a config that
// asks for another puts it in force, and the running sweeper follows it.
// With MinSweepInterval in force, the sweeper empties the slot of a key
// that has expired, with nothing else touching the store; counters swept
// every hour still hold their expired key by then, since their sweeper has
// not run yet.
//
// The test waits for events (the sweeper taking a new interval, the key
// count dropping) and asserts nothing about how long they took: waitUntil's
// deadline only keeps a sweeper that never sweeps from hanging the test.
func TestMemorySweepInterval(t *testing.T) {
	// askFor puts interval in force, and waits until the sweeper has taken
	// the change off resweep: from then on its ticker runs, so a later
	// interval takes effect only if the sweeper resets it.
	askFor := func(m *Store, interval time.Duration) {
		t.Helper()
		m.SetSweepInterval(interval)
		if got := sweepInterval(m); got != interval {
			t.Fatalf("sweep interval in force %s, want the %s asked for", got, interval)
		}
		wait.For(t, "the sweeper takes the new interval", func() bool { return len(m.counters.resweep) == 0 })
	}
	expired := func(intervals ...time.Duration) *counters {
		c, clock := newTestCounters(t, DefaultMaxKeys)
		m := &Store{counters: c}
		if got := sweepInterval(m); got != DefaultSweepInterval {
			t.Fatalf("new counters sweep every %s, want the default %s", got, DefaultSweepInterval)
		}
		c.addUser(m)
		for _, d := range intervals {
			askFor(m, d)
		}
		take1(c, storage.Request{Zone: "z", Key: "k", Algorithm: algorithms.SlidingTail, Rate: algorithms.Rate{Units: 5, Window: time.Second}, Cost: 1})
		if n := c.len(); n != 1 {
			t.Fatalf("%d keys after one take", n)
		}
		// Counts are kept to the end of the next window: 2 s on, they
		// no longer matter.
		clock.Set(vectors.Start.Add(3 * time.Second))
		return c
	}
	short, hourly := expired(time.Hour, MinSweepInterval), expired(time.Hour)
	wait.For(t, "the sweeper empties the expired key's slot", func() bool { return short.len() == 0 })
	if n := hourly.len(); n != 1 {
		t.Fatalf("%d keys in counters swept every hour, want the expired key held until their first sweep", n)
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
	provision := func(d time.Duration) *Store {
		m := new(Store)
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
func sweepInterval(m *Store) time.Duration {
	return time.Duration(m.counters.sweepEvery.Load())
}

// BenchmarkMemorySweep fills the store to its default bound (1,000,000
// keys, about 15,600 a shard), then times the sweep: the longest and the
// 99th percentile of the holds of one shard's lock, which a request for a
// key of that shard waits for. Half the keys have ended their windows, so
// the sweep has work to do. The holds are timed in the sweeping thread's
// own CPU time (threadtime.Now), as the lease table's are.
func BenchmarkMemorySweep(b *testing.B) {
	now := time.Unix(1_800_000_000, 0)
	c := newCounters(DefaultMaxKeys, func() time.Time { return now })
	defer c.Destruct()
	d := make([]algorithms.Decision, 1)
	for i := range DefaultMaxKeys {
		w := time.Minute
		if i%2 == 0 {
			w = time.Second
		}
		c.take([]storage.Request{{Zone: "z", Key: ipKey(i) + "/" + strconv.Itoa(i>>24), Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 1 << 30, Window: w}, Cost: 1}}, d)
	}
	now = now.Add(10 * time.Second)
	var holds []time.Duration
	for b.Loop() {
		for i := range c.shards {
			s := &c.shards[i]
			start := threadtime.Now()
			s.mu.Lock()
			c.admin.overrides.Add(int64(-s.sweep(unixSeconds(now.UnixMilli()))))
			s.mu.Unlock()
			holds = append(holds, threadtime.Now()-start)
		}
	}
	slices.Sort(holds)
	b.ReportMetric(float64(holds[len(holds)-1].Nanoseconds()), "max-hold-ns")
	b.ReportMetric(float64(holds[len(holds)*99/100].Nanoseconds()), "p99-hold-ns")
}
