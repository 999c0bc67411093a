package costfrom

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// The fuzz targets hold what this package reads against references: a
// request's body against three ways a server reads one, a response's
// usage against Go's encoding/json. Their seeds, under
// testdata/fuzz/<target>, run as unit tests; `go test -fuzz` searches
// for more.
//
// Each reference reads every field of a bound (as a server of its kind
// that reads that field would), so that the targets hold how a field is
// spelled and written; that a server reads a field at all is the
// operator's to know.

// refRequest is what a server reads of a request's body, as far as the
// reservation depends on it.
type refRequest struct {
	bounds  []float64 // the bounds given, each a number
	choices []float64 // n and best_of, where given
	stream  bool
}

// reservation is what a zone of limit, with def for a request without a
// bound, must reserve for what the server read: its largest bound times
// its choices (best_of are generated, of which n are returned), or the
// whole limit if a bound means none.
func (r refRequest) reservation(def, limit float64) float64 {
	bound := def
	if len(r.bounds) > 0 {
		bound = 0
	}
	for _, b := range r.bounds {
		if !(b > 0) || math.IsInf(b, 1) {
			return limit
		}
		bound = max(bound, math.Ceil(b))
	}
	choices := 1.0
	for _, c := range r.choices {
		choices = max(choices, math.Ceil(c))
	}
	return min(bound*choices, maxBound)
}

// A reference reads a body as one kind of server does, and returns false
// if that server refuses it.
type reference func(body []byte) (refRequest, bool)

var references = map[string]reference{
	// Go's encoding/json into a struct, as Ollama reads a request: keys
	// matched without regard to case, the first JSON value of the body,
	// a bound that is a number (rounded up: a server that truncates
	// reads less), a stream that is a boolean; anything else refused.
	"encoding/json": func(body []byte) (refRequest, bool) {
		var v struct {
			MaxTokens           any `json:"max_tokens"`
			MaxCompletionTokens any `json:"max_completion_tokens"`
			MaxOutputTokens     any `json:"max_output_tokens"`
			NPredict            any `json:"n_predict"`
			Options             *struct {
				NumPredict any `json:"num_predict"`
			} `json:"options"`
			N      any `json:"n"`
			BestOf any `json:"best_of"`
			Stream any `json:"stream"`
		}
		d := json.NewDecoder(bytes.NewReader(body))
		d.UseNumber()
		if d.Decode(&v) != nil {
			return refRequest{}, false
		}
		var r refRequest
		number := func(x any, into *[]float64) bool {
			switch x := x.(type) {
			case nil:
				return true
			case json.Number:
				f, err := strconv.ParseFloat(string(x), 64)
				*into = append(*into, f)
				return err == nil || errors.Is(err, strconv.ErrRange)
			}
			return false
		}
		ok := number(v.MaxTokens, &r.bounds) && number(v.MaxCompletionTokens, &r.bounds) &&
			number(v.MaxOutputTokens, &r.bounds) && number(v.NPredict, &r.bounds) &&
			number(v.N, &r.choices) && number(v.BestOf, &r.choices)
		if v.Options != nil {
			ok = ok && number(v.Options.NumPredict, &r.bounds)
		}
		switch s := v.Stream.(type) {
		case bool:
			r.stream = s
		case nil:
		default:
			ok = false
		}
		return r, ok
	},
	// A strict decoder, as llama.cpp's server (nlohmann's json) reads a
	// request: keys compared as they are, the last of two; a bound that
	// is a number or a boolean; a field of another type read as absent.
	"strict": func(body []byte) (refRequest, bool) {
		m, ok := decodeMap(body)
		if !ok {
			return refRequest{}, false
		}
		var r refRequest
		number := func(x any, into *[]float64) {
			switch x := x.(type) {
			case json.Number:
				f, _ := strconv.ParseFloat(string(x), 64)
				*into = append(*into, f)
			case bool:
				*into = append(*into, b2f(x))
			}
		}
		for _, k := range []string{"max_tokens", "max_completion_tokens", "max_output_tokens", "n_predict"} {
			number(m[k], &r.bounds)
		}
		if o, ok := m["options"].(map[string]any); ok {
			number(o["num_predict"], &r.bounds)
		}
		number(m["n"], &r.choices)
		number(m["best_of"], &r.choices)
		r.stream = m["stream"] == true
		return r, true
	},
	// pydantic's lax mode, as vLLM validates a request (keys compared as
	// they are, the last of two): an int from an integer, a float with no fraction, a
	// boolean, or a string of digits (with a sign, underscores between
	// digits, zero decimals); a bool from a boolean, 0 or 1, or one of
	// its words. Anything else refused.
	"pydantic": func(body []byte) (refRequest, bool) {
		m, ok := decodeMap(body)
		if !ok {
			return refRequest{}, false
		}
		var r refRequest
		ok = true
		number := func(x any, into *[]float64) {
			if x == nil {
				return
			}
			n, valid := laxInt(x)
			ok = ok && valid
			*into = append(*into, n)
		}
		for _, k := range []string{"max_tokens", "max_completion_tokens", "max_output_tokens", "n_predict"} {
			number(m[k], &r.bounds)
		}
		if o, ok := m["options"].(map[string]any); ok {
			number(o["num_predict"], &r.bounds)
		}
		number(m["n"], &r.choices)
		number(m["best_of"], &r.choices)
		if s, present := m["stream"]; present && s != nil {
			var valid bool
			r.stream, valid = laxBool(s)
			ok = ok && valid
		}
		return r, ok
	},
}

// protojsonRequest reads a request's body as Google's Gemini API reads
// one, by the JSON mapping of protocol buffers: the last of two keys
// compared as they are, under either name of a field; an integer from a
// JSON number or a string of one.
func protojsonRequest(body []byte) (refRequest, bool) {
	m, ok := decodeMap(body)
	if !ok {
		return refRequest{}, false
	}
	var r refRequest
	ok = true
	number := func(x any, into *[]float64) {
		var s string
		switch x := x.(type) {
		case nil:
			return
		case json.Number:
			s = string(x)
		case string:
			s = x
		default:
			ok = false
			return
		}
		f, err := strconv.ParseFloat(s, 64)
		ok = ok && err == nil
		*into = append(*into, f)
	}
	for _, name := range []string{"generationConfig", "generation_config"} {
		c, _ := m[name].(map[string]any)
		number(c["maxOutputTokens"], &r.bounds)
		number(c["max_output_tokens"], &r.bounds)
		number(c["candidateCount"], &r.choices)
		number(c["candidate_count"], &r.choices)
	}
	return r, ok
}

// decodeMap decodes the first JSON value of body as an object, keeping
// numbers as they are written.
func decodeMap(body []byte) (map[string]any, bool) {
	var m map[string]any
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	return m, d.Decode(&m) == nil && m != nil
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// laxInt is pydantic's lax int, from its conversion table.
func laxInt(x any) (float64, bool) {
	switch x := x.(type) {
	case bool:
		return b2f(x), true
	case json.Number:
		f, err := strconv.ParseFloat(string(x), 64)
		return f, err == nil && f == math.Trunc(f)
	case string:
		s := strings.TrimSpace(x)
		if i := strings.IndexByte(s, '.'); i >= 0 && strings.Trim(s[i+1:], "0") == "" {
			s = s[:i]
		}
		if !strings.HasPrefix(s, "_") && !strings.HasSuffix(s, "_") && !strings.Contains(s, "__") {
			s = strings.ReplaceAll(s, "_", "")
		}
		digits := strings.TrimLeft(s, "+-")
		if len(s)-len(digits) > 1 || digits == "" || strings.Trim(digits, "0123456789") != "" {
			return 0, false
		}
		f, err := strconv.ParseFloat(s, 64)
		return f, err == nil
	}
	return 0, false
}

// laxBool is pydantic's lax bool, from its conversion table.
func laxBool(x any) (value, valid bool) {
	switch x := x.(type) {
	case bool:
		return x, true
	case json.Number:
		f, err := strconv.ParseFloat(string(x), 64)
		return f == 1, err == nil && (f == 0 || f == 1)
	case string:
		switch strings.ToLower(x) {
		case "1", "t", "true", "y", "yes", "on":
			return true, true
		case "0", "f", "false", "n", "no", "off":
			return false, true
		}
	}
	return false, false
}

// duplicated returns the field on a path Request reads that the first
// JSON value of body gives twice, as Go's encoding/json decodes its keys
// and as strings.EqualFold compares them; "" if none, and false if Go's
// encoding/json does not read body.
func duplicated(body []byte) (string, bool) {
	var first json.RawMessage
	if json.NewDecoder(bytes.NewReader(body)).Decode(&first) != nil {
		return "", false
	}
	fields := map[string][]string{
		"":                 {"max_tokens", "max_completion_tokens", "max_output_tokens", "n_predict", "options", "n", "best_of", "stream", "stream_options", "model", "messages", "prompt", "input", "generationConfig", "generation_config"},
		"options":          {"num_predict"},
		"stream_options":   {"include_usage"},
		"generationConfig": {"maxOutputTokens", "max_output_tokens", "candidateCount", "candidate_count"},
	}
	fields["generation_config"] = fields["generationConfig"]
	// Gemini's fields under their protocol buffer names are the same
	// fields as under their JSON names.
	same := map[string]string{"generation_config": "generationConfig", "max_output_tokens": "maxOutputTokens", "candidate_count": "candidateCount"}
	canonical := func(path, f string) string {
		if c, ok := same[f]; ok && (path != "" || f == "generation_config") {
			return c
		}
		return f
	}
	var walk func(obj json.RawMessage, path string) string
	walk = func(obj json.RawMessage, path string) string {
		d := json.NewDecoder(bytes.NewReader(obj))
		if t, _ := d.Token(); t != json.Delim('{') {
			return ""
		}
		seen := map[string]bool{}
		for d.More() {
			t, _ := d.Token()
			var v json.RawMessage
			d.Decode(&v)
			for _, f := range fields[path] {
				if !strings.EqualFold(t.(string), f) {
					continue
				}
				c := canonical(path, f)
				name := strings.TrimPrefix(canonical("", path)+"."+c, ".")
				if seen[c] {
					return name
				}
				seen[c] = true
				if _, nested := fields[f]; nested && path == "" {
					if dup := walk(v, f); dup != "" {
						return dup
					}
				}
			}
		}
		return ""
	}
	return walk(first, ""), true
}

func FuzzRequestBody(f *testing.F) {
	const def, limit = 100, 1_000_000
	f.Fuzz(func(t *testing.T, body []byte) {
		var r Request
		err := r.Read("", body)
		dup, goReads := duplicated(utf8Body(body))
		var d *DuplicateError
		switch {
		case err != nil && !errors.As(err, &d):
			t.Fatalf("Read = %v, want nil or a *DuplicateError", err)
		case err != nil && goReads && dup == "":
			t.Fatalf("refused for %s given twice, which encoding/json does not find twice", d.Field)
		case err == nil && dup != "":
			t.Fatalf("read, while it gives %s twice", dup)
		case err != nil:
			return
		}
		var g Request
		if err := g.Read(geminiPath, body); err != nil {
			t.Fatalf("read on another path, refused on Gemini's: %v", err)
		}
		if ref, ok := protojsonRequest(body); ok {
			n, unbounded := g.MaxTokens(def)
			ours := float64(n)
			if unbounded {
				ours = max(ours, limit)
			}
			// A Gemini request without a bound is generated up to the
			// model's own maximum, as with a bound of 0: the whole limit.
			if len(ref.bounds) == 0 {
				ref.bounds = []float64{0}
			}
			if want := ref.reservation(def, limit); ours < want {
				t.Errorf("reserves %v for Gemini (MaxTokens %d, unbounded %v), which reads a reservation of %v (%+v)", ours, n, unbounded, want, ref)
			}
		}
		n, unbounded := r.MaxTokens(def)
		ours := float64(n)
		if unbounded {
			ours = max(ours, limit)
		}
		for name, read := range references {
			ref, ok := read(body)
			if !ok {
				continue
			}
			if want := ref.reservation(def, limit); ours < want {
				t.Errorf("reserves %v (MaxTokens %d, unbounded %v), and %s reads a reservation of %v (%+v)", ours, n, unbounded, name, want, ref)
			}
			if ref.stream && !r.Stream() {
				t.Errorf("reads no stream, and %s reads one", name)
			}
		}
		changed, ok := r.StreamUsage()
		if !ok {
			return
		}
		var again Request
		if err := again.Read("", changed); err != nil {
			t.Fatalf("StreamUsage made %q, which Read refuses: %v", changed, err)
		}
		n2, unbounded2 := again.MaxTokens(def)
		if _, twice := again.StreamUsage(); twice || !again.Stream() || !again.AsksStreamUsage() || n2 != n || unbounded2 != unbounded {
			t.Errorf("StreamUsage made %q, which reads as stream %v, asking for the usage %v (changed again: %v), bound %d %v; want a stream asking for it, bound %d %v",
				changed, again.Stream(), again.AsksStreamUsage(), twice, n2, unbounded2, n, unbounded)
		}
		if m, ok := decodeMap(r.text); ok {
			m2, ok := decodeMap(changed)
			opts, _ := m2["stream_options"].(map[string]any)
			if !ok || opts["include_usage"] != true {
				t.Errorf("StreamUsage made %q of %q, in which encoding/json reads no stream_options.include_usage true", changed, r.text)
			}
			if len(m2) > len(m)+1 {
				t.Errorf("StreamUsage made %q of %q, with more members", changed, r.text)
			}
		}
	})
}

// refUsage is a usage as encoding/json reads it.
type refUsage struct {
	PromptTokens     any `json:"prompt_tokens"`
	CompletionTokens any `json:"completion_tokens"`
	TotalTokens      any `json:"total_tokens"`
	InputTokens      any `json:"input_tokens"`
	OutputTokens     any `json:"output_tokens"`
	CacheCreation    any `json:"cache_creation_input_tokens"`
	CacheRead        any `json:"cache_read_input_tokens"`
	PromptDetails    struct {
		Cached any `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	InputDetails struct {
		Cached any `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	CacheCreationDetails struct {
		Write1h any `json:"ephemeral_1h_input_tokens"`
	} `json:"cache_creation"`
}

// refCounts are the counts encoding/json reads of a response, to price:
// the largest of each kind given where it reads one, in and out given or
// not.
type refCounts struct {
	in, out, cacheCreate, cacheRead, cached, write1h int64
	hasIn, hasOut                                    bool
}

// usage is what r costs as a Writer prices a usage (Writer.Usage):
// cached tokens out of the prompt's, 1-hour writes out of the writes, a
// part no larger than its whole.
func (r refCounts) usage() Usage {
	cached, write1h := min(r.cached, r.in), min(r.write1h, r.cacheCreate)
	return Usage{Input: r.in - cached, Output: r.out, CacheRead: r.cacheRead + cached,
		CacheWrite: r.cacheCreate - write1h, CacheWrite1h: write1h}
}

// fuzzPrices are prices of the shapes every price table has (a cached
// read costs no more than input, a 1-hour write no less than a write),
// at which a Writer's usage must cost at least what encoding/json's does.
var fuzzPrices = []Price{
	{Input: 3, Output: 15, CacheRead: 1, CacheWrite: 4, CacheWrite1h: 6},
	{Input: 5, Output: 1, CacheRead: 5, CacheWrite: 5, CacheWrite1h: 5},
}

// count returns x as a count the Writer reads: a non-negative integer of
// at most maxDigits digits.
func count(x any) (int64, bool) {
	n, ok := x.(json.Number)
	if !ok || len(n) > maxDigits || strings.Trim(string(n), "0123456789") != "" {
		return 0, false
	}
	c, err := strconv.ParseInt(string(n), 10, 64)
	return c, err == nil
}

// wantAtLeast returns, by Count, the least a Writer must read of body: the
// counts encoding/json reads in its usage (or response.usage) and, for
// Ollama's answer (withOllama), its counts once done; and false if
// encoding/json does not read body as one JSON object.
func wantAtLeast(body []byte, withOllama bool) (map[Count]int64, refCounts, bool) {
	var v struct {
		Usage    json.RawMessage `json:"usage"`
		Response json.RawMessage `json:"response"`
		Done     any             `json:"done"`
		Prompt   any             `json:"prompt_eval_count"`
		Eval     any             `json:"eval_count"`
		// Gemini's.
		UsageMetadata  json.RawMessage `json:"usageMetadata"`
		Candidates     json.RawMessage `json:"candidates"`
		PromptFeedback json.RawMessage `json:"promptFeedback"`
	}
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	if d.Decode(&v) != nil || d.Decode(new(any)) != io.EOF {
		return nil, refCounts{}, false
	}
	want := map[Count]int64{}
	var ref refCounts
	at := func(c Count, x any) {
		if n, ok := count(x); ok {
			want[c] = max(want[c], n)
		}
	}
	largest := func(to *int64, has *bool, xs ...any) {
		for _, x := range xs {
			if n, ok := count(x); ok {
				*to = max(*to, n)
				if has != nil {
					*has = true
				}
			}
		}
	}
	usage := func(raw json.RawMessage) {
		var u refUsage
		if len(raw) == 0 || raw[0] != '{' {
			return
		}
		d := json.NewDecoder(bytes.NewReader(raw))
		d.UseNumber()
		if d.Decode(&u) != nil {
			return
		}
		// Input is the prompt's tokens and the cache's beside them.
		var in int64
		hasIn := false
		for _, x := range []any{u.PromptTokens, u.InputTokens} {
			if n, ok := count(x); ok {
				in, hasIn = max(in, n), true
			}
		}
		if hasIn {
			for _, x := range []any{u.CacheCreation, u.CacheRead} {
				n, _ := count(x)
				in += n
			}
			at(Input, json.Number(strconv.FormatInt(in, 10)))
		}
		at(Output, u.CompletionTokens)
		at(Output, u.OutputTokens)
		at(Total, u.TotalTokens)
		largest(&ref.in, &ref.hasIn, u.PromptTokens, u.InputTokens)
		largest(&ref.out, &ref.hasOut, u.CompletionTokens, u.OutputTokens)
		largest(&ref.cacheCreate, nil, u.CacheCreation)
		largest(&ref.cacheRead, nil, u.CacheRead)
		largest(&ref.write1h, nil, u.CacheCreationDetails.Write1h)
		// Where both say, a server reads either.
		largest(&ref.cached, nil, u.PromptDetails.Cached)
		if n, ok := count(u.InputDetails.Cached); ok && ref.cached == 0 {
			ref.cached = n
		}
		if _, total := want[Total]; !total && hasIn {
			if out, ok := want[Output]; ok {
				want[Total] = in + out
			}
		}
	}
	usage(v.Usage)
	if len(v.Response) > 0 && v.Response[0] == '{' {
		var r struct {
			Usage json.RawMessage `json:"usage"`
		}
		if json.Unmarshal(v.Response, &r) == nil {
			usage(r.Usage)
		}
	}
	if withOllama || geminiEnds(v.Candidates, v.PromptFeedback) {
		var g struct {
			Prompt     any `json:"promptTokenCount"`
			ToolUse    any `json:"toolUsePromptTokenCount"`
			Candidates any `json:"candidatesTokenCount"`
			Thoughts   any `json:"thoughtsTokenCount"`
			Total      any `json:"totalTokenCount"`
			Cached     any `json:"cachedContentTokenCount"`
		}
		d := json.NewDecoder(bytes.NewReader(v.UsageMetadata))
		d.UseNumber()
		if len(v.UsageMetadata) > 0 && v.UsageMetadata[0] == '{' && d.Decode(&g) == nil {
			// Counts left out are 0.
			prompt, p := count(g.Prompt)
			toolUse, u := count(g.ToolUse)
			candidates, c := count(g.Candidates)
			thoughts, o := count(g.Thoughts)
			_, total := count(g.Total)
			_, cached := count(g.Cached)
			in, out := prompt+toolUse, candidates+thoughts
			// A usageMetadata with no count is no usage.
			if p || u || c || o || total || cached {
				if !total {
					at(Total, json.Number(strconv.FormatInt(in+out, 10)))
				}
				at(Input, json.Number(strconv.FormatInt(in, 10)))
				at(Output, json.Number(strconv.FormatInt(out, 10)))
				at(Total, g.Total)
				ref.in, ref.out, ref.hasIn, ref.hasOut = max(ref.in, in), max(ref.out, out), true, true
				largest(&ref.cached, nil, g.Cached)
			}
		}
	}
	if withOllama && v.Done == true {
		at(Input, v.Prompt)
		at(Output, v.Eval)
		largest(&ref.in, &ref.hasIn, v.Prompt)
		largest(&ref.out, &ref.hasOut, v.Eval)
	}
	return want, ref, true
}

// geminiEnds reports whether a Gemini chunk is the last of its response:
// a candidate has a finishReason, or the prompt a blockReason.
func geminiEnds(candidates, feedback json.RawMessage) bool {
	var cs []map[string]any
	var f map[string]any
	_ = json.Unmarshal(candidates, &cs)
	_ = json.Unmarshal(feedback, &f)
	for _, c := range cs {
		for k, v := range c {
			if strings.EqualFold(k, "finishReason") && v != nil {
				return true
			}
		}
	}
	for k, v := range f {
		if strings.EqualFold(k, "blockReason") && v != nil {
			return true
		}
	}
	return false
}

// readCounts are what a Writer read of a response: its counts by Count
// (-1 where it read none), and its usage to price.
type readCounts struct {
	tokens [3]int64
	usage  Usage
	priced bool
}

func FuzzResponseUsage(f *testing.F) {
	f.Fuzz(func(t *testing.T, body []byte, split int) {
		read := func(contentType string, hide bool, pieces ...[]byte) readCounts {
			rec := newRecorder()
			cw := Wrap(rec, Source{Count: Total})
			if hide {
				cw.HideStreamUsage()
			}
			cw.Header().Set("Content-Type", contentType)
			cw.WriteHeader(http.StatusOK)
			for _, p := range pieces {
				cw.Write(p)
			}
			var got readCounts
			for i, c := range []Count{Input, Output, Total} {
				if n, ok := cw.Tokens(c); ok {
					got.tokens[i] = n
				} else {
					got.tokens[i] = -1
				}
			}
			got.usage, got.priced = cw.Usage()
			return got
		}
		at := 0
		if len(body) > 0 {
			at = (split%len(body) + len(body)) % len(body)
		}
		check := func(format string, want map[Count]int64, ref refCounts, got readCounts) {
			for i, c := range []Count{Input, Output, Total} {
				if w, ok := want[c]; ok && got.tokens[i] < w {
					t.Errorf("%s: Tokens(%d) = %d, and encoding/json reads %d", format, c, got.tokens[i], w)
				}
			}
			if !ref.hasIn || !ref.hasOut {
				return
			}
			if !got.priced {
				t.Errorf("%s: no usage to price, and encoding/json reads %+v", format, ref)
				return
			}
			for _, p := range fuzzPrices {
				if cost, least := p.Cost(got.usage), p.Cost(ref.usage()); cost < least {
					t.Errorf("%s: at %+v, Usage() %+v costs %d, and encoding/json's %+v costs %d", format, p, got.usage, cost, ref, least)
				}
			}
		}

		whole := read("application/json", false, body)
		if split := read("application/json", false, body[:at], body[at:]); split != whole {
			t.Errorf("JSON: read whole %v, split at %d %v", whole, at, split)
		}
		if want, ref, ok := wantAtLeast(body, true); ok {
			check("JSON", want, ref, whole)
		}

		if bytes.ContainsAny(body, "\r\n") {
			return
		}
		event := append(append([]byte("data: "), body...), "\n\n"...)
		stream := read("text/event-stream", false, event)
		for _, hide := range []bool{false, true} {
			if split := read("text/event-stream", hide, event[:at], event[at:]); split != stream {
				t.Errorf("event stream (hidden: %v): read whole %v, split at %d %v", hide, stream, at, split)
			}
		}
		if want, ref, ok := wantAtLeast(body, false); ok {
			check("event stream", want, ref, stream)
		}
	})
}
