package costfrom

import (
	"math"
	"testing"

	"github.com/d61b427a/caddy-rate-limit/internal/race"
)

// A price table as the Caddyfile writes one, in picodollars a token
// (dollars per million tokens at six decimals).
var testPrices = Prices{
	{Model: "gpt-4o-mini", Price: Price{Input: 150_000, Output: 600_000, CacheRead: 75_000, CacheWrite: 150_000, CacheWrite1h: 150_000}},
	{Model: "gpt-4o*", Price: Price{Input: 2_500_000, Output: 10_000_000, CacheRead: 1_250_000, CacheWrite: 2_500_000, CacheWrite1h: 2_500_000}},
	{Model: "claude-*-4*", Price: Price{Input: 3_000_000, Output: 15_000_000, CacheRead: 300_000, CacheWrite: 3_750_000, CacheWrite1h: 6_000_000}},
	{Model: "*", Price: Price{Input: 1_000_000, Output: 4_000_000, CacheRead: 1_000_000, CacheWrite: 1_000_000, CacheWrite1h: 1_000_000}},
}

func TestPricesFind(t *testing.T) {
	for _, c := range []struct {
		model string
		line  int
	}{
		{"gpt-4o-mini", 0},
		{"GPT-4o-MINI", 0}, // as a server that folds case reads it
		{"gpt-4o-mini-2024-07-18", 1},
		{"gpt-4o", 1},
		{"gpt-4o-2024-08-06", 1},
		{"claude-sonnet-4-5-20250929", 2},
		{"claude-opus-4", 2},
		{"claude-3-haiku", 3},
		{"llama3.2", 3},
		{"", 3},
	} {
		p, ok := testPrices.Find([]byte(c.model))
		if !ok || p != &testPrices[c.line].Price {
			t.Errorf("Find(%q) = %v, %v; want line %d", c.model, p, ok, c.line)
		}
	}
	noStar := testPrices[:3]
	for _, model := range []string{"gpt-4", "llama3.2", "", "claude-3-haiku", "gpt-4o-mini-x"} {
		if p, ok := noStar[:1].Find([]byte(model)); ok {
			t.Errorf("Find(%q) without *: %v, want none", model, p)
		}
	}
}

func TestMatch(t *testing.T) {
	for _, c := range []struct {
		pattern, model string
		want           bool
	}{
		{"*", "", true},
		{"*", "anything", true},
		{"a*b*c", "abc", true},
		{"a*b*c", "aXbYc", true},
		{"a*b*c", "aXbYcZ", false},
		{"a*b*c", "acb", false},
		{"**", "x", true},
		{"*-mini", "gpt-4o-mini", true},
		{"*-mini", "gpt-4o-mini-2", false},
		{"gpt", "gpt-4", false},
		{"gpt-4", "gpt", false},
		{"Claude*", "cLAUDE-3", true},
	} {
		if got := match(c.pattern, []byte(c.model)); got != c.want {
			t.Errorf("match(%q, %q) = %v, want %v", c.pattern, c.model, got, c.want)
		}
	}
}

func TestPriceCost(t *testing.T) {
	claude := &testPrices[2].Price
	for _, c := range []struct {
		name  string
		price *Price
		u     Usage
		want  int64
	}{
		// 1000 input, 500 output at $3 and $15 per million:
		// 3,000,000,000 + 7,500,000,000 picodollars.
		{"input and output", claude, Usage{Input: 1000, Output: 500}, 10_500_000_000},
		{"every kind", claude, Usage{Input: 2095, Output: 503, CacheRead: 1000, CacheWrite: 40, CacheWrite1h: 60},
			2095*3_000_000 + 503*15_000_000 + 1000*300_000 + 40*3_750_000 + 60*6_000_000},
		{"nothing", claude, Usage{}, 0},
		{"a huge count stops at 2^63-1", claude, Usage{Output: math.MaxInt64 / 2}, math.MaxInt64},
		{"huge counts stop at 2^63-1", claude, Usage{Input: 1 << 40, Output: 1 << 40, CacheRead: 1 << 40, CacheWrite: 1 << 40, CacheWrite1h: 1 << 40}, math.MaxInt64},
	} {
		if got := c.price.Cost(c.u); got != c.want {
			t.Errorf("%s: Cost(%+v) = %d, want %d", c.name, c.u, got, c.want)
		}
	}
}

func TestPriceReservation(t *testing.T) {
	claude := &testPrices[2].Price
	// 4096 tokens out at $15 per million, 2000 bytes of prompt at the
	// highest input-side price, the 1-hour cache write's $6.
	if got, want := claude.Reservation(4096, 2000), int64(4096*15_000_000+2000*6_000_000); got != want {
		t.Errorf("Reservation = %d, want %d", got, want)
	}
	// A cache write above the input price is the prompt's price.
	p := Price{Input: 1, Output: 2, CacheWrite: 5, CacheWrite1h: 3}
	if got := p.Reservation(10, 100); got != 10*2+100*5 {
		t.Errorf("Reservation = %d, want %d", got, 10*2+100*5)
	}
	if got := claude.Reservation(math.MaxInt64, 1); got != math.MaxInt64 {
		t.Errorf("Reservation of a huge bound = %d, want 2^63-1", got)
	}
}

// TestPriceAllocations: finding a price and pricing a usage allocate
// nothing, on every request.
func TestPriceAllocations(t *testing.T) {
	if race.Enabled {
		t.Skip("the race detector allocates")
	}
	model := []byte("claude-sonnet-4-5-20250929")
	n := testing.AllocsPerRun(100, func() {
		p, _ := testPrices.Find(model)
		_ = p.Cost(Usage{Input: 1, Output: 2}) + p.Reservation(3, 4)
	})
	if n != 0 {
		t.Fatalf("%v allocations", n)
	}
}
