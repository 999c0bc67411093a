package redis

import (
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/internal/threadtime"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// BenchmarkDenyCacheFlood stores rejections of fresh keys into a full deny
// cache, as a flood of keys each over its limit does: every store makes
// room. max-hold-ns is the longest a store held a shard's lock, in the
// CPU time of its thread (max-wall-ns in wall time), p99-hold-ns the 99th
// percentile.
func BenchmarkDenyCacheFlood(b *testing.B) {
	var c denyCache
	c.init()
	q := []storage.Request{{Zone: "z", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 1000, Window: time.Minute}, Cost: 1}}
	now := time.UnixMilli(1_700_000_000_000)
	d := []algorithms.Decision{{Limit: 1000, Reset: now.Add(time.Minute), RetryAt: now.Add(time.Minute)}}
	key := func(n int) string { return "bench:{k" + strconv.Itoa(n) + "}:z" }
	full := denyCacheShards * denyShardSize
	for n := range 2 * full {
		c.store([]string{key(n)}, q, d, now)
	}
	keys := make([]string, b.N)
	for i := range keys {
		keys[i] = key(2*full + i)
	}
	holds := make([]time.Duration, 0, b.N)
	var maxWall time.Duration
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		start, cpu := time.Now(), threadtime.Now()
		c.store(keys[i:i+1], q, d, now)
		holds = append(holds, threadtime.Now()-cpu)
		maxWall = max(maxWall, time.Since(start))
	}
	b.StopTimer()
	reportHolds(b, holds, maxWall)
	b.ReportMetric(float64(c.size.Load()), "entries")
}

// reportHolds reports the longest and the 99th percentile of holds, a
// lock's hold times in its thread's CPU time, and maxWall, the longest in
// wall time.
func reportHolds(b *testing.B, holds []time.Duration, maxWall time.Duration) {
	slices.Sort(holds)
	b.ReportMetric(float64(holds[len(holds)-1].Nanoseconds()), "max-hold-ns")
	b.ReportMetric(float64(holds[len(holds)*99/100].Nanoseconds()), "p99-hold-ns")
	b.ReportMetric(float64(maxWall.Nanoseconds()), "max-wall-ns")
}
