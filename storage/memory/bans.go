package memory

// banQueue holds a shard's bans: when each banned key's ban ends, in ms,
// by key hash, with the bans in order of their ends (a min-heap), so that
// the ban that ends first is always at hand. A new ban in a full shard
// lifts that one, and the sweep lifts the bans that ended from the top,
// each in O(log n): neither walks the shard's bans, however many a flood
// of banned keys made. Few keys are ever banned, so bans are kept apart
// from the slots, and evicting a key's counts does not lift its ban. The
// methods need the shard's lock.
type banQueue struct {
	// at is where each banned key's ban is in heap, by key hash.
	at   map[uint64]int32
	heap []ban
}

// ban is a key's ban: the key's hash, and when its ban ends, in ms.
type ban struct {
	h    uint64
	ends int64
}

func (q *banQueue) len() int { return len(q.heap) }

// ends returns when the ban of the key with hash h ends, if it is kept
// (it may have ended and not been swept yet).
func (q *banQueue) ends(h uint64) (int64, bool) {
	i, ok := q.at[h]
	if !ok {
		return 0, false
	}
	return q.heap[i].ends, true
}

// set bans the key with hash h until ends. It keeps at most bound bans:
// when full, the ban that ends first is lifted for a new one.
func (q *banQueue) set(h uint64, ends int64, bound int) {
	if i, ok := q.at[h]; ok {
		q.heap[i].ends = ends
		q.fix(int(i))
		return
	}
	if len(q.heap) >= max(bound, 1) {
		q.removeAt(0)
	}
	if q.at == nil {
		q.at = make(map[uint64]int32)
	}
	q.heap = append(q.heap, ban{h: h, ends: ends})
	q.at[h] = int32(len(q.heap) - 1)
	q.up(len(q.heap) - 1)
}

// remove lifts the ban of the key with hash h, and reports whether it
// had one.
func (q *banQueue) remove(h uint64) bool {
	i, ok := q.at[h]
	if ok {
		q.removeAt(int(i))
	}
	return ok
}

// expire lifts the bans that ended by now (ms), from the top of the heap:
// it touches only those.
func (q *banQueue) expire(now int64) {
	for len(q.heap) > 0 && q.heap[0].ends <= now {
		q.removeAt(0)
	}
}

// removeAt lifts the ban at heap position i: the last one takes its
// place and moves to where it belongs.
func (q *banQueue) removeAt(i int) {
	last := len(q.heap) - 1
	delete(q.at, q.heap[i].h)
	if i != last {
		q.heap[i] = q.heap[last]
		q.at[q.heap[i].h] = int32(i)
	}
	q.heap = q.heap[:last]
	if i != last {
		q.fix(i)
	}
	if len(q.heap) == 0 {
		// No ban left: let the map's and the heap's memory go, which a
		// flood of bans may have made large.
		*q = banQueue{}
	}
}

// fix moves the ban at heap position i to where its end puts it.
func (q *banQueue) fix(i int) {
	if !q.down(i) {
		q.up(i)
	}
}

func (q *banQueue) swap(i, j int) {
	q.heap[i], q.heap[j] = q.heap[j], q.heap[i]
	q.at[q.heap[i].h], q.at[q.heap[j].h] = int32(i), int32(j)
}

func (q *banQueue) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if q.heap[parent].ends <= q.heap[i].ends {
			return
		}
		q.swap(i, parent)
		i = parent
	}
}

// down moves the ban at i away from the top while a child ends sooner,
// and reports whether it moved.
func (q *banQueue) down(i int) bool {
	start, n := i, len(q.heap)
	for {
		least := i
		if l := 2*i + 1; l < n && q.heap[l].ends < q.heap[least].ends {
			least = l
		}
		if r := 2*i + 2; r < n && q.heap[r].ends < q.heap[least].ends {
			least = r
		}
		if least == i {
			return i != start
		}
		q.swap(i, least)
		i = least
	}
}
