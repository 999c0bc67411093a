package redis

import (
	"strconv"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// TestOwedTableBounded: a flood of fresh keys admitted by the local
// fallback keeps at most maxOwed of them for Redis, and a key already
// kept still adds up.
func TestOwedTableBounded(t *testing.T) {
	var table owedTable
	names := new(dialWatcher)
	now := time.Now()
	rate := algorithms.Rate{Units: 10, Window: time.Hour}
	d := []algorithms.Decision{{Allowed: true, Window: algorithms.WindowIndex(now.UnixMilli(), time.Hour.Milliseconds())}}
	for i := range maxOwed + 1000 {
		table.add(names, []storage.Request{{Zone: "z", Key: strconv.Itoa(i), Algorithm: algorithms.FixedWindow, Rate: rate, Cost: 1}}, d, now)
	}
	if n := table.size(); n != maxOwed {
		t.Fatalf("%d keys kept after %d, want the bound %d", n, maxOwed+1000, maxOwed)
	}
	table.add(names, []storage.Request{{Zone: "z", Key: "0", Algorithm: algorithms.FixedWindow, Rate: rate, Cost: 2}}, d, now)
	for _, o := range table.drain() {
		if o.q.Key == "0" && o.units != 3 {
			t.Fatalf("key 0 owes %d, want 3 (1, then 2)", o.units)
		}
	}
	if n := table.size(); n != 0 {
		t.Fatalf("%d keys kept after drain, want 0", n)
	}
}

// TestOwedCounting: only what still counts against a key is caught up:
// a fixed window's units in their window, a sliding window's for a
// window after the latest, gcra's less what the bucket drained.
func TestOwedCounting(t *testing.T) {
	at := time.UnixMilli(10 * time.Hour.Milliseconds()) // the start of a window of an hour
	owed := func(alg algorithms.Algorithm) owedKey {
		return owedKey{
			q:      storage.Request{Algorithm: alg, Rate: algorithms.Rate{Units: 60, Window: time.Hour}},
			units:  30,
			window: algorithms.WindowIndex(at.UnixMilli(), time.Hour.Milliseconds()),
			last:   at,
		}
	}
	for _, c := range []struct {
		alg   algorithms.Algorithm
		after time.Duration
		want  int64
	}{
		{algorithms.FixedWindow, 59 * time.Minute, 30},
		{algorithms.FixedWindow, time.Hour, 0},
		{algorithms.SlidingTail, 59 * time.Minute, 30},
		{algorithms.SlidingTail, time.Hour, 0},
		{algorithms.SlidingWindow, 90 * time.Minute, 0},
		{algorithms.SlidingWindow, 59 * time.Minute, 30},
		// 60 an hour: one a minute drains.
		{algorithms.GCRA, 10 * time.Minute, 20},
		{algorithms.GCRA, time.Hour, 0},
	} {
		if got := owed(c.alg).counting(at.Add(c.after)); got != c.want {
			t.Errorf("%s, %v after: %d still count, want %d", c.alg, c.after, got, c.want)
		}
	}
}
