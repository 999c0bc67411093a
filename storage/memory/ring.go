package memory

import (
	"math"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
)

// The memory store keeps a sliding_window key's ring (algorithms.Ring) in
// tables of their own. A slot holds the sub-window counts at the width
// they need: 8 bits while every count is at most 255, 16 bits while at
// most 65,535, 32 bits beyond (a key moves to a wider table when a take
// needs it). And it holds as many as the ring's buckets need: a ring of
// the default 10 buckets or fewer takes a small slot, one of more (up to
// 60) a wide one. So the common ring, 10 buckets of counts under 256, is
// a 20-byte slot and its 8-byte key, and pays for neither wider counts
// nor more buckets.

// ringCount is the width a ring slot keeps its counts at.
type ringCount interface{ uint8 | uint16 | uint32 }

// smallRing is how many sub-window counts a small slot holds: those of up
// to algorithms.DefaultBuckets buckets.
const smallRing = algorithms.DefaultBuckets + 1

// ringHeader and ringMeta are what every ring slot holds before its
// counts: 9 bytes. They are two fields, not one struct, since a struct of
// 9 bytes would take 12 with its padding, and the common slot 24.
type ringHeader struct {
	// index is the ring's Index modulo 2^32; ringFrom finds the rest from
	// expires. (The full index would take 8 bytes and, with its
	// alignment, make the common slot 32.)
	index   uint32
	expires uint32 // as slot's, from ringExpiry
}

// ringMeta is the ring's Buckets (at most 60: 6 bits), and CLOCK's
// reference bit as its top bit.
type ringMeta uint8

const (
	metaBuckets ringMeta = 0x3f
	metaRef     ringMeta = 0x80
)

type ringSlot[C ringCount] struct {
	ringHeader
	ringMeta
	counts [smallRing]C
}

type wideRingSlot[C ringCount] struct {
	ringHeader
	ringMeta
	counts [algorithms.MaxBuckets + 1]C
}

func (e *ringHeader) expiry() uint32 { return e.expires }
func (m *ringMeta) referenced() bool { return *m&metaRef != 0 }
func (m *ringMeta) setReferenced(r bool) {
	*m &^= metaRef
	if r {
		*m |= metaRef
	}
}

func (e *ringSlot[C]) ring(w int64) algorithms.Ring {
	return ringFrom(e.ringHeader, e.ringMeta, e.counts[:], w)
}

func (e *wideRingSlot[C]) ring(w int64) algorithms.Ring {
	return ringFrom(e.ringHeader, e.ringMeta, e.counts[:], w)
}

func (e *ringSlot[C]) set(r algorithms.Ring, expires uint32, ref bool) {
	e.ringHeader, e.ringMeta = header(r, expires, ref)
	narrow(e.counts[:], r.Counts[:smallRing])
}

func (e *wideRingSlot[C]) set(r algorithms.Ring, expires uint32, ref bool) {
	e.ringHeader, e.ringMeta = header(r, expires, ref)
	narrow(e.counts[:], r.Counts[:])
}

func header(r algorithms.Ring, expires uint32, ref bool) (ringHeader, ringMeta) {
	m := ringMeta(r.Buckets)
	m.setReferenced(ref)
	return ringHeader{index: uint32(r.Index), expires: expires}, m
}

// ringFrom returns the ring a slot holds, for a window of w ms; narrow
// stores a ring's counts in a slot, which the caller has made sure they
// fit.
//
// The slot keeps the low 32 bits of the ring's index; its expiry gives
// the rest. ringExpiry rounded the start of sub-window index+1+n up to a
// second, so the sub-window holding that second is within 1000n/w + 1 of
// it (at most 60,001 for 1 ms sub-windows), and the index is the one with
// those low bits nearest. A ring read for another window than it was
// kept for (a reload changed it) comes out, all but surely, with an index
// far from the clock's, and DecideRing starts it afresh.
func ringFrom[C ringCount](h ringHeader, m ringMeta, counts []C, w int64) algorithms.Ring {
	n := int(m & metaBuckets)
	near := algorithms.SubWindow(int64(h.expires)*1000, w, n) - 1 - int64(n)
	r := algorithms.Ring{Index: nearest(h.index, near), Buckets: n}
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
	ring(w int64) algorithms.Ring
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

// find returns h's ring, kept for a window of w ms, marking it used, with
// the table it is in (ringNone if none holds it). A key's ring is in one
// table at a time.
func (t *ringTables) find(h uint64, w int64) (algorithms.Ring, int) { return t.lookup(h, w, true) }

// lookup returns h's ring, kept for a window of w ms, and the table it is
// in (ringNone if none), and with mark, marks it used.
func (t *ringTables) lookup(h uint64, w int64, mark bool) (algorithms.Ring, int) {
	if r, ok := readRing(&t.small8, h, w, mark); ok {
		return r, ringSmall8
	}
	if r, ok := readRing(&t.small16, h, w, mark); ok {
		return r, ringSmall16
	}
	if r, ok := readRing(&t.small32, h, w, mark); ok {
		return r, ringSmall32
	}
	if r, ok := readRing(&t.wide8, h, w, mark); ok {
		return r, ringWide8
	}
	if r, ok := readRing(&t.wide16, h, w, mark); ok {
		return r, ringWide16
	}
	if r, ok := readRing(&t.wide32, h, w, mark); ok {
		return r, ringWide32
	}
	return algorithms.Ring{}, ringNone
}

// storeRing stores r for h, which find found in table was (or ringNone),
// in the table its buckets and counts need, moving it there if it was in
// another. A key new to the table first makes room, as store does.
func (s *shard) storeRing(h uint64, r algorithms.Ring, expires uint32, was int, bound int, now uint32) {
	var most int64
	for _, c := range r.Counts[:r.Buckets+1] {
		most = max(most, c)
	}
	kind := ringKind(r.Buckets, most)
	t := &s.rings
	if was != ringNone && was != kind {
		t.forgetIn(was, h)
	}
	switch kind {
	case ringSmall8:
		writeRing(s, &t.small8, h, r, expires, bound, now)
	case ringSmall16:
		writeRing(s, &t.small16, h, r, expires, bound, now)
	case ringSmall32:
		writeRing(s, &t.small32, h, r, expires, bound, now)
	case ringWide8:
		writeRing(s, &t.wide8, h, r, expires, bound, now)
	case ringWide16:
		writeRing(s, &t.wide16, h, r, expires, bound, now)
	default:
		writeRing(s, &t.wide32, h, r, expires, bound, now)
	}
}

// release releases the cost of a request allowed with d from h's ring,
// kept for a window of w ms, if one is kept: a count that falls stays in
// the table it is in.
func (t *ringTables) release(h uint64, w int64, d algorithms.Decision, cost int64) {
	// A key's ring is in one table at a time: stop at the one that has it.
	_ = releaseRing(&t.small8, h, w, d, cost) || releaseRing(&t.small16, h, w, d, cost) ||
		releaseRing(&t.small32, h, w, d, cost) || releaseRing(&t.wide8, h, w, d, cost) ||
		releaseRing(&t.wide16, h, w, d, cost) || releaseRing(&t.wide32, h, w, d, cost)
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

// inspect returns h's ring as stored for a window of w ms, without
// marking it used.
func (t *ringTables) inspect(h uint64, w int64) (algorithms.Ring, bool) {
	r, kind := t.lookup(h, w, false)
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

// readRing returns the ring t holds for h, kept for a window of w ms, and
// with mark marks it used, and whether it holds one.
func readRing[S any, P ringPtr[S]](t *table[S, P], h uint64, w int64, mark bool) (algorithms.Ring, bool) {
	i, ok := t.lookup(h)
	if !ok {
		return algorithms.Ring{}, false
	}
	e := P(&t.slots[i])
	if mark {
		e.setReferenced(true)
	}
	return e.ring(w), true
}

// writeRing stores r for h in t, one of s's ring tables, in the slot it
// has or a new one (see slotFor); a new key starts with its reference bit
// clear.
func writeRing[S any, P ringPtr[S]](s *shard, t *table[S, P], h uint64, r algorithms.Ring, expires uint32, bound int, now uint32) {
	i, ok := slotFor(s, t, h, bound, now)
	P(&t.slots[i]).set(r, expires, ok)
}

// releaseRing releases a cost, allowed with d, from h's ring in t,
// kept for a window of w ms, if t holds one, and reports whether it does.
func releaseRing[S any, P ringPtr[S]](t *table[S, P], h uint64, w int64, d algorithms.Decision, cost int64) bool {
	i, ok := t.lookup(h)
	if ok {
		e := P(&t.slots[i])
		e.set(algorithms.ReleaseRing(e.ring(w), d, cost), e.expiry(), e.referenced())
	}
	return ok
}

// ringExpiry is when a ring stops mattering, in Unix seconds rounded up:
// when the last of its sub-windows leaves.
func ringExpiry(r algorithms.Ring, window int64) uint32 {
	return unixSeconds(algorithms.SubWindowStart(r.Index+1+int64(r.Buckets), window, r.Buckets) + 999)
}
