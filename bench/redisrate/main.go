// Command redisrate measures what a decision of go-redis/redis_rate costs
// Redis, for comparison with this module's Redis store in the same run
// against the same server: it makes decisions from concurrent clients,
// every one allowed, and prints the Redis CPU per decision that INFO
// commandstats shows for its script calls (EVALSHA and EVAL), and the
// decisions a second.
//
//	go run . -addr 127.0.0.1:6379 -keys 10000 -duration 5s
//
// It prints one line: decisions, Redis µs per decision, decisions/s.
// It is a module of its own, so that the plugin's go.mod does not take
// redis_rate as a dependency.
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:6379", "the Redis server, host:port (loopback only)")
	keys := flag.Int("keys", 1, "how many keys the decisions are spread over, drawn at random")
	clients := flag.Int("clients", 32, "concurrent callers, as wrk's connections")
	duration := flag.Duration("duration", 5*time.Second, "how long to decide")
	flag.Parse()
	if err := run(*addr, *keys, *clients, *duration); err != nil {
		fmt.Fprintln(os.Stderr, "redisrate:", err)
		os.Exit(1)
	}
}

func run(addr string, keys, clients int, duration time.Duration) error {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: clients})
	defer rdb.Close()
	limiter := redis_rate.NewLimiter(rdb)
	// Every decision allowed, as in the load test's allowed cases.
	limit := redis_rate.Limit{Rate: 2_000_000_000, Burst: 2_000_000_000, Period: time.Minute}
	// The first call loads the script (EVALSHA, NOSCRIPT, EVAL); the
	// measurement starts after it.
	if _, err := limiter.Allow(ctx, "redisrate:warm", limit); err != nil {
		return err
	}
	before, err := scriptUsec(ctx, rdb)
	if err != nil {
		return err
	}
	var decided atomic.Int64
	var failed atomic.Value
	deadline := time.Now().Add(duration)
	start := time.Now()
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				key := "redisrate:key-" + strconv.Itoa(1+rand.IntN(keys))
				if _, err := limiter.Allow(ctx, key, limit); err != nil {
					failed.Store(err)
					return
				}
				decided.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err, _ := failed.Load().(error); err != nil {
		return err
	}
	after, err := scriptUsec(ctx, rdb)
	if err != nil {
		return err
	}
	n := decided.Load()
	fmt.Printf("%d %.2f %.0f\n", n, float64(after-before)/float64(n), float64(n)/elapsed.Seconds())
	return nil
}

// scriptUsec is the CPU time, in µs, Redis has spent in script calls
// (EVALSHA and EVAL) since it started, from INFO commandstats.
func scriptUsec(ctx context.Context, rdb *redis.Client) (int64, error) {
	text, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	var total int64
	for _, line := range strings.Split(text, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if name != "cmdstat_evalsha" && name != "cmdstat_eval" || !ok {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(kv, "usec="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return 0, fmt.Errorf("commandstats %q: %w", line, err)
				}
				total += n
			}
		}
	}
	return total, nil
}
