package costfrom

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// Text returns a JSON request body as the UTF-8 text Fields.Read reads,
// decoded as Request.Read decodes it (see utf8Body): a field of it then
// reads the same whether a zone reserves by it or keys on it.
func Text(body []byte) []byte {
	return utf8Body(body)
}

// maxExponent bounds the exponent of a number Scalar writes out: past
// it, no server reads the number as anything but infinity or zero, and
// the form Scalar writes would be as long as the exponent is large.
const maxExponent = 999_999_999

// Scalar returns the value as text, the way a key or a limit reads it,
// and false for a value that has none: an object, an array, null, or
// text that is not JSON.
//
//   - A string is its text, with its escapes decoded: "\u0031000" is
//     1000.
//   - A number is its exact value in the shortest decimal form, laid out
//     as JavaScript writes a number (1000, 0.5, 1.5e+300): 1000, 1e3,
//     1000.0 and 10e2 are all 1000, and so is the string "1000", while the
//     string "1e3" stays 1e3. The digits are kept as written, never
//     rounded to a float64, so two large integers (snowflake IDs) that
//     differ in their last digit stay apart.
//   - true and false are themselves.
func (v Value) Scalar() (string, bool) {
	if len(v.raw) == 0 {
		return "", false
	}
	switch c := v.raw[0]; {
	case c == '"':
		if len(v.raw) >= 2 && plainText(v.raw[1:len(v.raw)-1]) {
			return string(v.raw[1 : len(v.raw)-1]), true
		}
		return v.Text()
	case c == 't' || c == 'f':
		if s := string(v.raw); s == "true" || s == "false" {
			return s, true
		}
	case c == '-' || '0' <= c && c <= '9':
		return decimal(v.raw)
	}
	return "", false
}

// plainText reports whether b, the inside of a JSON string, is its own
// text: valid UTF-8 with no escape or control character, which is most
// often so (a model's name), and is read without decoding it.
func plainText(b []byte) bool {
	for _, c := range b {
		if c == '\\' || c < ' ' || c == '"' {
			return false
		}
	}
	return utf8.Valid(b)
}

// decimal returns the JSON number b in the shortest decimal form (see
// Scalar), and false if b is not a JSON number or its exponent is beyond
// maxExponent.
func decimal(b []byte) (string, bool) {
	s := string(b)
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	whole, s := leadingDigits(s)
	if whole == "" || len(whole) > 1 && whole[0] == '0' {
		return "", false
	}
	var frac string
	if rest, ok := strings.CutPrefix(s, "."); ok {
		if frac, s = leadingDigits(rest); frac == "" {
			return "", false
		}
	}
	exp := 0
	if len(s) > 0 && (s[0] == 'e' || s[0] == 'E') {
		s = s[1:]
		sign := 1
		if len(s) > 0 && (s[0] == '+' || s[0] == '-') {
			if s[0] == '-' {
				sign = -1
			}
			s = s[1:]
		}
		var digits string
		if digits, s = leadingDigits(s); digits == "" {
			return "", false
		}
		digits = strings.TrimLeft(digits, "0")
		n, err := strconv.Atoi(digits)
		if digits != "" && (err != nil || n > maxExponent) {
			return "", false
		}
		exp = sign * n
	}
	if s != "" {
		return "", false
	}
	// The value is 0.digits × 10^point.
	digits := whole + frac
	point := len(whole) + exp
	trimmed := strings.TrimLeft(digits, "0")
	point -= len(digits) - len(trimmed)
	digits = strings.TrimRight(trimmed, "0")
	if digits == "" {
		return "0", true
	}
	var out strings.Builder
	if neg {
		out.WriteByte('-')
	}
	k, n := len(digits), point
	switch {
	case k <= n && n <= 21:
		out.WriteString(digits)
		out.WriteString(strings.Repeat("0", n-k))
	case 0 < n && n <= 21:
		out.WriteString(digits[:n])
		out.WriteByte('.')
		out.WriteString(digits[n:])
	case -6 < n && n <= 0:
		out.WriteString("0.")
		out.WriteString(strings.Repeat("0", -n))
		out.WriteString(digits)
	default:
		out.WriteByte(digits[0])
		if k > 1 {
			out.WriteByte('.')
			out.WriteString(digits[1:])
		}
		out.WriteByte('e')
		if n-1 > 0 {
			out.WriteByte('+')
		}
		out.WriteString(strconv.Itoa(n - 1))
	}
	return out.String(), true
}

// leadingDigits splits s after its leading ASCII digits.
func leadingDigits(s string) (digits, rest string) {
	i := 0
	for i < len(s) && '0' <= s[i] && s[i] <= '9' {
		i++
	}
	return s[:i], s[i:]
}
