package storage

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
)

// This file coalesces concurrent decisions into shared script calls. Redis
// runs one command at a time, and a script call costs it several times what
// one more request in the same call does (see scripts/take.lua), besides
// the round trip and the system calls on both ends. So while a call is in
// flight for a slot, the requests for that slot queue, and the next call
// decides them all. A request that finds no call in flight is sent at
// once, on its own goroutine and context: nothing ever waits for a timer.
//
// go-redis's AutoPipeliner was measured too: it shares the round trip but
// still runs one script per request, and it runs queued commands on its own
// context, so a decision's timeout would no longer bound its wait.

// maxBatch bounds the requests one call decides, so that a call holds
// Redis for at most a few hundred microseconds.
const maxBatch = 128

// A take is one request's part of a take script call.
type take struct {
	keys   []string
	reqs   []Request
	charge bool
	// deadline bounds the request's decision: the store's timeout from
	// when it was asked.
	deadline time.Time

	// state goes from takeWaiting to takeSent when a call picks the
	// request up, or to takeAbandoned when its context ends first.
	state atomic.Int32
	// done, for a queued request, is closed once now, vals and err are set.
	done chan struct{}

	now  int64   // the script's clock, in ms
	vals []int64 // five values per zone (see scripts/take.lua)
	err  error
}

const (
	takeWaiting int32 = iota
	takeSent
	takeAbandoned
)

// A batcher queues the requests for one slot while a call is in flight.
type batcher struct {
	mu      sync.Mutex
	busy    bool // a call is in flight
	waiting []*take
}

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// batcher returns the batcher for key's slot. One script call may only
// touch keys of one cluster slot; a single server has one batcher.
func (c *redisClient) batcher(key string) *batcher {
	if len(c.batchers) == 1 {
		return &c.batchers[0]
	}
	return &c.batchers[keySlot(key)]
}

// keySlot is the cluster slot of key, which holds a non-empty hash tag:
// CRC16 (XMODEM) of the tag, modulo 16384.
func keySlot(key string) int {
	tag := hashTag(key)
	tag = tag[1 : len(tag)-1]
	var crc uint16
	for i := range len(tag) {
		crc ^= uint16(tag[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % clusterSlots
}

// take decides t: in a call of its own if none is in flight for its slot,
// else in the next call, with the requests that queue meanwhile. It
// returns when t is decided, fails or ctx ends; a request whose context
// ends, or whose deadline passes, before a call picks it up is never sent.
//
// A queued request needs no timer of its own to keep its deadline: each
// call is bounded by the earliest deadline among its requests, and every
// request ahead of t in the queue, or in the call in flight, was asked
// for earlier under the same timeout (one client per timeout), so its
// deadline comes no later than t's.
func (c *redisClient) take(ctx context.Context, t *take) error {
	b := c.batcher(t.keys[0])
	b.mu.Lock()
	if b.busy {
		t.done = make(chan struct{})
		b.waiting = append(b.waiting, t)
		b.mu.Unlock()
		select {
		case <-t.done:
			return t.err
		case <-ctx.Done():
			// Sent or not, the decision is given up; only a request
			// never sent is known to be uncharged.
			t.state.CompareAndSwap(takeWaiting, takeAbandoned)
			return ctx.Err()
		}
	}
	b.busy = true
	b.mu.Unlock()
	c.callAlone(ctx, 0, t)
	b.mu.Lock()
	if len(b.waiting) == 0 {
		b.busy = false
	} else {
		go c.drain(b)
	}
	b.mu.Unlock()
	return t.err
}

// callAlone runs the take script for t alone, by t's deadline.
func (c *redisClient) callAlone(ctx context.Context, clock int64, t *take) {
	ctx, cancel := context.WithDeadline(ctx, t.deadline)
	defer cancel()
	c.call(ctx, clock, []*take{t})
}

// drain decides the queued requests of b, a call at a time, until none
// are left. Each call runs until the earliest deadline among its
// requests, so that none waits past its own; a request whose deadline has
// passed while it queued fails without being sent.
func (c *redisClient) drain(b *batcher) {
	for {
		b.mu.Lock()
		batch := b.waiting
		if len(batch) > maxBatch {
			b.waiting = slices.Clone(batch[maxBatch:])
			batch = batch[:maxBatch]
		} else {
			b.waiting = nil
		}
		if len(batch) == 0 {
			b.busy = false
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()

		live := batch[:0]
		var deadline time.Time
		now := time.Now()
		for _, t := range batch {
			if !t.state.CompareAndSwap(takeWaiting, takeSent) {
				continue
			}
			if !now.Before(t.deadline) {
				t.err = context.DeadlineExceeded
				close(t.done)
				continue
			}
			live = append(live, t)
			if deadline.IsZero() || t.deadline.Before(deadline) {
				deadline = t.deadline
			}
		}
		if len(live) == 0 {
			continue
		}
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		c.call(ctx, 0, live)
		cancel()
	}
}

// call runs the take script once for takes, whose keys all lie in one
// slot, and hands each take its part of the answer. A clock of 0 means
// the server's.
func (c *redisClient) call(ctx context.Context, clock int64, takes []*take) {
	zones := 0
	for _, t := range takes {
		zones += len(t.keys)
	}
	// The command: EVALSHA, the script's hash, the keys, then the clock
	// and each take's arguments, in one slice.
	args := make([]any, 3, 3+zones+1+2*len(takes)+5*zones)
	args[0], args[1], args[2] = "evalsha", takeScript.Hash(), zones
	for _, t := range takes {
		for _, k := range t.keys {
			args = append(args, k)
		}
	}
	if clock != 0 {
		args = append(args, clock)
	} else {
		args = append(args, "")
	}
	for _, t := range takes {
		// Constants, so that making them arguments allocates nothing.
		if t.charge {
			args = append(args, "1", len(t.reqs))
		} else {
			args = append(args, "0", len(t.reqs))
		}
		for _, q := range t.reqs {
			args = append(args, scriptAlgorithm(q.Algorithm), q.Rate.Units, q.Rate.Window.Milliseconds(), q.Cost, scriptExtra(q))
		}
	}
	vals, err := evalInts(ctx, c.rdb, takeSource, args)
	if err == nil && len(vals) != 1+5*zones {
		err = fmt.Errorf("take script returned %d values for %d zones", len(vals), zones)
	}
	next := 1
	for _, t := range takes {
		if err != nil {
			t.err = err
		} else {
			t.now = vals[0]
			t.vals = vals[next : next+5*len(t.reqs)]
			next += 5 * len(t.reqs)
		}
		if t.done != nil {
			close(t.done)
		}
	}
}

// evalInts runs the script whose EVALSHA command args holds (with its keys
// from args[3] on) and reads the reply, an array of integers, as such:
// go-redis's Script.Run reads it into a []any, boxing every number, and a
// coalesced take call answers five numbers per decision. A server that
// does not know the script yet (NOSCRIPT) gets it in full, from src, as
// Script.Run does.
func evalInts(ctx context.Context, rdb redis.UniversalClient, src string, args []any) ([]int64, error) {
	cmd := redis.NewIntSliceCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	_ = rdb.Process(ctx, cmd)
	if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		args[0], args[1] = "eval", src
		cmd = redis.NewIntSliceCmd(ctx, args...)
		cmd.SetFirstKeyPos(3)
		_ = rdb.Process(ctx, cmd)
	}
	return cmd.Result()
}

// scriptAlgorithm names an algorithm as the scripts do, as a script
// argument: an interface holding a constant, which costs no allocation.
func scriptAlgorithm(a algorithms.Algorithm) any {
	switch a {
	case algorithms.FixedWindow:
		return "f"
	case algorithms.GCRA:
		return "g"
	case algorithms.Concurrency:
		return "c"
	}
	return "s"
}

// scriptExtra is the take script's last argument for a zone: gcra's
// burst, or the name a concurrency request holds its units under.
func scriptExtra(q Request) any {
	switch q.Algorithm {
	case algorithms.GCRA:
		return q.Rate.Burst
	case algorithms.Concurrency:
		return holderName(q)
	}
	return ""
}

// holderName names a concurrency request in its key's set of holders:
// this process, the request, and its cost, which the take script reads
// back when the holder's lease ends.
func holderName(q Request) string {
	return processID + ":" + strconv.FormatUint(q.Holder, 10) + "/" + strconv.FormatInt(q.Cost, 10)
}

// processID tells this process's holders from those of other instances
// sharing the store.
var processID = func() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}()
