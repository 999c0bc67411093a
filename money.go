package ratelimit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/d61b427a/caddy-rate-limit/costfrom"
	"github.com/d61b427a/caddy-rate-limit/internal/money"
)

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
