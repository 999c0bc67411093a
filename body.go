package ratelimit

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/d61b427a/caddy-rate-limit/admin"
	"github.com/d61b427a/caddy-rate-limit/costfrom"
	"github.com/d61b427a/caddy-rate-limit/internal/bodyread"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// This file is how a zone reads a request's body, which clients send as
// they please: announced long and sent slowly, many at once, from keys
// already refused. A zone reads a body to reserve by it (reserve
// max_tokens), to ask a stream for its usage (usage_in_stream), or when
// a key or limit template reads it ({http.request.body}). The body is
// read once, as its bytes arrive, within MaxBody, the process's
// body_memory and the handler's body_timeout; and not at all for a
// request the store already knows it refuses.

// MaxBody is the largest request body a zone reads (reserve max_tokens,
// usage_in_stream on): a larger one is answered 413 Content Too Large
// before any zone takes anything.
const MaxBody = bodyread.MaxSize

// refusedBodyDrain bounds what is read and dropped of a body refused as
// larger than MaxBody, before the answer (see bodyRefused).
const refusedBodyDrain = 4 * MaxBody

// errBodyTooLarge refuses a request whose body a zone would read, and
// which is larger than MaxBody.
var errBodyTooLarge = fmt.Errorf("request body larger than %d bytes, the most a zone that reserves by the body reads", MaxBody)

// readBody reads the request's body, once, for the zones that read it,
// and hands it on unchanged to the handlers after this one. It reads as
// the bytes arrive, within the process's body_memory (bodyread.Read),
// and within the handler's body_timeout: a client that sends its body
// slowly holds its share of body_memory no longer than that. A body
// larger than MaxBody, by its Content-Length or as it is read, fails
// with errBodyTooLarge, as does one cut short by request_body's
// max_size.
func (s *scratch) readBody(w http.ResponseWriter, r *http.Request, limits bodyLimits) error {
	s.bodyRead = true
	if r.Body == nil || r.Body == http.NoBody {
		return nil
	}
	// The deadline bounds the read, and the rest of a body refused as too
	// large that bodyRefused drops; it is lifted once the body is read,
	// for a connection whose read deadline passes while the response
	// runs is taken for a client gone. A writer that cannot set one
	// (outside Caddy's servers, which all can) reads without it.
	rc := http.NewResponseController(w)
	deadline := rc.SetReadDeadline(time.Now().Add(limits.timeout(r))) == nil
	if r.ContentLength > MaxBody {
		return errBodyTooLarge
	}
	body, err := bodyread.Read(r.Body, MaxBody, limits.memory)
	var tooLarge *http.MaxBytesError
	switch {
	case errors.Is(err, bodyread.ErrTooLarge), errors.As(err, &tooLarge):
		return errBodyTooLarge
	case err != nil:
		return err
	}
	if deadline {
		_ = rc.SetReadDeadline(time.Time{})
	}
	r.Body.Close()
	s.body = body
	setBody(r, s.body)
	return nil
}

// bodyLimits are what a handler allows the bodies its zones read: the
// memory all bodies being read in the process may take (body_memory),
// and how long a client has to send one (body_timeout).
type bodyLimits struct {
	memory int64
	wait   time.Duration
}

// timeout is how long the client of r has to send its body: the
// handler's body_timeout, or the server's read_body timeout if that is
// shorter (it counts from the request's start, so it is shorter still).
func (l bodyLimits) timeout(r *http.Request) time.Duration {
	if srv, ok := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); ok && srv.ReadTimeout > 0 {
		return min(l.wait, time.Duration(srv.ReadTimeout))
	}
	return l.wait
}

// setBody makes b the request's body, with a length to match.
func setBody(r *http.Request, b []byte) {
	r.Body = io.NopCloser(bytes.NewReader(b))
	r.ContentLength = int64(len(b))
	r.TransferEncoding = nil
	r.Header.Set("Content-Length", strconv.Itoa(len(b)))
}

// bodyRefused answers a request whose body could not be read: 413 for
// one too large, 503 when the bodies being read take all of
// body_memory, 408 for one not sent within body_timeout, 499 for a
// client gone, 400 otherwise. Nothing has been taken. The answers that
// leave some of the body unread close an HTTP/1 connection (see refuse).
func bodyRefused(w http.ResponseWriter, r *http.Request, err error) error {
	switch {
	case errors.Is(err, errBodyTooLarge):
		// A client still sending the body reads the answer only if the
		// connection is not closed on bytes it sent: closing with them
		// unread resets it, and the client sees a broken connection
		// instead of a 413. So the rest is read and dropped first, up to
		// refusedBodyDrain.
		if r.Body != nil {
			_, _ = io.CopyN(io.Discard, r.Body, refusedBodyDrain)
		}
		return refuse(w, r, http.StatusRequestEntityTooLarge, nil, err)
	case errors.Is(err, bodyread.ErrMemory):
		return refuse(w, r, http.StatusServiceUnavailable, retryAfterOne, err)
	case errors.Is(err, os.ErrDeadlineExceeded):
		// Checked before the context: Go's HTTP/1 server cancels the
		// request's context when a read of its connection fails.
		return refuse(w, r, http.StatusRequestTimeout, nil, fmt.Errorf("request body not received within body_timeout: %w", err))
	case r.Context().Err() != nil:
		return caddyhttp.Error(statusClientClosedRequest, err)
	}
	return caddyhttp.Error(http.StatusBadRequest, fmt.Errorf("reading the request body: %w", err))
}

// readsBody reports whether template reads the request's body: Caddy's
// {http.request.body} placeholders read it whole when they are resolved.
func readsBody(template string) bool {
	return strings.Contains(template, "{http.request.body")
}

// templatesReadBody reports whether any key or limit template of z
// reads the request's body: the zone's decision then depends on it.
func (z *Zone) templatesReadBody() bool {
	for _, alts := range []Alternatives{z.KeyAlternatives, z.LimitAlternatives} {
		for _, t := range alts {
			if readsBody(t) {
				return true
			}
		}
	}
	return false
}

// leastReservation is the least a request can reserve in the meter's
// zone, whatever its body: reserve <n>, or, by max_tokens, one unit (a
// bound is a positive integer, and the default is at least 1); in a zone
// priced in money, one token at the lowest output price of its table,
// which a free model's line makes 0.
func (m *meter) leastReservation() int64 {
	if m.fixed > 0 {
		return m.fixed
	}
	if m.prices != nil {
		least := m.prices[0].Output // a table has a line at least
		for i := range m.prices {
			least = min(least, m.prices[i].Output)
		}
		return least
	}
	return 1
}

// refusedNow returns the check of checks whose store already knows,
// from what this process holds and without a round trip, that it refuses
// the request whatever its body says: its key is banned, or (Redis) a
// rejection of it is remembered until its retry instant, for a cost the
// request cannot go below (storage.Refuser). Such a request is answered
// before its body is read. Dry-run zones refuse nothing, and a zone with
// max_delay refuses here only a banned key. If several
// checks refuse, it returns the one that frees up last, as a rejection
// does; nil if none does.
func (h *Handler) refusedNow(checks []zoneCheck) *zoneCheck {
	refuser, ok := h.store.(storage.Refuser)
	if !ok {
		return nil
	}
	var refused *zoneCheck
	for i := range checks {
		c := &checks[i]
		if c.dryRun {
			continue
		}
		d, ok := refuser.Refused(c.req)
		// A zone with max_delay may hold the request rather than refuse
		// it, unless its key is banned.
		if ok && (c.zone.MaxDelay == 0 || !d.BanEnds.IsZero()) {
			c.decision = d
			if refused == nil || d.RetryAt.After(refused.decision.RetryAt) {
				refused = c
			}
		}
	}
	return refused
}

// validateBodyLimits checks body_memory and body_timeout.
func (h *Handler) validateBodyLimits() error {
	if h.BodyMemory != 0 {
		if err := bodyread.CheckMemory(h.BodyMemory); err != nil {
			return fmt.Errorf("body_memory: %w", err)
		}
	}
	if h.BodyTimeout != 0 {
		if err := bodyread.CheckTimeout(time.Duration(h.BodyTimeout)); err != nil {
			return fmt.Errorf("body_timeout: %w", err)
		}
	}
	return nil
}

// provisionBodyLimits sets the limits the handler's zones read bodies
// within: its own body_memory and body_timeout, else the global
// rate_limit option's (the rate_limit app), else the defaults.
func (h *Handler) provisionBodyLimits(ctx caddy.Context) error {
	h.bodyLimits = bodyLimits{memory: bodyread.DefaultMemory, wait: bodyread.DefaultTimeout}
	switch app, err := ctx.AppIfConfigured("rate_limit"); {
	case err == nil:
		a := app.(*admin.App)
		if a.BodyMemory != 0 {
			h.bodyLimits.memory = a.BodyMemory
		}
		if a.BodyTimeout != 0 {
			h.bodyLimits.wait = time.Duration(a.BodyTimeout)
		}
	case !errors.Is(err, caddy.ErrNotConfigured):
		return fmt.Errorf("loading the rate_limit app: %w", err)
	}
	if h.BodyMemory != 0 {
		h.bodyLimits.memory = h.BodyMemory
	}
	if h.BodyTimeout != 0 {
		h.bodyLimits.wait = time.Duration(h.BodyTimeout)
	}
	return nil
}

// This file answers the {body.<field>} placeholders: a field of the
// request's JSON body, named by the keys that lead to it from the
// top-level object joined by dots ({body.model},
// {body.metadata.user_id}), as text (costfrom.Value.Scalar). A zone's
// key and limit read them, and so does any handler after rate_limit, or
// a map whose output a zone reads.
//
// The body is read only for a zone that needs it: the first time a
// zone's key or limit asks for a field, the handler reads the body
// (once, up to MaxBody, handed on as it came) and resolves them again.
// A zone that asks for none reads nothing, so an upload through it
// streams on as it comes; a handler or log that asks for a field of a
// body no zone read finds it empty. A field is read as the most lenient
// server reads it (costfrom.Fields): a body that gives it, or an object
// on its path, twice under any spelling is refused with 400 before
// anything is taken.

// bodyPrefix begins the name of a {body.*} placeholder.
const bodyPrefix = "body."

// modelPlaceholder names {http.rate_limit.model}: the request's model,
// whatever its API's format, as a zone priced in money prices it. Google's
// Gemini API and Vertex AI name it in the request's path
// (/v1beta/models/gemini-2.5-flash:generateContent, see
// costfrom.PathModel), the other formats in the body's model, which
// {body.model} reads. It is read as a {body.*} is: the body is read for
// it (a body that gives model twice is refused), and it is empty if the
// request names no model.
const modelPlaceholder = "http.rate_limit.model"

// bodyFields answers one request's {body.*} placeholders, once a zone
// read its body.
type bodyFields struct {
	// text is the body, as costfrom.Text reads it.
	text []byte
	// pathModel is the model the request's path names, if it is a
	// Gemini one.
	pathModel string
	// err is the first *costfrom.DuplicateError of a field read, which
	// refuses the request if a zone read the field.
	err error
	// values are the first fields read, n of them: a config names a
	// few, and any more are read again each time they are asked for.
	values [4]bodyValue
	n      int
	// read is where a field is read into.
	read [1]costfrom.Value
}

// bodyValue is a field as bodyFields found it. Its text is kept as the
// replacer hands it on, so that a field asked for again (a key's second
// alternative, a map, a log) costs no allocation.
type bodyValue struct {
	path string
	text any
}

// setBody makes body, which a zone read, what the request's {body.*}
// read, and path, the request's URL path, where its model may be.
func (p *placeholders) setBody(path string, body []byte) {
	p.body, p.bodyWanted = &bodyFields{text: costfrom.Text(body)}, false
	p.body.pathModel, _ = costfrom.PathModel(path)
}

// model answers {http.rate_limit.model} as bodyField answers a field:
// before a zone read the body, it tells the handler so.
func (p *placeholders) model() (any, bool) {
	switch {
	case p.body == nil:
		p.bodyWanted = true
		return "", true
	case p.body.pathModel != "":
		return p.body.pathModel, true
	}
	return p.body.get("model")
}

// bodyField answers the placeholder body.<path>: the field's text;
// empty if no zone read the body, or if it is not JSON or does not give
// the field as a string, a number or a boolean. A path that names no
// field is unknown. Asked before a zone read the body, it tells the
// handler so (bodyWanted), which then reads it and asks again.
func (p *placeholders) bodyField(path string) (any, bool) {
	if p.body == nil {
		if bodyFieldsOf(path) == nil {
			return nil, false
		}
		p.bodyWanted = true
		return "", true
	}
	return p.body.get(path)
}

// get answers a field of the body for bodyField.
func (b *bodyFields) get(path string) (any, bool) {
	for _, v := range b.values[:b.n] {
		if v.path == path {
			return v.text, true
		}
	}
	f := bodyFieldsOf(path)
	if f == nil {
		return nil, false
	}
	var text any = ""
	if err := f.Read(b.text, b.read[:]); err != nil {
		if b.err == nil {
			b.err = err
		}
	} else if s, ok := b.read[0].Scalar(); ok {
		text = s
	}
	b.read[0] = costfrom.Value{}
	if b.n < len(b.values) {
		b.values[b.n] = bodyValue{path: path, text: text}
		b.n++
	}
	return text, true
}

// readFields reads the request's body, if no zone has yet, for a zone
// whose key or limit asks for a field of it, and makes it what p's
// {body.*} read.
func (s *scratch) readFields(w http.ResponseWriter, r *http.Request, p *placeholders, limits bodyLimits) error {
	if !s.bodyRead {
		if err := s.readBody(w, r, limits); err != nil {
			return err
		}
	}
	p.setBody(r.URL.Path, s.body)
	return nil
}

// bodyPaths holds the compiled Fields of each path a {body.*} of a
// loaded config names, so that a request reads it without compiling it.
// It grows with the templates of the configs loaded, never with
// requests: a path named otherwise (a map's source, a later handler) is
// compiled each time it is read.
var bodyPaths sync.Map

// {http.rate_limit.model} reads the body's model, whether or not a
// template names {body.model}.
func init() {
	compileBodyPaths("{" + bodyPrefix + "model}")
}

// bodyFieldsOf returns the Fields that reads path, or nil if path names
// no field.
func bodyFieldsOf(path string) *costfrom.Fields {
	if f, ok := bodyPaths.Load(path); ok {
		return f.(*costfrom.Fields)
	}
	f, err := newBodyFields(path)
	if err != nil {
		return nil
	}
	return f
}

// compileBodyPaths compiles the {body.*} placeholders of template a,
// which checkBodyPlaceholders accepted.
func compileBodyPaths(a string) {
	for _, path := range bodyPlaceholders(a) {
		if _, ok := bodyPaths.Load(path); ok {
			continue
		}
		if f, err := newBodyFields(path); err == nil {
			bodyPaths.Store(path, f)
		}
	}
}

// bodyPlaceholders returns the paths of the {body.*} placeholders in
// template a.
func bodyPlaceholders(a string) []string {
	var paths []string
	for _, p := range placeholderPattern.FindAllString(a, -1) {
		if path, ok := strings.CutPrefix(p[1:len(p)-1], bodyPrefix); ok {
			paths = append(paths, path)
		}
	}
	return paths
}

// pathPatterns are the characters of the path syntax of GJSON (array
// counts and queries, wildcards, modifiers, pipes), which caddy-ext's
// requestbodyvar read {body.*} with: a path here names object keys only.
const pathPatterns = "#*?@|"

// newBodyFields compiles path, refusing what names no field of an
// object.
func newBodyFields(path string) (*costfrom.Fields, error) {
	if i := strings.IndexAny(path, pathPatterns); i >= 0 {
		return nil, fmt.Errorf("want object keys joined by dots, got the path syntax %q", path[i:i+1])
	}
	return costfrom.NewFields(path)
}

// checkBodyPlaceholders refuses a {body.*} placeholder of template a
// that names no field of an object.
func checkBodyPlaceholders(a string) error {
	for _, path := range bodyPlaceholders(a) {
		if _, err := newBodyFields(path); err != nil {
			return fmt.Errorf("{body.%s}: %v (a {body.*} names a field of the JSON body by the keys that lead to it from the top-level object, joined by dots, such as {body.model} or {body.metadata.user_id}; array elements and patterns are not read)", path, err)
		}
	}
	return nil
}
