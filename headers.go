package ratelimit

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/dunglas/httpsfv"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
)

// This file writes what a response tells the client about its limit: the
// X-RateLimit-* or IETF RateLimit headers, Retry-After, and the
// {http.rate_limit.*} placeholders for later handlers and logs.

// Values of Handler.Headers.
const (
	headersXRateLimit = "x-ratelimit"
	headersIETF       = "ietf"
	headersBoth       = "both"
	headersOff        = "off"
)

// leastRemaining picks the check the response headers describe.
// Concurrency zones have no window to describe, so another zone is
// preferred whatever its remaining.
func leastRemaining(checks []zoneCheck) *zoneCheck {
	best := &checks[0]
	for i := range checks[1:] {
		c := &checks[i+1]
		bestConc, cConc := best.req.Algorithm == algorithms.Concurrency, c.req.Algorithm == algorithms.Concurrency
		if bestConc && !cConc || bestConc == cConc && c.decision.Remaining < best.decision.Remaining {
			best = c
		}
	}
	return best
}

// report sets the response headers and placeholders for check c, and
// returns the request's placeholder state. A rejected request's
// Retry-After, in seconds, is formatted along with the other numbers
// (retryAfter 0 for an allowed request) and left in the state's values for
// refuse to set.
func (h *Handler) report(w http.ResponseWriter, values requestValues, c *zoneCheck, exceeded bool, retryAfter int64) *placeholders {
	p := requestPlaceholders(values)
	d := c.decision
	p.zone, p.key, p.limit, p.remaining, p.exceeded = c.zone.Name, keyValue(c.req.Key), d.Limit, d.Remaining, exceeded
	p.cost = c.req.Cost

	// Units in flight have no window, reset or policy to describe.
	window := c.req.Algorithm != algorithms.Concurrency
	// The numbers are formatted into one string, whose parts are the
	// values: one allocation for all the headers but the IETF ones.
	var buf [100]byte
	b := buf[:0]
	var i, j, k, u int // where the limit, remaining, reset and used end
	if window && h.xRateLimitHeaders {
		b = strconv.AppendInt(b, d.Limit, 10)
		i = len(b)
		b = strconv.AppendInt(b, d.Remaining, 10)
		j = len(b)
		b = strconv.AppendInt(b, ceilUnix(d.Reset), 10)
		k = len(b)
		b = strconv.AppendInt(b, d.Used, 10)
		u = len(b)
	}
	if retryAfter > 0 {
		b = strconv.AppendInt(b, retryAfter, 10)
	}
	all := string(b)
	if retryAfter > 0 {
		p.values[retryAfterValue] = all[u:]
	}
	if !window {
		return p
	}
	// The header names are written in canonical form (X-Ratelimit-Limit
	// is how Go spells X-RateLimit-Limit) so the map is set directly,
	// without canonicalizing them on every request.
	hdr := w.Header()
	if h.xRateLimitHeaders {
		p.values[limitValue], p.values[remainingValue], p.values[resetValue], p.values[usedValue] = all[:i], all[i:j], all[j:k], all[k:u]
		hdr["X-Ratelimit-Limit"] = p.header(limitValue)
		hdr["X-Ratelimit-Remaining"] = p.header(remainingValue)
		hdr["X-Ratelimit-Reset"] = p.header(resetValue)
		hdr["X-Ratelimit-Used"] = p.header(usedValue)
	}
	if h.ietfHeaders {
		p.values[policyValue] = fmt.Sprintf("%s;q=%d%s;w=%d", c.zone.sfName, d.Limit, c.zone.quotaUnit, c.zone.policySeconds)
		p.values[rateLimitValue] = fmt.Sprintf("%s;r=%d;t=%d", c.zone.sfName, d.Remaining, retryAfterSeconds(d.Reset, h.now()))
		hdr["Ratelimit-Policy"] = p.header(policyValue)
		hdr["Ratelimit"] = p.header(rateLimitValue)
	}
	return p
}

// placeholders answers the {http.rate_limit.*} placeholders of one
// request, computing their values only when a later handler or a log asks
// for one. Its one provider is registered with the replacer once per
// request; a later rate_limit handler on the same request finds it in the
// request's variables and updates it, so that, as for the headers, the
// last handler's report is what later handlers see.
type placeholders struct {
	zone      string
	key       string
	limit     int64
	remaining int64
	exceeded  bool
	// cost is the request's cost in the zone reported (a reservation, in
	// a cost_from zone) until, once the response is done, the first
	// cost_from zone that admitted it sets what the request cost there.
	cost int64
	// values back the response header values, so that setting a header
	// allocates no slice of its own.
	values [valueCount]string
}

// Indexes into placeholders.values.
const (
	limitValue = iota
	remainingValue
	resetValue
	usedValue
	policyValue
	rateLimitValue
	retryAfterValue
	valueCount
)

// placeholdersVar names the request variable holding the placeholders.
const placeholdersVar = "http.handlers.rate_limit.placeholders"

// requestPlaceholders returns the request's placeholder state, registering
// it on first use.
func requestPlaceholders(v requestValues) *placeholders {
	p, _ := v.vars[placeholdersVar].(*placeholders)
	if p == nil {
		p = new(placeholders)
		if v.vars != nil {
			v.vars[placeholdersVar] = p
		}
		v.repl.Map(p.get)
	}
	return p
}

// header returns values[i] as a header value: a slice of capacity 1, so
// that a later Header.Add copies it rather than writing into values.
func (p *placeholders) header(i int) []string {
	return p.values[i : i+1 : i+1]
}

func (p *placeholders) get(name string) (any, bool) {
	field, ok := strings.CutPrefix(name, "http.rate_limit.")
	if !ok {
		return nil, false
	}
	switch field {
	case "zone":
		return p.zone, true
	case "key":
		return p.key, true
	case "limit":
		return p.limit, true
	case "remaining":
		return p.remaining, true
	case "exceeded":
		return p.exceeded, true
	case "cost":
		return p.cost, true
	case "exceeded.name":
		// mholt/caddy-ratelimit's placeholder: the rejecting zone.
		if p.exceeded {
			return p.zone, true
		}
		return "", true
	}
	return nil, false
}

// String keeps the state's contents out of {http.vars.*} output.
func (p *placeholders) String() string { return "rate_limit placeholders" }

// ceilUnix is t in Unix seconds, rounded up, so that a client waiting until
// then never comes back before the window has ended.
func ceilUnix(t time.Time) int64 {
	s := t.Unix()
	if t.Nanosecond() > 0 {
		s++
	}
	return s
}

// retryAfterSeconds rounds the wait up to whole seconds, at least one, so a
// client that honours it never comes back too early.
func retryAfterSeconds(at, now time.Time) int64 {
	d := at.Sub(now)
	s := int64((d + time.Second - 1) / time.Second)
	return max(s, 1)
}

// retryAfter is the Retry-After of a request that may next be allowed at
// at: the wait in whole seconds, rounded up, at least 1, plus, with
// jitter, a uniformly random extra of up to that fraction of the wait.
// Only the header moves: the instant the store and the deny cache hold is
// at.
func (h *Handler) retryAfter(at, now time.Time) int64 {
	if h.Jitter == 0 || h.random == nil {
		return retryAfterSeconds(at, now)
	}
	wait := max(at.Sub(now), 0)
	extra := time.Duration(h.random() * h.Jitter * float64(wait))
	return retryAfterSeconds(at.Add(extra), now)
}

// sfString writes a zone's name, which names.Check accepted, as an RFC
// 8941 (Structured Field Values) String, for the RateLimit and
// RateLimit-Policy headers: in double quotes, with only `\` and `"`
// escaped by a backslash (Go's %q escapes other bytes in ways an RFC 8941
// parser refuses). names.Check accepts only the bytes such a String can
// hold, so it fails only for a name that skipped the check.
//
// It is called once per zone, when the zone is provisioned. Each request
// then writes its numbers after the encoded name with fmt.Sprintf: to
// marshal the whole header through httpsfv instead (an Item and its
// Params, per request) would take about 31 allocations and 1.5 KB per
// request answering both kinds of headers, where this takes 9 and 385 B
// (BenchmarkHandler/allowed_all_headers); the numbers are integers,
// which need no escaping.
func sfString(name string) (string, error) {
	return httpsfv.Marshal(httpsfv.NewItem(name))
}
