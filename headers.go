package ratelimit

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dunglas/httpsfv"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

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

// report sets the response headers, and the request's placeholders p,
// for check c. A rejected request's Retry-After, in seconds, is
// formatted along with the other numbers (retryAfter 0 for an allowed
// request) and left in p's values for refuse to set.
func (h *Handler) report(w http.ResponseWriter, p *placeholders, c *zoneCheck, exceeded bool, retryAfter int64) {
	d := c.decision
	p.zone, p.key, p.limit, p.remaining, p.exceeded = c.zone.Name, keyValue(c.req.Key), d.Limit, d.Remaining, exceeded
	p.cost = c.taken()

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
		return
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
		p.values[policyValue] = fmt.Sprintf("%s;q=%d%s;w=%d", c.zone.sfName, d.Limit, c.zone.quotaUnit, c.zone.policyWindow(h.now()))
		p.values[rateLimitValue] = fmt.Sprintf("%s;r=%d;t=%d", c.zone.sfName, d.Remaining, retryAfterSeconds(d.Reset, h.now()))
		hdr["Ratelimit-Policy"] = p.header(policyValue)
		hdr["Ratelimit"] = p.header(rateLimitValue)
	}
}

// placeholders answers the {http.rate_limit.*} and {body.*}
// placeholders of one request, computing their values only when a later
// handler or a log asks for one. Its one provider is registered with the
// replacer once per request, when a zone first matches it (before its
// key and limit are resolved, which may read {body.*}); a later
// rate_limit handler on the same request finds it in the request's
// variables and updates it, so that, as for the headers, the last
// handler's report is what later handlers see. The {http.rate_limit.*}
// placeholders are unknown until a handler reports.
type placeholders struct {
	zone      string
	key       string
	limit     int64
	remaining int64
	exceeded  bool
	// bodyWanted tells that a {body.*} was asked for before a zone read
	// the body: the handler then reads it, and resolves again.
	bodyWanted bool
	// cost is what the request took in the zone reported: its cost, or
	// reservation, at admission; 0 if it was refused, or took nothing
	// there (a dry run that would have refused it); and, once the
	// response is done, what it finally took, if count_status released
	// it or the zone reads its cost from the response (cost_from).
	cost int64
	// costs are what the request took in each cost_from zone that
	// counted it, as cost says.
	costs []zoneCost
	// values back the response header values, so that setting a header
	// allocates no slice of its own.
	values [valueCount]string
	// body answers {body.*} once a zone read the request's body.
	body *bodyFields
}

// zoneCost is what a request took in a cost_from zone.
type zoneCost struct {
	zone string
	cost int64
}

// setCost records that the request took cost in the cost_from zone.
func (p *placeholders) setCost(zone string, cost int64) {
	for i := range p.costs {
		if p.costs[i].zone == zone {
			p.costs[i].cost = cost
			return
		}
	}
	p.costs = append(p.costs, zoneCost{zone: zone, cost: cost})
}

// took records that the request finally took cost in the zone of check
// c, once its response is done.
func (p *placeholders) took(c *zoneCheck, cost int64) {
	if c.zone.meter.on {
		p.setCost(c.zone.Name, cost)
	}
	if p.zone == c.zone.Name {
		p.cost = cost
	}
}

// refused records that a refused request took nothing in any of its
// checks' cost_from zones, and logs it: what it took is final.
func (p *placeholders) refused(ctx context.Context, checks []zoneCheck) {
	for i := range checks {
		if c := &checks[i]; c.zone.meter.on {
			p.setCost(c.zone.Name, 0)
		}
	}
	p.logCosts(ctx)
}

// costLogField names the access log field in which a request through
// cost_from zones shows what it took in each (see logCosts).
const costLogField = "rate_limit_cost"

// logCosts puts what the request took in each cost_from zone in the
// request's access log line, as an object of zone names and their
// units, if any cost_from zone counted it. It is called once those are
// final, on every way out of the handler: a response that Caddy aborts
// (a stream cut off, a client gone) never returns through the handlers
// before this one, so the fields log_append would add after them are
// missing from its line, while this one is there.
func (p *placeholders) logCosts(ctx context.Context) {
	if len(p.costs) == 0 {
		return
	}
	if extra, ok := ctx.Value(caddyhttp.ExtraLogFieldsCtxKey).(*caddyhttp.ExtraLogFields); ok {
		extra.Set(zap.Object(costLogField, loggedCosts(p.costs)))
	}
}

// loggedCosts are a request's costs as logCosts logs them.
type loggedCosts []zoneCost

func (l loggedCosts) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	for _, c := range l {
		enc.AddInt64(c.zone, c.cost)
	}
	return nil
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
	if path, ok := strings.CutPrefix(name, bodyPrefix); ok {
		return p.bodyField(path)
	}
	if name == modelPlaceholder {
		return p.model()
	}
	field, ok := strings.CutPrefix(name, "http.rate_limit.")
	if !ok || p.zone == "" {
		return nil, false
	}
	if zone, ok := strings.CutPrefix(field, "cost."); ok {
		for _, c := range p.costs {
			if c.zone == zone {
				return c.cost, true
			}
		}
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

// policyWindow is the zone's window at now in whole seconds, rounded up,
// for the RateLimit-Policy header: a calendar period's is the length of
// the current period, which the limit is a quota for (2678400 for a month
// of 31 days, 2674800 for March in New York, which loses an hour), so
// that RateLimit's t never exceeds it.
func (z *Zone) policyWindow(now time.Time) int64 {
	if z.calendar == nil {
		return z.policySeconds
	}
	return (z.calendar.At(now.UnixMilli()).Length() + 999) / 1000
}

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
