package storage

import (
	"math"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
)

// The memory store keeps a sliding_window key's ring (algorithms.Ring) in
// tables of their own. A slot holds the sub-window counts at the width
// they need: 8 bits while every count is at most 255, 16 bits while at
// most 65,535, 32 bits beyond (a key moves to a wider table when a charge
// needs it). And it holds as many as the ring's buckets need: a ring of
// the default 10 buckets or fewer takes a small slot, one of more (up to
// 60) a wide one. So the common ring, 10 buckets of counts under 256, is
// a 32-byte slot and its 8-byte key, and pays for neither wider counts
// nor more buckets.

// ringCount is the width a ring slot keeps its counts at.
type ringCount interface{ uint8 | uint16 | uint32 }

// smallRing is how many sub-window counts a small slot holds: those of up
// to algorithms.DefaultBuckets buckets.
const smallRing = algorithms.DefaultBuckets + 1

// ringHeader is what every ring slot holds beside its counts.
type ringHeader struct {
	index   int64  // the ring's Index
	expires uint32 // as memorySlot's
	ref     bool
	buckets uint8 // the ring's Buckets
}

type ringSlot[C ringCount] struct {
	ringHeader
	counts [smallRing]C
}

type wideRingSlot[C ringCount] struct {
	ringHeader
	counts [algorithms.MaxBuckets + 1]C
}

func (e *ringHeader) expiry() uint32       { return e.expires }
func (e *ringHeader) referenced() bool     { return e.ref }
func (e *ringHeader) setReferenced(r bool) { e.ref = r }

func (e *ringSlot[C]) ring() algorithms.Ring     { return ringFrom(&e.ringHeader, e.counts[:]) }
func (e *wideRingSlot[C]) ring() algorithms.Ring { return ringFrom(&e.ringHeader, e.counts[:]) }

func (e *ringSlot[C]) set(r algorithms.Ring, expires uint32, ref bool) {
	e.ringHeader = ringHeader{index: r.Index, expires: expires, ref: ref, buckets: uint8(r.Buckets)}
	narrow(e.counts[:], r.Counts[:smallRing])
}

func (e *wideRingSlot[C]) set(r algorithms.Ring, expires uint32, ref bool) {
	e.ringHeader = ringHeader{index: r.Index, expires: expires, ref: ref, buckets: uint8(r.Buckets)}
	narrow(e.counts[:], r.Counts[:])
}

// ringFrom returns the ring a slot holds; narrow stores a ring's counts
// in a slot, which the caller has made sure they fit.
func ringFrom[C ringCount](e *ringHeader, counts []C) algorithms.Ring {
	r := algorithms.Ring{Index: e.index, Buckets: int(e.buckets)}
	for i, c := range counts {
		r.Counts[i] = int64(c)
	}
	return r
}

func narrow[C ringCount](dst []C, src []int64) {
	for i := range dst {
		dst[i] = C(src[i])
	}
}

// ringPtr is what the ring tables ask of their slot types.
type ringPtr[S any] interface {
	slotPtr[S]
	ring() algorithms.Ring
	set(r algorithms.Ring, expires uint32, ref bool)
}

// Where a ring is kept: which of ringTables' tables.
const (
	ringSmall8 = iota
	ringSmall16
	ringSmall32
	ringWide8
	ringWide16
	ringWide32
	ringKinds
	ringNone = -1
)

// ringTables are a shard's ring tables.
type ringTables struct {
	small8  table[ringSlot[uint8], *ringSlot[uint8]]
	small16 table[ringSlot[uint16], *ringSlot[uint16]]
	small32 table[ringSlot[uint32], *ringSlot[uint32]]
	wide8   table[wideRingSlot[uint8], *wideRingSlot[uint8]]
	wide16  table[wideRingSlot[uint16], *wideRingSlot[uint16]]
	wide32  table[wideRingSlot[uint32], *wideRingSlot[uint32]]
}

// ringKind returns the table a ring of n buckets whose counts are at most
// most goes in.
func ringKind(n int, most int64) int {
	kind := ringSmall8
	if n >= smallRing {
		kind = ringWide8
	}
	switch {
	case most > math.MaxUint16:
		kind += 2
	case most > math.MaxUint8:
		kind++
	}
	return kind
}

// find returns h's ring, marking it used, with the table it is in
// (ringNone if none holds it). A key's ring is in one table at a time.
func (t *ringTables) find(h uint64) (algorithms.Ring, int) { return t.lookup(h, true) }

// lookup returns h's ring and the table it is in (ringNone if none), and
// with mark, marks it used.
func (t *ringTables) lookup(h uint64, mark bool) (algorithms.Ring, int) {
	if r, ok := readRing(&t.small8, h, mark); ok {
		return r, ringSmall8
	}
	if r, ok := readRing(&t.small16, h, mark); ok {
		return r, ringSmall16
	}
	if r, ok := readRing(&t.small32, h, mark); ok {
		return r, ringSmall32
	}
	if r, ok := readRing(&t.wide8, h, mark); ok {
		return r, ringWide8
	}
	if r, ok := readRing(&t.wide16, h, mark); ok {
		return r, ringWide16
	}
	if r, ok := readRing(&t.wide32, h, mark); ok {
		return r, ringWide32
	}
	return algorithms.Ring{}, ringNone
}

// store stores r for h, which find found in table was (or ringNone), in
// the table its buckets and counts need, moving it there if it was in
// another. makeRoom(evictFirst) makes room for a key new to the table.
func (t *ringTables) store(h uint64, r algorithms.Ring, expires uint32, was int, makeRoom func(evictFirst func(uint32) bool)) {
	var most int64
	for _, c := range r.Counts {
		most = max(most, c)
	}
	kind := ringKind(r.Buckets, most)
	if was != ringNone && was != kind {
		t.forgetIn(was, h)
	}
	switch kind {
	case ringSmall8:
		writeRing(&t.small8, h, r, expires, func() { makeRoom(t.small8.evict) })
	case ringSmall16:
		writeRing(&t.small16, h, r, expires, func() { makeRoom(t.small16.evict) })
	case ringSmall32:
		writeRing(&t.small32, h, r, expires, func() { makeRoom(t.small32.evict) })
	case ringWide8:
		writeRing(&t.wide8, h, r, expires, func() { makeRoom(t.wide8.evict) })
	case ringWide16:
		writeRing(&t.wide16, h, r, expires, func() { makeRoom(t.wide16.evict) })
	default:
		writeRing(&t.wide32, h, r, expires, func() { makeRoom(t.wide32.evict) })
	}
}

// giveBack takes the cost of a request allowed with d back from h's ring,
// if one is kept: a count that falls stays in the table it is in.
func (t *ringTables) giveBack(h uint64, d algorithms.Decision, cost int64) {
	giveBackRing(&t.small8, h, d, cost)
	giveBackRing(&t.wide8, h, d, cost)
	giveBackRing(&t.small16, h, d, cost)
	giveBackRing(&t.small32, h, d, cost)
	giveBackRing(&t.wide16, h, d, cost)
	giveBackRing(&t.wide32, h, d, cost)
}

func (t *ringTables) forgetIn(kind int, h uint64) bool {
	switch kind {
	case ringSmall8:
		return t.small8.forget(h)
	case ringWide8:
		return t.wide8.forget(h)
	case ringSmall16:
		return t.small16.forget(h)
	case ringSmall32:
		return t.small32.forget(h)
	case ringWide16:
		return t.wide16.forget(h)
	}
	return t.wide32.forget(h)
}

// forget removes h's ring, and reports whether one was kept.
func (t *ringTables) forget(h uint64) bool {
	found := false
	for kind := range ringKinds {
		found = t.forgetIn(kind, h) || found
	}
	return found
}

// inspect returns h's ring as stored, without marking it used.
func (t *ringTables) inspect(h uint64) (algorithms.Ring, bool) {
	r, kind := t.lookup(h, false)
	return r, kind != ringNone
}

func (t *ringTables) keys() int {
	return t.small8.n + t.small16.n + t.small32.n + t.wide8.n + t.wide16.n + t.wide32.n
}

func (t *ringTables) evict(now uint32) bool {
	return t.small8.evict(now) || t.small16.evict(now) || t.small32.evict(now) ||
		t.wide8.evict(now) || t.wide16.evict(now) || t.wide32.evict(now)
}

func (t *ringTables) sweep(now uint32) {
	t.small8.sweep(now)
	t.wide8.sweep(now)
	t.small16.sweep(now)
	t.small32.sweep(now)
	t.wide16.sweep(now)
	t.wide32.sweep(now)
}

func (t *ringTables) clear() {
	t.small8.clear()
	t.wide8.clear()
	t.small16.clear()
	t.small32.clear()
	t.wide16.clear()
	t.wide32.clear()
}

// readRing returns the ring t holds for h, and with mark marks it used,
// and whether it holds one.
func readRing[S any, P ringPtr[S]](t *table[S, P], h uint64, mark bool) (algorithms.Ring, bool) {
	i, ok := t.lookup(h)
	if !ok {
		return algorithms.Ring{}, false
	}
	e := P(&t.slots[i])
	if mark {
		e.setReferenced(true)
	}
	return e.ring(), true
}

// writeRing stores r for h in t, in the slot it has or a new one (room
// made by makeRoom first); a new key starts with its reference bit clear.
func writeRing[S any, P ringPtr[S]](t *table[S, P], h uint64, r algorithms.Ring, expires uint32, makeRoom func()) {
	i, ok := t.lookup(h)
	if !ok {
		makeRoom()
		i = t.add(h)
	}
	P(&t.slots[i]).set(r, expires, ok)
}

// giveBackRing takes a cost, allowed with d, back from h's ring in t, if
// t holds one.
func giveBackRing[S any, P ringPtr[S]](t *table[S, P], h uint64, d algorithms.Decision, cost int64) {
	if i, ok := t.lookup(h); ok {
		e := P(&t.slots[i])
		e.set(algorithms.GiveBackRing(e.ring(), d, cost), e.expiry(), e.referenced())
	}
}

// ringExpiry is when a ring stops mattering, in Unix seconds rounded up:
// when the last of its sub-windows leaves.
func ringExpiry(r algorithms.Ring, window int64) uint32 {
	return unixSeconds(algorithms.SubWindowStart(r.Index+1+int64(r.Buckets), window, r.Buckets) + 999)
}
