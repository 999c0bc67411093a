package ratelimit

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// exceededEvent is the Caddy event a zone emits for the first rejection of
// a key in a window (the name mholt/caddy-ratelimit uses).
const exceededEvent = "rate_limit_exceeded"

// exceededKeys remembers, for a zone, the window in which each key last
// had an event, so that a key emits one event per window however many of
// its requests are rejected: a flood must not flood the event handlers.
type exceededKeys struct {
	mu   sync.Mutex
	last map[string]int64
}

// maxExceededKeys bounds the keys remembered; past it they are all
// forgotten, which may let a key emit a second event in its window.
const maxExceededKeys = 10_000

// first reports whether key has had no event in window yet, and notes
// that it has now.
func (e *exceededKeys) first(key string, window int64) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if w, ok := e.last[key]; ok && w == window {
		return false
	}
	if e.last == nil || len(e.last) >= maxExceededKeys {
		e.last = make(map[string]int64)
	}
	e.last[key] = window
	return true
}

// emitExceeded emits rate_limit_exceeded for the rejection c of r at now,
// if anything listens and it is the key's first in the zone's current
// window. The event carries the zone, the key (unless log_keys off hides
// it), the client's address, the seconds to wait, and, for a banned key,
// when its ban ends.
func (h *Handler) emitExceeded(r *http.Request, c *zoneCheck, retryAfter int64, now time.Time) {
	if h.events == nil || !h.events.ShouldEmit(exceededEvent) {
		return
	}
	if !c.zone.events.first(c.req.Key, now.UnixNano()/int64(max(c.zone.period, time.Millisecond))) {
		return
	}
	data := map[string]any{
		"zone":        c.zone.Name,
		"remote_ip":   remoteIP(r),
		"retry_after": retryAfter,
	}
	if h.LogKeys != "off" {
		data["key"] = c.req.Key
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
