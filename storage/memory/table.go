package memory

import "math/bits"

// A table is an open-addressing hash table with linear probing, of slots
// of one type S, keyed by the keyed hash of zone and key (see Store). It
// grows by doubling before it is more than 7/8 full, so it is between
// 7/16 and 7/8 full: memory is the store's limit (a key costs its slot
// over the load), and at 7/8 a lookup for a present key still probes
// about 4.5 adjacent slots on average, one for a missing key (a new key)
// about 32, where 3/4 would take 2.5 and 8.5 for twice the memory just
// after growing (docs/design.md has what bench/load.sh measured). Removal
// shifts the entries after the hole back, so there are no tombstones and
// probes never lengthen with churn.
//
// The keys are kept apart from the slots, in an array of their own: a
// probe reads 8 bytes, eight keys to a cache line, and never the slots it
// passes over.
//
// A shard holds one table per kind of slot: counts (slot) and the
// rings of sliding windows (ringSlot, wideRingSlot). The methods need the
// shard's lock.
type table[S any, P slotPtr[S]] struct {
	// keys holds each slot's key, the keyed hash of zone and key (see
	// Store); 0 marks an empty slot. slots holds what is kept for it.
	// Both are a power of two long, or nil.
	keys  []uint64
	slots []S
	shift uint // 64 - log2(len(slots)): a hash's top bits pick its home slot
	n     int  // keys held
	hand  int  // CLOCK's hand: the next slot eviction considers
}

// slotPtr is what a table asks of its slot type, through a pointer.
type slotPtr[S any] interface {
	*S
	// expiry is when the slot's counts stop mattering, in Unix seconds;
	// pinned for a slot that may be neither swept nor evicted.
	expiry() uint32
	// referenced is CLOCK's reference bit: set when the key is requested
	// again, cleared when the hand passes it.
	referenced() bool
	setReferenced(bool)
}

// minSlots is the smallest table a shard allocates.
const minSlots = 16

// lookup returns the slot holding h and true, or the empty slot where h
// would go and false. The table is never full, so probing ends.
func (t *table[S, P]) lookup(h uint64) (int, bool) {
	if t.keys == nil {
		return -1, false
	}
	mask := len(t.keys) - 1
	for i := int(h >> t.shift); ; i = (i + 1) & mask {
		switch t.keys[i] {
		case h:
			return i, true
		case 0:
			return i, false
		}
	}
}

// add returns the empty slot where h, a key not held, goes, growing the
// table rather than fill it beyond 7/8, and counts the key. The caller
// fills the slot.
func (t *table[S, P]) add(h uint64) int {
	if (t.n+1)*8 > len(t.keys)*7 {
		t.resize(max(minSlots, 2*len(t.keys)))
	}
	i, _ := t.lookup(h)
	t.keys[i] = h
	t.n++
	return i
}

// evict forgets one key, chosen by CLOCK (second chance): the hand passes
// over the slots, clearing reference bits, and takes the first key whose
// bit is already clear or whose counts have expired. A key requested
// since the hand last passed survives, so keys in use stay and idle ones
// go, much as with LRU but without a list threaded through every entry.
// Pinned keys (units held in flight) are never taken: forgetting them
// would admit more than the limit. The hand stops within two turns; it
// reports false if every key was pinned (or there are none).
func (t *table[S, P]) evict(now uint32) bool {
	if t.n == 0 {
		return false
	}
	mask := len(t.keys) - 1
	for range 2 * len(t.keys) {
		e := P(&t.slots[t.hand])
		if t.keys[t.hand] != 0 && e.expiry() != pinned {
			if !e.referenced() || e.expiry() <= now {
				// The slot now holds the entry shifted into the hole, if
				// any, which the hand considers next.
				t.remove(t.hand)
				return true
			}
			e.setReferenced(false)
		}
		t.hand = (t.hand + 1) & mask
	}
	return false
}

// remove empties slot i and shifts back the entries after it that probed
// past it, so every entry stays reachable from its home slot.
func (t *table[S, P]) remove(i int) {
	mask := len(t.keys) - 1
	for j := (i + 1) & mask; t.keys[j] != 0; j = (j + 1) & mask {
		// The entry at j may fill the hole at i unless its home lies
		// (cyclically) after i, where a probe for it starts past the hole.
		home := int(t.keys[j] >> t.shift)
		if (j-home)&mask >= (j-i)&mask {
			t.keys[i], t.slots[i] = t.keys[j], t.slots[j]
			i = j
		}
	}
	var empty S
	t.keys[i], t.slots[i] = 0, empty
	t.n--
}

// resize moves the entries to a new table of n slots, a power of two.
func (t *table[S, P]) resize(n int) {
	oldKeys, oldSlots := t.keys, t.slots
	t.keys, t.slots = make([]uint64, n), make([]S, n)
	t.shift = uint(64 - bits.TrailingZeros(uint(n)))
	t.hand = 0
	for j, h := range oldKeys {
		if h != 0 {
			i, _ := t.lookup(h)
			t.keys[i], t.slots[i] = h, oldSlots[j]
		}
	}
}

// sweep removes the entries that expired by now, and shrinks a table left
// less than 1/8 full (after a burst of keys, say) to between 1/4 and 1/2
// full, so the memory a burst took is freed.
func (t *table[S, P]) sweep(now uint32) {
	for i := 0; i < len(t.keys); {
		if t.keys[i] != 0 && P(&t.slots[i]).expiry() <= now {
			// Removal shifts later entries into i (and entries from the
			// table's start, already seen, into its end), so look at i
			// again: every entry is seen at least once.
			t.remove(i)
			continue
		}
		i++
	}
	if len(t.keys) > minSlots && t.n < len(t.keys)/8 {
		n := len(t.keys)
		for n > minSlots && t.n < n/4 {
			n /= 2
		}
		t.resize(n)
	}
}

// forget removes h, if held, and reports whether it was.
func (t *table[S, P]) forget(h uint64) bool {
	i, ok := t.lookup(h)
	if ok {
		t.remove(i)
	}
	return ok
}

func (e *slot) expiry() uint32       { return e.expires }
func (e *slot) referenced() bool     { return e.ref }
func (e *slot) setReferenced(r bool) { e.ref = r }

func (e *wideSlot) expiry() uint32       { return e.expires }
func (e *wideSlot) referenced() bool     { return e.ref }
func (e *wideSlot) setReferenced(r bool) { e.ref = r }
