package ratelimit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/costfrom"
	"github.com/d61b427a/caddy-rate-limit/internal/money"
)

// This file holds what a zone that limits what responses cost (an LLM
// API's tokens) adds to the handler: cost_from, reserve and
// usage_in_stream. Such a zone takes a reservation when it admits a
// request, as it takes any cost, reads the response's cost as the
// response passes (costfrom.Writer), and trues the reservation up to it
// when the response is done (storage.Request.TrueUp).

// CostFrom is where a zone reads a response's cost: one of its fields is
// set.
type CostFrom struct {
	// The token count of the usage the response's body reports: "input"
	// (the prompt's tokens), "output" (the tokens generated) or "total"
	// (both). See the costfrom package for the formats read: OpenAI's and
	// the servers compatible with it, Anthropic's, Ollama's, and Google's
	// Gemini API and Vertex AI. Or "price": what those tokens cost in
	// money, each kind at its price in Price, by the request's model
	// ({http.rate_limit.model}); the zone's limit is then in dollars, and
	// its counts in picodollars.
	Usage string `json:"usage,omitempty"`

	// The price table of usage "price", one line per model or pattern
	// of models: a request's model is priced by the first line whose
	// pattern matches it (a request that names none, by the line "*").
	// A request whose model no line prices is refused with 400.
	Price []PriceLine `json:"price,omitempty"`

	// The response header, or trailer, whose value is the cost: a
	// non-negative decimal integer.
	Header string `json:"header,omitempty"`
}

// Reserve is what a request of a cost_from zone takes when it is
// admitted: one of its fields is set.
type Reserve struct {
	// A fixed reservation, in cost units.
	Units int64 `json:"units,omitempty"`

	// Reserve the most tokens the request's body lets the model generate
	// (max_tokens, max_completion_tokens, max_output_tokens, n_predict
	// or Ollama's options.num_predict, the largest given, times n or
	// best_of), or this many if it gives none; the zone's whole limit if
	// its bound means none (0 or less); with cost_from usage input or
	// total, plus the body's length in bytes, which bounds its prompt's
	// tokens. A request to Google's Gemini API or Vertex AI, whose path
	// names its model, reserves its generationConfig.maxOutputTokens
	// times its candidateCount, and the whole limit without a bound. The
	// body is read as the most lenient server reads it, and one that
	// gives a field it reads twice is refused with 400.
	MaxTokens int64 `json:"max_tokens,omitempty"`
}

// checkUsage accepts the counts cost_from usage reads, and price.
func checkUsage(v string) error {
	if _, ok := usageCounts[v]; !ok && v != usagePrice {
		return fmt.Errorf("want input, output, total or price, got %q", v)
	}
	return nil
}

var usageCounts = map[string]costfrom.Count{"input": costfrom.Input, "output": costfrom.Output, "total": costfrom.Total}

// checkCostHeader accepts a header's name: an HTTP token.
func checkCostHeader(name string) error {
	if name == "" || strings.IndexFunc(name, func(r rune) bool {
		return r <= ' ' || r >= 0x7f || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, r)
	}) >= 0 {
		return fmt.Errorf("want a header name such as X-Cost, got %q", name)
	}
	return nil
}

// checkReserveUnits accepts a reservation, or the default of reserve
// max_tokens.
func checkReserveUnits(n int64) error {
	if n < 1 || n > maxLimit {
		return fmt.Errorf("want an integer from 1 to %d, got %d", maxLimit, n)
	}
	return nil
}

// validateCostFrom checks cost_from, reserve and usage_in_stream, which
// go together.
func (z *Zone) validateCostFrom() error {
	if err := checkOnOff(z.UsageInStream); err != nil {
		return fmt.Errorf("usage_in_stream: %w", err)
	}
	if err := z.checkLimitMoney(); err != nil {
		return err
	}
	if z.CostFrom == nil {
		switch {
		case z.Reserve != nil:
			return errors.New("reserve: only with cost_from, whose responses true the reservation up (want cost_from usage input|output|total or cost_from header <name>)")
		case z.UsageInStream != "":
			return errors.New("usage_in_stream: only with cost_from usage, which reads the usage of a stream (want cost_from usage input|output|total)")
		}
		return nil
	}
	cf := z.CostFrom
	switch {
	case cf.Usage != "" && cf.Header != "":
		return errors.New("cost_from: want usage or header, not both")
	case cf.Usage != "":
		if err := checkUsage(cf.Usage); err != nil {
			return fmt.Errorf("cost_from: usage: %w", err)
		}
	case cf.Header != "":
		if err := checkCostHeader(cf.Header); err != nil {
			return fmt.Errorf("cost_from: header: %w", err)
		}
	default:
		return errors.New("cost_from: want usage input|output|total or header <name>, got neither")
	}
	if z.Algorithm == algorithms.Concurrency {
		return errors.New("cost_from: not for algorithm concurrency, which limits requests in flight, not what they cost (want a windowed or gcra zone)")
	}
	if len(z.Cost) > 0 {
		return errors.New("cost: not with cost_from, whose requests take their reserve (want reserve <n> or reserve max_tokens <default> instead)")
	}
	if z.UsageInStream != "" && cf.Usage == "" {
		return errors.New("usage_in_stream: only with cost_from usage, which reads the usage of a stream (want no usage_in_stream with cost_from header)")
	}
	if err := z.validatePrice(); err != nil {
		return err
	}
	r := z.Reserve
	switch {
	case r == nil:
		return errors.New("reserve: missing, which cost_from needs (want reserve <n> or reserve max_tokens <default>)")
	case r.Units != 0 && r.MaxTokens != 0:
		return errors.New("reserve: want units or max_tokens, not both")
	case r.Units != 0:
		if err := checkReserveUnits(r.Units); err != nil {
			return fmt.Errorf("reserve: %w", err)
		}
	case r.MaxTokens != 0:
		if err := checkReserveUnits(r.MaxTokens); err != nil {
			return fmt.Errorf("reserve: max_tokens: %w", err)
		}
	default:
		return errors.New("reserve: want <n> or max_tokens <default>, got neither")
	}
	return nil
}

// validatePrice checks what goes with cost_from usage price: a price
// table, and the algorithms and reservation that count money.
func (z *Zone) validatePrice() error {
	cf := z.CostFrom
	if !z.priced() {
		if len(cf.Price) > 0 {
			return fmt.Errorf("cost_from: a price table only with usage price (want cost_from usage price { ... }), got usage %q", cf.Usage)
		}
		return nil
	}
	if _, err := compilePrices(cf.Price); err != nil {
		return fmt.Errorf("cost_from: price: %w", err)
	}
	if alg := z.Algorithm; alg != "" && alg != algorithms.FixedWindow && alg != algorithms.SlidingTail {
		return fmt.Errorf("algorithm: want fixed_window or sliding_tail, which count money (cost_from usage price), got %s", alg)
	}
	if z.Reserve != nil && z.Reserve.Units != 0 {
		return fmt.Errorf("reserve: a zone priced in money reserves the request's bound at its model's prices (want reserve max_tokens <default>), got reserve %d", z.Reserve.Units)
	}
	return nil
}

// meter is how a cost_from zone reserves a request's cost and reads its
// response's.
type meter struct {
	// on tells the zone has cost_from; the other fields are its.
	on  bool
	src costfrom.Source
	// fixed is reserve <n>, def reserve max_tokens' default.
	fixed, def int64
	// prompt adds the body's length to a reservation by max_tokens: the
	// count read includes the prompt, whose tokens its bytes bound.
	prompt      bool
	streamUsage bool
	// prices is the price table of a zone priced in money (cost_from
	// usage price), nil for any other: its reservations and costs are
	// in picodollars.
	prices costfrom.Prices
	// units are the zone's caddy_http_rate_limit_cost_units_total
	// series, by kind.
	units [costKinds]prometheus.Counter
}

// newMeter returns z's meter: a zone without cost_from has none.
func newMeter(z *Zone, metricsOff bool) meter {
	if z.CostFrom == nil || z.Reserve == nil {
		return meter{}
	}
	count := usageCounts[z.CostFrom.Usage]
	m := meter{
		on:          true,
		src:         costfrom.Source{Header: z.CostFrom.Header, Count: count},
		fixed:       z.Reserve.Units,
		def:         z.Reserve.MaxTokens,
		prompt:      count == costfrom.Input || count == costfrom.Total,
		streamUsage: z.UsageInStream == "on",
	}
	unit := "tokens"
	switch {
	case z.priced():
		// Refused by Validate if it does not compile.
		m.prices, _ = compilePrices(z.CostFrom.Price)
		m.src.Count, unit = costfrom.Total, money.Unit
	case z.CostFrom.Header != "":
		unit = "units"
	}
	m.units = costSeries(z.Name, unit, metricsOff)
	return m
}

// readsBody reports whether the zone reads a request's body: to reserve
// by it, or to ask for a stream's usage.
func (m *meter) readsBody() bool {
	return m.on && (m.def > 0 || m.streamUsage)
}

// reservation is what a request whose body reads as req takes at
// admission, where its key's limit is limit. It is at most maxLimit: a
// request asking for more than any limit is refused whatever its count.
// A request whose bound means none takes the whole limit (or more, if
// another of its bounds asks for more), which its key must have free.
// In a zone priced in money, price is the price of the request's model
// (see findPrice), and the reservation its bound at the output price and
// its body at the highest price of a prompt's token (at most 2^63-1
// picodollars).
func (m *meter) reservation(req *costfrom.Request, limit int64, price *costfrom.Price) int64 {
	if m.fixed > 0 {
		return m.fixed
	}
	n, unbounded := req.MaxTokens(m.def)
	if price != nil {
		r := price.Reservation(n, req.Size())
		if unbounded {
			r = max(r, limit)
		}
		return r
	}
	if unbounded {
		return min(max(n, limit), maxLimit)
	}
	r := min(n, maxLimit)
	if m.prompt {
		r += int64(req.Size())
	}
	return min(r, maxLimit)
}

// fieldRefused answers a request whose body gives a field a zone reads
// more than once, under any spelling (a *costfrom.DuplicateError), which
// servers would read differently: 400, with a JSON body in the shape of
// OpenAI's and Anthropic's errors that names the field in param. Nothing
// has been taken. Where the server has error routes (handle_errors), they
// answer it, with the error's message naming the field.
func fieldRefused(w http.ResponseWriter, r *http.Request, err error) error {
	var dup *costfrom.DuplicateError
	errors.As(err, &dup)
	return refusedRequest(w, r, "duplicate_field", dup.Field, err)
}

// refusedRequest answers a request refused for what its body asks, err,
// before anything is taken: 400, with a JSON body in the shape of
// OpenAI's and Anthropic's errors, with code and the field named in
// param; or, where the server has error routes, the error for them.
func refusedRequest(w http.ResponseWriter, r *http.Request, code, param string, err error) error {
	if hasErrorRoutes(r) {
		return caddyhttp.Error(http.StatusBadRequest, err)
	}
	var answer fieldError
	answer.Type = "error"
	answer.Error.Type, answer.Error.Code = "invalid_request_error", code
	answer.Error.Param, answer.Error.Message = param, err.Error()
	body, _ := json.Marshal(answer)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusBadRequest)
	_, _ = w.Write(body)
	return nil
}

// fieldError is the body of fieldRefused's answer.
type fieldError struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Code    string `json:"code"`
		Param   string `json:"param"`
		Message string `json:"message"`
	} `json:"error"`
}

// costWriter is a Writer reading one source of cost for the zones that
// read it: one for the usage, whatever its count, and one per header.
type costWriter struct {
	src costfrom.Source
	w   *costfrom.Writer
}

var writerPool = sync.Pool{New: func() any { return new(costfrom.Writer) }}

// key is the source a Writer reads for the meter: every count of a
// usage is read by one.
func (m *meter) key() costfrom.Source {
	if m.src.Header != "" {
		return costfrom.Source{Header: http.CanonicalHeaderKey(m.src.Header)}
	}
	return costfrom.Source{Count: costfrom.Total}
}

// meterResponse wraps w in the Writers the allowed cost_from checks read
// their costs with (a usage is read only from an answer that is not
// compressed), and, if one asks for a stream's usage, asks the
// request's body for it and hides it from the client. It returns w
// unchanged if no check reads a cost.
func (s *scratch) meterResponse(w http.ResponseWriter, r *http.Request) http.ResponseWriter {
	hide, usage := false, false
	for i := range s.checks {
		c := &s.checks[i]
		m := &c.zone.meter
		if !m.on || c.dryRunExceeded {
			continue
		}
		key := m.key()
		if s.costWriter(key) == nil {
			cw := writerPool.Get().(*costfrom.Writer)
			cw.Reset(w, key)
			w = cw
			s.writers = append(s.writers, costWriter{src: key, w: cw})
		}
		hide = hide || m.streamUsage
		usage = usage || key.Header == ""
	}
	// A compressed answer's usage cannot be read. Without the client's
	// Accept-Encoding, Caddy's encode leaves the answer as it is, and
	// reverse_proxy asks the upstream for gzip itself and hands on what
	// it decompressed.
	if usage {
		r.Header.Del("Accept-Encoding")
	}
	// Anthropic's Messages API refuses stream_options, and its
	// requests, which look like a Chat Completion's by their body, all
	// carry anthropic-version: they are handed on as sent.
	if hide && s.requestRead && r.Header.Get("anthropic-version") == "" {
		if b, ok := s.request.StreamUsage(); ok {
			setBody(r, b)
			// A client that asked for the usage, in a spelling some
			// server does not read, sees it.
			if !s.request.AsksStreamUsage() {
				s.costWriter(costfrom.Source{Count: costfrom.Total}).HideStreamUsage()
			}
		}
	}
	return w
}

// costWriter returns the Writer reading src, nil if there is none.
func (s *scratch) costWriter(src costfrom.Source) *costfrom.Writer {
	for _, cw := range s.writers {
		if cw.src == src {
			return cw.w
		}
	}
	return nil
}

// cost returns the cost the response showed for the meter, and whether
// it showed one. A zone priced in money prices the response's usage by
// the model it names, if a line prices that one (a router's alias
// resolved), else at price, the request's model's, as its reservation
// was.
func (s *scratch) cost(m *meter, price *costfrom.Price) (int64, bool) {
	cw := s.costWriter(m.key())
	switch {
	case cw == nil:
		return 0, false
	case m.src.Header != "":
		return cw.Cost()
	case m.prices == nil:
		return cw.Tokens(m.src.Count)
	}
	u, ok := cw.Usage()
	if !ok {
		return 0, false
	}
	if model := cw.Model(); model != nil {
		if p, found := m.prices.Find(model); found {
			price = p
		}
	}
	return price.Cost(u), true
}

// recycleWriters returns the request's Writers to their pool, keeping no
// response reachable.
func (s *scratch) recycleWriters() {
	for i, cw := range s.writers {
		cw.w.Reset(nil, costfrom.Source{})
		writerPool.Put(cw.w)
		s.writers[i] = costWriter{}
	}
	s.writers = s.writers[:0]
}

// anyMeters reports whether any of the allowed checks reads its cost
// from the response.
func anyMeters(checks []zoneCheck) bool {
	for i := range checks {
		if checks[i].zone.meter.on && !checks[i].dryRunExceeded {
			return true
		}
	}
	return false
}

// Kinds of caddy_http_rate_limit_cost_units_total: what cost_from zones
// reserved at admission, and what they did with it once the responses
// were done. Over any span, reserved - released + debt = taken.
const (
	costReserved = iota
	costTaken
	costReleased
	costDebt
	costKinds
)

var costKindNames = [costKinds]string{"reserved", "taken", "released", "debt"}

// This file holds what a zone priced in money adds to a cost_from zone
// (cost_from usage price): its price table, its limits in dollars, and
// the refusal of a request whose model it has no price for. Such a zone
// counts picodollars (money.Unit), exactly, in 64-bit counts
// (storage.Request.Wide); its meter (tokens.go) reserves and trues up in
// them.

// usagePrice is the cost_from usage that prices tokens in money.
const usagePrice = "price"

// PriceLine is a line of cost_from usage price: the models it prices and
// their prices, in dollars per million tokens, with at most six decimals
// ("2.50", "0.075"). A model's price is that of the first line whose
// pattern matches it.
type PriceLine struct {
	// The models the line prices: a name, or a pattern in which *
	// stands for any run of characters ("claude-sonnet-4*"; "*" alone:
	// any model). Matched without regard to case.
	Model string `json:"model"`

	// The price of the prompt's tokens read anew, and of the tokens the
	// model generates. Required.
	Input  Dollars `json:"input"`
	Output Dollars `json:"output"`

	// The price of the prompt's tokens read from the prompt cache:
	// OpenAI's cached tokens (part of its prompt tokens), Anthropic's
	// cache reads (beside its input tokens). At most the input price.
	// Default: the input price.
	CacheRead Dollars `json:"cache_read,omitempty"`

	// The price of the prompt's tokens written to Anthropic's prompt
	// cache (its cache_creation_input_tokens). Default: the input price.
	CacheWrite Dollars `json:"cache_write,omitempty"`

	// The price of those written to its 1-hour cache (its
	// ephemeral_1h_input_tokens, part of the cache writes). At least the
	// cache_write price. Default: the cache_write price.
	CacheWrite1h Dollars `json:"cache_write_1h,omitempty"`
}

// Dollars is a price as written: in JSON a string ("2.50") or a number
// (2.50), kept as its text, so that it is read exactly.
type Dollars string

// UnmarshalJSON keeps a number's text, or a string's value.
func (d *Dollars) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*d = Dollars(s)
		return nil
	}
	var n json.Number
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("want dollars per million tokens, as a string or a number, got %s", b)
	}
	*d = Dollars(n)
	return nil
}

// priced reports whether the zone is priced in money.
func (z *Zone) priced() bool {
	return z.CostFrom != nil && z.CostFrom.Usage == usagePrice
}

// priceKinds are the prices a price line sets, in the order the
// Caddyfile writes them.
var priceKinds = []string{"input", "output", "cache_read", "cache_write", "cache_write_1h"}

// field returns the price of the kind named (one of priceKinds).
func (l *PriceLine) field(kind string) *Dollars {
	switch kind {
	case "input":
		return &l.Input
	case "output":
		return &l.Output
	case "cache_read":
		return &l.CacheRead
	case "cache_write":
		return &l.CacheWrite
	}
	return &l.CacheWrite1h
}

// compilePrices checks a price table and returns it in picodollars a
// token, each missing price at its default.
func compilePrices(lines []PriceLine) (costfrom.Prices, error) {
	if len(lines) == 0 {
		return nil, errors.New("want a line per model, such as gpt-4o input 2.50 output 10.00, got none")
	}
	out := make(costfrom.Prices, len(lines))
	for i, l := range lines {
		if err := checkModelPattern(l.Model); err != nil {
			return nil, err
		}
		for _, earlier := range lines[:i] {
			if earlier.Model == "*" || strings.EqualFold(earlier.Model, l.Model) {
				return nil, fmt.Errorf("%s: never used, since the line %s above prices every model it would (want each pattern once, and * last)", l.Model, earlier.Model)
			}
		}
		p, err := l.price()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", l.Model, err)
		}
		out[i] = costfrom.PriceLine{Model: l.Model, Price: p}
	}
	return out, nil
}

// checkModelPattern accepts a model pattern: 1 to 256 printable ASCII
// characters, no space.
func checkModelPattern(m string) error {
	if m == "" || len(m) > 256 || strings.IndexFunc(m, func(r rune) bool { return r <= ' ' || r > '~' }) >= 0 {
		return fmt.Errorf("want a model's name or a pattern such as claude-sonnet-4* (printable ASCII, no space, at most 256 characters), got %q", m)
	}
	return nil
}

// price reads the line's prices, each missing cache price at its
// default. A cache read costs no more than input, and a 1-hour write no
// less than a write: so a usage read ambiguously costs no less than any
// server's reading of it (see costfrom.Writer.Usage).
func (l *PriceLine) price() (costfrom.Price, error) {
	var p costfrom.Price
	read := func(kind string, to *int64, def int64) error {
		v := *l.field(kind)
		if v == "" {
			if def < 0 {
				return fmt.Errorf("%s: missing (want dollars per million tokens, such as 2.50)", kind)
			}
			*to = def
			return nil
		}
		n, err := money.ParsePrice(string(v))
		if err != nil {
			return fmt.Errorf("%s: %w", kind, err)
		}
		*to = n
		return nil
	}
	if err := read("input", &p.Input, -1); err != nil {
		return p, err
	}
	if err := read("output", &p.Output, -1); err != nil {
		return p, err
	}
	if err := read("cache_read", &p.CacheRead, p.Input); err != nil {
		return p, err
	}
	if err := read("cache_write", &p.CacheWrite, p.Input); err != nil {
		return p, err
	}
	if err := read("cache_write_1h", &p.CacheWrite1h, p.CacheWrite); err != nil {
		return p, err
	}
	if p.CacheRead > p.Input {
		return p, fmt.Errorf("cache_read: want at most the input price, %s (a token read from the cache costs no more than one read anew), got %s", l.Input, l.CacheRead)
	}
	if p.CacheWrite1h < p.CacheWrite {
		return p, fmt.Errorf("cache_write_1h: want at least the cache_write price, %s, got %s", money.FormatPrice(p.CacheWrite), l.CacheWrite1h)
	}
	return p, nil
}

// checkLimitMoney accepts a zone's limit alternatives where the zone is
// or is not priced in money: dollars ("$50") in one that is, a number of
// units in one that is not, a placeholder in either.
func (z *Zone) checkLimitMoney() error {
	for _, l := range z.LimitAlternatives {
		if strings.Contains(l, "{") {
			continue
		}
		dollars := strings.HasPrefix(l, "$")
		switch {
		case z.priced() && !dollars:
			return fmt.Errorf("limit: want dollars such as $50 in a zone priced in money (cost_from usage price), or a placeholder, got %q", l)
		case !z.priced() && dollars:
			return fmt.Errorf("limit: %s is money, for a zone priced by cost_from usage price { ... } (want a number of units), got %q", l, l)
		}
	}
	return nil
}

// limitValue reads the value of a limit alternative: an integer from 1 to
// maxLimit, or in a zone priced in money a positive dollar amount, with
// or without its $ ("$50", "50", "0.25").
func (z *Zone) limitValue(s string) (int64, bool) {
	s = strings.TrimSpace(s)
	if z.meter.prices != nil {
		n, err := money.Parse(s)
		return n, err == nil && n > 0
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil && n > 0 && n <= maxLimit
}

// unpricedError tells that a zone priced in money has no price for a
// request: for its model, or, naming none, for any model (no * line).
type unpricedError struct {
	zone  string
	model []byte // nil when the request names none
}

func (e *unpricedError) Error() string {
	if e.model == nil {
		return fmt.Sprintf("zone %q prices requests by their model, and the request names no model (the zone's price table has no * line to price it by)", e.zone)
	}
	return fmt.Sprintf("zone %q has no price for the request's model %q (the zone's price table has no line that matches it, and no * line)", e.zone, e.model)
}

// code is the unpriced answer's error code.
func (e *unpricedError) code() string {
	if e.model == nil {
		return "model_missing"
	}
	return "model_not_priced"
}

// findPrice returns the price of req's model in the zone's table, or an
// *unpricedError.
// A request that names no model is priced by the * line.
func (m *meter) findPrice(zone string, req *costfrom.Request) (*costfrom.Price, *unpricedError) {
	model, named := req.ModelName()
	if !named {
		for i := range m.prices {
			if m.prices[i].Model == "*" {
				return &m.prices[i].Price, nil
			}
		}
		return nil, &unpricedError{zone: zone}
	}
	if p, ok := m.prices.Find(model); ok {
		return p, nil
	}
	return nil, &unpricedError{zone: zone, model: bytes.Clone(model)}
}

// unpriced answers a request that a zone priced in money has no price for
// (an *unpricedError): 400, with a JSON body that names the model, as
// fieldRefused answers. Nothing has been taken.
func unpriced(w http.ResponseWriter, r *http.Request, err *unpricedError) error {
	return refusedRequest(w, r, err.code(), "model", err)
}
