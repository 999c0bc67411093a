// Package topkeys keeps each rate_limit zone's heaviest keys, which the
// admin API, the status page and `caddy rate-limit top` show: a
// Space-Saving summary a zone (see Keys), in memory that does not grow
// with the number of keys, kept across config reloads by zone name.
package topkeys

import (
	"cmp"
	"hash/maphash"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/d61b427a/caddy-rate-limit/admin"
)

// Keys finds a zone's heaviest keys over about the last minute, in
// memory that does not grow with the number of keys: Space-Saving
// summaries (Metwally, Agrawal and El Abbadi, 2005) of at most topTracked
// keys in all. A key seen and not tracked takes the place of the tracked
// key with the lowest count, and inherits its count as its error: every
// count is then at most error more than the truth, and a key counted more
// than error is certain to be tracked. A count is of requests, one each,
// or, in a zone that reads what responses cost (cost_from), of the units
// each request took: the summary adds up weights, and the bounds
// hold alike.
//
// A zone's requests come from every CPU at once, so the summary is split
// by a keyed hash of the key into topShards shards, each with its own
// lock and a topPerShard-key summary: requests of different keys rarely
// wait for each other, and the requests of one key wait for each other
// no more than they do in the memory store, which locks the key's shard
// too. A key always goes to the same shard, so the shards track disjoint
// keys and their answers are merged by adding them up; a count is
// overstated by at most its shard's error, so by at most the largest.
//
// Two summaries take turns, each topPeriod long: the answer is the sum of
// the current one and the one before it, so it covers between one and two
// periods. A timer turns them, not the requests: a request reads no
// clock. The timer runs only while the zone has traffic: a turn that
// finds nothing counted in the period it ends stops it, and the next
// request starts it again.
type Keys struct {
	shards [topShards]topShard
	// period is how long each summary counts: topPeriod, shorter in
	// tests.
	period time.Duration
	// turning tells that a timer will turn the summaries: read by every
	// request, written only when the timer starts or stops.
	turning atomic.Bool
}

// topTracked bounds the keys a zone's summary tracks, in all its shards:
// as many as the admin API shows at most.
const topTracked = admin.MaxTopKeys

// topPeriod is how long each of the two summaries counts.
const topPeriod = 30 * time.Second

// topShards is how many shards a summary is split in, and topPerShard how
// many keys each tracks. With fewer keys a shard, a key that makes room
// inherits a count of about the same share of the shard's requests as in
// one summary of topTracked keys: hashing spreads the requests evenly.
const (
	topShards   = 8
	topPerShard = topTracked / topShards
	// topIndexSlots is the size of a summary's index: twice its keys, so
	// that it is at most half full, and a probe seldom passes a slot.
	topIndexSlots = 2 * topPerShard
	topIndexShift = 64 - 5 // a hash's top 5 bits pick its slot in the index
)

// topSeed keys the hash that picks a key's shard and index slot, so that
// no client can choose keys that pile up in one shard. A summary tells
// keys apart by this hash: two keys that hashed alike would share an
// entry, with odds too small to matter (about 1 in 2^64 a pair), and no
// one can aim at it without the seed, which never leaves the process.
var topSeed = maphash.MakeSeed()

// topShard is one shard of a zone's summary, under its own lock.
type topShard struct {
	mu       sync.Mutex
	current  topSummary
	previous topSummary
}

// topSummary is a Space-Saving summary of at most topPerShard keys, with
// the key of lowest count always at hand: entries are kept in a
// min-heap by count, so counting a request, or making room for a new
// key, moves an entry a few places at most and scans nothing. An index
// by hash finds a key's entry. Entry numbers are a byte, and 0 in the
// index marks an empty slot, so it holds entry numbers plus one.
type topSummary struct {
	entries [topPerShard]topEntry
	n       uint8 // entries in use
	// heap holds entry numbers, each one's count at most its
	// children's; at is where each entry is in heap.
	heap  [topPerShard]uint8
	at    [topPerShard]uint8
	index [topIndexSlots]uint8
}

// topEntry is a tracked key and its counts: count (Space-Saving's, of
// requests or units), rejected requests, and err, the most count may be
// overstated.
type topEntry struct {
	hash                 uint64
	key                  string
	count, rejected, err int64
}

// summaries holds the top-keys summary of each zone name, shared by the
// handlers that have a zone of that name, and kept across reloads, as the
// metrics are. Zone names are few (they label metrics too).
var summaries = struct {
	sync.Mutex
	m map[string]*Keys
}{m: map[string]*Keys{}}

// For returns the summary of zone.
func For(zone string) *Keys {
	summaries.Lock()
	defer summaries.Unlock()
	t := summaries.m[zone]
	if t == nil {
		t = New(topPeriod)
		summaries.m[zone] = t
	}
	return t
}

// New returns an empty summary whose two summaries take turns
// every period.
func New(period time.Duration) *Keys {
	return &Keys{period: period}
}

// Add counts a request of key, rejected or not, as n: 1, or the units
// it took.
func (t *Keys) Add(key string, n int64, rejected bool) {
	h := maphash.String(topSeed, key)
	s := &t.shards[h%topShards]
	s.mu.Lock()
	s.current.add(h, key, n, rejected)
	s.mu.Unlock()
	// After the count, so that a turn that stops the timer either sees
	// the count or is seen to have stopped it.
	if !t.turning.Load() && t.turning.CompareAndSwap(false, true) {
		time.AfterFunc(t.period, t.turnLater)
	}
}

// turnLater turns the summaries, and again a period later unless the
// zone went idle.
func (t *Keys) turnLater() {
	if !t.turn() {
		time.AfterFunc(t.period, t.turnLater)
	}
}

// turn starts a new period: the current summaries become the previous
// ones, the previous ones are forgotten. It reports whether nothing was
// counted in the period that ended; then the summaries are all empty, and
// the timer stops until the next request.
func (t *Keys) turn() (idle bool) {
	// Every shard at once, so that no request counts between the check
	// that all are empty and the timer's stop.
	for i := range t.shards {
		t.shards[i].mu.Lock()
	}
	idle = true
	for i := range t.shards {
		s := &t.shards[i]
		s.previous, s.current = s.current, topSummary{}
		idle = idle && s.previous.n == 0
	}
	if idle {
		t.turning.Store(false)
	}
	for i := range t.shards {
		t.shards[i].mu.Unlock()
	}
	return idle
}

// Add counts a request of key, whose hash is h, as n.
func (s *topSummary) add(h uint64, key string, n int64, rejected bool) {
	var r int64
	if rejected {
		r = 1
	}
	slot, found := s.find(h)
	if found {
		e := s.index[slot] - 1
		s.entries[e].count += n
		s.entries[e].rejected += r
		s.down(int(s.at[e]))
		return
	}
	if s.n < topPerShard {
		e := s.n
		s.n++
		s.entries[e] = topEntry{hash: h, key: key, count: n, rejected: r}
		s.index[slot] = e + 1
		s.heap[e], s.at[e] = e, e
		s.up(int(e))
		return
	}
	// Full: the key takes the place of the one with the lowest count,
	// at the heap's top.
	e := s.heap[0]
	old := s.entries[e]
	s.unindex(old.hash)
	slot, _ = s.find(h)
	s.index[slot] = e + 1
	s.entries[e] = topEntry{hash: h, key: key, count: old.count + n, rejected: r, err: old.count}
	s.down(0)
}

// find returns the index slot holding the entry of hash h and true, or
// the empty slot where it would go and false. The index is never full, so
// probing ends.
func (s *topSummary) find(h uint64) (int, bool) {
	for i := int(h >> topIndexShift); ; i = (i + 1) % topIndexSlots {
		e := s.index[i]
		if e == 0 {
			return i, false
		}
		if s.entries[e-1].hash == h {
			return i, true
		}
	}
}

// unindex removes hash h, which the index holds, shifting the slots after
// it back so that no probe stops short at the hole.
func (s *topSummary) unindex(h uint64) {
	hole, _ := s.find(h)
	for i := (hole + 1) % topIndexSlots; s.index[i] != 0; i = (i + 1) % topIndexSlots {
		home := int(s.entries[s.index[i]-1].hash >> topIndexShift)
		// The entry at i may fill the hole unless its home slot lies
		// after the hole, up to i (cyclically): then the hole is before
		// where a probe for it starts.
		if hole < i && hole < home && home <= i || i < hole && (hole < home || home <= i) {
			continue
		}
		s.index[hole] = s.index[i]
		hole = i
	}
	s.index[hole] = 0
}

// less reports whether the entry at heap position i has a lower count
// than the one at j.
func (s *topSummary) less(i, j int) bool {
	return s.entries[s.heap[i]].count < s.entries[s.heap[j]].count
}

func (s *topSummary) swap(i, j int) {
	s.heap[i], s.heap[j] = s.heap[j], s.heap[i]
	s.at[s.heap[i]], s.at[s.heap[j]] = uint8(i), uint8(j)
}

// up moves the entry at heap position i towards the top while it has
// a lower count than its parent.
func (s *topSummary) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !s.less(i, parent) {
			return
		}
		s.swap(i, parent)
		i = parent
	}
}

// down moves the entry at heap position i away from the top while a child
// has a lower count. A key counted again only gains, so this is
// all it needs; the heaviest keys sit at the bottom, where it costs
// nothing.
func (s *topSummary) down(i int) {
	n := int(s.n)
	for {
		least := i
		if l := 2*i + 1; l < n && s.less(l, least) {
			least = l
		}
		if r := 2*i + 2; r < n && s.less(r, least) {
			least = r
		}
		if least == i {
			return
		}
		s.swap(i, least)
		i = least
	}
}

// Top returns the n heaviest keys, their counts as Requests, sorted by
// rejected, then count, then key, and the most any count may be overstated: in each period, a
// key's count is overstated by at most the largest error of its shard's
// summary, so by at most the largest of all the shards'.
func (t *Keys) Top(n int) ([]admin.TopKey, int64) {
	merged := map[string]*admin.TopKey{}
	var most [2]int64 // the largest error of each period's summaries
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		for p, sum := range []*topSummary{&s.previous, &s.current} {
			for _, e := range sum.entries[:sum.n] {
				most[p] = max(most[p], e.err)
				k := merged[e.key]
				if k == nil {
					k = &admin.TopKey{Key: e.key}
					merged[e.key] = k
				}
				k.Requests += e.count
				k.Rejected += e.rejected
			}
		}
		s.mu.Unlock()
	}
	out := make([]admin.TopKey, 0, len(merged))
	for _, k := range merged {
		out = append(out, *k)
	}
	slices.SortFunc(out, func(a, b admin.TopKey) int {
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
	return out, most[0] + most[1]
}
