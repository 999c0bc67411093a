package costfrom

import (
	"io"
	"net/http"
	"strings"
)

// Count is which of a response's token counts is its cost.
type Count uint8

const (
	// Input is the tokens the model read: the prompt.
	Input Count = iota + 1
	// Output is the tokens the model generated.
	Output
	// Total is both: the total the response reports, or else input plus
	// output.
	Total
)

// Source is where a response's cost is read.
type Source struct {
	// Header, when set, names the response header, or trailer, whose
	// value is the cost: a non-negative decimal integer.
	Header string
	// Count, when Header is not set, is the token count of the usage that
	// the response's body reports.
	Count Count
}

// Writer passes a response on to the ResponseWriter it wraps, byte for byte
// and write for write, and reads its cost on the way: the usage in its body,
// or a header or trailer. It holds none of the body and adds nothing before
// passing a write on, except for HideStreamUsage. It is not safe for
// concurrent use, as a ResponseWriter is not.
type Writer struct {
	rw   http.ResponseWriter
	src  Source
	hide bool

	started bool
	body    body
	// header is the value of src.Header when the response's header was
	// written, and trailer whether src.Header was declared as a trailer.
	header  []string
	trailer bool

	sc       scanner
	usage    counts // the usage read so far
	complete bool   // usage holds a whole usage
	// model is the name of the model the response names, the last one
	// read, modelN bytes long (0: none).
	model  [maxModel]byte
	modelN int

	sse sse
	// array is what a JSON body is: see seq.
	array seq
}

// seq tells whether a JSON body is a streamed array: Gemini's
// streamGenerateContent, asked for without alt=sse, answers with a JSON
// array of its chunks, each read as a value of its own.
type seq uint8

const (
	seqUnknown seq = iota // nothing read yet
	seqNone               // the body's first value is not an array
	seqIn                 // in the array
	seqEnded              // past its end, where nothing more is read
)

// body is how the Writer reads the response's body.
type body uint8

const (
	bodyNone body = iota // not read
	bodyJSON             // JSON values, one or newline-delimited
	bodySSE              // server-sent events
)

// Wrap returns a Writer that passes the response to w and reads its cost
// from src.
func Wrap(w http.ResponseWriter, src Source) *Writer {
	cw := new(Writer)
	cw.Reset(w, src)
	return cw
}

// Reset makes cw a Writer for a new response to w, as Wrap does, keeping
// the memory it had (a Writer can be kept in a pool).
func (cw *Writer) Reset(w http.ResponseWriter, src Source) {
	src.Header = http.CanonicalHeaderKey(src.Header)
	hold := cw.sse.hold[:0]
	*cw = Writer{rw: w, src: src}
	cw.sse.hold = hold
}

// HideStreamUsage hides, from the client, the usage that
// RequestStreamUsage asked for in the request: the chunk of an event
// stream that only carries usage (its choices empty) and the
// "usage": null member of the other chunks. It is called before the
// response is written. The usage is still read.
//
// To take a chunk out, the Writer holds each event from its first byte
// until the end of its JSON, which comes in the same write but for events
// split across writes; an event stream's client acts on an event only at
// its end. An event larger than maxHold is passed on as it comes, as it is.
func (cw *Writer) HideStreamUsage() {
	cw.hide = true
}

// Header returns the header of the wrapped ResponseWriter.
func (cw *Writer) Header() http.Header {
	return cw.rw.Header()
}

// WriteHeader writes the status, and reads from the header how to read the
// body (its Content-Type) or, for a cost from a header, that header.
func (cw *Writer) WriteHeader(code int) {
	if !cw.started && (code >= 200 || code == http.StatusSwitchingProtocols) {
		cw.start()
	}
	cw.rw.WriteHeader(code)
}

// start is the response's header being written: what the Writer does with
// the body depends on it.
func (cw *Writer) start() {
	cw.started = true
	h := cw.rw.Header()
	if cw.src.Header != "" {
		cw.header = h[cw.src.Header]
		cw.trailer = declared(h["Trailer"], cw.src.Header)
		if !cw.hide {
			return
		}
	}
	if ce := h["Content-Encoding"]; len(ce) > 0 && !strings.EqualFold(ce[0], "identity") {
		// Compressed: no usage can be read.
		return
	}
	var ct string
	if v := h["Content-Type"]; len(v) > 0 {
		ct = v[0]
	}
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	ct = strings.TrimSpace(ct)
	switch {
	case strings.EqualFold(ct, "text/event-stream"):
		cw.body = bodySSE
	case cw.src.Header != "":
		// Only a stream has usage to hide.
	case strings.EqualFold(ct, "application/json"),
		strings.EqualFold(ct, "application/x-ndjson"),
		len(ct) > 5 && strings.EqualFold(ct[len(ct)-5:], "+json"):
		cw.body = bodyJSON
	}
}

// declared reports whether the Trailer header values list the canonical
// header name.
func declared(values []string, name string) bool {
	for _, v := range values {
		for v != "" {
			field := v
			if i := strings.IndexByte(v, ','); i >= 0 {
				field, v = v[:i], v[i+1:]
			} else {
				v = ""
			}
			if strings.EqualFold(strings.TrimSpace(field), name) {
				return true
			}
		}
	}
	return false
}

// Write passes p on and then reads it (under HideStreamUsage, an event
// stream is read first, to know what to pass on).
func (cw *Writer) Write(p []byte) (int, error) {
	if !cw.started {
		cw.start()
	}
	switch cw.body {
	case bodyJSON:
		n, err := cw.rw.Write(p)
		cw.scanJSON(p)
		return n, err
	case bodySSE:
		if cw.hide {
			return cw.filter(p)
		}
		n, err := cw.rw.Write(p)
		cw.scanSSE(p)
		return n, err
	}
	return cw.rw.Write(p)
}

// scanJSON reads a piece of a body of JSON values, or of a streamed
// array of them (see seq).
func (cw *Writer) scanJSON(p []byte) {
	for len(p) > 0 {
		if cw.array != seqNone && cw.sc.between() {
			if p = cw.arrayFraming(p); len(p) == 0 || cw.array == seqEnded {
				return
			}
			if n := cw.skipElement(p); n > 0 {
				p = p[n:]
				continue
			}
		}
		n, done := cw.sc.feed(p, 0)
		if done {
			cw.took()
		}
		p = p[n:]
	}
}

// skipElement returns the length of the element of a streamed array p
// begins with, if it can be passed over unread, or 0. Until a chunk
// ends the response, the usage of the chunks before it does not count
// (see took), so a chunk that cannot end it has nothing to read: one
// that p holds whole, that is valid JSON (which the scanner reads to the
// same end, without error) and without the key of a finishReason or a
// blockReason, an escape or a long s (see quiet). The model is read, as
// for an event stream, from the chunks read.
func (cw *Writer) skipElement(p []byte) int {
	if cw.array != seqIn || cw.complete {
		return 0
	}
	n := objectEnd(p)
	if n == 0 {
		return 0
	}
	if e := p[:n]; holds(e, escapeU) || holds(e, longS) || hasEndKey(e) {
		return 0
	}
	return n
}

// arrayFraming reads, between two values of a JSON body, the bytes that
// make it a streamed array: the bracket that opens it (the body's first
// byte but for spaces), the commas between its elements, the bracket that
// ends it. It returns the rest of p, which begins with a value.
func (cw *Writer) arrayFraming(p []byte) []byte {
	for len(p) > 0 {
		switch c := p[0]; {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
		case cw.array == seqUnknown && c == '[':
			cw.array = seqIn
		case cw.array == seqUnknown:
			cw.array = seqNone
			return p
		case c == ',':
		case c == ']':
			cw.array = seqEnded
			return nil
		default:
			return p
		}
		p = p[1:]
	}
	return p
}

// took reads the record of the top-level value the scanner just read.
//
// A response's usage is complete when a whole usage was read: the usage
// object of OpenAI's formats and of Anthropic's message or message_delta
// (whose counts are totals so far, so the last one counts), the response's
// usage in a Responses API event, or the counts of Ollama's last object
// ("done": true), which leaves out a count of 0 (Ollama does not send
// events). Anthropic's message_start
// gives the input counts only, so it completes nothing by itself. Of
// counts one value gives in several places, the largest counts.
//
// Gemini's usageMetadata, which leaves out a count of 0 too, is whole in
// the last value of a response: one whose candidate has a finishReason
// or whose prompt has a blockReason (the last chunk of a stream, whose
// counts are totals), or a JSON body that is one value. A streamed array
// is only Gemini's, and only its usageMetadata is read.
func (cw *Writer) took() {
	r := &cw.sc.rec
	if r.top != kindObject {
		return
	}
	if r.hasModel {
		cw.modelN = copy(cw.model[:], cw.sc.model[:cw.sc.modelN])
	}
	var got counts
	if cw.array != seqIn {
		got = r.partial
		if r.final.has != 0 {
			got.union(r.final)
			cw.complete = true
		}
		if r.done && r.ollama.has != 0 && cw.body == bodyJSON {
			o := r.ollama
			o.has |= hasIn | hasOut
			got.union(o)
			cw.complete = true
		}
	}
	if r.gemini.has != 0 {
		got.union(r.gemini.counts())
		if r.ends || cw.body == bodyJSON && cw.array == seqNone {
			cw.complete = true
		}
	}
	cw.usage.merge(got)
}

// Flush flushes what was passed on to the client.
func (cw *Writer) Flush() {
	if !cw.started {
		cw.start()
	}
	_ = http.NewResponseController(cw.rw).Flush()
}

// Unwrap returns the wrapped ResponseWriter, for http.ResponseController.
func (cw *Writer) Unwrap() http.ResponseWriter {
	return cw.rw
}

// ReadFrom copies r to the response. When nothing of the body is read, it
// leaves the copy to the wrapped ResponseWriter (which may send a file
// without reading it); else it writes what it reads through Write.
func (cw *Writer) ReadFrom(r io.Reader) (int64, error) {
	if !cw.started {
		cw.start()
	}
	if rf, ok := cw.rw.(io.ReaderFrom); ok && cw.body == bodyNone {
		return rf.ReadFrom(r)
	}
	return io.Copy(writerOnly{cw}, r)
}

// writerOnly hides a Writer's ReadFrom from io.Copy.
type writerOnly struct{ io.Writer }

// Cost returns the response's cost as its Source says, once the response
// is written, and whether there is one: a cost is a whole usage read
// (not one cut off with the stream, nor a body without usage or not JSON),
// or a valid header or trailer.
func (cw *Writer) Cost() (int64, bool) {
	if cw.src.Header == "" {
		return cw.Tokens(cw.src.Count)
	}
	h := cw.rw.Header()
	v, ok := h[http.TrailerPrefix+cw.src.Header]
	switch {
	case ok:
	case cw.trailer || !cw.started:
		// A declared trailer is set in the header once the body is
		// written; with nothing written yet, the header is still to be
		// sent as it is.
		v = h[cw.src.Header]
	default:
		v = cw.header
	}
	if len(v) == 0 {
		return 0, false
	}
	return parseCount(strings.TrimSpace(v[0]))
}

// Tokens returns the count c of the usage the response reported, and
// whether it reported it. Input counts the tokens read from Anthropic's
// prompt cache, and written to it, with the others (the counts of
// OpenAI's formats include cached tokens already); Total is input plus
// output where the format gives no total.
func (cw *Writer) Tokens(c Count) (int64, bool) {
	u := &cw.usage
	if !cw.complete {
		return 0, false
	}
	in := u.in + u.cacheCreate + u.cacheRead
	switch c {
	case Input:
		return in, u.has&hasIn != 0
	case Output:
		return u.out, u.has&hasOut != 0
	case Total:
		if u.has&hasTotal != 0 {
			return u.total, true
		}
		return in + u.out, u.has&(hasIn|hasOut) == hasIn|hasOut
	}
	return 0, false
}

// Usage returns the usage the response reported, each kind of token
// apart, as a price table prices them, and whether it reported a whole
// usage with its input and its output. OpenAI's cached tokens, part of
// its prompt's, are taken out of Input into CacheRead (none, where the
// response gives them ambiguously: see counts); Anthropic's cache reads
// and writes come beside its input, and its 1-hour writes are taken out
// of CacheWrite into CacheWrite1h. A part larger than its whole is the
// whole.
func (cw *Writer) Usage() (Usage, bool) {
	u := &cw.usage
	if !cw.complete || u.has&(hasIn|hasOut) != hasIn|hasOut {
		return Usage{}, false
	}
	cached := u.cached
	if u.ambiguous {
		cached = 0
	}
	cached = min(cached, u.in)
	write1h := min(u.write1h, u.cacheCreate)
	return Usage{
		Input: u.in - cached, Output: u.out,
		CacheRead: u.cacheRead + cached, CacheWrite: u.cacheCreate - write1h, CacheWrite1h: write1h,
	}, true
}

// Model returns the name of the model the response names (its model,
// that of Anthropic's message or of the Responses API's response, or
// Gemini's modelVersion), the
// last one given, or nil if it names none that was read: one with an
// escape, or longer than 256 bytes, is not. The slice is the Writer's,
// valid until its next Write or Reset.
func (cw *Writer) Model() []byte {
	if cw.modelN == 0 {
		return nil
	}
	return cw.model[:cw.modelN]
}

// parseCount parses a non-negative decimal integer. One of more than
// maxDigits digits is read as maxCount: a cost too large to hold is a
// cost larger than any limit, not no cost.
func parseCount(s string) (int64, bool) {
	if s == "" {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		if i < maxDigits {
			n = n*10 + int64(c-'0')
		}
	}
	if len(s) > maxDigits {
		n = maxCount
	}
	return n, true
}
