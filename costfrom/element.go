package costfrom

import "bytes"

// maxElementDepth bounds the nesting objectEnd follows: a deeper element
// is read by the scanner.
const maxElementDepth = 64

// objectEnd returns the length of the JSON object p begins with, if p
// holds all of it and it is valid JSON, or 0. The scanner reads valid
// JSON without error and ends the object where objectEnd does, so an
// element of a streamed array it passes over is one the scanner would
// have read to its end (see Writer.skipElement). Strings are checked only
// for where they end, as the scanner checks them.
func objectEnd(p []byte) int {
	const (
		value      = iota // a value is expected
		firstKey          // after '{': a key or '}'
		firstValue        // after '[': a value or ']'
		key               // after ',' in an object
		colon             // after a key
		after             // after a value: ',' or the end of its container
	)
	var open [maxElementDepth]byte
	depth, state := 0, value
	if len(p) == 0 || p[0] != '{' {
		return 0
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		if c == ' ' || c == '\t' || c == '\n' || c == '\r' {
			continue
		}
		switch state {
		case firstKey, key:
			switch {
			case c == '}' && state == firstKey:
				if depth--; depth == 0 {
					return i + 1
				}
				state = after
			case c == '"':
				n := stringLen(p[i+1:])
				if n < 0 {
					return 0
				}
				i += n
				state = colon
			default:
				return 0
			}
		case colon:
			if c != ':' {
				return 0
			}
			state = value
		case firstValue, value:
			if c == ']' && state == firstValue {
				if depth--; depth == 0 {
					return i + 1
				}
				state = after
				continue
			}
			switch {
			case c == '{' || c == '[':
				if depth == maxElementDepth {
					return 0
				}
				open[depth], depth = c, depth+1
				state = firstKey
				if c == '[' {
					state = firstValue
				}
				continue
			case c == '"':
				n := stringLen(p[i+1:])
				if n < 0 {
					return 0
				}
				i += n
			case c == 't' || c == 'f' || c == 'n':
				n := literalLen(p[i:])
				if n == 0 {
					return 0
				}
				i += n - 1
			default:
				n := numberLen(p[i:])
				if n == 0 {
					return 0
				}
				i += n - 1
			}
			state = after
		case after:
			switch {
			case c == ',' && open[depth-1] == '{':
				state = key
			case c == ',':
				state = value
			case c == '}' && open[depth-1] == '{' || c == ']' && open[depth-1] == '[':
				if depth--; depth == 0 {
					return i + 1
				}
			default:
				return 0
			}
		}
	}
	return 0
}

// stringLen returns how many bytes of p, which begins inside a string,
// reach past its closing quote, or -1 if the string goes on after p. A
// quote is escaped by the backslashes before it if they are odd in
// number, as the scanner reads them (each escapes the byte after it).
func stringLen(p []byte) int {
	for from := 0; ; {
		j := bytes.IndexByte(p[from:], '"')
		if j < 0 {
			return -1
		}
		j += from
		b := j
		for b > 0 && p[b-1] == '\\' {
			b--
		}
		if (j-b)%2 == 0 {
			return j + 1
		}
		from = j + 1
	}
}

// literalLen returns the length of the true, false or null p begins
// with, or 0.
func literalLen(p []byte) int {
	for _, lit := range [...]string{"true", "false", "null"} {
		if bytes.HasPrefix(p, []byte(lit)) {
			return len(lit)
		}
	}
	return 0
}

// numberLen returns the length of the JSON number p begins with, or 0.
func numberLen(p []byte) int {
	i := 0
	digits := func() int {
		n := 0
		for i < len(p) && p[i] >= '0' && p[i] <= '9' {
			i, n = i+1, n+1
		}
		return n
	}
	if i < len(p) && p[i] == '-' {
		i++
	}
	switch {
	case i < len(p) && p[i] == '0':
		i++
	case digits() == 0:
		return 0
	}
	if i < len(p) && p[i] == '.' {
		i++
		if digits() == 0 {
			return 0
		}
	}
	if i < len(p) && (p[i] == 'e' || p[i] == 'E') {
		i++
		if i < len(p) && (p[i] == '+' || p[i] == '-') {
			i++
		}
		if digits() == 0 {
			return 0
		}
	}
	return i
}
