package costfrom

import (
	"unicode"
	"unicode/utf8"
)

// A key of a JSON object, in a request's body as in a response's, is
// compared the way the most lenient server compares it: with its escapes
// decoded ("max_tok\u0065ns" is max_tokens, as every JSON parser reads
// it), and without regard to case, as Go's encoding/json matches a key to
// a struct field (bytes.EqualFold): by Unicode's simple case folding,
// under which the long s (ſ, U+017F) is an s and the Kelvin sign (K,
// U+212A) a k. Every key read here is ASCII, so a key is compared as the
// ASCII lower case of its runes' folds, and a key with a rune that folds
// to no ASCII character is none of them.

// maxKey is the longest key, in bytes, that is compared: the longest of
// those read, and of the keys a Fields names.
const maxKey = 64

// keyByte returns the byte the rune r of a key is compared as, and false
// if r folds to no ASCII character.
func keyByte(r rune) (byte, bool) {
	if r < utf8.RuneSelf {
		if 'A' <= r && r <= 'Z' {
			r += 'a' - 'A'
		}
		return byte(r), true
	}
	for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
		if f < utf8.RuneSelf {
			return keyByte(f)
		}
	}
	return 0, false
}

// keyFolder reads a key, the text of a JSON string without its quotes,
// as it comes in pieces of any size (an escape or a rune may be split
// between two), into the form it is compared in.
type keyFolder struct {
	buf [maxKey]byte
	n   int // bytes in buf; -1 once the key can be none compared
	// esc is 1 after a backslash, 2 to 5 while the hex digits of a \u
	// escape are read (esc-2 of them so far, their value in r).
	esc uint8
	r   rune
	// A rune's UTF-8 bytes read so far.
	raw  [utf8.UTFMax]byte
	nraw int
}

// reset begins a new key.
func (k *keyFolder) reset() {
	k.n, k.esc, k.r, k.nraw = 0, 0, 0, 0
}

// key returns the key read, folded, or nil if it is none that can be
// compared (too long, or with a rune that folds to no ASCII character).
func (k *keyFolder) key() []byte {
	if k.n < 0 || k.esc != 0 || k.nraw != 0 {
		return nil
	}
	return k.buf[:k.n]
}

// write reads the next piece of the key.
func (k *keyFolder) write(p []byte) {
	if k.esc == 0 && k.nraw == 0 && k.n >= 0 {
		// Plain ASCII, of which keys are made but for a rare escape or
		// rune, is folded here, in a loop of its own, rather than through
		// add and keyByte.
		n, buf := k.n, k.buf[:]
		i := 0
		for ; i < len(p); i++ {
			c := p[i]
			if c >= utf8.RuneSelf || c == '\\' {
				break
			}
			if n == len(buf) {
				k.n = -1
				return
			}
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			buf[n] = c
			n++
		}
		k.n, p = n, p[i:]
	}
	for _, c := range p {
		if k.n < 0 {
			return
		}
		switch {
		case k.esc == 1:
			k.esc = 0
			switch c {
			case 'u':
				k.esc, k.r = 2, 0
			case 'b':
				k.add('\b')
			case 'f':
				k.add('\f')
			case 'n':
				k.add('\n')
			case 'r':
				k.add('\r')
			case 't':
				k.add('\t')
			default: // '"', '\\', '/'
				k.add(rune(c))
			}
		case k.esc > 1:
			d, ok := unhex(c)
			if !ok {
				k.n = -1
				return
			}
			k.r = k.r<<4 | d
			if k.esc++; k.esc == 6 {
				// A surrogate, half of a rune beyond the BMP, folds to
				// no ASCII character whatever its other half.
				k.esc = 0
				k.add(k.r)
			}
		case k.nraw > 0 || c >= utf8.RuneSelf:
			k.raw[k.nraw] = c
			k.nraw++
			if utf8.FullRune(k.raw[:k.nraw]) {
				r, _ := utf8.DecodeRune(k.raw[:k.nraw])
				k.nraw = 0
				k.add(r)
			}
		case c == '\\':
			k.esc = 1
		default:
			k.add(rune(c))
		}
	}
}

// add appends the folded rune r, or marks the key as none compared.
func (k *keyFolder) add(r rune) {
	b, ok := keyByte(r)
	if !ok || k.n == len(k.buf) {
		k.n = -1
		return
	}
	k.buf[k.n] = b
	k.n++
}

// unhex returns the value of the hex digit c.
func unhex(c byte) (rune, bool) {
	switch {
	case '0' <= c && c <= '9':
		return rune(c - '0'), true
	case 'a' <= c && c <= 'f':
		return rune(c - 'a' + 10), true
	case 'A' <= c && c <= 'F':
		return rune(c - 'A' + 10), true
	}
	return 0, false
}
