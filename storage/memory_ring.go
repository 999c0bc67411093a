package storage

import "github.com/d61b427a/caddy-rate-limit/algorithms"

// The memory store keeps a sliding_window key's ring (algorithms.Ring) in
// a table of its own, of slots that hold the sub-window counts in 32 bits
// each (no count exceeds maxCount). A ring of the default 10 buckets or
// fewer takes a ringSlot (72 bytes); one of more buckets, up to 60, a
// wideRingSlot (264 bytes), so that the common ring does not pay for the
// rare wide one.

// smallRing is how many sub-window counts a ringSlot holds: those of up
// to algorithms.DefaultBuckets buckets.
const smallRing = algorithms.DefaultBuckets + 1

type ringSlot struct {
	hash    uint64 // keyHash of zone and key; 0 marks an empty slot
	index   int64  // the ring's Index
	expires uint32 // as memorySlot's
	ref     bool
	buckets uint8 // the ring's Buckets
	counts  [smallRing]uint32
}

type wideRingSlot struct {
	hash    uint64
	index   int64
	expires uint32
	ref     bool
	buckets uint8
	counts  [algorithms.MaxBuckets + 1]uint32
}

// ringPtr is what the ring tables ask of their slot types.
type ringPtr[S any] interface {
	slotPtr[S]
	ring() algorithms.Ring
	set(h uint64, r algorithms.Ring, expires uint32, ref bool)
}

func (e *ringSlot) keyHash() uint64      { return e.hash }
func (e *ringSlot) expiry() uint32       { return e.expires }
func (e *ringSlot) referenced() bool     { return e.ref }
func (e *ringSlot) setReferenced(r bool) { e.ref = r }

func (e *ringSlot) ring() algorithms.Ring {
	r := algorithms.Ring{Index: e.index, Buckets: int(e.buckets)}
	for i, c := range e.counts {
		r.Counts[i] = int64(c)
	}
	return r
}

func (e *ringSlot) set(h uint64, r algorithms.Ring, expires uint32, ref bool) {
	*e = ringSlot{hash: h, index: r.Index, expires: expires, ref: ref, buckets: uint8(r.Buckets)}
	for i := range e.counts {
		e.counts[i] = uint32(r.Counts[i])
	}
}

func (e *wideRingSlot) keyHash() uint64      { return e.hash }
func (e *wideRingSlot) expiry() uint32       { return e.expires }
func (e *wideRingSlot) referenced() bool     { return e.ref }
func (e *wideRingSlot) setReferenced(r bool) { e.ref = r }

func (e *wideRingSlot) ring() algorithms.Ring {
	r := algorithms.Ring{Index: e.index, Buckets: int(e.buckets)}
	for i, c := range e.counts {
		r.Counts[i] = int64(c)
	}
	return r
}

func (e *wideRingSlot) set(h uint64, r algorithms.Ring, expires uint32, ref bool) {
	*e = wideRingSlot{hash: h, index: r.Index, expires: expires, ref: ref, buckets: uint8(r.Buckets)}
	for i := range e.counts {
		e.counts[i] = uint32(r.Counts[i])
	}
}

// readRing returns the ring t holds for h, marking it used, and whether it
// holds one.
func readRing[S any, P ringPtr[S]](t *table[S, P], h uint64) (algorithms.Ring, bool) {
	i, ok := t.lookup(h)
	if !ok {
		return algorithms.Ring{}, false
	}
	e := P(&t.slots[i])
	e.setReferenced(true)
	return e.ring(), true
}

// writeRing stores r for h in t, in the slot it has or a new one (room
// made by the caller); a new key starts with its reference bit clear.
func writeRing[S any, P ringPtr[S]](t *table[S, P], h uint64, r algorithms.Ring, expires uint32, makeRoom func()) {
	i, ok := t.lookup(h)
	if !ok {
		makeRoom()
		i = t.add(h)
	}
	P(&t.slots[i]).set(h, r, expires, ok)
}

// giveBackRing takes the cost of q, allowed with d, back from h's ring in
// t, if it holds one.
func giveBackRing[S any, P ringPtr[S]](t *table[S, P], h uint64, d algorithms.Decision, cost int64) {
	if i, ok := t.lookup(h); ok {
		e := P(&t.slots[i])
		e.set(h, algorithms.GiveBackRing(e.ring(), d, cost), e.expiry(), e.referenced())
	}
}

// ringOf returns the ring the shard holds for h, whichever table holds it
// (a zone whose buckets changed may have left it in the other), and
// whether it holds one.
func (s *memoryShard) ringOf(h uint64, n int) (algorithms.Ring, bool) {
	if n < smallRing {
		if r, ok := readRing(&s.rings, h); ok {
			return r, true
		}
		return readRing(&s.wide, h)
	}
	if r, ok := readRing(&s.wide, h); ok {
		return r, true
	}
	return readRing(&s.rings, h)
}

// storeRing stores r, a ring of n buckets, for h, in the table for n,
// and forgets any ring of h in the other.
func (s *memoryShard) storeRing(h uint64, r algorithms.Ring, expires uint32, bound int, now uint32) {
	if n := r.Buckets; n < smallRing {
		s.wide.forget(h)
		writeRing(&s.rings, h, r, expires, func() { s.makeRoom(bound, now, s.rings.evict) })
	} else {
		s.rings.forget(h)
		writeRing(&s.wide, h, r, expires, func() { s.makeRoom(bound, now, s.wide.evict) })
	}
}

// ringExpiry is when a ring stops mattering, in Unix seconds rounded up:
// when the last of its sub-windows leaves.
func ringExpiry(r algorithms.Ring, window int64) uint32 {
	return unixSeconds(algorithms.SubWindowStart(r.Index+1+int64(r.Buckets), window, r.Buckets) + 999)
}
