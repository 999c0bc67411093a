package costfrom

import (
	"math"
	"math/bits"
)

// A zone priced in money (cost_from usage price) counts what a response
// cost in picodollars: its tokens, each kind at its model's price. A
// price in dollars per million tokens, at six decimals, is a whole number
// of picodollars a token, so every cost is exact.

// Price is what one model's tokens cost, in picodollars a token.
type Price struct {
	Input, Output int64
	// CacheRead is a token read from the prompt cache (OpenAI's
	// cached_tokens, Anthropic's cache_read_input_tokens), CacheWrite one
	// written to it (Anthropic's cache_creation_input_tokens) and
	// CacheWrite1h one written to its 1-hour cache (Anthropic's
	// ephemeral_1h_input_tokens).
	CacheRead, CacheWrite, CacheWrite1h int64
}

// Usage is what a response reports it used, each kind of token at a
// price of its own (see Writer.Usage).
type Usage struct {
	// Input is the prompt's tokens read anew, not from the cache.
	Input, Output                       int64
	CacheRead, CacheWrite, CacheWrite1h int64
}

// Cost returns what u costs at p, in picodollars, or math.MaxInt64 if
// that is more.
func (p *Price) Cost(u Usage) int64 {
	var c capped
	c.add(u.Input, p.Input)
	c.add(u.Output, p.Output)
	c.add(u.CacheRead, p.CacheRead)
	c.add(u.CacheWrite, p.CacheWrite)
	c.add(u.CacheWrite1h, p.CacheWrite1h)
	return int64(c)
}

// Reservation returns the most a request can cost at p that lets the
// model generate at most out tokens and whose body is bytes long: out at
// the output price, and each byte at the highest price a token of the
// prompt may cost (a token is at least a byte of text; a token read from
// the cache costs no more than one read anew). It is math.MaxInt64 if
// that is more.
func (p *Price) Reservation(out int64, bytes int) int64 {
	var c capped
	c.add(out, p.Output)
	c.add(int64(bytes), max(p.Input, p.CacheWrite, p.CacheWrite1h))
	return int64(c)
}

// capped is a sum of costs that stops at math.MaxInt64: no limit is
// larger, and a cost past it is past every limit.
type capped int64

// add adds n tokens at price each.
func (c *capped) add(n, price int64) {
	if n <= 0 || price <= 0 {
		return
	}
	hi, lo := bits.Mul64(uint64(n), uint64(price))
	if hi != 0 || lo > uint64(math.MaxInt64-*c) {
		*c = math.MaxInt64
		return
	}
	*c += capped(lo)
}

// PriceLine is a line of a price table: the models it prices, a pattern
// in which * stands for any run of characters, and their price.
type PriceLine struct {
	Model string
	Price
}

// Prices is a price table: a model's price is that of the first line
// whose pattern matches its name.
type Prices []PriceLine

// Find returns the price of model, and false if no line prices it.
// Patterns match without regard to ASCII case, as a server that reads a
// model's name in any case would.
func (t Prices) Find(model []byte) (*Price, bool) {
	for i := range t {
		if match(t[i].Model, model) {
			return &t[i].Price, true
		}
	}
	return nil, false
}

// match reports whether pattern matches all of name, * matching any run
// of bytes: the usual greedy walk, which goes back only to the last *,
// so it takes at most len(pattern)×len(name) steps.
func match(pattern string, name []byte) bool {
	p, n := 0, 0
	star, from := -1, 0
	for n < len(name) {
		switch {
		case p < len(pattern) && pattern[p] == '*':
			star, from = p, n
			p++
		case p < len(pattern) && lower(pattern[p]) == lower(name[n]):
			p++
			n++
		case star >= 0:
			from++
			p, n = star+1, from
		default:
			return false
		}
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}
