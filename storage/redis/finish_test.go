package redis

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
	"github.com/d61b427a/caddy-rate-limit/internal/wait"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// TestRedisQueuedReleasesShareACall: while a release call is in flight (to
// a paused server), the releases that come meanwhile queue and go in the
// next call, up to maxBatch in a call; every one is settled: every other
// one is a true-up that owes a unit more than it reserved, which shares
// the calls as well.
func TestRedisQueuedReleasesShareACall(t *testing.T) {
	s := redistest.Standalone(t)
	// A timeout longer than the test: the call held in flight waits for
	// the paused server, not for its deadline.
	r := newRedisStore(t, &Store{Timeout: caddy.Duration(time.Hour)}, s.URL())
	req := storage.Request{Zone: "z", Key: "k", Algorithm: algorithms.SlidingTail, Rate: algorithms.Rate{Units: 1 << 30, Window: time.Hour}, Cost: 1, Releasable: true}
	q := r.client.finishQueue(r.counterKey("z", "k"))
	queueIs := func(cond func() bool) func() bool {
		return func() bool {
			q.mu.Lock()
			defer q.mu.Unlock()
			return cond()
		}
	}
	count := func(key string) string {
		t.Helper()
		c, err := s.Do("HGET", r.counterKey("z", key), "c")
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	// Load the finish script, so that every call below is one EVALSHA.
	d := redisTake(t, r, time.Time{}, req)[0]
	if err := r.Finish(context.Background(), []storage.Request{req}, []algorithms.Decision{d}); err != nil {
		t.Fatal(err)
	}

	for _, n := range []int{5, maxBatch, 2*maxBatch + 3} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			// A key of its own: the true-ups leave units counted.
			req := req
			req.Key = "k" + strconv.Itoa(n)
			decisions := make([]algorithms.Decision, n+1)
			for i := range decisions {
				decisions[i] = redisTake(t, r, time.Time{}, req)[0]
			}
			if c := count(req.Key); c != strconv.Itoa(n+1) {
				t.Fatalf("Redis counts %s after %d takes", c, n+1)
			}
			before := scriptCalls(t, s)
			if err := s.Pause(); err != nil {
				t.Fatal(err)
			}
			// A step that fails must not leave the server paused: the
			// call in flight would not end, nor would the next step.
			t.Cleanup(func() { _ = s.Resume() })
			errs := make(chan error, n+1)
			release := func(i int, d algorithms.Decision) {
				q := req
				q.TrueUp, q.Actual = i%2 == 1, 2
				errs <- r.Finish(context.Background(), []storage.Request{q}, []algorithms.Decision{d})
			}
			go release(0, decisions[0])
			wait.For(t, "a release call in flight", queueIs(func() bool { return q.busy && len(q.waiting) == 0 }))
			for i, d := range decisions[1:] {
				go release(i+1, d)
			}
			wait.For(t, fmt.Sprintf("%d releases queued", n), queueIs(func() bool { return len(q.waiting) == n }))
			if err := s.Resume(); err != nil {
				t.Fatal(err)
			}
			for range n + 1 {
				if err := <-errs; err != nil {
					t.Error(err)
				}
			}
			if got, want := scriptCalls(t, s)-before, 1+(n+maxBatch-1)/maxBatch; got != want {
				t.Errorf("%d release calls for a call in flight and %d releases queued behind it, want %d", got, n, want)
			}
			// The true-ups, the odd ones of the n+1, kept 2 each.
			if c, want := count(req.Key), strconv.Itoa((n+1)/2*2); c != want {
				t.Errorf("Redis counts %s after every cost was settled, want %s", c, want)
			}
			wait.For(t, "the queue idle", queueIs(func() bool { return !q.busy }))
		})
	}
}
