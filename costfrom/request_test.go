package costfrom

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/d61b427a/caddy-rate-limit/internal/race"
)

func TestMaxTokens(t *testing.T) {
	deep := strings.Repeat("[", 100000) + strings.Repeat("]", 100000)
	for _, tc := range []struct {
		name, body string
		want       int64
		none       bool // a bound means none
	}{
		{"chat", `{"model":"gpt-4o","messages":[{"role":"user","content":"Hi"}],"max_tokens":300}`, 300, false},
		{"chat max_completion_tokens", `{"model":"o3","messages":[],"max_completion_tokens":2048}`, 2048, false},
		{"both: the larger", `{"max_tokens":100,"messages":[],"max_completion_tokens":50}`, 100, false},
		{"responses", `{"model":"gpt-4.1","input":"Hi","max_output_tokens":1000}`, 1000, false},
		{"anthropic", `{"model":"claude-sonnet-4-5","max_tokens":1024,"messages":[{"role":"user","content":"Hello, world"}]}`, 1024, false},
		{"ollama", `{"model":"llama3.2","prompt":"Why?","options":{"temperature":0.2,"num_predict":128}}`, 128, false},
		{"llama.cpp n_predict over max_tokens", `{"prompt":"Why?","max_tokens":10,"n_predict":9000}`, 9000, false},
		{"absent", `{"model":"gpt-4o","messages":[{"role":"user","content":"max_tokens: 5"}]}`, 4096, false},
		{"nested elsewhere", `{"metadata":{"max_tokens":5},"messages":[{"max_tokens":6}]}`, 4096, false},
		{"null", `{"max_tokens":null}`, 4096, false},
		{"not an object", `[{"max_tokens":10}]`, 4096, false},
		{"cut", `{"max_tokens":10,"messages":[`, 4096, false},
		{"empty", ``, 4096, false},
		{"trailing space", "{\"max_tokens\":10}\n", 10, false},
		// Go's json.Decoder, as Ollama's router reads a body, acts on
		// the first value.
		{"trailing garbage", `{"max_tokens":10}x`, 10, false},
		{"a second value", `{"max_tokens":9000}{"max_tokens":10}`, 9000, false},

		// Keys as Go's encoding/json matches them.
		{"capitals", `{"messages":[],"MAX_TOKENS":9000}`, 9000, false},
		{"escape", `{"messages":[],"max_tok\u0065ns":9000}`, 9000, false},
		{"kelvin sign", `{"messages":[],"max_to\u212aens":9000}`, 9000, false},
		{"kelvin sign as UTF-8", "{\"messages\":[],\"max_to\u212aens\":9000}", 9000, false},
		{"long s", "{\"prompt\":\"Why?\",\"option\u017f\":{\"num_predict\":9000}}", 9000, false},
		{"object on the path", `{"prompt":"Why?","OPTIONS":{"Num_Predict":9000}}`, 9000, false},
		// A server that compares keys as they are may not read the
		// bound, and generates as if there were none: the default.
		{"other spelling below the default", `{"messages":[],"Max_Tokens":50}`, 4096, false},
		{"other spelling beside a plain one", `{"messages":[],"max_tokens":50,"Max_Completion_Tokens":60}`, 60, false},

		// Values as the most lenient server reads them.
		{"string", `{"max_tokens":"9000"}`, 9000, false},
		{"string below the default", `{"max_tokens":"10"}`, 4096, false},
		{"string with spaces and underscores", `{"max_tokens":" 9_000 "}`, 9000, false},
		{"string with decimals", `{"max_tokens":"9000.0"}`, 9000, false},
		{"string with an escape", `{"max_tokens":"9\u0030\u0030\u0030"}`, 9000, false},
		{"exponent", `{"max_tokens":9e3}`, 9000, false},
		{"float", `{"max_tokens":9000.0}`, 9000, false},
		{"fraction rounds up", `{"max_tokens":10.5}`, 11, false},
		{"true is 1, read beside the default", `{"max_tokens":true}`, 4096, false},
		{"not a number", `{"max_tokens":"many"}`, 4096, false},
		{"an object", `{"max_tokens":{"value":9000}}`, 4096, false},
		{"Python's NaN elsewhere", `{"temperature":NaN,"max_tokens":9000}`, 9000, false},
		{"deep elsewhere", `{"a":` + deep + `,"max_tokens":9000}`, 9000, false},
		{"huge", `{"max_tokens":1e30}`, maxBound, false},

		// Bounds that mean none.
		{"ollama infinite", `{"model":"llama3.2","prompt":"Why?","options":{"num_predict":-1}}`, 4096, true},
		{"ollama fill the context", `{"prompt":"Why?","options":{"num_predict":-2}}`, 4096, true},
		{"ollama zero", `{"prompt":"Why?","options":{"num_predict":0}}`, 4096, true},
		{"zero", `{"max_tokens":0}`, 4096, true},
		{"false is 0", `{"max_tokens":false}`, 4096, true},
		{"negative string", `{"max_tokens":"-1"}`, 4096, true},
		{"Python's Infinity", `{"max_tokens":Infinity}`, 4096, true},
		{"Python's NaN", `{"max_tokens":NaN}`, 4096, true},
		{"one of several", `{"max_tokens":100,"options":{"num_predict":-1}}`, 100, true},

		// Choices.
		{"n", `{"max_tokens":100,"n":3}`, 300, false},
		{"best_of", `{"prompt":"Why?","max_tokens":100,"n":2,"best_of":5}`, 500, false},
		{"n as a string", `{"max_tokens":100,"n":"3"}`, 300, false},
		{"n rounds up", `{"max_tokens":100,"n":2.5}`, 300, false},
		{"n under 1", `{"max_tokens":100,"n":0}`, 100, false},
		{"n spelled otherwise", `{"max_tokens":100,"N":3}`, 300, false},
		{"n of the default", `{"messages":[],"n":2}`, 8192, false},
		{"n infinite", `{"max_tokens":100,"n":Infinity}`, maxBound, false},
	} {
		var r Request
		if err := r.Read("", []byte(tc.body)); err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if got, none := r.MaxTokens(4096); got != tc.want || none != tc.none {
			t.Errorf("%s: MaxTokens = %d, %v; want %d, %v", tc.name, got, none, tc.want, tc.none)
		}
	}
}

// TestEncodings reads bodies in the encodings Python's json.loads takes.
func TestEncodings(t *testing.T) {
	const body = `{"messages":[],"max_tokens":9000,"model":"mödel"}`
	units := utf16.Encode([]rune(body))
	enc16 := func(order binary.AppendByteOrder, bom bool) []byte {
		var b []byte
		if bom {
			b = order.AppendUint16(b, 0xfeff)
		}
		for _, u := range units {
			b = order.AppendUint16(b, u)
		}
		return b
	}
	enc32 := func(order binary.AppendByteOrder, bom bool) []byte {
		var b []byte
		if bom {
			b = order.AppendUint32(b, 0xfeff)
		}
		for _, r := range body {
			b = order.AppendUint32(b, uint32(r))
		}
		return b
	}
	for name, b := range map[string][]byte{
		"utf-8":                 []byte(body),
		"utf-8 byte order mark": append([]byte("\xef\xbb\xbf"), body...),
		"utf-16le":              enc16(binary.LittleEndian, false),
		"utf-16be":              enc16(binary.BigEndian, false),
		"utf-16 mark le":        enc16(binary.LittleEndian, true),
		"utf-16 mark be":        enc16(binary.BigEndian, true),
		"utf-32le":              enc32(binary.LittleEndian, false),
		"utf-32be":              enc32(binary.BigEndian, false),
		"utf-32 mark le":        enc32(binary.LittleEndian, true),
		"utf-32 mark be":        enc32(binary.BigEndian, true),
	} {
		var r Request
		if err := r.Read("", b); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		n, _ := r.MaxTokens(100)
		model, _ := r.Model()
		if n != 9000 || model != "mödel" || r.Size() < len(body) {
			t.Errorf("%s: MaxTokens %d, model %q, size %d; want 9000, mödel, at least %d", name, n, model, r.Size(), len(body))
		}
	}
}

func TestDuplicateFields(t *testing.T) {
	for _, tc := range []struct {
		name, body, field string
	}{
		{"same spelling", `{"max_tokens":100,"max_tokens":5000}`, "max_tokens"},
		{"capitals", `{"max_tokens":10,"MAX_TOKENS":9000}`, "max_tokens"},
		{"escape", `{"max_tokens":10,"max_tok\u0065ns":9000}`, "max_tokens"},
		{"escaped capital", `{"max_tokens":10,"\u004dax_tokens":9000}`, "max_tokens"},
		{"kelvin sign", `{"max_tokens":10,"max_to\u212aens":9000}`, "max_tokens"},
		{"long s", `{"stream":false,"ſtream":true}`, "stream"},
		{"null and a value", `{"max_completion_tokens":null,"max_completion_tokens":9000}`, "max_completion_tokens"},
		{"object on the path", `{"options":{"num_predict":10},"Options":{"temperature":1}}`, "options"},
		{"nested", `{"options":{"num_predict":10,"NUM_PREDICT":9000}}`, "options.num_predict"},
		{"stream_options", `{"stream":true,"stream_options":{"include_usage":true},"stream_options":{}}`, "stream_options"},
		{"include_usage", `{"stream":true,"stream_options":{"include_usage":false,"Include_Usage":true}}`, "stream_options.include_usage"},
		{"n", `{"n":1,"n":9}`, "n"},
		{"best_of", `{"best_of":1,"BEST_OF":9}`, "best_of"},
		{"model", `{"model":"a","Model":"b"}`, "model"},
		{"messages", `{"messages":[],"MESSAGES":[]}`, "messages"},
		{"after the others", `{"a":1,"max_tokens":1,"b":{"c":[1,2]},"max_tokens":2}`, "max_tokens"},
	} {
		var r Request
		err := r.Read("", []byte(tc.body))
		var dup *DuplicateError
		if !errors.As(err, &dup) || dup.Field != tc.field {
			t.Errorf("%s: Read = %v, want a duplicate %s", tc.name, err, tc.field)
			continue
		}
		if !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: the error %q does not name %s", tc.name, err, tc.field)
		}
		if n, _ := r.MaxTokens(4096); n != 4096 || r.Stream() {
			t.Errorf("%s: a body refused still reads as MaxTokens %d, stream %v", tc.name, n, r.Stream())
		}
	}
	for _, body := range []string{
		`{"temperature":1,"temperature":2,"max_tokens":10}`,
		`{"metadata":{"max_tokens":5,"max_tokens":6},"max_tokens":10}`,
		`{"messages":[{"max_tokens":1},{"max_tokens":2}],"max_tokens":10}`,
		`{"options":{"temperature":1,"temperature":2},"max_tokens":10}`,
		`{"max_tokens":10,"max_tokens_":9000}`,
		// Cut: not JSON, so no server reads it.
		`{"max_tokens":10,"max_tokens":9000`,
	} {
		var r Request
		if err := r.Read("", []byte(body)); err != nil {
			t.Errorf("%s: %v, want no duplicate", body, err)
		}
	}
}

func TestStreamAndModel(t *testing.T) {
	for _, tc := range []struct {
		body   string
		stream bool
		model  string
	}{
		{`{"model":"gpt-4o","stream":true}`, true, "gpt-4o"},
		{`{"MODEL":"gpt\u002d4o","STREAM":true}`, true, "gpt-4o"},
		{`{"ſtream":true}`, true, ""},
		{`{"stream":false}`, false, ""},
		{`{"stream":1}`, true, ""},
		{`{"stream":1.0}`, true, ""},
		{`{"stream":2}`, false, ""},
		{`{"stream":0}`, false, ""},
		{`{"stream":"true"}`, true, ""},
		{`{"stream":" Yes "}`, true, ""},
		{`{"stream":"on"}`, true, ""},
		{`{"stream":"t"}`, true, ""},
		{`{"stream":"y"}`, true, ""},
		{`{"stream":"1"}`, true, ""},
		{`{"stream":"no"}`, false, ""},
		{`{"stream":"false"}`, false, ""},
		{`{"stream":null}`, false, ""},
		{`{"stream":{}}`, false, ""},
		{`{"model":5}`, false, ""},
	} {
		var r Request
		if err := r.Read("", []byte(tc.body)); err != nil {
			t.Fatalf("%s: %v", tc.body, err)
		}
		model, ok := r.Model()
		if r.Stream() != tc.stream || model != tc.model || ok != (tc.model != "") {
			t.Errorf("%s: stream %v, model %q %v; want %v, %q", tc.body, r.Stream(), model, ok, tc.stream, tc.model)
		}
	}
}

func TestStreamUsage(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       string // "" if the body is not changed
		asks       bool   // the client asked for the usage itself
	}{
		{"chat",
			`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Hi"}],"stream":true}`,
			`{"stream_options":{"include_usage":true},"model":"gpt-4o-mini","messages":[{"role":"user","content":"Hi"}],"stream":true}`, false},
		{"completions, spaces kept",
			"{ \"model\": \"gpt-3.5-turbo-instruct\",\n  \"prompt\": \"Say this is a test\",\n  \"stream\": true }",
			"{\"stream_options\":{\"include_usage\":true}, \"model\": \"gpt-3.5-turbo-instruct\",\n  \"prompt\": \"Say this is a test\",\n  \"stream\": true }", false},
		{"include_usage false",
			`{"messages":[],"stream":true,"stream_options":{"include_usage":false}}`,
			`{"messages":[],"stream":true,"stream_options":{"include_usage":true}}`, false},
		{"stream_options empty",
			`{"messages":[],"stream":true,"stream_options":{ }}`,
			`{"messages":[],"stream":true,"stream_options":{"include_usage":true }}`, false},
		{"stream_options with another member",
			`{"messages":[],"stream":true,"stream_options":{"include_obfuscation":false}}`,
			`{"messages":[],"stream":true,"stream_options":{"include_usage":true,"include_obfuscation":false}}`, false},
		{"stream_options null",
			`{"messages":[],"stream":true,"stream_options":null}`,
			`{"messages":[],"stream":true,"stream_options":{"include_usage":true}}`, false},
		{"stream_options not an object",
			`{"messages":[],"stream":true,"stream_options" : "yes","n":1}`,
			`{"messages":[],"stream":true,"stream_options":{"include_usage":true},"n":1}`, false},

		// Other spellings, replaced by one every server reads.
		{"stream escaped",
			`{"messages":[],"str\u0065am":true}`,
			`{"stream_options":{"include_usage":true},"messages":[],"str\u0065am":true}`, false},
		{"stream as a string",
			`{"messages":[],"stream":"true"}`,
			`{"stream_options":{"include_usage":true},"messages":[],"stream":"true"}`, false},
		{"stream as 1",
			`{"messages":[],"stream":1}`,
			`{"stream_options":{"include_usage":true},"messages":[],"stream":1}`, false},
		{"stream_options in capitals",
			`{"messages":[],"stream":true,"STREAM_OPTIONS":{"include_usage":false}}`,
			`{"messages":[],"stream":true,"stream_options":{"include_usage":true}}`, false},
		{"include_usage in capitals, asked",
			`{"messages":[],"stream":true,"Stream_Options":{"x":1, "Include_Usage":true}}`,
			`{"messages":[],"stream":true,"stream_options":{"x":1, "include_usage":true}}`, true},
		{"include_usage as a string, asked",
			`{"messages":[],"stream":true,"stream_options":{"include_usage":"yes"}}`,
			`{"messages":[],"stream":true,"stream_options":{"include_usage":true}}`, true},
		{"escaped key with spaces",
			`{"messages":[],"stream":true,"stream_opti\u006fns" : { "include_usag\u0065" : false , "x":[1]}}`,
			`{"messages":[],"stream":true,"stream_options":{ "include_usage":true , "x":[1]}}`, false},

		{"usage asked", `{"messages":[],"stream":true,"stream_options":{"include_usage":true}}`, "", true},
		{"not streamed", `{"messages":[],"stream":false}`, "", false},
		{"stream no", `{"messages":[],"stream":"no"}`, "", false},
		{"stream absent", `{"messages":[]}`, "", false},
		{"responses", `{"model":"gpt-4.1","input":"Hi","stream":true}`, "", false},
		{"responses in capitals", `{"model":"gpt-4.1","INPUT":"Hi","messages":[],"stream":true}`, "", false},
		{"neither messages nor prompt", `{"model":"x","stream":true}`, "", false},
		{"not json", `{"messages":[],"stream":true`, "", false},
		{"not an object", `[{"messages":[],"stream":true}]`, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r Request
			if err := r.Read("", []byte(tc.body)); err != nil {
				t.Fatal(err)
			}
			if r.AsksStreamUsage() != tc.asks {
				t.Errorf("AsksStreamUsage = %v, want %v", r.AsksStreamUsage(), tc.asks)
			}
			got, changed := r.StreamUsage()
			if tc.want == "" {
				if changed {
					t.Errorf("changed to %s", got)
				}
				return
			}
			if !changed || string(got) != tc.want {
				t.Fatalf("got %s, %v\nwant %s", got, changed, tc.want)
			}
			checkAsksUsage(t, []byte(tc.body), got)
		})
	}
}

// checkAsksUsage checks that after, the body StreamUsage made of before,
// asks for the stream's usage in the form every server reads, and is
// before otherwise: decoded, before with stream_options (whatever its
// spelling) replaced by one with include_usage true and its other
// members; read, the same bound and a stream.
func checkAsksUsage(t *testing.T, before, after []byte) {
	t.Helper()
	var b, a map[string]any
	if err := json.Unmarshal(before, &b); err != nil {
		return // Not JSON to Go's encoding/json: nothing to compare.
	}
	if err := json.Unmarshal(after, &a); err != nil {
		t.Fatalf("%s is not valid JSON: %v", after, err)
	}
	opts := map[string]any{}
	for k, v := range b {
		if strings.EqualFold(k, "stream_options") {
			if o, ok := v.(map[string]any); ok {
				for ok, ov := range o {
					if !strings.EqualFold(ok, "include_usage") {
						opts[ok] = ov
					}
				}
			}
			delete(b, k)
		}
	}
	opts["include_usage"] = true
	b["stream_options"] = opts
	if !reflect.DeepEqual(b, a) {
		t.Errorf("decoded, got %v\nwant %v", a, b)
	}
	var rb, ra Request
	if err := rb.Read("", before); err != nil {
		t.Fatal(err)
	}
	if err := ra.Read("", after); err != nil {
		t.Fatalf("%s: %v", after, err)
	}
	nb, ub := rb.MaxTokens(100)
	na, ua := ra.MaxTokens(100)
	if _, again := ra.StreamUsage(); again || !ra.Stream() || !ra.AsksStreamUsage() || na != nb || ua != ub {
		t.Errorf("%s reads as stream %v, asking for the usage %v (again: %v), bound %d %v; want a stream asking for it, bound %d %v", after, ra.Stream(), ra.AsksStreamUsage(), again, na, ua, nb, ub)
	}
}

func TestNewFields(t *testing.T) {
	for _, paths := range [][]string{
		{""},
		{"a..b"},
		{"a."},
		{"ſ"},
		{`a"b`},
		{`a\u0062`},
		{strings.Repeat("a", maxKey+1)},
		{"a", "A"},
	} {
		if _, err := NewFields(paths...); err == nil {
			t.Errorf("NewFields(%q) = nil error", paths)
		}
	}
	f, err := NewFields("metadata.user_id", "model")
	if err != nil {
		t.Fatal(err)
	}
	values := make([]Value, 2)
	if err := f.Read([]byte(`{"Metadata":{"user_\u0069d":"alice","other":1},"model":"m"}`), values); err != nil {
		t.Fatal(err)
	}
	if user, ok := values[0].Text(); !ok || user != "alice" || values[0].exact {
		t.Errorf("metadata.user_id: %q %v, exact %v; want alice, not spelled as named", user, ok, values[0].exact)
	}
	if model, _ := values[1].Text(); model != "m" || !values[1].exact {
		t.Errorf("model: %q, exact %v; want m, spelled as named", model, values[1].exact)
	}
}

// TestReadAllocations: reading a body for every zone takes no
// allocation, nor do its bound, stream and model.
func TestReadAllocations(t *testing.T) {
	if race.Enabled {
		t.Skip("the race detector allocates")
	}
	body := []byte(`{"model":"gpt-4o-mini","stream":true,"max_tokens":512,"n":2,"options":{"num_predict":100},"messages":[{"role":"user","content":"` + strings.Repeat("Tell me about the sky. ", 85) + `"}]}`)
	var r Request
	allocs := testing.AllocsPerRun(100, func() {
		if err := r.Read("", body); err != nil {
			t.Fatal(err)
		}
		if n, _ := r.MaxTokens(100); n != 1024 || !r.Stream() {
			t.Fatal("read wrong")
		}
		if m, _ := r.ModelName(); string(m) != "gpt-4o-mini" {
			t.Fatal("model read wrong")
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations a read", allocs)
	}
}
