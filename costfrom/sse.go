package costfrom

import "bytes"

// sse is the state of a server-sent event stream being read: the line
// being read, and the event it is part of. The data of an event's data
// lines, joined by newlines as the event's client joins them, goes to the
// scanner; the other fields are skipped.
type sse struct {
	line  line
	name  int  // bytes of the field name that match "data" so far; -1 once it is another
	lines int  // data lines in the event so far
	cr    bool // a CR ended the last line: a LF next is part of that line's end
	event bool // an event has begun: a line that is not blank was read

	// Under HideStreamUsage, the event being read is held, from its
	// first byte (at hs in p, or the first len(hold) bytes of it in
	// hold if it began in an earlier write) until it is passed on or
	// dropped; the bytes of p from out on are still to be passed on.
	hold     []byte
	holding  bool
	dropping bool // the event is dropped until its end
	dropLF   bool // a CR ended the dropped event: a LF next goes with it
	p        []byte
	hs, out  int
	err      error // of passing bytes on
}

// line is where a line of the stream is being read.
type line uint8

const (
	lineStart line = iota
	lineName       // the field name
	lineSpace      // right after "data:", where one space is skipped
	lineData       // the value of a data field
	lineSkip       // the rest of a line not read
)

// maxHold bounds the bytes of an event held under HideStreamUsage: a
// larger event is passed on unchanged (a usage-only chunk is far smaller).
const maxHold = 16 << 10

// nl joins an event's data lines.
var nl = []byte{'\n'}

// scanSSE reads a piece of an event stream.
func (cw *Writer) scanSSE(p []byte) {
	s := &cw.sse
	for i := 0; i < len(p); {
		c := p[i]
		if s.cr {
			s.cr = false
			if c == '\n' {
				if s.dropLF {
					s.out = i + 1
				}
				s.dropLF = false
				i++
				continue
			}
		}
		s.dropLF = false
		switch s.line {
		case lineStart:
			if c == '\n' || c == '\r' {
				i++
				s.cr = c == '\r'
				if s.event {
					cw.eventEnd(i)
				}
				continue
			}
			if !s.event {
				if n := wholeEvent(p[i:]); n > 0 && quiet(p[i:i+n], cw.hide) {
					// Nothing to read or to take out: the event
					// passes as it is.
					i += n
					continue
				}
				s.event = true
				if cw.hide {
					s.holding, s.hs = true, i
				}
			}
			if c == ':' {
				// A comment.
				s.line = lineSkip
				continue
			}
			s.line, s.name = lineName, 0
		case lineName:
			i++
			switch {
			case c == ':' && s.name == 4:
				cw.dataLine(i)
				s.line = lineSpace
			case c == ':':
				s.line = lineSkip
			case c == '\n' || c == '\r':
				// A field without a colon has an empty value.
				if s.name == 4 {
					cw.dataLine(i)
				}
				s.line, s.cr = lineStart, c == '\r'
			case s.name >= 0 && s.name < 4 && c == "data"[s.name]:
				s.name++
			default:
				s.name = -1
			}
		case lineSpace:
			s.line = lineData
			if c == ' ' {
				i++
			}
		default:
			j := bytes.IndexByte(p[i:], '\n')
			if j < 0 {
				j = len(p) - i
			}
			if k := bytes.IndexByte(p[i:i+j], '\r'); k >= 0 {
				j = k
			}
			if s.line == lineData && j > 0 {
				cw.data(p[i:i+j], i)
			}
			i += j
			if i < len(p) {
				s.line, s.cr = lineStart, p[i] == '\r'
				i++
			}
		}
	}
}

// wholeEvent returns the length of the event p begins with, blank line
// included, if p has all of it and its lines all end with LF, or all
// with CRLF (as Google's streams end them); else 0. It reads a line at a
// time: an event is most often one data line.
func wholeEvent(p []byte) int {
	mode := byte(0) // '\n' or '\r', once a line told which ends them
	for at := 0; ; {
		j := bytes.IndexByte(p[at:], '\n')
		if j < 0 {
			return 0
		}
		line, end := p[at:at+j], byte('\n')
		if len(line) > 0 && line[len(line)-1] == '\r' {
			line, end = line[:len(line)-1], '\r'
		}
		if mode != 0 && end != mode || bytes.IndexByte(line, '\r') >= 0 {
			return 0
		}
		mode, at = end, at+j+1
		if len(line) == 0 {
			return at
		}
	}
}

var (
	usageKey = "usage"
	// An escape, or a long s (ſ), can spell a key that reads as "usage"
	// (see keyByte) without the letters of usageKey.
	escapeU = []byte(`\u`)
	longS   = []byte("ſ")
)

// quiet reports whether the whole event has nothing in it to read: no
// usage key, or only usage keys whose value is null (which, under
// HideStreamUsage, are taken out, so that the event must be read); and
// no usageMetadata key (Gemini's) but in a chunk that may end a
// response. It looks for "usage" with its opening quote, in any case,
// followed by its closing quote, which in JSON can only be a whole
// string, as a quote within a string is escaped: a key if a colon
// follows; or followed by metadata" or _metadata". An event with an
// escape or a long s anywhere is read.
//
// Gemini's usage counts only in the last chunk of a response (see
// Writer.took), whose counts are totals: a chunk without the key of a
// finishReason or a blockReason (see hasEndKey) has nothing to read, and
// is passed on unread, as most of a stream's chunks are.
func quiet(event []byte, hide bool) bool {
	if holds(event, escapeU) || holds(event, longS) {
		return false
	}
	whole, gemini := event, false
	// The first usage key is looked for from its u, the others from its
	// g: after Gemini's usageMetadata, its counts' keys (promptTokenCount
	// and the like) hold many a u, and no g.
	for at := 0; ; at = 3 {
		i := indexFold(event, usageKey, at)
		if i < 0 {
			return !gemini || !hasEndKey(whole)
		}
		quoted := i > 0 && event[i-1] == '"'
		event = event[i+len(usageKey):]
		if quoted && (hasPrefixFold(event, `metadata"`) || hasPrefixFold(event, `_metadata"`)) {
			gemini = true
			continue
		}
		if !quoted || len(event) == 0 || event[0] != '"' {
			continue
		}
		event = trimSpace(event[1:])
		switch {
		case len(event) > 0 && (event[0] == ',' || event[0] == '}' || event[0] == ']'):
			// A string value "usage".
			continue
		case hide || len(event) == 0 || event[0] != ':':
			return false
		}
		event = trimSpace(event[1:])
		if !bytes.HasPrefix(event, []byte("null")) {
			return false
		}
	}
}

// holds reports whether p holds pair, two bytes the first of which is
// rare in JSON: as bytes.Contains does, without its search's setup, which
// costs more than the search itself in an event of a few hundred bytes.
func holds(p, pair []byte) bool {
	for {
		i := bytes.IndexByte(p, pair[0])
		if i < 0 || i+1 == len(p) {
			return false
		}
		if p[i+1] == pair[1] {
			return true
		}
		p = p[i+1:]
	}
}

// hasEndKey reports whether p holds, as keyFolder reads a key with no
// escape and no long s, the key of a candidate's finishReason or of the
// prompt's blockReason, in either spelling (finish_reason, block_reason),
// with its closing quote. It looks for finish and bloc from their first
// letters, rarer in JSON, text included, than those of reason: each letter
// found costs a call to IndexByte. The k of block may be the Kelvin sign,
// which folds to k.
func hasEndKey(p []byte) bool {
	for q := p; ; {
		i := indexFold(q, "finish", 0)
		if i < 0 {
			break
		}
		if q = q[i+len("finish"):]; endsReason(q) {
			return true
		}
	}
	for q := p; ; {
		i := indexFold(q, "bloc", 0)
		if i < 0 {
			return false
		}
		q = q[i+len("bloc"):]
		switch {
		case len(q) > 0 && q[0]|0x20 == 'k':
			q = q[1:]
		case bytes.HasPrefix(q, kelvin):
			q = q[len(kelvin):]
		default:
			continue
		}
		if endsReason(q) {
			return true
		}
	}
}

// kelvin is the Kelvin sign, which folds to k.
var kelvin = []byte("\u212a")

// endsReason reports whether p begins with reason" or _reason", in any
// case.
func endsReason(p []byte) bool {
	return hasPrefixFold(p, `reason"`) || hasPrefixFold(p, `_reason"`)
}

// hasPrefixFold reports whether p begins with prefix, which is in lower
// case, in any ASCII case.
func hasPrefixFold(p []byte, prefix string) bool {
	if len(p) < len(prefix) {
		return false
	}
	for i := range len(prefix) {
		c := p[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != prefix[i] {
			return false
		}
	}
	return true
}

// indexFold returns where the first word of p, in any ASCII case,
// begins, or -1; word is in lower case, and its byte at is a letter, the
// one looked for (the rarest in the text searched): each one found costs a
// call to IndexByte. It looks for that letter in either case, of which
// JSON has fewer than quotes.
func indexFold(p []byte, word string, at int) int {
	c := word[at]
	lower, upper := indexFrom(p, at, c), indexFrom(p, at, c-'a'+'A')
	for lower >= 0 || upper >= 0 {
		i := lower
		if i < 0 || upper >= 0 && upper < i {
			i = upper
		}
		if hasPrefixFold(p[i-at:], word) {
			return i - at
		}
		if i == lower {
			lower = indexFrom(p, i+1, c)
		} else {
			upper = indexFrom(p, i+1, c-'a'+'A')
		}
	}
	return -1
}

// indexFrom returns the index of the first c in p at or after i, or -1.
func indexFrom(p []byte, i int, c byte) int {
	if i > len(p) {
		return -1
	}
	if j := bytes.IndexByte(p[i:], c); j >= 0 {
		return i + j
	}
	return -1
}

// trimSpace trims the spaces and tabs p begins with.
func trimSpace(p []byte) []byte {
	for len(p) > 0 && (p[0] == ' ' || p[0] == '\t') {
		p = p[1:]
	}
	return p
}

// dataLine begins a data line of the event at i: the lines after the
// first are joined to it by a newline.
func (cw *Writer) dataLine(i int) {
	s := &cw.sse
	if s.lines > 0 {
		cw.data(nl, i)
	}
	s.lines++
}

// data reads run, a piece of an event's data that begins at i in p.
func (cw *Writer) data(run []byte, i int) {
	s := &cw.sse
	for len(run) > 0 {
		n, done := cw.sc.feed(run, len(s.hold)+i-s.hs)
		if done {
			cw.took()
			if s.holding {
				cw.decide()
			}
		}
		run, i = run[n:], i+n
	}
	if r := &cw.sc.rec; s.holding && (r.top != kindNone && r.top != kindObject || cw.sc.state == stError) {
		// Not a chunk of JSON: nothing to take out.
		cw.pass()
	}
}

// decide passes on or drops the held event, whose JSON just ended: a
// chunk with no choices but a usage is dropped; a "usage": null member is
// taken out of the others.
func (cw *Writer) decide() {
	r := &cw.sc.rec
	switch {
	case r.choices == kindArray && !r.choicesFilled && r.usage == kindObject:
		cw.drop()
	case r.cutA < r.cutB:
		cw.release(r.cutA, r.cutB)
	default:
		cw.pass()
	}
}

// eventEnd ends the event at i, after the blank line that ends it.
func (cw *Writer) eventEnd(i int) {
	s := &cw.sse
	s.event, s.lines = false, 0
	cw.sc.reset()
	if s.holding {
		cw.pass()
	}
	if s.dropping {
		s.out, s.dropping, s.dropLF = i, false, s.cr
	}
}

// filter is Write under HideStreamUsage.
func (cw *Writer) filter(p []byte) (int, error) {
	s := &cw.sse
	s.p, s.hs, s.out, s.err = p, 0, 0, nil
	cw.scanSSE(p)
	switch {
	case s.holding:
		if len(s.hold) == 0 {
			cw.emit(p[s.out:s.hs])
		}
		if len(s.hold)+len(p)-s.hs > maxHold {
			// Too large to be a usage chunk: passed on as it comes.
			cw.emit(s.hold)
			cw.emit(p[s.hs:])
			s.hold, s.holding = s.hold[:0], false
		} else {
			if s.hold == nil {
				s.hold = make([]byte, 0, 512)
			}
			s.hold = append(s.hold, p[s.hs:]...)
		}
	case !s.dropping:
		cw.emit(p[s.out:])
	}
	s.p = nil
	if s.err != nil {
		return 0, s.err
	}
	return len(p), nil
}

// emit passes b on, unless passing bytes on failed already.
func (cw *Writer) emit(b []byte) {
	if len(b) > 0 && cw.sse.err == nil {
		_, cw.sse.err = cw.rw.Write(b)
	}
}

// pass passes the held event on as it is.
func (cw *Writer) pass() {
	k := len(cw.sse.hold)
	cw.release(k, k)
}

// release passes the held event on less its bytes [a, b), which may lie in
// hold, in p, or across both; a == b takes nothing out.
func (cw *Writer) release(a, b int) {
	s := &cw.sse
	s.holding = false
	k := len(s.hold)
	if k == 0 {
		// The event is in p: the bytes before a go with those still to
		// pass on before it.
		if a < b {
			cw.emit(s.p[s.out : s.hs+a])
			s.out = s.hs + b
		}
		return
	}
	cw.emit(s.hold[:min(a, k)])
	if a > k {
		cw.emit(s.p[:a-k])
	}
	if b < k {
		cw.emit(s.hold[b:])
	}
	s.out = max(b-k, 0)
	s.hold = s.hold[:0]
}

// drop drops the held event, to its end.
func (cw *Writer) drop() {
	s := &cw.sse
	if len(s.hold) == 0 {
		cw.emit(s.p[s.out:s.hs])
	}
	s.hold = s.hold[:0]
	s.holding, s.dropping = false, true
}
