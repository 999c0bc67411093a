package costfrom

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Fields is a set of fields of a JSON request body, each named by the
// keys that lead to it from the top-level object, joined by dots
// ("options.num_predict"). Read reads a body once for all of them, as the
// most lenient server reads it, so that a decision made on a field is
// made on what the server acts on:
//
//   - Keys are compared with their escapes decoded and without regard to
//     case (see keyByte), at every level of a field's path.
//   - A field given twice under such spellings, or an object on a field's
//     path given twice ("options" twice, for options.num_predict), is
//     refused with a *DuplicateError: servers disagree on which of the
//     two counts (Go's encoding/json takes the last; a struct field
//     matched without regard to case takes any spelling).
//   - The first JSON value of the body is read, and what follows it is
//     not: Go's json.Decoder, with which Ollama's router reads a body,
//     acts on the first value and ignores the rest.
//   - A body whose first value is not an object has none of the fields.
//
// What is not on a field's path is skipped without being checked, so a
// body that is not JSON past the fields may still be read: no server
// acts on it, and what is read of it only changes the client's own
// reservation.
type Fields struct {
	// nodes are the keys of the fields' paths, as a tree: nodes[0] is the
	// top-level object.
	nodes []fieldNode
}

// fieldNode is a key on the path of one or more fields.
type fieldNode struct {
	name  string // the key, as a field names it
	key   string // folded
	path  string // the keys that lead to it, as a field is named
	field int    // the index of the field this key ends, or -1
	kids  []int  // the keys of the object it holds that are on a path
}

// maxKids bounds the keys on a path that one object may hold: Read
// keeps which it has seen in the bits of a uint64.
const maxKids = 64

// NewFields compiles the fields named by paths, whose indexes are those
// of the values Read reads.
func NewFields(paths ...string) (*Fields, error) {
	f := &Fields{nodes: []fieldNode{{field: -1}}}
	for i, p := range paths {
		n, end := 0, 0
		for key := range strings.SplitSeq(p, ".") {
			if end > 0 {
				end++
			}
			end += len(key)
			var k keyFolder
			k.write([]byte(key))
			folded := k.key()
			if len(folded) == 0 || strings.IndexFunc(key, func(r rune) bool { return r >= utf8.RuneSelf || r == '\\' || r == '"' }) >= 0 {
				return nil, fmt.Errorf("field %q: want keys of 1 to %d ASCII characters, without quotes or backslashes, joined by dots, got %q", p, maxKey, key)
			}
			if n = f.child(n, key, string(folded), p[:end]); n < 0 {
				return nil, fmt.Errorf("field %q: more than %d keys in one object", p, maxKids)
			}
		}
		if f.nodes[n].field >= 0 {
			return nil, fmt.Errorf("field %q: given twice", p)
		}
		f.nodes[n].field = i
	}
	return f, nil
}

// child returns the node of the key name (folded: key) in the object of
// node n, added if it is new, or -1 if the object has maxKids keys
// already.
func (f *Fields) child(n int, name, key, path string) int {
	for _, c := range f.nodes[n].kids {
		if f.nodes[c].key == key {
			return c
		}
	}
	if len(f.nodes[n].kids) == maxKids {
		return -1
	}
	f.nodes = append(f.nodes, fieldNode{name: name, key: key, path: path, field: -1})
	c := len(f.nodes) - 1
	f.nodes[n].kids = append(f.nodes[n].kids, c)
	return c
}

// DuplicateError tells that a request body gives a field more than once.
type DuplicateError struct {
	// Field is the field, or the object on its path, given more than
	// once, named as the Fields name it.
	Field string
}

func (e *DuplicateError) Error() string {
	return fmt.Sprintf("the request body gives %s more than once (keys are compared with their escapes decoded and without regard to case)", e.Field)
}

// Value is what a body holds at a field: a JSON value, as its text. The
// zero Value is a field the body does not give.
type Value struct {
	raw []byte
	// at is where raw begins in the body, key where the key of its
	// member does.
	at, key int
	// exact tells that every key on the field's path is spelled as the
	// Fields name it, so that a server that compares keys as they are
	// reads it too.
	exact bool
}

// Text returns the value of a JSON string, and false for any other value.
func (v Value) Text() (string, bool) {
	if len(v.raw) == 0 || v.raw[0] != '"' {
		return "", false
	}
	var s string
	if json.Unmarshal(v.raw, &s) != nil {
		return "", false
	}
	return s, true
}

// Number returns the value as a number, read as the most lenient server
// reads one: a JSON number (Python's json also takes NaN, Infinity and
// -Infinity); a string that holds a number, around spaces and with
// underscores between its digits, as pydantic's lax mode takes "9000",
// "9_000" and "9000.0" (and more: "9e3", "inf"); true as 1 and false as
// 0, as pydantic and nlohmann's json take them. It returns false for
// anything else: null, an object, an array, a string of no number.
func (v Value) Number() (float64, bool) {
	if len(v.raw) == 0 {
		return 0, false
	}
	s := string(v.raw)
	switch v.raw[0] {
	case '{', '[', 'n':
		return 0, false
	case 't':
		return 1, s == "true"
	case 'f':
		return 0, s == "false"
	case '"':
		t, ok := v.Text()
		if !ok {
			return 0, false
		}
		s = strings.ReplaceAll(strings.TrimSpace(t), "_", "")
	}
	x, err := strconv.ParseFloat(s, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return 0, false
	}
	return x, true
}

// plainNumber reports whether the value is a JSON number under keys
// spelled as the Fields name them: the form in which every server that
// reads the field reads it. A server may read any other form as if the
// field were absent (llama.cpp's server takes its default for a bound it
// cannot read as a number).
func (v Value) plainNumber() bool {
	return v.exact && len(v.raw) > 0 && (v.raw[0] == '-' || '0' <= v.raw[0] && v.raw[0] <= '9')
}

// True reports whether the value is true as the most lenient server reads
// a boolean: true; a number equal to 1; a string that is, around spaces
// and in any case, one of pydantic's words for true (1, t, true, y, yes,
// on).
func (v Value) True() bool {
	if len(v.raw) == 0 {
		return false
	}
	switch v.raw[0] {
	case 't', 'f', '{', '[', 'n':
		return string(v.raw) == "true"
	case '"':
		t, _ := v.Text()
		switch strings.ToLower(strings.TrimSpace(t)) {
		case "1", "t", "true", "y", "yes", "on":
			return true
		}
		return false
	}
	x, ok := v.Number()
	return ok && x == 1
}

// Read reads body for the fields f names, into values (one per field, in
// their order), and returns a *DuplicateError if it gives one twice. A
// body whose first JSON value is not an object gives none.
func (f *Fields) Read(body []byte, values []Value) error {
	clear(values)
	r := fieldReader{b: body, f: f, values: values}
	r.space()
	if r.peek() != '{' {
		return nil
	}
	if !r.object(0, true) {
		clear(values)
		return nil
	}
	if r.dup != nil {
		clear(values)
		return r.dup
	}
	return nil
}

// fieldReader reads a body for Fields.Read: a recursive descent that
// follows the objects on the fields' paths and skips every other value.
type fieldReader struct {
	b      []byte
	i      int
	f      *Fields
	values []Value
	key    keyFolder
	dup    *DuplicateError // the first field found twice
}

func (r *fieldReader) peek() byte {
	if r.i < len(r.b) {
		return r.b[r.i]
	}
	return 0
}

func (r *fieldReader) space() {
	for r.i < len(r.b) {
		switch r.b[r.i] {
		case ' ', '\t', '\n', '\r':
			r.i++
		default:
			return
		}
	}
}

// object reads the object at r.i, which holds the keys of node n;
// exact tells that the keys that led to it are spelled as the Fields
// name them. It returns false if the body ends, or stops being JSON,
// before the object does.
func (r *fieldReader) object(n int, exact bool) bool {
	node := &r.f.nodes[n]
	var seen uint64
	r.i++ // {
	r.space()
	if r.peek() == '}' {
		r.i++
		return true
	}
	for {
		r.space()
		keyAt := r.i
		end, ok := r.stringEnd()
		if !ok {
			return false
		}
		kid, kidExact := -1, false
		if len(node.kids) > 0 {
			kid, kidExact = r.match(node, r.b[keyAt+1:end-1])
		}
		r.i = end
		r.space()
		if r.peek() != ':' {
			return false
		}
		r.i++
		r.space()
		at := r.i
		if kid < 0 {
			if !r.skip() {
				return false
			}
		} else {
			c := node.kids[kid]
			if seen&(1<<kid) != 0 && r.dup == nil {
				r.dup = &DuplicateError{Field: r.f.nodes[c].path}
			}
			seen |= 1 << kid
			k := &r.f.nodes[c]
			if len(k.kids) > 0 && r.peek() == '{' {
				if !r.object(c, exact && kidExact) {
					return false
				}
			} else if !r.skip() {
				return false
			}
			if k.field >= 0 {
				r.values[k.field] = Value{raw: r.b[at:r.i], at: at, key: keyAt, exact: exact && kidExact}
			}
		}
		r.space()
		switch r.peek() {
		case ',':
			r.i++
		case '}':
			r.i++
			return true
		default:
			return false
		}
	}
}

// match returns the index, among node's kids, of the key whose text
// (without quotes) is raw, or -1; and whether raw spells it as the
// Fields name it.
func (r *fieldReader) match(node *fieldNode, raw []byte) (int, bool) {
	r.key.reset()
	r.key.write(raw)
	folded := r.key.key()
	if folded == nil {
		return -1, false
	}
	for i, c := range node.kids {
		k := &r.f.nodes[c]
		if string(folded) == k.key {
			return i, string(raw) == k.name
		}
	}
	return -1, false
}

// stringEnd returns where the string at r.i ends, past its closing
// quote.
func (r *fieldReader) stringEnd() (int, bool) {
	if r.peek() != '"' {
		return 0, false
	}
	for i := r.i + 1; ; {
		j := bytes.IndexByte(r.b[i:], '"')
		if j < 0 {
			return 0, false
		}
		j += i
		// The quote ends the string unless an odd number of
		// backslashes escapes it.
		k := j
		for k > r.i+1 && r.b[k-1] == '\\' {
			k--
		}
		if (j-k)%2 == 0 {
			return j + 1, true
		}
		i = j + 1
	}
}

// skip skips the value at r.i: a string, an object or an array whose
// brackets it counts, or any other token up to the byte that ends it.
func (r *fieldReader) skip() bool {
	depth := 0
	for r.i < len(r.b) {
		switch c := r.b[r.i]; c {
		case '"':
			end, ok := r.stringEnd()
			if !ok {
				return false
			}
			r.i = end
			if depth == 0 {
				return true
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return false
			}
			if depth--; depth == 0 {
				r.i++
				return true
			}
		case ',', ':', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return false
			}
		default:
			if depth == 0 {
				// A number or a literal, which ends where a value
				// does.
				start := r.i
				for r.i < len(r.b) && strings.IndexByte(",}] \t\n\r", r.b[r.i]) < 0 {
					r.i++
				}
				return r.i > start
			}
		}
		r.i++
	}
	return false
}
