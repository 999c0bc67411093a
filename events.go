package ratelimit

import (
	"hash/maphash"
	"net"
	"net/http"
	"sync/atomic"
	"time"
)

// exceededEvent is the Caddy event a zone emits for the first rejection of
// a key in a window (the name mholt/caddy-ratelimit uses).
const exceededEvent = "rate_limit_exceeded"

// exceededKeys remembers, for a zone, the window in which keys last had
// an event, so that a key emits one event per window however many of its
// requests are rejected: a flood must not flood the event handlers.
//
// It is a fixed table of exceededSlots slots, allocated at the zone's
// first event, each an atomic word set with compare-and-swap: rejected
// requests take no lock, and a flood of new keys costs no more memory. A
// key's slot is picked by a keyed hash of the key, and holds 31 more bits
// of that hash beside the low 32 bits of the window. A key alone in its
// slot emits exactly one event per window. Keys that share a slot
// overwrite each other's mark, so a key may emit a second event in its
// window after another key's rejection took its slot: extra events, never
// a missing one, unless two keys share both the slot and the 31 more bits
// (odds of 1 in 2 billion for a pair sharing a slot, and no one can aim
// at it without the seed, which never leaves the process).
type exceededKeys struct {
	slots atomic.Pointer[[exceededSlots]atomic.Uint64]
}

// exceededSlots is the size of a zone's table: 8,192 slots, 64 KiB.
const exceededSlots = 1 << 13

// exceededSeed keys the hash that places keys in the table.
var exceededSeed = maphash.MakeSeed()

// first reports whether key has had no event in window yet, and notes
// that it has now. Of requests of one key that come at once, one is first.
func (e *exceededKeys) first(key string, window int64) bool {
	slots := e.slots.Load()
	if slots == nil {
		slots = new([exceededSlots]atomic.Uint64)
		if !e.slots.CompareAndSwap(nil, slots) {
			slots = e.slots.Load()
		}
	}
	h := maphash.String(exceededSeed, key)
	slot := &slots[h%exceededSlots]
	// The hash's top 32 bits, the lowest of them set so that no mark is
	// an empty slot's, and the window's low 32.
	mark := (h|1<<32)&^(1<<32-1) | uint64(uint32(window))
	for {
		old := slot.Load()
		if old == mark {
			return false
		}
		if slot.CompareAndSwap(old, mark) {
			return true
		}
	}
}

// windowIndex is the index of the zone's window that holds now: its
// calendar period's, or now cut in windows of its period.
func (z *Zone) windowIndex(now time.Time) int64 {
	if z.calendar != nil {
		return z.calendar.At(now.UnixMilli()).Index
	}
	return now.UnixNano() / int64(max(z.period, time.Millisecond))
}

// emitExceeded emits rate_limit_exceeded for the rejection c of r at now,
// if anything listens and it is the key's first in the zone's current
// window. The event carries the zone, the key (as its hash unless
// log_keys is on) and the alternative of the zone's key it came from,
// the client's address, the seconds to wait, and, for a banned key,
// when its ban ends.
func (h *Handler) emitExceeded(r *http.Request, c *zoneCheck, retryAfter int64, now time.Time) {
	if h.events == nil || !h.events.ShouldEmit(exceededEvent) {
		return
	}
	if !c.zone.events.first(c.req.Key, c.zone.windowIndex(now)) {
		return
	}
	_, from := keyFrom(c.req.Key)
	data := map[string]any{
		"zone":        c.zone.Name,
		"key":         shownKey(c.req.Key, h.showKeys),
		"from":        from,
		"remote_ip":   remoteIP(r),
		"retry_after": retryAfter,
	}
	if !c.decision.BanEnds.IsZero() {
		data["ban_ends"] = c.decision.BanEnds
	}
	h.events.Emit(h.ctx, exceededEvent, data)
}

// remoteIP is the address of the connection's far end.
func remoteIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
