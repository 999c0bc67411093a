// Package money holds how a zone priced in money (cost_from usage price)
// writes and reads amounts: dollars as a person writes them ("$50",
// "$0.25"), counted in picodollars, an integer unit fine enough that a
// price of $0.000001 per million tokens costs a whole unit a token. Every
// price with six decimals is then exact, and so is every cost.
package money

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
)

// Unit names the unit money is counted in, wherever a program reads a
// count: headers, placeholders, metrics.
const Unit = "picodollars"

// PerDollar is how many picodollars make a dollar.
const PerDollar = 1_000_000_000_000

// dollarDecimals is how many decimals a dollar amount may have: one
// picodollar is $0.000000000001.
const dollarDecimals = 12

// priceDecimals is how many decimals a price may have, in dollars per
// million tokens: $0.000001 per million tokens is a picodollar a token.
const priceDecimals = 6

// MaxDollars is the largest amount there is, in dollars: 2^63-1
// picodollars.
var MaxDollars = Format(math.MaxInt64)

// Parse reads a dollar amount, "$50", "$0.25", or the same without the
// dollar sign, as picodollars. It refuses anything else: a sign, an
// exponent, a thousands separator, more than 12 decimals, more than
// MaxDollars.
func Parse(s string) (int64, error) {
	n, err := decimal(strings.TrimPrefix(s, "$"), dollarDecimals)
	if err != nil {
		return 0, fmt.Errorf("want a dollar amount such as $50 or $0.25, with at most %d decimals, up to %s, got %q", dollarDecimals, MaxDollars, s)
	}
	return n, nil
}

// ParsePrice reads a price in dollars per million tokens, "2.50" or
// "$2.50", as picodollars a token (the same digits, at six decimals).
func ParsePrice(s string) (int64, error) {
	n, err := decimal(strings.TrimPrefix(s, "$"), priceDecimals)
	if err != nil {
		return 0, fmt.Errorf("want dollars per million tokens such as 2.50, with at most %d decimals, got %q", priceDecimals, s)
	}
	return n, nil
}

var errDecimal = errors.New("not a decimal")

// decimal reads digits, optionally with a point and 1 to places more, as
// an integer in units of 10^-places.
func decimal(s string, places int) (int64, error) {
	whole, frac, point := strings.Cut(s, ".")
	if !digits(whole) || point && (!digits(frac) || len(frac) > places) {
		return 0, errDecimal
	}
	frac += strings.Repeat("0", places-len(frac))
	w, err := strconv.ParseUint(whole, 10, 64)
	if err != nil {
		return 0, errDecimal
	}
	f, _ := strconv.ParseUint(frac, 10, 64)
	hi, lo := bits.Mul64(w, pow10(places))
	sum, carry := bits.Add64(lo, f, 0)
	if hi != 0 || carry != 0 || sum > math.MaxInt64 {
		return 0, errDecimal
	}
	return int64(sum), nil
}

// digits reports whether s is one or more ASCII digits.
func digits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func pow10(n int) uint64 {
	p := uint64(1)
	for range n {
		p *= 10
	}
	return p
}

// FormatPrice writes a price in picodollars a token as dollars per
// million tokens, as a price line writes it: "3.75", "0.000001".
func FormatPrice(perToken int64) string {
	whole, frac := perToken/1_000_000, perToken%1_000_000
	s := strconv.FormatInt(whole, 10)
	if frac == 0 {
		return s
	}
	f := strconv.FormatInt(frac, 10)
	return s + "." + strings.TrimRight(strings.Repeat("0", priceDecimals-len(f))+f, "0")
}

// Format writes picodollars as dollars, with as many decimals as the
// amount needs to be exact and at least two: "$50.00", "$12.50",
// "$12.345678", "$0.000000000001".
func Format(n int64) string {
	sign := ""
	u := uint64(n)
	if n < 0 {
		sign, u = "-", -u
	}
	frac := strconv.FormatUint(u%PerDollar, 10)
	frac = strings.Repeat("0", dollarDecimals-len(frac)) + frac
	frac = strings.TrimRight(frac, "0")
	if len(frac) < 2 {
		frac += strings.Repeat("0", 2-len(frac))
	}
	return sign + "$" + strconv.FormatUint(u/PerDollar, 10) + "." + frac
}
