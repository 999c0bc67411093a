package ratelimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/costfrom"
	"github.com/d61b427a/caddy-rate-limit/internal/bodyread"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// statusClientClosedRequest is what a request gets when its client went
// away while max_delay held it (nginx's and Caddy's proxy's convention).
const statusClientClosedRequest = 499

// loadShedder is what the handler asks of its load shedder (shed.Shed):
// whether to shed a request before any zone counts it, and to count the
// requests it passes on while the next handler has them.
type loadShedder interface {
	// Check returns nil for a request that goes on, and for a shed one
	// the error to answer it with.
	Check(repl *caddy.Replacer) error
	Enter()
	Leave()
}

// zoneCheck is one zone's check of a request: the zone, what it takes
// from the store and the store's answer.
type zoneCheck struct {
	zone     *Zone
	req      storage.Request
	decision algorithms.Decision
	// dryRun tells that the zone counts without rejecting, by its config
	// or by a dial.
	dryRun bool
	// dryRunExceeded marks a dry-run zone that would have rejected.
	dryRunExceeded bool
	// price is, in a zone priced in money, the price of the request's
	// model, which its reservation was taken at.
	price *costfrom.Price
}

// holds reports whether the allowed check c holds concurrency units,
// which must be released when Caddy is done with the request. A dry-run
// zone that would have rejected took none.
func (c *zoneCheck) holds() bool {
	return c.req.Algorithm == algorithms.Concurrency && !c.dryRunExceeded
}

// taken is what the allowed check c took at admission: its cost (a
// reservation, in a cost_from zone), or nothing if its zone is a dry run
// that would have refused the request.
func (c *zoneCheck) taken() int64 {
	if c.dryRunExceeded {
		return 0
	}
	return c.req.Cost
}

// releases reports whether the allowed check c releases its cost once
// the response is done with status: its zone counts only some statuses
// (count_status), not this one. A dry-run zone that would have rejected
// took nothing.
func (c *zoneCheck) releases(status int) bool {
	return c.zone.countsStatus && !c.dryRunExceeded && c.req.Cost > 0 && !c.zone.counted.has(status)
}

// ServeHTTP checks the request to every zone it matches and passes it on
// if every zone allows it. A load shedder, if any, sees the request first.
//
// The checking is admit's, which returns before the next handler runs:
// its frame, large with the checks it builds, is off the stack while the
// response is made and written, so the request goroutine's stack, which
// the collector shrinks, does not grow again on every request.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	s := scratchPool.Get().(*scratch)
	defer s.recycle()
	a, err := h.admit(w, r, s)
	switch a {
	case answered:
		return err
	case passOn:
		return h.serveNext(w, r, next)
	}
	p := s.placeholders
	countsStatus, meters := anyCountsStatus(s.checks), anyMeters(s.checks)
	if !countsStatus && !meters && !anyHoldsUnits(s.checks) {
		// What the request took is final.
		p.logCosts(r.Context())
		return h.serveNext(w, r, next)
	}
	var rec *statusRecorder
	if countsStatus {
		rec = &s.recorder
		rec.ResponseWriter = w
		w = rec
	}
	if meters {
		w = s.meterResponse(w, r)
	}
	// Runs before the scratch goes back to the pool, and on every way
	// out: a response, an error, a panic, a client gone.
	defer h.finish(r.Context(), s, rec, p)
	err = h.serveNext(w, r, next)
	if rec != nil {
		rec.end(r, err)
	}
	return err
}

// admission is what admit found of a request.
type admission int

const (
	// answered: admit answered the request (a rejection, a refused
	// body) or failed; its error is the handler's.
	answered admission = iota
	// passOn: no zone counts the request (none matched, or the store
	// failed and on_store_error allows it); it goes on as it is.
	passOn
	// admitted: every zone allowed the request, and s.checks hold what
	// each took, for the response to release or true up.
	admitted
)

// admit checks the request to every zone it matches, in s, and answers
// it if it does not go on. Its steps: the load shedder; a check for each
// zone that counts the request (addChecks); the reservations, once the
// body they need is read (reserve); the take of every check at once
// (takeChecks). An admitted request's headers are set, and its
// placeholders are s.placeholders.
func (h *Handler) admit(w http.ResponseWriter, r *http.Request, s *scratch) (admission, error) {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if h.JWT != nil {
		h.JWT.Register(repl, r)
	}
	if h.shedder != nil {
		if err := h.shedder.Check(repl); err != nil {
			return answered, refuse(w, r, h.Shed.Status, retryAfterOne, err)
		}
	}
	if a, err := h.addChecks(w, r, s, repl); a != admitted {
		return a, err
	}
	if a, err := h.reserve(w, r, s); a != admitted {
		return a, err
	}
	if a, err := h.takeChecks(w, r, s); a != admitted {
		return a, err
	}
	countAdmitted(s)
	h.report(w, s.placeholders, leastRemaining(s.checks), anyDryRunExceeded(s.checks), 0)
	return admitted, nil
}

// addChecks adds to s.checks a check for each zone that matches the
// request and counts it now, and sets s.placeholders once a zone
// matches. It answers a request whose body, read for a zone, is refused.
func (h *Handler) addChecks(w http.ResponseWriter, r *http.Request, s *scratch, repl *caddy.Replacer) (admission, error) {
	values := requestValues{repl: repl, header: r.Header}
	values.vars, _ = r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
	for _, z := range h.Zones {
		match, err := z.matchers.AnyMatchWithError(r)
		if err != nil {
			return answered, caddyhttp.Error(http.StatusInternalServerError, fmt.Errorf("zone %q: matching: %w", z.Name, err))
		}
		if !match {
			continue
		}
		if s.placeholders == nil {
			// Before the zone's key and limit are resolved, which may
			// ask for {body.*}, themselves or through a map.
			s.placeholders = requestPlaceholders(values)
		}
		if a, err := h.addCheck(w, r, s, z, values); a != admitted {
			return a, err
		}
	}
	if p := s.placeholders; p != nil && p.body != nil && p.body.err != nil {
		return answered, fieldRefused(w, r, p.body.err)
	}
	if len(s.checks) == 0 {
		return passOn, nil
	}
	return admitted, nil
}

// addCheck adds z's check of the request, which z matches, to s.checks,
// unless z does not count it now: its dial turned it off, or its limit
// does not resolve. The zone's dial (the admin API's) may set its mode
// and limit. A body is read before anything is taken, so that a body
// refused takes nothing; and only for a zone that needs it, its fields
// or its bound.
func (h *Handler) addCheck(w http.ResponseWriter, r *http.Request, s *scratch, z *Zone, values requestValues) (admission, error) {
	p := s.placeholders
	dryRun := z.DryRun
	var dial storage.ZoneDial
	if z.admin != nil {
		if d, ok := z.admin.ZoneDial(z.Name); ok && d.Active(h.now()) {
			dial = d
		}
	}
	switch dial.Mode {
	case storage.ModeOff:
		return admitted, nil
	case storage.ModeDryRun:
		dryRun = true
	case storage.ModeEnforce:
		dryRun = false
	}
	if z.bodyTemplates && !s.bodyRead {
		// Read as a zone reads any body, before Caddy's placeholder
		// would read it whole, whatever its size.
		if err := s.readBody(w, r, h.bodyLimits); err != nil {
			return answered, bodyRefused(w, r, err)
		}
	}
	limit, ok := dial.Limit, dial.Limit > 0
	if !ok {
		p.bodyWanted = false
		limit, ok = z.resolveLimit(values)
		if p.bodyWanted {
			if err := s.readFields(w, r, p, h.bodyLimits); err != nil {
				return answered, bodyRefused(w, r, err)
			}
			limit, ok = z.resolveLimit(values)
		}
		if !ok {
			return admitted, nil
		}
	}
	cost := z.costs[methodIndex(r.Method)]
	if z.meter.on {
		// The reservation is set once the body is read (reserve).
		cost = z.meter.leastReservation()
	}
	p.bodyWanted = false
	key := z.resolveKey(values)
	if p.bodyWanted {
		if err := s.readFields(w, r, p, h.bodyLimits); err != nil {
			return answered, bodyRefused(w, r, err)
		}
		key = z.resolveKey(values)
	}
	req := storage.Request{
		Zone:        z.Name,
		Key:         key,
		Algorithm:   z.Algorithm,
		Rate:        z.rate(limit),
		Cost:        cost,
		Releasable:  z.countsStatus || z.meter.on,
		Reservation: z.meter.on,
		Wide:        z.meter.prices != nil,
	}
	if !dryRun {
		req.Ban = time.Duration(z.Ban)
	}
	if z.Algorithm == algorithms.Concurrency {
		req.Holder = holders.Add(1)
	}
	s.checks = append(s.checks, zoneCheck{zone: z, dryRun: dryRun, req: req})
	return admitted, nil
}

// reserve sets the reservation of each check of a cost_from zone, once
// the body it is read from is (readReserved). A zone priced in money
// first prices the request by its model: one it has no price for is
// refused before anything is taken, except by a dry run, which never
// refuses and counts nothing it cannot price.
func (h *Handler) reserve(w http.ResponseWriter, r *http.Request, s *scratch) (admission, error) {
	if a, err := h.readReserved(w, r, s); a != admitted {
		return a, err
	}
	for i := 0; i < len(s.checks); {
		c := &s.checks[i]
		m := &c.zone.meter
		if m.prices != nil {
			price, err := m.findPrice(c.zone.Name, &s.request)
			if err != nil {
				if !c.dryRun {
					return answered, unpriced(w, r, err)
				}
				s.checks = slices.Delete(s.checks, i, i+1)
				continue
			}
			c.price = price
		}
		if m.on {
			c.req.Cost = m.reservation(&s.request, c.req.Rate.Units, c.price)
		}
		i++
	}
	if len(s.checks) == 0 {
		return passOn, nil
	}
	return admitted, nil
}

// readReserved reads the body for the reservations that need it, and
// what they read of it (s.request). A key the store knows it refuses is
// answered before its body is read; any other body is read before
// anything is taken, so that a body refused takes nothing.
func (h *Handler) readReserved(w http.ResponseWriter, r *http.Request, s *scratch) (admission, error) {
	p := s.placeholders
	if anyReadsBody(s.checks) {
		if !s.bodyRead {
			if c := h.refusedNow(s.checks); c != nil {
				countTop(s.checks, rejectedByZone, c)
				c.zone.results[resultRejected].Inc()
				p.refused(r.Context(), s.checks)
				return answered, h.reject(w, r, p, c)
			}
			if err := s.readBody(w, r, h.bodyLimits); err != nil {
				return answered, bodyRefused(w, r, err)
			}
		}
		if err := s.request.Read(r.URL.Path, s.body); err != nil {
			return answered, fieldRefused(w, r, err)
		}
		s.requestRead = true
	}
	if s.bodyRead && p.body == nil {
		// Read for a reservation: later handlers see its fields.
		p.setBody(r.URL.Path, s.body)
	}
	return admitted, nil
}

// anyReadsBody reports whether any of checks reserves what the request's
// body asks for.
func anyReadsBody(checks []zoneCheck) bool {
	for i := range checks {
		if m := &checks[i].zone.meter; m.on && m.readsBody() {
			return true
		}
	}
	return false
}

// takeChecks has the store take every check's cost at once, or, with
// on_store_error local when the store failed, this instance's fallback
// with its share of every limit, and answers a request a zone rejected
// or the store could not decide.
func (h *Handler) takeChecks(w http.ResponseWriter, r *http.Request, s *scratch) (admission, error) {
	p := s.placeholders
	s.take.store = h.store
	v, rejected, err := h.decide(r.Context(), s.checks, &s.take)
	if v == unanswered && h.fallback != nil && r.Context().Err() == nil {
		h.storeError(err)
		s.take.store = h.fallback
		v, rejected, err = h.decide(r.Context(), s.checks, &s.take)
	}
	if v != unanswered {
		countTop(s.checks, v, rejected)
	}
	switch v {
	case unanswered:
		return h.storeFailed(w, r, err)
	case rejectedByZone:
		rejected.zone.results[resultRejected].Inc()
		h.banned(s.checks)
		p.refused(r.Context(), s.checks)
		if c := neverPasses(s.checks); c != nil {
			return answered, h.refuseCost(w, r, p, c)
		}
		return answered, h.reject(w, r, p, rejected)
	}
	return admitted, nil
}

// countAdmitted counts an admitted request in its zones' metrics and
// placeholders: its result, a cost_from zone's reservation, and the
// share of its limit a key used in the window a take moved it out of.
func countAdmitted(s *scratch) {
	for _, c := range s.checks {
		switch {
		case c.dryRunExceeded:
			c.zone.results[resultDryRun].Inc()
		case s.waited:
			c.zone.results[resultDelayed].Inc()
		default:
			c.zone.results[resultAllowed].Inc()
		}
		if c.zone.meter.on {
			c.zone.meter.units[costReserved].Add(float64(c.taken()))
			s.placeholders.setCost(c.zone.Name, c.taken())
		}
		if c.decision.Rolled && !c.dryRunExceeded {
			// This check took for the key and moved it into a new window: report what
			// it used of its limit in the one that finished.
			c.zone.usage.Observe(float64(c.decision.Finished) / float64(c.decision.Limit))
		}
	}
}

// countTop counts a decided request in the top keys of its checks' zones,
// the check rejected, if any, as rejected.
func countTop(checks []zoneCheck, v verdict, rejected *zoneCheck) {
	for i := range checks {
		c := &checks[i]
		switch {
		case !c.zone.meter.on:
			c.zone.top.Add(c.req.Key, 1, c == rejected)
		case c == rejected:
			// A cost_from zone counts units taken: none here.
			c.zone.top.Add(c.req.Key, 0, true)
		case v == allowed && c.dryRunExceeded:
			// Takes nothing: counted as the reservation it would have
			// taken, so the key still shows.
			c.zone.top.Add(c.req.Key, c.req.Cost, false)
		}
		// An allowed cost_from check is counted once its response is
		// done, with what it finally took (finish); one of a request
		// another zone rejected took nothing.
	}
}

// anyCountsStatus reports whether any of the allowed checks counts only
// some statuses, and so needs the response's.
func anyCountsStatus(checks []zoneCheck) bool {
	for i := range checks {
		if checks[i].zone.countsStatus && !checks[i].dryRunExceeded {
			return true
		}
	}
	return false
}

// banned counts the bans that a rejection of checks began, and logs them,
// a line a second at most for each zone: the line names the ban that got
// it and counts the others since the last.
func (h *Handler) banned(checks []zoneCheck) {
	for i := range checks {
		c := &checks[i]
		if !c.decision.BanStarted {
			continue
		}
		c.zone.bans.Inc()
		if n, ok := c.zone.banLog.Allow(h.now()); ok {
			h.logger.Info("rate limit ban",
				zap.String("zone", c.zone.Name), h.keyField(c.req.Key), zap.Time("until", c.decision.BanEnds),
				zap.Int64("bans_since_last_log", n))
		}
	}
}

// retryAfterOne is a shed request's Retry-After: the shedding amount moves
// once a second.
var retryAfterOne = []string{"1"}

// serveNext passes the request on, counting it in flight in the handler's
// load shedder while the next handler has it: one atomic add and one
// subtract.
func (h *Handler) serveNext(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if h.shedder == nil {
		return next.ServeHTTP(w, r)
	}
	h.shedder.Enter()
	defer h.shedder.Leave()
	return next.ServeHTTP(w, r)
}

// holders numbers the concurrency requests of this process, so that a
// shared store can tell apart the holders of one key.
var holders atomic.Uint64

// anyHoldsUnits reports whether any of the allowed checks holds units.
func anyHoldsUnits(checks []zoneCheck) bool {
	for i := range checks {
		if checks[i].holds() {
			return true
		}
	}
	return false
}

// finish ends, once Caddy is done with the request, the accounting of
// what checks took. It releases what they should not keep: the units of
// concurrency zones, and the cost of zones that count only some statuses
// when the response's status, as rec recorded it, is not one of them. A zone that reads costs from
// responses (cost_from) trues its reservation up to the cost the
// response showed, if it showed one; else the reservation stands, and
// its store is told so, to no longer hold it as in flight. A zone that
// bans is told of a counted response too, for the same reason
// (storage.Request.KeepsInFlight).
// The client may be gone, so the request's context may be done: stores
// finish regardless (Store). A Finish that fails is a store error; a
// shared store then keeps what it counted until its hold or window ends.
// The placeholders p, and the access log, get what the request finally
// took (see placeholders.cost), and a cost_from zone's top keys count it.
func (h *Handler) finish(ctx context.Context, s *scratch, rec *statusRecorder, p *placeholders) {
	q := &s.take
	q.reqs, q.decisions = q.reqs[:0], q.decisions[:0]
	for i := range s.checks {
		c := &s.checks[i]
		req := c.req
		m := &c.zone.meter
		switch {
		case c.holds() || rec != nil && c.releases(rec.final()):
			// Units, or a cost, to release.
			if m.on {
				m.units[costReleased].Add(float64(req.Cost))
			}
			if !c.holds() {
				p.took(c, 0)
			}
		case m.on && !c.dryRunExceeded:
			kept := req.Cost
			if actual, ok := s.cost(m, c.price); ok {
				req.TrueUp, req.Actual, kept = true, actual, actual
				release, debt := req.Finishing()
				m.units[costReleased].Add(float64(release))
				m.units[costDebt].Add(float64(debt))
			} else if req.KeepsInFlight() {
				req.Counted = true
			}
			m.units[costTaken].Add(float64(kept))
			if kept > 0 {
				c.zone.top.Add(req.Key, kept, false)
			}
			p.took(c, kept)
			if !req.TrueUp && !req.Counted {
				// The reservation stands.
				continue
			}
		case !c.dryRunExceeded && req.TracksInFlight():
			// A cost the response's status keeps, no longer in flight.
			req.Counted = true
		default:
			continue
		}
		q.reqs = append(q.reqs, req)
		q.decisions = append(q.decisions, c.decision)
	}
	p.logCosts(ctx)
	if len(q.reqs) == 0 {
		return
	}
	if err := q.store.Finish(ctx, q.reqs, q.decisions); err != nil {
		h.storeError(err)
	}
}

// scratch is the working memory of one request's decision. It is pooled,
// so that deciding allocates nothing: the slices passed to the store
// through its interface would otherwise go to the heap on every request.
type scratch struct {
	checks []zoneCheck
	take
	// recorder records the response's status for zones that count only
	// some statuses.
	recorder statusRecorder
	// body is the request's body, once bodyRead, for the zones that
	// reserve by it (cost_from) or read its fields ({body.*}), and
	// request what the reserving zones read of it, once requestRead;
	// writers read the response's costs.
	body        []byte
	bodyRead    bool
	request     costfrom.Request
	requestRead bool
	writers     []costWriter
	// placeholders are the request's placeholders, once a zone matched
	// it.
	placeholders *placeholders
}

var scratchPool = sync.Pool{New: func() any {
	return &scratch{
		checks: make([]zoneCheck, 0, 4),
		take:   take{reqs: make([]storage.Request, 0, 4), decisions: make([]algorithms.Decision, 0, 4)},
	}
}}

// recycle returns s to the pool, keeping no key or zone reachable.
func (s *scratch) recycle() {
	clear(s.checks)
	clear(s.reqs)
	s.checks, s.reqs, s.decisions, s.waited, s.store = s.checks[:0], s.reqs[:0], s.decisions[:0], false, nil
	s.recorder, s.placeholders = statusRecorder{}, nil
	if s.bodyRead {
		s.request, s.requestRead = costfrom.Request{}, false
	}
	bodyread.Release(int64(len(s.body)))
	s.body, s.bodyRead = nil, false
	s.recycleWriters()
	scratchPool.Put(s)
}

// reject answers a request that the check c rejected: the zone's status
// (429 by default), with the limit headers and Retry-After, and emits
// the key's rate_limit_exceeded event if it is its first in the window.
func (h *Handler) reject(w http.ResponseWriter, r *http.Request, p *placeholders, c *zoneCheck) error {
	now := h.now()
	retryAfter := h.retryAfter(c.decision.RetryAt, now)
	h.report(w, p, c, true, retryAfter)
	p.cost = 0
	h.emitExceeded(r, c, retryAfter, now)
	if ce := h.logger.Check(zap.DebugLevel, "rate limit exceeded"); ce != nil {
		ce.Write(zap.String("zone", c.zone.Name), h.keyField(c.req.Key))
	}
	return refuse(w, r, c.zone.Status, p.header(retryAfterValue), c.zone.exceeded)
}

// neverPasses returns a check of checks, rejected in an enforcing zone,
// whose cost is more than its zone lets pass at once, against the limit
// in force (a dial's, or the key's override, which the store applied):
// the limit, or a gcra zone's burst. However long the request waits, it
// can never pass. Nil if there is none.
func neverPasses(checks []zoneCheck) *zoneCheck {
	for i := range checks {
		c := &checks[i]
		if !c.dryRunExceeded && !c.decision.Allowed && c.req.Cost > c.capacity() {
			return c
		}
	}
	return nil
}

// capacity is the most the check's zone lets pass at once: the limit it
// was decided against, or a gcra zone's burst.
func (c *zoneCheck) capacity() int64 {
	if c.req.Algorithm == algorithms.GCRA {
		return c.req.Rate.BurstFor(c.decision.Limit)
	}
	return c.decision.Limit
}

// refuseCost answers a request whose cost in c's zone can never pass
// (neverPasses) with 413 Content Too Large: it is not rate limited but
// too large, and a 429 would have the client, or its SDK on its own,
// retry what can never pass. So there is no Retry-After; the limit
// headers describe the zone as for any rejection. The body is JSON
// naming the zone, the cost and the limit (and a gcra zone's burst).
// Nothing was taken.
func (h *Handler) refuseCost(w http.ResponseWriter, r *http.Request, p *placeholders, c *zoneCheck) error {
	h.report(w, p, c, true, 0)
	p.cost = 0
	answer := costAnswer{Error: "request cost exceeds the zone's limit", Zone: c.zone.Name, Cost: c.req.Cost, Limit: c.decision.Limit}
	if most := c.capacity(); most != answer.Limit {
		answer.Error, answer.Burst = "request cost exceeds the zone's burst", most
	}
	body, _ := json.Marshal(answer)
	if ce := h.logger.Check(zap.DebugLevel, "rate limit cost exceeds the zone's limit"); ce != nil {
		ce.Write(zap.String("zone", c.zone.Name), h.keyField(c.req.Key), zap.Int64("cost", answer.Cost), zap.Int64("limit", answer.Limit))
	}
	if r.ProtoMajor == 1 && r.ContentLength != 0 {
		w.Header()["Connection"] = connectionClose // see refuse
	}
	if hasErrorRoutes(r) {
		// The error's message is the body, for an error route to
		// answer with ({err.message}).
		return caddyhttp.Error(http.StatusRequestEntityTooLarge, errors.New(string(body)))
	}
	w.Header()["Content-Type"] = jsonContentType
	w.WriteHeader(http.StatusRequestEntityTooLarge)
	_, _ = w.Write(body)
	return nil
}

// costAnswer is the body of refuseCost's answer.
type costAnswer struct {
	Error string `json:"error"`
	Zone  string `json:"zone"`
	Cost  int64  `json:"cost"`
	Limit int64  `json:"limit"`
	// Burst is a gcra zone's burst, when it is not the limit.
	Burst int64 `json:"burst,omitempty"`
}

var jsonContentType = []string{"application/json"}

// refuse answers a request that does not go on, rejected by a zone,
// shed, or whose body could not be read: status, with Retry-After if
// one is given, as errorStatus answers.
func refuse(w http.ResponseWriter, r *http.Request, status int, retryAfter []string, err error) error {
	hdr := w.Header()
	if retryAfter != nil {
		hdr["Retry-After"] = retryAfter
	}
	if r.ProtoMajor == 1 && r.ContentLength != 0 {
		// The rest of the body is never read. Otherwise Go's server
		// reads up to 256 KiB of it before it sends the answer, and a
		// client that withholds its body waits for nothing. (Not on
		// HTTP/2, where this header would shut down the whole
		// connection.)
		hdr["Connection"] = connectionClose
	}
	return errorStatus(w, r, status, err)
}

var connectionClose = []string{"close"}

// verdict is how decide found a request.
type verdict int

const (
	// allowed: every zone allows the request, and it has been taken
	// (dry-run zones that would reject it are marked and take nothing).
	allowed verdict = iota
	// rejectedByZone: a zone rejects the request; nothing was taken.
	rejectedByZone
	// unanswered: the store failed, or the client went away while the
	// request waited; on_store_error decides what happens.
	unanswered
)

// decide takes from the store until the request is allowed, rejected, or
// unanswered. It returns the check whose rejection stands, for a rejected
// request, and the error, for an unanswered one. A request rejected within
// its zones' max_delay waits for its retry instant and tries again.
func (h *Handler) decide(ctx context.Context, checks []zoneCheck, q *take) (verdict, *zoneCheck, error) {
	var start time.Time
	if h.delays {
		start = time.Now()
	}
	var waiting waitingZones
	defer waiting.leave()
	for {
		// Called before the store is, so that no release between the
		// store's answer and the wait goes unseen.
		var released <-chan struct{}
		if h.delays && waitsForReleases(checks) {
			released = q.store.Released()
		}
		err := q.run(ctx, h.storeLatency, checks)
		if err != nil {
			return unanswered, nil, err
		}
		rejected, dryRunSaidNo := h.rejection(checks)
		if rejected == nil {
			if dryRunSaidNo {
				// Only dry-run zones said no, so nothing was taken: try
				// again without them.
				continue
			}
			return allowed, nil, nil
		}
		deadline := rejected.decision.RetryAt
		if !h.delays || !waiting.enter(checks, deadline, start) {
			return rejectedByZone, rejected, nil
		}
		if c := h.logger.Check(zap.DebugLevel, "rate limit delaying request"); c != nil {
			c.Write(zap.String("zone", rejected.zone.Name), h.keyField(rejected.req.Key), zap.Time("until", deadline))
		}
		q.waited = true
		if rejected.req.Algorithm == algorithms.Concurrency || rejected.decision.InFlight {
			// The rejection that frees up last frees up when requests
			// in flight end: a concurrency zone's units, or the costs
			// that filled a count_status zone's limit. Wait for them
			// to be released.
			deadline = waitingLimit(checks, start)
			err = waitForRelease(ctx, released, deadline)
		} else {
			err = sleepUntil(ctx, deadline)
		}
		if err != nil {
			return unanswered, nil, err
		}
	}
}

// releasePoll is how often a request held for concurrency units tries
// again when no release of this instance wakes it: units released by
// another instance sharing the store, or by a hold ending, are seen
// only by trying.
const releasePoll = 25 * time.Millisecond

// waitingLimit is the last instant the rejecting zones let a request
// that came at start wait: the earliest end of their max_delay.
func waitingLimit(checks []zoneCheck, start time.Time) time.Time {
	var until time.Time
	for _, c := range checks {
		if c.dryRunExceeded || c.decision.Allowed {
			continue
		}
		if t := start.Add(time.Duration(c.zone.MaxDelay)); until.IsZero() || t.Before(until) {
			until = t
		}
	}
	return until
}

// waitForRelease waits until released is closed, the next poll, or
// until, whichever comes first, or until ctx is done. Past until, the
// next try finds the request still rejected and beyond max_delay.
func waitForRelease(ctx context.Context, released <-chan struct{}, until time.Time) error {
	timer := time.NewTimer(min(time.Until(until)+time.Millisecond, releasePoll))
	defer timer.Stop()
	select {
	case <-released:
		return nil
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// take is what decide takes from the store: the checks still in play,
// with room for the store's answers, reused from one try to the next.
type take struct {
	// store is what is taken from: the handler's store, or its local fallback
	// (on_store_error local) when the store failed.
	store     storage.Store
	reqs      []storage.Request
	decisions []algorithms.Decision
	// waited tells that max_delay held the request at least once.
	waited bool
}

// run takes the checks still in play from the store, all or nothing: all
// but the dry-run zones that already said they would reject, which take
// no more. Each check gets its decision. If latency is set, it
// observes how long the store took.
func (q *take) run(ctx context.Context, latency prometheus.Observer, checks []zoneCheck) error {
	q.reqs, q.decisions = q.reqs[:0], q.decisions[:0]
	for _, c := range checks {
		if !c.dryRunExceeded {
			q.reqs = append(q.reqs, c.req)
			q.decisions = append(q.decisions, algorithms.Decision{})
		}
	}
	if len(q.reqs) == 0 {
		return nil
	}
	var start time.Time
	if latency != nil {
		start = time.Now()
	}
	err := q.store.Take(ctx, q.reqs, q.decisions)
	if latency != nil {
		latency.Observe(time.Since(start).Seconds())
	}
	if err != nil {
		return err
	}
	i := 0
	for j := range checks {
		if !checks[j].dryRunExceeded {
			checks[j].decision = q.decisions[i]
			i++
		}
	}
	return nil
}

// rejection picks, among the checks the store rejected, the one whose
// rejection stands: the enforcing zone that frees up last. Dry-run zones
// that reject are marked (and logged) instead; dryRunSaidNo reports
// whether any newly did.
func (h *Handler) rejection(checks []zoneCheck) (rejected *zoneCheck, dryRunSaidNo bool) {
	for j := range checks {
		c := &checks[j]
		if c.dryRunExceeded || c.decision.Allowed {
			continue
		}
		if c.dryRun {
			c.dryRunExceeded = true
			dryRunSaidNo = true
			if n, ok := c.zone.dryRunLog.Allow(h.now()); ok {
				h.logger.Info("rate limit would be exceeded (dry run)",
					zap.String("zone", c.zone.Name), h.keyField(c.req.Key), zap.Int64("since_last_log", n))
			}
			continue
		}
		if rejected == nil || c.decision.RetryAt.After(rejected.decision.RetryAt) {
			rejected = c
		}
	}
	return rejected, dryRunSaidNo
}

// waitsForReleases reports whether checks include a zone whose rejection
// max_delay may wait out by watching releases: a concurrency zone, or
// one whose store keeps costs in flight, whose limit those can fill.
func waitsForReleases(checks []zoneCheck) bool {
	for _, c := range checks {
		if c.req.Algorithm == algorithms.Concurrency || c.req.TracksInFlight() {
			return true
		}
	}
	return false
}

// waitingZones are the zones a request waits in because of max_delay.
type waitingZones []*Zone

// enter reports whether a request that came at start may wait until
// deadline, when the last rejecting zone would allow it, and counts it as
// waiting in each rejecting zone. It may only if every rejecting zone
// allows a delay that long, could ever allow it (a cost above the limit
// never passes), and has fewer than max_waiting requests waiting.
func (wz *waitingZones) enter(checks []zoneCheck, deadline, start time.Time) bool {
	for j := range checks {
		c := &checks[j]
		if c.dryRunExceeded || c.decision.Allowed {
			continue
		}
		capacity := c.decision.Limit
		if c.req.Algorithm == algorithms.GCRA {
			capacity = c.req.Rate.BurstFor(c.decision.Limit)
		}
		// A banned key waits for nothing: its requests are refused.
		if c.req.Cost > capacity || !c.decision.BanEnds.IsZero() || deadline.After(start.Add(time.Duration(c.zone.MaxDelay))) {
			return false
		}
		if !slices.Contains(*wz, c.zone) {
			if c.zone.waiting.Add(1) > int64(c.zone.MaxWaiting) {
				c.zone.waiting.Add(-1)
				return false
			}
			*wz = append(*wz, c.zone)
		}
	}
	return true
}

// leave stops counting the request as waiting.
func (wz *waitingZones) leave() {
	for _, z := range *wz {
		z.waiting.Add(-1)
	}
}

// sleepUntil waits until t or until ctx is done, whichever comes first.
func sleepUntil(ctx context.Context, t time.Time) error {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// storeFailed answers a request whose decision failed with err. A request
// whose client went away is its client's doing, whatever the store said:
// nothing is logged or counted against the store. Otherwise
// on_store_error applies: allow passes the request on, with no counts to
// report; deny answers 503. (local decided in this instance's memory
// before this, and fails only if that does.)
func (h *Handler) storeFailed(w http.ResponseWriter, r *http.Request, err error) (admission, error) {
	if r.Context().Err() != nil {
		return answered, caddyhttp.Error(statusClientClosedRequest, err)
	}
	h.storeError(err)
	if h.OnStoreError != "deny" {
		return passOn, nil
	}
	w.Header().Set("Retry-After", "1")
	return answered, errorStatus(w, r, http.StatusServiceUnavailable, err)
}

// storeError counts and logs (at most once a second) a store error.
func (h *Handler) storeError(err error) {
	h.storeErrorCount.Inc()
	if n, ok := h.storeErrorLog.Allow(h.now()); ok {
		h.logger.Warn("rate limit store error", zap.Error(err), zap.Int64("errors_since_last_log", n))
	}
}

// errorStatus answers with an error status: a zone's rejection (429 or its
// status), a shed request, or a 503 from on_store_error deny. Caddy logs
// every 5xx handler error that no error route handles at error level, one
// line per request, which during a store outage or an overload would flood
// the log; and a handler error costs a random ID and a stack trace, more
// than a rejection should. So the status is written here, unless the
// server has error routes (handle_errors): then the error is returned for
// them to shape, and Caddy logs it at debug.
func errorStatus(w http.ResponseWriter, r *http.Request, status int, err error) error {
	if !hasErrorRoutes(r) {
		w.WriteHeader(status)
		return nil
	}
	return caddyhttp.Error(status, err)
}

// hasErrorRoutes reports whether the request's server has error routes
// (handle_errors), which a handler error goes to. Without them, a status
// written directly is the same response, and spares the error value
// Caddy would build (with a stack trace) and log for it. Outside a Caddy
// server (as in tests), it reports true.
func hasErrorRoutes(r *http.Request) bool {
	srv, ok := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	return !ok || (srv.Errors != nil && len(srv.Errors.Routes) > 0)
}

func anyDryRunExceeded(checks []zoneCheck) bool {
	for _, c := range checks {
		if c.dryRunExceeded {
			return true
		}
	}
	return false
}

// The HTTP methods a cost can be set for; methodOther counts everything else
// and marks unknown names.
const (
	methodGet = iota
	methodHead
	methodPost
	methodPut
	methodPatch
	methodDelete
	methodOptions
	methodConnect
	methodTrace
	methodOther
	methodCount
)

func methodIndex(m string) int {
	switch m {
	case http.MethodGet:
		return methodGet
	case http.MethodHead:
		return methodHead
	case http.MethodPost:
		return methodPost
	case http.MethodPut:
		return methodPut
	case http.MethodPatch:
		return methodPatch
	case http.MethodDelete:
		return methodDelete
	case http.MethodOptions:
		return methodOptions
	case http.MethodConnect:
		return methodConnect
	case http.MethodTrace:
		return methodTrace
	}
	return methodOther
}

// statusRecorder passes a response through and records its status, for
// zones that count only some statuses (count_status).
type statusRecorder struct {
	caddyhttp.ResponseWriterWrapper
	// written is the final status written (0 until one is): 1xx
	// statuses other than 101 Switching Protocols are informational, and
	// the final status follows them.
	written int
	// status is the status the response ended with, set by end; 0 if
	// the next handler panicked.
	status int
}

// WriteHeader records the first final status.
func (w *statusRecorder) WriteHeader(code int) {
	if w.written == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.written = code
	}
	w.ResponseWriterWrapper.WriteHeader(code)
}

// Write records the implicit 200 of a body written before any status.
func (w *statusRecorder) Write(b []byte) (int, error) {
	if w.written == 0 {
		w.written = http.StatusOK
	}
	return w.ResponseWriterWrapper.Write(b)
}

// ReadFrom records the implicit 200, as Write does.
func (w *statusRecorder) ReadFrom(r io.Reader) (int64, error) {
	if w.written == 0 {
		w.written = http.StatusOK
	}
	return w.ResponseWriterWrapper.ReadFrom(r)
}

// end sets the status the response ended with, once the next handler
// returned err: the status written, if any; else the status an error
// carries (basic_auth fails with one: 401), whether or not the client is
// still there to read it; 499 if the client went away before any answer;
// or the 200 that an empty response gets.
func (w *statusRecorder) end(r *http.Request, err error) {
	carried := 0
	if err != nil {
		carried = carriedStatus(err)
	}
	switch {
	case w.written != 0:
		w.status = w.written
	case carried != 0:
		w.status = carried
	case r.Context().Err() != nil:
		w.status = statusClientClosedRequest
	case err != nil:
		w.status = http.StatusInternalServerError
	default:
		w.status = http.StatusOK
	}
}

// carriedStatus returns the status a handler error carries, or 0. It is
// a function of its own so that the error value errors.As needs is made
// only for a request that ended in an error.
func carriedStatus(err error) int {
	var he caddyhttp.HandlerError
	if errors.As(err, &he) {
		return he.StatusCode
	}
	return 0
}

// final is the status the request counts as: what end recorded, or,
// if the next handler panicked before it could, the status written or
// the 500 Caddy answers a panic with.
func (w *statusRecorder) final() int {
	switch {
	case w.status != 0:
		return w.status
	case w.written != 0:
		return w.written
	}
	return http.StatusInternalServerError
}
