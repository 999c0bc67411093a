package money

import (
	"math"
	"testing"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
	}{
		{"$50", 50 * PerDollar},
		{"50", 50 * PerDollar},
		{"$0.25", 250_000_000_000},
		{"0.000000000001", 1},
		{"$12.345678", 12_345_678_000_000},
		{"$9223372.036854775807", math.MaxInt64},
		{"$0", 0},
		{"007.5", 7_500_000_000_000},
	} {
		got, err := Parse(c.in)
		if err != nil || got != c.want {
			t.Errorf("Parse(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "$", "$-1", "-1", "$1.", "$.5", "$1.0000000000001", "$9223372.036854775808",
		"$99999999", "1e3", "$ 5", "5$", "$1,000", "$$1", "0x10", "١"} {
		if n, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) = %d, want an error", bad, n)
		}
	}
}

func TestParsePrice(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
	}{
		// Dollars per million tokens are picodollars a token.
		{"2.50", 2_500_000},
		{"$3", 3_000_000},
		{"0.000001", 1},
		{"0.075", 75_000},
		{"0", 0},
	} {
		got, err := ParsePrice(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParsePrice(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "-1", "0.0000001", "abc", "1.5.5", "$"} {
		if n, err := ParsePrice(bad); err == nil {
			t.Errorf("ParsePrice(%q) = %d, want an error", bad, n)
		}
	}
}

func TestFormatPrice(t *testing.T) {
	for in, want := range map[int64]string{3_750_000: "3.75", 1: "0.000001", 0: "0", 15_000_000: "15", 75_000: "0.075"} {
		if got := FormatPrice(in); got != want {
			t.Errorf("FormatPrice(%d) = %q, want %q", in, got, want)
		}
		if back, err := ParsePrice(FormatPrice(in)); err != nil || back != in {
			t.Errorf("ParsePrice(FormatPrice(%d)) = %d, %v", in, back, err)
		}
	}
}

func TestFormat(t *testing.T) {
	for _, c := range []struct {
		in   int64
		want string
	}{
		{0, "$0.00"},
		{50 * PerDollar, "$50.00"},
		{12_500_000_000_000, "$12.50"},
		{12_345_678_000_000, "$12.345678"},
		{1, "$0.000000000001"},
		{math.MaxInt64, "$9223372.036854775807"},
		{-PerDollar / 2, "-$0.50"},
		{math.MinInt64, "-$9223372.036854775808"},
	} {
		if got := Format(c.in); got != c.want {
			t.Errorf("Format(%d) = %q, want %q", c.in, got, c.want)
		}
	}
	// Every amount reads back as itself.
	for _, n := range []int64{1, 999, PerDollar - 1, PerDollar + 1, math.MaxInt64 - 1} {
		if back, err := Parse(Format(n)); err != nil || back != n {
			t.Errorf("Parse(Format(%d)) = %d, %v", n, back, err)
		}
	}
}
