package ratelimit

import (
	"cmp"
	"slices"
	"strings"
	"sync"
	"time"
)

// topKeys finds a zone's heaviest keys over about the last minute, in
// memory that does not grow with the number of keys: a Space-Saving
// summary (Metwally, Agrawal and El Abbadi, 2005) of at most topTracked
// keys. A key seen and not tracked takes the place of the tracked key with
// the fewest requests, and inherits its count as its error: every count
// is then at most error more than the truth, and a key with more requests
// than error is certain to be tracked.
//
// Two summaries take turns, each topPeriod long: the answer is the sum of
// the current one and the one before it, so it covers between one and two
// periods.
type topKeys struct {
	mu       sync.Mutex
	now      func() time.Time
	started  time.Time
	current  topSummary
	previous topSummary
}

// topTracked bounds the keys a summary tracks.
const topTracked = 128

// topPeriod is how long each of the two summaries counts.
const topPeriod = 30 * time.Second

type topSummary struct {
	index   map[string]int
	entries []topEntry
}

// topEntry is a tracked key and its counts: requests (Space-Saving's
// count), of them rejected, and err, the most requests may be overstated.
type topEntry struct {
	key                     string
	requests, rejected, err int64
}

// summaries holds the top-keys summary of each zone name, shared by the
// handlers that have a zone of that name, and kept across reloads, as the
// metrics are. Zone names are few (they label metrics too).
var summaries = struct {
	sync.Mutex
	m map[string]*topKeys
}{m: map[string]*topKeys{}}

// topKeysFor returns the summary of zone.
func topKeysFor(zone string) *topKeys {
	summaries.Lock()
	defer summaries.Unlock()
	t := summaries.m[zone]
	if t == nil {
		t = &topKeys{now: time.Now}
		summaries.m[zone] = t
	}
	return t
}

// add counts a request of key, rejected or not.
func (t *topKeys) add(key string, rejected bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.turn()
	t.current.add(key, rejected)
}

// turn starts a new period if the current one is over; the caller holds
// mu.
func (t *topKeys) turn() {
	now := t.now()
	if elapsed := now.Sub(t.started); elapsed >= topPeriod {
		if elapsed >= 2*topPeriod {
			t.previous = topSummary{}
		} else {
			t.previous = t.current
		}
		t.current = topSummary{}
		t.started = now
	}
}

func (s *topSummary) add(key string, rejected bool) {
	var r int64
	if rejected {
		r = 1
	}
	if i, ok := s.index[key]; ok {
		s.entries[i].requests++
		s.entries[i].rejected += r
		return
	}
	if s.index == nil {
		s.index = make(map[string]int, topTracked)
		s.entries = make([]topEntry, 0, topTracked)
	}
	if len(s.entries) < topTracked {
		s.index[key] = len(s.entries)
		s.entries = append(s.entries, topEntry{key: key, requests: 1, rejected: r})
		return
	}
	// Full: the key takes the place of the one with the fewest requests.
	least := 0
	for i, e := range s.entries {
		if e.requests < s.entries[least].requests {
			least = i
		}
	}
	old := s.entries[least]
	delete(s.index, old.key)
	s.index[key] = least
	s.entries[least] = topEntry{key: key, requests: old.requests + 1, rejected: r, err: old.requests}
}

// topKey is a key as GET /rate_limit/zones/<zone>/top shows it.
type topKey struct {
	Key      string `json:"key"`
	Requests int64  `json:"requests"`
	Rejected int64  `json:"rejected"`
}

// top returns the n heaviest keys, sorted by rejected, then requests,
// then key, and the most any count may be overstated.
func (t *topKeys) top(n int) ([]topKey, int64) {
	t.mu.Lock()
	t.turn()
	merged := map[string]*topKey{}
	var bound int64
	for _, s := range []*topSummary{&t.previous, &t.current} {
		var most int64
		for _, e := range s.entries {
			most = max(most, e.err)
			k := merged[e.key]
			if k == nil {
				k = &topKey{Key: e.key}
				merged[e.key] = k
			}
			k.Requests += e.requests
			k.Rejected += e.rejected
		}
		bound += most
	}
	t.mu.Unlock()
	out := make([]topKey, 0, len(merged))
	for _, k := range merged {
		out = append(out, *k)
	}
	slices.SortFunc(out, func(a, b topKey) int {
		if c := cmp.Compare(b.Rejected, a.Rejected); c != 0 {
			return c
		}
		if c := cmp.Compare(b.Requests, a.Requests); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
	if len(out) > n {
		out = out[:n]
	}
	return out, bound
}
