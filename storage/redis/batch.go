package redis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// This file coalesces concurrent decisions into shared script calls. Redis
// runs one command at a time, and a script call costs it several times what
// one more request in the same call does (see scripts/take.lua), besides
// the round trip and the system calls on both ends. So while a call is in
// flight for a slot, the requests for that slot queue, and the next call
// decides them all. A request that finds no call in flight sends the next
// call on its own goroutine. Each call is sent once the goroutines ready
// to run have had their turn (see slotQueue.next): nothing waits for a timer.
//
// go-redis's AutoPipeliner was measured too: it shares the round trip but
// still runs one script per request, and it runs queued commands on its own
// context, so a decision's timeout would no longer bound its wait.

// maxBatch bounds the requests one call decides, so that a call holds
// Redis for at most a few hundred microseconds.
const maxBatch = 128

// A callPart is one request's part of a take script call.
type callPart struct {
	keys []string
	reqs []storage.Request
	take bool
	// wants are the units each zone would lease beyond its cost (see
	// lease.go); nil for none.
	wants []int64
	// deadline bounds the request's decision: the store's timeout from
	// when it was taken.
	deadline time.Time
	// local is the store's clock when the request was taken: a calendar
	// period's windows are given to the script around it (see
	// scriptWindow), and the script picks the one its own clock is in.
	local time.Time

	// state goes from partWaiting to partSent when a call picks the
	// request up, or to partAbandoned when its context ends first.
	state atomic.Int32
	// done, for a queued request, is closed once now, vals and err are set.
	done chan struct{}

	// same, on the first of the parts a call sends as one entry (see
	// groupParts), is how many there are.
	same int

	now  int64   // the script's clock, in ms
	vals []int64 // zoneValues values per zone, at the offsets out*
	err  error
}

const (
	partWaiting int32 = iota
	partSent
	partAbandoned
)

// A slotQueue queues the parts of calls for one slot (take's requests,
// release's releases) while a call is in flight. The caller that finds
// no call in flight sends the next itself (lead); the parts that queue
// meanwhile go in calls sent by a goroutine of their own (drain).
type slotQueue[P any] struct {
	mu      sync.Mutex
	busy    bool // a call is in flight
	waiting []P
}

// push queues p, and reports whether its caller is to lead: send the next
// call, there being none in flight.
func (q *slotQueue[P]) push(p P) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.waiting = append(q.waiting, p)
	if q.busy {
		return false
	}
	q.busy = true
	return true
}

// next takes up to maxBatch of the parts queued, the first ones, or marks
// q idle if none are. Before it takes them, it lets the goroutines that
// are ready to run go first, so that parts already on their way (such as
// the rest of a burst read off the network together) queue and join this
// call, rather than wait for it and go in the next. On an idle server the
// yield returns at once: nothing waits for a timer.
func (q *slotQueue[P]) next() []P {
	runtime.Gosched()
	q.mu.Lock()
	defer q.mu.Unlock()
	batch := q.waiting
	if len(batch) > maxBatch {
		q.waiting = slices.Clone(batch[maxBatch:])
		return batch[:maxBatch]
	}
	q.waiting = nil
	if len(batch) == 0 {
		q.busy = false
	}
	return batch
}

// lead sends the next call, which takes the leader's own part (queued
// first), with send. It reports whether parts queued meanwhile, for the
// leader to leave to `go q.drain(send)`; if none did, q is idle. (The go
// statement is the caller's so that send, often a method value, escapes
// to the heap only when a goroutine needs it.)
func (q *slotQueue[P]) lead(send func([]P)) bool {
	send(q.next())
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.waiting) == 0 {
		q.busy = false
		return false
	}
	return true
}

// drain sends the queued parts with send, a call at a time, until none
// are left, and then marks q idle.
func (q *slotQueue[P]) drain(send func([]P)) {
	for batch := q.next(); len(batch) > 0; batch = q.next() {
		send(batch)
	}
}

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// batcher returns the take queue for key's slot. One script call may only
// touch keys of one cluster slot; a single server has one queue.
func (c *client) batcher(key string) *slotQueue[*callPart] {
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

// take decides t in the next call for its slot. If a call is in flight, t
// queues for the call after it, with the requests that queue meanwhile;
// if not, t's goroutine sends the next call itself (see slotQueue).
//
// A queued t returns when it is decided or fails, or when ctx ends: at
// once if no call has picked t up yet, and then t is never sent (nor is
// it if its deadline passes first); else once that call has answered,
// since the call reads t's requests until then. A t whose goroutine sends
// the call returns when the call has answered: the call may carry other
// requests, so it runs to their earliest deadline whatever becomes of ctx.
//
// A queued request needs no timer of its own to keep its deadline: each
// call is bounded by the earliest deadline among its requests, and every
// request ahead of t in the queue, or in the call in flight, was taken
// earlier under the same timeout (one client per timeout), so its
// deadline comes no later than t's.
func (c *client) take(ctx context.Context, t *callPart) error {
	b := c.batcher(t.keys[0])
	t.done = make(chan struct{})
	if !b.push(t) {
		select {
		case <-t.done:
			return t.err
		case <-ctx.Done():
			// The decision is given up; only a request never sent is
			// known to have taken nothing. One sent is read by its call (t.reqs
			// is the caller's, reused once Take returns) until the call
			// has answered, which its deadline bounds.
			if !t.state.CompareAndSwap(partWaiting, partAbandoned) {
				<-t.done
			}
			return ctx.Err()
		}
	}
	// t is first in the queue, so this call decides it.
	if b.lead(c.sendTakes) {
		go b.drain(c.sendTakes)
	}
	return t.err
}

// callAlone runs the take script for t alone, by t's deadline.
func (c *client) callAlone(ctx context.Context, clock int64, t *callPart) {
	ctx, cancel := context.WithDeadline(ctx, t.deadline)
	defer cancel()
	c.call(ctx, clock, []*callPart{t})
}

// sendTakes decides a batch of queued requests in one call. The call runs
// until the earliest deadline among them, so that none waits past its
// own; a request whose deadline has passed while it queued fails without
// being sent, and one given up is left out.
func (c *client) sendTakes(batch []*callPart) {
	live := batch[:0]
	var deadline time.Time
	now := time.Now()
	for _, t := range batch {
		if !t.state.CompareAndSwap(partWaiting, partSent) {
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
	if len(live) > 0 {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		c.call(ctx, 0, live)
		cancel()
	}
}

// call runs the take script once for parts, whose keys all lie in one
// slot, and hands each take its part of the answer. A clock of 0 means
// the server's. Takes that are the same (one hot key under load) go to
// the script as one entry, whose arguments it reads once and whose answer
// is a few numbers, however many requests it stands for.
func (c *client) call(ctx context.Context, clock int64, parts []*callPart) {
	entries, zones := groupParts(parts)
	// The command: EVALSHA, the script's hash, the keys (a concurrency
	// zone's counters followed by its holders), then the clock, the live
	// instances and each entry's arguments, in one slice.
	args := make([]any, 3, 3+2*zones+2+3*entries+zoneArgs*zones)
	args[0], args[1] = "evalsha", takeScript.Hash()
	for i := 0; i < len(parts); i += parts[i].same {
		for z, k := range parts[i].keys {
			args = append(args, k)
			if parts[i].reqs[z].Algorithm == algorithms.Concurrency {
				args = append(args, holdersKey(k))
			}
		}
	}
	args[2] = len(args) - 3
	if clock != 0 {
		args = append(args, clock)
	} else {
		args = append(args, "")
	}
	args = append(args, c.fleet.instances())
	for i := 0; i < len(parts); i += parts[i].same {
		t := parts[i]
		// Constants, so that making them arguments allocates nothing.
		if t.take {
			args = append(args, "1", len(t.reqs), t.same)
		} else {
			args = append(args, "0", len(t.reqs), t.same)
		}
		for z, q := range t.reqs {
			var want int64
			if t.wants != nil {
				want = t.wants[z]
			}
			zone := scriptZone(q, want, t.local)
			args = append(args, zone[:]...)
		}
	}
	vals, err := evalInts(ctx, c.rdb, takeSource, args)
	if err == nil && len(vals) != 1+entries+zoneValues*zones {
		err = fmt.Errorf("take script returned %d values for %d zones", len(vals), zones)
	}
	if err == nil {
		next := 1
		for i := 0; i < len(parts); i += parts[i].same {
			t := parts[i]
			entry := vals[next+1 : next+1+zoneValues*len(t.reqs)]
			replay(parts[i:i+t.same], vals[next], entry, vals[0])
			next += 1 + len(entry)
		}
	}
	for _, t := range parts {
		if err != nil {
			t.err = err
		} else {
			t.now = vals[0]
		}
		if t.done != nil {
			close(t.done)
		}
	}
}

// groupParts orders parts so that those that are the same (see sameEntry) are
// next to each other, each key's in the order they came, and sets the
// first take's same to how many there are from it. It returns how many
// entries that makes, and how many zones they count.
func groupParts(parts []*callPart) (entries, zones int) {
	if len(parts) > 1 {
		slices.SortStableFunc(parts, func(a, b *callPart) int { return strings.Compare(a.keys[0], b.keys[0]) })
	}
	for i := 0; i < len(parts); {
		end := i + 1
		for end < len(parts) && sameEntry(parts[i], parts[end]) {
			end++
		}
		parts[i].same = end - i
		entries++
		zones += len(parts[i].keys)
		i = end
	}
	return entries, zones
}

// sameEntry reports whether a and b make the same entry of the take
// script: the same zones and keys, with the same algorithm, rate, cost,
// ban and releases. Concurrency requests never do: each holds its units
// under a name of its own; nor does one that wants a lease, which only an
// entry of one request is leased.
func sameEntry(a, b *callPart) bool {
	if a.take != b.take || len(a.keys) != len(b.keys) || a.wants != nil || b.wants != nil {
		return false
	}
	for i, qa := range a.reqs {
		qb := b.reqs[i]
		if a.keys[i] != b.keys[i] || qa.Algorithm != qb.Algorithm || qa.Rate != qb.Rate || qa.Cost != qb.Cost || qa.Ban != qb.Ban ||
			qa.Releasable != qb.Releasable || qa.Reservation != qb.Reservation || qa.Algorithm == algorithms.Concurrency {
			return false
		}
	}
	return true
}

// replay hands each of an entry's parts, which are the same, its part of
// the script's answer: zoneValues values per zone, as the script would have
// answered it alone (see take.lua). The script answers the counters and
// ban as they were before the entry, how many of its requests were
// allowed (the first ones), and each zone's verdict on the first one
// rejected, and whether that was a refusal only for costs in flight;
// what each later request saw is the counters the allowed ones before it
// left, computed by taking them one after the other as the script did,
// and the ban the first rejected one began, if it began one (the ones
// after it were refused for the same costs in flight, if it was).
func replay(parts []*callPart, allowed int64, entry []int64, now int64) {
	if len(parts) == 1 {
		parts[0].vals = entry
		return
	}
	lead := parts[0]
	n := zoneValues * len(lead.reqs)
	vals := make([]int64, n*len(parts))
	for i, t := range parts {
		v := vals[i*n : (i+1)*n : (i+1)*n]
		if i == 0 {
			copy(v, entry)
		} else {
			prev := vals[(i-1)*n : i*n]
			copy(v, prev)
			if lead.take && int64(i-1) < allowed {
				for z, q := range lead.reqs {
					_, next := decideAgain(q, prev[zoneValues*z:], now)
					copy(v[zoneValues*z+outW:zoneValues*z+outP+1], next[:])
				}
			}
		}
		for z, q := range lead.reqs {
			zv, ze := v[zoneValues*z:], entry[zoneValues*z:]
			if q.Algorithm == algorithms.SlidingWindow {
				// The retry instant is the first rejected request's.
				zv[outP] = 0
				if int64(i) >= allowed {
					zv[outP] = ze[outP]
				}
			}
			if int64(i) < allowed {
				zv[outAllows], zv[outInFlight] = 1, 0
				continue
			}
			zv[outAllows], zv[outInFlight] = ze[outAllows], ze[outInFlight]
			if int64(i) > allowed && q.Ban > 0 && zv[outAllows] == 0 && zv[outBan] <= now && zv[outInFlight] == 0 &&
				q.Cost <= algorithms.Capacity(q.Algorithm, q.Rate, zv[outLimit]) {
				// The first rejected request banned the key, as the script
				// did (unless its cost could never pass): the ones after
				// it find it banned.
				zv[outBan] = now + q.Ban.Milliseconds()
			}
		}
		t.vals = v
	}
}

// evalInts runs the script whose EVALSHA command args holds (with its keys
// from args[3] on) and reads the reply, an array of integers, as such:
// go-redis's Script.Run reads it into a []any, boxing every number, and a
// coalesced take call answers several numbers per entry. A server that
// does not know the script yet (NOSCRIPT) gets it in full, from src, as
// Script.Run does.
func evalInts(ctx context.Context, rdb goredis.UniversalClient, src string, args []any) ([]int64, error) {
	cmd := goredis.NewIntSliceCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	_ = rdb.Process(ctx, cmd)
	if goredis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		args[0], args[1] = "eval", src
		cmd = goredis.NewIntSliceCmd(ctx, args...)
		cmd.SetFirstKeyPos(3)
		_ = rdb.Process(ctx, cmd)
	}
	return cmd.Result()
}

// scriptZone is the take script's arguments for the zone of q, which
// wants a lease of want units (0 for none), taken at local, the store's
// clock.
func scriptZone(q storage.Request, want int64, local time.Time) [zoneArgs]any {
	var a [zoneArgs]any
	a[argAlgorithm] = scriptAlgorithmOf(q)
	a[argLimit] = q.Rate.Units
	a[argWindow] = scriptWindow(q.Rate, local)
	a[argCost] = q.Cost
	a[argExtra] = scriptExtra(q)
	a[argLease] = want
	a[argBan] = q.Ban.Milliseconds()
	a[argInFlight] = scriptFlag(q.KeepsInFlight())
	return a
}

// scriptWindow is a rate's windows as the scripts take them
// (scripts/period.lua): the window's length in ms, or for a
// calendar period the periods around the local clock, from the one
// before the clock's, as "first,s1,s2,s3,s4,s5,s6": the index of the
// first and the starts of the six, in ms. Lua in Redis knows no time
// zones; the script picks the period Redis's clock is in.
func scriptWindow(rate algorithms.Rate, local time.Time) any {
	if rate.Calendar == nil {
		return rate.Window.Milliseconds()
	}
	first, starts := rate.Calendar.Around(local.UnixMilli())
	b := make([]byte, 0, 20*(1+len(starts)))
	b = strconv.AppendInt(b, first, 10)
	for _, start := range starts {
		b = append(b, ',')
		b = strconv.AppendInt(b, start, 10)
	}
	return string(b)
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
	case algorithms.SlidingWindow:
		return "w"
	}
	return "s"
}

// scriptAlgorithmOf names q's algorithm as the scripts do: a wide
// zone's fixed window and sliding tail are "F" and "S" (take_wide.lua).
func scriptAlgorithmOf(q storage.Request) any {
	if !q.Wide {
		return scriptAlgorithm(q.Algorithm)
	}
	if q.Algorithm == algorithms.FixedWindow {
		return "F"
	}
	return "S"
}

// scriptFlag is a script's "1" or "0", as an argument that allocates
// nothing.
func scriptFlag(b bool) any {
	if b {
		return "1"
	}
	return "0"
}

// scriptExtra is the take script's argument for a zone after its cost: gcra's
// burst, a sliding window's buckets, or the name a concurrency request
// holds its units under.
func scriptExtra(q storage.Request) any {
	switch q.Algorithm {
	case algorithms.GCRA:
		return q.Rate.Burst
	case algorithms.SlidingWindow:
		return q.Rate.BucketsOr()
	case algorithms.Concurrency:
		return holderName(q)
	}
	return ""
}

// holderName names a concurrency request in its key's set of holders:
// this process, the request, and its cost, which the take script reads
// back when the holder's hold ends.
func holderName(q storage.Request) string {
	return processID + ":" + strconv.FormatUint(q.Holder, 10) + "/" + strconv.FormatInt(q.Cost, 10)
}

// processID tells this process's holders from those of other instances
// sharing the store.
var processID = func() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}()
