package ratelimit

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// Values of Handler.Headers.
const (
	headersXRateLimit = "x-ratelimit"
	headersIETF       = "ietf"
	headersBoth       = "both"
	headersOff        = "off"
)

// statusClientClosedRequest is what a request gets when its client went
// away while max_delay held it (nginx's and Caddy's proxy's convention).
const statusClientClosedRequest = 499

// charge is one zone's part of a request: the zone, what is asked of the
// store and the store's answer.
type charge struct {
	zone     *Zone
	req      storage.Request
	decision algorithms.Decision
	// dryRunExceeded marks a dry-run zone that would have rejected.
	dryRunExceeded bool
}

// ServeHTTP charges the request to every zone it matches and passes it on
// if every zone allows it.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if h.JWT != nil {
		h.JWT.Register(repl, r)
	}

	var buf [4]charge
	charges := buf[:0]
	for _, z := range h.Zones {
		match, err := z.matchers.AnyMatchWithError(r)
		if err != nil {
			return caddyhttp.Error(http.StatusInternalServerError, fmt.Errorf("zone %q: matching: %w", z.Name, err))
		}
		if !match {
			continue
		}
		limit, ok := z.resolveLimit(repl)
		if !ok {
			continue
		}
		charges = append(charges, charge{zone: z, req: storage.Request{
			Zone:      z.Name,
			Key:       z.resolveKey(repl),
			Algorithm: z.Algorithm,
			Rate:      algorithms.Rate{Units: limit, Window: time.Duration(z.Window)},
			Cost:      z.costs[methodIndex(r.Method)],
		}})
	}
	if len(charges) == 0 {
		return next.ServeHTTP(w, r)
	}

	v, rejected, err := h.decide(r.Context(), charges)
	switch v {
	case unanswered:
		return h.storeFailed(w, r, next, err)
	case rejectedByZone:
		return h.reject(w, r, repl, rejected)
	}
	h.report(w, repl, leastRemaining(charges), anyDryRunExceeded(charges), time.Now())
	return next.ServeHTTP(w, r)
}

// reject answers a request that the charge c rejected: 429, with the
// limit headers and Retry-After.
func (h *Handler) reject(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, c *charge) error {
	now := time.Now()
	h.report(w, repl, c, true, now)
	w.Header().Set("Retry-After", strconv.FormatInt(retryAfterSeconds(c.decision.RetryAt, now), 10))
	if r.ProtoMajor == 1 && r.ContentLength != 0 {
		// Otherwise Go's server reads up to 256 KiB of the unread body
		// before it sends the 429, and a client that withholds its body
		// waits for nothing. (Not on HTTP/2, where this header would shut
		// down the whole connection.)
		w.Header().Set("Connection", "close")
	}
	if ce := h.logger.Check(zap.DebugLevel, "rate limit exceeded"); ce != nil {
		ce.Write(zap.String("zone", c.zone.Name), zap.String("key", c.req.Key))
	}
	return caddyhttp.Error(http.StatusTooManyRequests, fmt.Errorf("rate limit exceeded in zone %q", c.zone.Name))
}

// verdict is how decide found a request.
type verdict int

const (
	// allowed: every zone allows the request, and it has been charged
	// (dry-run zones that would reject it are marked and not charged).
	allowed verdict = iota
	// rejectedByZone: a zone rejects the request; nothing was charged.
	rejectedByZone
	// unanswered: the store failed, or the client went away while the
	// request waited; on_store_error decides what happens.
	unanswered
)

// decide asks the store until the request is allowed, rejected, or
// unanswered. It returns the charge whose rejection stands, for a rejected
// request, and the error, for an unanswered one. A request rejected within
// its zones' max_delay waits for its retry instant and asks again.
func (h *Handler) decide(ctx context.Context, charges []charge) (verdict, *charge, error) {
	start := time.Now()
	q := newQuestion(len(charges))
	var waiting waitingZones
	defer waiting.leave()
	for {
		if err := q.ask(ctx, h.store, charges); err != nil {
			return unanswered, nil, err
		}
		rejected, dryRunSaidNo := h.rejection(charges)
		if rejected == nil {
			if dryRunSaidNo {
				// Only dry-run zones said no, so nothing was charged: ask
				// again without them.
				continue
			}
			return allowed, nil, nil
		}
		deadline := rejected.decision.RetryAt
		if !waiting.enter(charges, deadline, start) {
			return rejectedByZone, rejected, nil
		}
		if c := h.logger.Check(zap.DebugLevel, "rate limit delaying request"); c != nil {
			c.Write(zap.String("zone", rejected.zone.Name), zap.String("key", rejected.req.Key), zap.Time("until", deadline))
		}
		if err := sleepUntil(ctx, deadline); err != nil {
			return unanswered, nil, err
		}
	}
}

// question is what decide asks the store: the charges still in play, with
// room for the store's answers, reused from one asking to the next.
type question struct {
	reqs      []storage.Request
	decisions []algorithms.Decision
}

func newQuestion(n int) *question {
	return &question{reqs: make([]storage.Request, 0, n), decisions: make([]algorithms.Decision, 0, n)}
}

// ask takes the charges still in play from the store, all or nothing: all
// but the dry-run zones that already said they would reject, which are
// asked no more. Each charge gets its decision.
func (q *question) ask(ctx context.Context, store storage.Store, charges []charge) error {
	q.reqs, q.decisions = q.reqs[:0], q.decisions[:0]
	for _, c := range charges {
		if !c.dryRunExceeded {
			q.reqs = append(q.reqs, c.req)
			q.decisions = append(q.decisions, algorithms.Decision{})
		}
	}
	if len(q.reqs) == 0 {
		return nil
	}
	if err := store.Take(ctx, q.reqs, q.decisions); err != nil {
		return err
	}
	i := 0
	for j := range charges {
		if !charges[j].dryRunExceeded {
			charges[j].decision = q.decisions[i]
			i++
		}
	}
	return nil
}

// rejection picks, among the charges the store rejected, the one whose
// rejection stands: the enforcing zone that frees up last. Dry-run zones
// that reject are marked (and logged) instead; dryRunSaidNo reports
// whether any newly did.
func (h *Handler) rejection(charges []charge) (rejected *charge, dryRunSaidNo bool) {
	for j := range charges {
		c := &charges[j]
		if c.dryRunExceeded || c.decision.Allowed {
			continue
		}
		if c.zone.DryRun {
			c.dryRunExceeded = true
			dryRunSaidNo = true
			h.logger.Info("rate limit would be exceeded (dry run)",
				zap.String("zone", c.zone.Name), zap.String("key", c.req.Key))
			continue
		}
		if rejected == nil || c.decision.RetryAt.After(rejected.decision.RetryAt) {
			rejected = c
		}
	}
	return rejected, dryRunSaidNo
}

// waitingZones are the zones a request waits in because of max_delay.
type waitingZones []*Zone

// enter reports whether a request asked for at start may wait until
// deadline, when the last rejecting zone would allow it, and counts it as
// waiting in each rejecting zone. It may only if every rejecting zone
// allows a delay that long, could ever allow it (a cost above the limit
// never passes), and has fewer than max_waiting requests waiting.
func (wz *waitingZones) enter(charges []charge, deadline, start time.Time) bool {
	for j := range charges {
		c := &charges[j]
		if c.dryRunExceeded || c.decision.Allowed {
			continue
		}
		if c.req.Cost > c.decision.Limit || deadline.After(start.Add(time.Duration(c.zone.MaxDelay))) {
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
// report; deny answers 503.
func (h *Handler) storeFailed(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, err error) error {
	if r.Context().Err() != nil {
		return caddyhttp.Error(statusClientClosedRequest, err)
	}
	h.storeErrors.log(h.logger, err)
	if h.OnStoreError != "deny" {
		return next.ServeHTTP(w, r)
	}
	w.Header().Set("Retry-After", "1")
	return serverError(w, r, http.StatusServiceUnavailable, err)
}

// serverError answers with a 5xx status. Caddy logs every 5xx handler
// error that no error route handles at error level, one line per request,
// which during a store outage under load would flood the log. So the
// status is written here, and the rate-limited store error line is all
// the log gets, unless the server has error routes (handle_errors): then
// the error is returned for them to shape, and Caddy logs it at debug.
func serverError(w http.ResponseWriter, r *http.Request, status int, err error) error {
	if srv, ok := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); ok && (srv.Errors == nil || len(srv.Errors.Routes) == 0) {
		w.WriteHeader(status)
		return nil
	}
	return caddyhttp.Error(status, err)
}

// leastRemaining picks the charge the response headers describe.
func leastRemaining(charges []charge) *charge {
	best := &charges[0]
	for i := range charges[1:] {
		if c := &charges[i+1]; c.decision.Remaining < best.decision.Remaining {
			best = c
		}
	}
	return best
}

func anyDryRunExceeded(charges []charge) bool {
	for _, c := range charges {
		if c.dryRunExceeded {
			return true
		}
	}
	return false
}

// report sets the response headers and placeholders for charge c.
func (h *Handler) report(w http.ResponseWriter, repl *caddy.Replacer, c *charge, exceeded bool, now time.Time) {
	d := c.decision
	repl.Set("http.rate_limit.zone", c.zone.Name)
	repl.Set("http.rate_limit.key", c.req.Key)
	repl.Set("http.rate_limit.limit", d.Limit)
	repl.Set("http.rate_limit.remaining", d.Remaining)
	repl.Set("http.rate_limit.exceeded", exceeded)

	// The header names are written in canonical form (X-Ratelimit-Limit
	// is how Go spells X-RateLimit-Limit) so the map is set directly,
	// without canonicalizing them on every request.
	hdr := w.Header()
	if h.Headers == "" || h.Headers == headersXRateLimit || h.Headers == headersBoth {
		hdr["X-Ratelimit-Limit"] = []string{strconv.FormatInt(d.Limit, 10)}
		hdr["X-Ratelimit-Remaining"] = []string{strconv.FormatInt(d.Remaining, 10)}
		hdr["X-Ratelimit-Reset"] = []string{strconv.FormatInt(ceilUnix(d.Reset), 10)}
		hdr["X-Ratelimit-Used"] = []string{strconv.FormatInt(d.Used, 10)}
	}
	if h.Headers == headersIETF || h.Headers == headersBoth {
		hdr["Ratelimit-Policy"] = []string{fmt.Sprintf("%q;q=%d;w=%d", c.zone.Name, d.Limit, c.zone.policySeconds)}
		hdr["Ratelimit"] = []string{fmt.Sprintf("%q;r=%d;t=%d", c.zone.Name, d.Remaining, retryAfterSeconds(d.Reset, now))}
	}
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

// errorLog logs store errors at most once per second, with the number of
// errors since the last line, so an outage does not flood the log.
type errorLog struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

func (e *errorLog) log(logger *zap.Logger, err error) {
	e.mu.Lock()
	now := time.Now()
	if now.Sub(e.last) < time.Second {
		e.suppressed++
		e.mu.Unlock()
		return
	}
	count := e.suppressed + 1
	e.last, e.suppressed = now, 0
	e.mu.Unlock()
	logger.Warn("rate limit store error", zap.Error(err), zap.Int("errors_since_last_log", count))
}
