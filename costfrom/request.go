package costfrom

import (
	"bytes"
	"encoding/binary"
	"math"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// The fields of a request's body that a zone's decisions depend on. Each
// is read as requestFields reads it, as the most lenient server does.
const (
	// The bounds on the tokens the model may generate: max_tokens (Chat
	// Completions, Completions, Anthropic's Messages, llama.cpp's
	// server), max_completion_tokens (Chat Completions),
	// max_output_tokens (the Responses API), n_predict (llama.cpp's
	// server, which reads it before max_tokens) and options.num_predict
	// (Ollama's native API).
	fieldMaxTokens = iota
	fieldMaxCompletionTokens
	fieldMaxOutputTokens
	fieldNPredict
	fieldNumPredict
	// The choices the model generates, each up to the bound: n, and
	// best_of (Completions), of which n are returned.
	fieldN
	fieldBestOf
	fieldStream
	fieldStreamOptions
	fieldIncludeUsage
	fieldModel
	// What tells a Chat Completions or Completions request from one to
	// the Responses API.
	fieldMessages
	fieldPrompt
	fieldInput
	// Google's Gemini API and Vertex AI read a request's fields under
	// their JSON names (generationConfig.maxOutputTokens) and under their
	// protocol buffer names (generation_config.max_output_tokens), at
	// every level: each spelling of a path is a field, and a body that
	// gives two of them gives the field twice (see geminiFields). The
	// output bound is generationConfig.maxOutputTokens, per candidate, of
	// which generationConfig.candidateCount are generated.
	fieldGenerationConfig
	fieldGenerationConfigSnake
	fieldGeminiMaxOutputTokens // 4 spellings
	fieldGeminiCandidateCount  = fieldGeminiMaxOutputTokens + 4
	requestFieldCount          = fieldGeminiCandidateCount + 4
)

// geminiPaths are the spellings of a Gemini field's path, under either
// spelling of generationConfig, in the order of the fields.
func geminiPaths(camel, snake string) []string {
	return []string{
		"generationConfig." + camel, "generationConfig." + snake,
		"generation_config." + camel, "generation_config." + snake,
	}
}

var requestFields = func() *Fields {
	paths := []string{
		"max_tokens", "max_completion_tokens", "max_output_tokens", "n_predict", "options.num_predict",
		"n", "best_of",
		"stream", "stream_options", "stream_options.include_usage",
		"model",
		"messages", "prompt", "input",
		"generationConfig", "generation_config",
	}
	paths = append(paths, geminiPaths("maxOutputTokens", "max_output_tokens")...)
	paths = append(paths, geminiPaths("candidateCount", "candidate_count")...)
	f, err := NewFields(paths...)
	if err != nil {
		panic(err)
	}
	return f
}()

// Request is what a zone reads of a request's body, and of its path: the
// bound it asks for on the tokens the model generates, whether it
// streams, its model. A Request is read once per request, for every zone
// that reads it.
type Request struct {
	// text is the body, as UTF-8 (see utf8Body).
	text []byte
	// size is the body's length in bytes, as sent or as UTF-8, whichever
	// is larger: it bounds the tokens of a text prompt.
	size   int
	values [requestFieldCount]Value
	// gemini tells a request to Google's Gemini API or Vertex AI, whose
	// fields are read in place of the others, and model is the model its
	// path names (see PathModel), in memory kept from request to request.
	gemini bool
	model  []byte
}

// Read reads path, the request's URL path, and body into r. It returns
// a *DuplicateError if the body gives a field r reads more than once,
// under any spelling; r then has none of them. A body whose first JSON
// value is not an object gives none.
//
// A path that names a model as Google's Gemini API and Vertex AI do
// (see PathModel) makes the request one of theirs: its model is the
// path's, and its bound that of its generationConfig.
func (r *Request) Read(path string, body []byte) error {
	text := utf8Body(body)
	model := r.model[:0]
	*r = Request{text: text, size: max(len(body), len(text)), model: model}
	if m, ok := PathModel(path); ok {
		r.gemini, r.model = true, append(model, m...)
	}
	if err := requestFields.Read(text, r.values[:]); err != nil {
		return err
	}
	return r.geminiDuplicates()
}

// geminiSpellings are the fields that are one field of a Gemini request
// spelled otherwise, named as a DuplicateError names each.
var geminiSpellings = []struct {
	name        string
	first, last int
}{
	{"generationConfig", fieldGenerationConfig, fieldGenerationConfigSnake},
	{"generationConfig.maxOutputTokens", fieldGeminiMaxOutputTokens, fieldGeminiCandidateCount - 1},
	{"generationConfig.candidateCount", fieldGeminiCandidateCount, requestFieldCount - 1},
}

// geminiDuplicates refuses a body that gives a field of a Gemini request
// under two of its spellings: which one Google reads is not said, and a
// server may read either.
func (r *Request) geminiDuplicates() error {
	for _, g := range geminiSpellings {
		given := 0
		for f := g.first; f <= g.last; f++ {
			if r.values[f].raw != nil {
				given++
			}
		}
		if given > 1 {
			clear(r.values[:])
			return &DuplicateError{Field: g.name}
		}
	}
	return nil
}

// PathModel returns the model that path, a request's URL path, names as
// Google's Gemini API and Vertex AI name it, and true; or false if it
// names none. Both end in .../models/<model>:<method>: the Gemini API in
// /v1beta/models/gemini-2.5-flash:generateContent, Vertex AI in
// /v1/projects/<project>/locations/<location>/publishers/google/models/<model>:streamGenerateContent.
// The model is the last segment of the path up to its last colon, as
// Google's routes match it, below a segment "models" in any case; any
// method is read, and any prefix (a route of the proxy's own).
func PathModel(path string) (string, bool) {
	slash := strings.LastIndexByte(path, '/')
	if slash < 0 {
		return "", false
	}
	last, parent := path[slash+1:], path[:slash]
	colon := strings.LastIndexByte(last, ':')
	parent = parent[strings.LastIndexByte(parent, '/')+1:]
	if colon <= 0 || !strings.EqualFold(parent, "models") {
		return "", false
	}
	return last[:colon], true
}

// Gemini reports whether the request is one to Google's Gemini API or
// Vertex AI: its path names a model (see PathModel).
func (r *Request) Gemini() bool {
	return r.gemini
}

// Size is the body's length in bytes, which bounds its prompt's tokens (a
// token is at least one byte of text).
func (r *Request) Size() int {
	return r.size
}

// maxBound is where MaxTokens saturates: far above any limit, and exact
// as a float64.
const maxBound = 1 << 53

// MaxTokens returns the most tokens the request lets the model generate:
// the largest bound it gives (see fieldMaxTokens), rounded up, times the
// choices it asks for (n or best_of, the larger); or def times the
// choices if it gives none. It also reports whether a bound means that
// there is none: 0 or less (Ollama reads a num_predict of 0 or less as no
// bound, -1 and -2 by its documentation, and takes max_tokens as
// num_predict in its OpenAI-compatible API; llama.cpp's server reads -1
// as no bound), or infinite; the count is then that of its other bounds.
//
// A bound the body gives only in a form that some server does not read
// (under a key spelled otherwise than its name, or as anything but a JSON
// number) counts no lower than def: such a server generates as if the
// request had no bound.
//
// A Gemini request (see Gemini) reads generationConfig.maxOutputTokens
// times generationConfig.candidateCount instead, and nothing else. The
// thoughts of a thinking model count within maxOutputTokens (Gemini 2.5
// and 3 stop with MAX_TOKENS once thoughts and candidates reach it), so
// thinkingConfig.thinkingBudget adds nothing to it. A request without
// it, or with one of 0 or less (proto3's 0 is the field unset), is
// generated up to the model's own maximum, which the request does not
// say: it means none.
func (r *Request) MaxTokens(def int64) (n int64, unbounded bool) {
	if r.Gemini() {
		return r.geminiMaxTokens()
	}
	bound, plain := 0.0, false
	for f := fieldMaxTokens; f <= fieldNumPredict; f++ {
		v := r.values[f]
		x, ok := v.Number()
		if !ok {
			continue
		}
		if !(x > 0) || math.IsInf(x, 1) {
			unbounded = true
			continue
		}
		bound = max(bound, math.Ceil(x))
		plain = plain || v.plainNumber()
	}
	if !plain {
		bound = max(bound, float64(def))
	}
	return int64(min(bound*r.choices(fieldN, fieldBestOf), maxBound)), unbounded
}

// geminiMaxTokens is MaxTokens for a Gemini request. A bound in a form
// some server does not read (a string, which protocol buffers' JSON
// reads as a number, or a key in other case) means none.
func (r *Request) geminiMaxTokens() (n int64, unbounded bool) {
	bound, plain := 0.0, false
	for f := fieldGeminiMaxOutputTokens; f < fieldGeminiCandidateCount; f++ {
		v := r.values[f]
		x, ok := v.Number()
		if !ok {
			continue
		}
		if x > 0 && !math.IsInf(x, 1) {
			bound, plain = math.Ceil(x), v.plainNumber()
		}
	}
	choices := r.choices(fieldGeminiCandidateCount, requestFieldCount-1)
	return int64(min(bound*choices, maxBound)), !plain
}

// choices returns the choices the fields first to last ask for, the
// largest, rounded up: at least 1.
func (r *Request) choices(first, last int) float64 {
	choices := 1.0
	for f := first; f <= last; f++ {
		if x, ok := r.values[f].Number(); ok && x > choices {
			choices = math.Ceil(x)
		}
	}
	return choices
}

// Stream reports whether the request asks for a stream: its stream is
// true as the most lenient server reads it (see Value.True).
func (r *Request) Stream() bool {
	return r.values[fieldStream].True()
}

// Model returns the request's model, and false if it names none: the
// model its body names, or a Gemini request's path (see PathModel).
func (r *Request) Model() (string, bool) {
	b, ok := r.ModelName()
	return string(b), ok
}

// ModelName is Model as bytes: a slice of the body where the name has
// no escape, as most do, so that finding its price allocates nothing. A
// Gemini request's model is its path's (see PathModel).
func (r *Request) ModelName() ([]byte, bool) {
	if r.Gemini() {
		return r.model, true
	}
	v := r.values[fieldModel]
	if len(v.raw) < 2 || v.raw[0] != '"' {
		return nil, false
	}
	if bytes.IndexByte(v.raw, '\\') < 0 {
		return v.raw[1 : len(v.raw)-1], true
	}
	s, ok := v.Text()
	return []byte(s), ok
}

// AsksStreamUsage reports whether the request asks for its stream's usage
// (stream_options.include_usage true, as the most lenient server reads
// it): its client expects the usage chunk.
func (r *Request) AsksStreamUsage() bool {
	return r.values[fieldIncludeUsage].True()
}

// The stream_options StreamUsage puts in a request.
const (
	streamOptionsKey = `"stream_options":`
	includeUsage     = `"include_usage":true`
)

// StreamUsage returns the body of a streamed Chat Completions or
// Completions request (OpenAI's, or a server compatible with it) changed
// to ask for the usage chunk at the end of the stream, and true; or nil
// and false if it needs no change. The request is one that streams (see
// Stream), with messages or prompt and without input (the Responses
// API, whose stream always ends with its usage), and that does not ask
// for the usage in the form every server reads: "stream_options":
// {"include_usage": true}, both keys spelled so.
//
// The request's stream_options, under whatever spelling, is replaced by
// one spelled so, with "include_usage": true in place of any it had, and
// its other members kept; nothing else in the body changes. The body
// returned is UTF-8 (see utf8Body). A Writer then hides the usage chunk
// from a client that did not ask for it (Writer.HideStreamUsage).
//
// Anthropic's Messages API refuses a stream_options field: a request for
// it must not be changed (the handler tells one by its anthropic-version
// header).
func (r *Request) StreamUsage() ([]byte, bool) {
	v := &r.values
	opts, inc := v[fieldStreamOptions], v[fieldIncludeUsage]
	switch {
	case !r.Stream(), v[fieldMessages].raw == nil && v[fieldPrompt].raw == nil, v[fieldInput].raw != nil:
		return nil, false
	case opts.exact && inc.exact && string(inc.raw) == "true":
		return nil, false
	}
	var e edits
	switch {
	case opts.raw == nil:
		top := 0
		for r.text[top] != '{' {
			top++
		}
		e.add(top+1, top+1, streamOptionsKey+"{"+includeUsage+"},")
	case opts.raw[0] != '{':
		e.add(opts.key, opts.at+len(opts.raw), streamOptionsKey+"{"+includeUsage+"}")
	case inc.raw == nil:
		insert := streamOptionsKey + "{" + includeUsage
		if hasMembers(opts.raw) {
			insert += ","
		}
		e.add(opts.key, opts.at+1, insert)
	default:
		e.add(opts.key, opts.at+1, streamOptionsKey+"{")
		e.add(inc.key, inc.at+len(inc.raw), includeUsage)
	}
	return e.apply(r.text), true
}

// hasMembers reports whether the JSON object has a member.
func hasMembers(object []byte) bool {
	for _, c := range object[1:] {
		switch c {
		case ' ', '\t', '\n', '\r':
		case '}':
			return false
		default:
			return true
		}
	}
	return false
}

// edits are up to two replacements of a body's bytes, in order.
type edits struct {
	n    int
	list [2]struct {
		at, end int
		with    string
	}
}

// add replaces the bytes [at, end) with with.
func (e *edits) add(at, end int, with string) {
	e.list[e.n].at, e.list[e.n].end, e.list[e.n].with = at, end, with
	e.n++
}

// apply returns a copy of b with the replacements made.
func (e *edits) apply(b []byte) []byte {
	size := len(b)
	for _, x := range e.list[:e.n] {
		size += len(x.with) - (x.end - x.at)
	}
	out, from := make([]byte, 0, size), 0
	for _, x := range e.list[:e.n] {
		out = append(out, b[from:x.at]...)
		out = append(out, x.with...)
		from = x.end
	}
	return append(out, b[from:]...)
}

// utf8Body returns the text of a JSON body as UTF-8: the body itself,
// less a UTF-8 byte order mark; or, where Python's json.loads (with which
// servers built on FastAPI, such as vLLM, read a body) would decode it
// from UTF-16 or UTF-32, the body so decoded, in a new slice. Python
// tells those encodings by their byte order marks, or by the zero bytes
// of the body's first character, which is ASCII in JSON. A body that is
// not JSON comes back as it is, or decoded to text that is not JSON
// either.
func utf8Body(b []byte) []byte {
	switch {
	case hasPrefix(b, "\x00\x00\xfe\xff"):
		return utf32Body(b[4:], binary.BigEndian)
	case hasPrefix(b, "\xff\xfe\x00\x00"):
		return utf32Body(b[4:], binary.LittleEndian)
	case hasPrefix(b, "\xfe\xff"):
		return utf16Body(b[2:], binary.BigEndian)
	case hasPrefix(b, "\xff\xfe"):
		return utf16Body(b[2:], binary.LittleEndian)
	case hasPrefix(b, "\xef\xbb\xbf"):
		return b[3:]
	case len(b) < 4:
		return b
	case b[0] == 0 && b[1] != 0:
		return utf16Body(b, binary.BigEndian)
	case b[0] == 0:
		return utf32Body(b, binary.BigEndian)
	case b[1] == 0 && (b[2] != 0 || b[3] != 0):
		return utf16Body(b, binary.LittleEndian)
	case b[1] == 0:
		return utf32Body(b, binary.LittleEndian)
	}
	return b
}

func hasPrefix(b []byte, prefix string) bool {
	return len(b) >= len(prefix) && string(b[:len(prefix)]) == prefix
}

// utf16Body decodes b from UTF-16, a lone surrogate as U+FFFD.
func utf16Body(b []byte, order binary.ByteOrder) []byte {
	out := make([]byte, 0, len(b)/2*3)
	for i := 0; i+1 < len(b); i += 2 {
		r := rune(order.Uint16(b[i:]))
		if utf16.IsSurrogate(r) && i+3 < len(b) {
			if pair := utf16.DecodeRune(r, rune(order.Uint16(b[i+2:]))); pair != utf8.RuneError {
				r = pair
				i += 2
			}
		}
		out = utf8.AppendRune(out, r)
	}
	return out
}

// utf32Body decodes b from UTF-32, an invalid rune as U+FFFD.
func utf32Body(b []byte, order binary.ByteOrder) []byte {
	out := make([]byte, 0, len(b))
	for i := 0; i+3 < len(b); i += 4 {
		out = utf8.AppendRune(out, rune(order.Uint32(b[i:])))
	}
	return out
}
