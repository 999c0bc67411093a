package costfrom

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/internal/race"
)

// recorder is the ResponseWriter a Writer wraps in the tests: it keeps the
// body and logs every write and flush, in order.
type recorder struct {
	h       http.Header
	status  int
	body    bytes.Buffer
	log     []string
	flushes int
	// readFrom counts the calls to ReadFrom; failAfter, when positive,
	// makes writes fail once that many bytes were written.
	readFrom  int
	failAfter int
	deadline  time.Time
}

func newRecorder() *recorder { return &recorder{h: http.Header{}} }

func (r *recorder) Header() http.Header { return r.h }

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.failAfter > 0 && r.body.Len()+len(p) > r.failAfter {
		return 0, errors.New("client gone")
	}
	if r.status == 0 {
		r.status = http.StatusOK
	}
	r.log = append(r.log, "write "+string(p))
	return r.body.Write(p)
}

func (r *recorder) Flush() {
	r.flushes++
	r.log = append(r.log, "flush")
}

func (r *recorder) SetWriteDeadline(t time.Time) error {
	r.deadline = t
	return nil
}

// readerFromRecorder is a recorder that can copy from a reader itself, as
// net/http's does (with sendfile).
type readerFromRecorder struct{ *recorder }

func (r readerFromRecorder) ReadFrom(src io.Reader) (int64, error) {
	r.readFrom++
	return r.body.ReadFrom(src)
}

// fixture is a response of one of the formats read, as its API documents
// it, and the counts it reports.
type fixture struct {
	file, contentType string
	in, out, total    int64
	// last is found on the line that completes the usage of a stream;
	// empty for a single JSON value.
	last string
}

var fixtures = []fixture{
	{"openai_chat.json", "application/json", 1117, 46, 1163, ""},
	{"openai_chat_stream.txt", "text/event-stream; charset=utf-8", 9, 12, 21, `"choices":[],"usage"`},
	{"openai_completions.json", "application/json", 5, 7, 12, ""},
	{"openai_completions_stream.txt", "text/event-stream", 5, 4, 9, `"choices":[]`},
	{"openai_responses.json", "application/json", 328, 52, 380, ""},
	{"openai_responses_stream.txt", "text/event-stream; charset=utf-8", 37, 11, 48, `"type":"response.completed"`},
	// Input counts the cache's tokens: 2095 + 100 + 1000.
	{"anthropic_messages.json", "application/json", 3195, 503, 3698, ""},
	{"anthropic_stream.txt", "text/event-stream; charset=utf-8", 35, 15, 50, `"type": "message_delta"`},
	{"ollama_chat.json", "application/json; charset=utf-8", 26, 298, 324, ""},
	{"ollama_chat_stream.ndjson", "application/x-ndjson", 26, 282, 308, `"done":true`},
	{"ollama_generate.json", "application/json; charset=utf-8", 26, 290, 316, ""},
	{"ollama_generate_stream.ndjson", "application/x-ndjson", 26, 259, 285, `"done":true`},
	// Input counts the tool-use prompt: 2152 + 57; output the thoughts:
	// 311 + 882.
	{"gemini_generate.json", "application/json; charset=UTF-8", 2209, 1193, 3402, ""},
	{"gemini_stream.txt", "text/event-stream", 1065, 405, 1470, `"finishReason"`},
	// streamGenerateContent without alt=sse: a JSON array.
	{"gemini_stream_array.json", "application/json; charset=UTF-8", 96, 80, 176, ""},
	{"vertex_stream.txt", "text/event-stream", 12, 9, 21, `"finishReason"`},
}

func (f fixture) body(t testing.TB) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", f.file))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// usageEnd is where, in body, the usage is complete: after the JSON
// value that carries it.
func (f fixture) usageEnd(t testing.TB, body []byte) int {
	t.Helper()
	if f.last == "" {
		return bytes.LastIndexByte(body, '}') + 1
	}
	i := bytes.Index(body, []byte(f.last))
	if i < 0 || bytes.Count(body, []byte(f.last)) != 1 {
		t.Fatalf("%s: %q is not on one line", f.file, f.last)
	}
	j := bytes.IndexByte(body[i:], '\n')
	return bytes.LastIndexByte(body[:i+j], '}') + 1
}

// serve writes body through a Writer in the pieces given, and returns the
// Writer and what reached the client.
func serve(t testing.TB, contentType string, src Source, hide bool, pieces ...[]byte) (*Writer, *recorder) {
	t.Helper()
	rec := newRecorder()
	cw := Wrap(rec, src)
	if hide {
		cw.HideStreamUsage()
	}
	if contentType != "" {
		cw.Header().Set("Content-Type", contentType)
	}
	cw.WriteHeader(http.StatusOK)
	for _, p := range pieces {
		if n, err := cw.Write(p); n != len(p) || err != nil {
			t.Fatalf("Write = %d, %v; want %d, nil", n, err, len(p))
		}
	}
	return cw, rec
}

// checkCounts checks the counts a Writer read.
func checkCounts(t testing.TB, cw *Writer, in, out, total int64, ok bool) {
	t.Helper()
	for _, c := range []struct {
		count Count
		want  int64
	}{{Input, in}, {Output, out}, {Total, total}} {
		got, gotOK := cw.Tokens(c.count)
		if gotOK != ok || ok && got != c.want {
			t.Errorf("Tokens(%d) = %d, %v; want %d, %v", c.count, got, gotOK, c.want, ok)
		}
	}
}

func TestFormats(t *testing.T) {
	for _, f := range fixtures {
		t.Run(f.file, func(t *testing.T) {
			body := f.body(t)
			cw, rec := serve(t, f.contentType, Source{Count: Total}, false, body)
			if !bytes.Equal(rec.body.Bytes(), body) {
				t.Fatal("the body did not reach the client as it was")
			}
			if len(rec.log) != 1 {
				t.Errorf("%d writes reached the client, want 1", len(rec.log))
			}
			checkCounts(t, cw, f.in, f.out, f.total, true)
			if cost, ok := cw.Cost(); !ok || cost != f.total {
				t.Errorf("Cost() = %d, %v; want %d, true", cost, ok, f.total)
			}
		})
	}
}

// TestFormatsSplit writes each fixture in two pieces, split at every
// position, and a byte at a time.
func TestFormatsSplit(t *testing.T) {
	for _, f := range fixtures {
		t.Run(f.file, func(t *testing.T) {
			body := f.body(t)
			for k := 0; k <= len(body); k++ {
				cw, rec := serve(t, f.contentType, Source{Count: Total}, false, body[:k], body[k:])
				if !bytes.Equal(rec.body.Bytes(), body) {
					t.Fatalf("split at %d: the body did not reach the client as it was", k)
				}
				checkCounts(t, cw, f.in, f.out, f.total, true)
				if t.Failed() {
					t.Fatalf("split at %d", k)
				}
			}
			pieces := make([][]byte, len(body))
			for i := range body {
				pieces[i] = body[i : i+1]
			}
			cw, _ := serve(t, f.contentType, Source{Count: Total}, false, pieces...)
			checkCounts(t, cw, f.in, f.out, f.total, true)
		})
	}
}

// TestFormatsCut cuts each fixture at every position: there is a cost only
// once the JSON value carrying the usage is whole.
func TestFormatsCut(t *testing.T) {
	for _, f := range fixtures {
		t.Run(f.file, func(t *testing.T) {
			body := f.body(t)
			end := f.usageEnd(t, body)
			for k := 0; k < len(body); k++ {
				cw, _ := serve(t, f.contentType, Source{Count: Total}, false, body[:k])
				got, ok := cw.Cost()
				if ok != (k >= end) || ok && got != f.total {
					t.Fatalf("cut at %d (usage ends at %d): Cost() = %d, %v", k, end, got, ok)
				}
			}
		})
	}
}

// TestLineEndings reads the event streams with CRLF and CR line endings,
// and with each event's JSON over two data lines.
func TestLineEndings(t *testing.T) {
	for _, f := range fixtures {
		if !strings.HasPrefix(f.contentType, "text/event-stream") {
			continue
		}
		body := f.body(t)
		variants := map[string][]byte{
			"crlf": bytes.ReplaceAll(body, []byte("\n"), []byte("\r\n")),
			"cr":   bytes.ReplaceAll(body, []byte("\n"), []byte("\r")),
			// The data field's space is optional; a second data line
			// is joined to the first by a newline.
			"lines": bytes.ReplaceAll(body, []byte(`,"`), []byte(",\ndata:\"")),
		}
		for name, b := range variants {
			t.Run(f.file+"/"+name, func(t *testing.T) {
				for k := 0; k <= len(b); k++ {
					cw, _ := serve(t, f.contentType, Source{Count: Total}, false, b[:k], b[k:])
					checkCounts(t, cw, f.in, f.out, f.total, true)
					if t.Failed() {
						t.Fatalf("split at %d", k)
					}
				}
			})
		}
	}
}

func TestNoCost(t *testing.T) {
	for _, tc := range []struct {
		name, contentType, encoding, body string
	}{
		{"error", "application/json", "", `{"error":{"message":"Rate limit reached","type":"requests","param":null,"code":"rate_limit_exceeded"}}`},
		{"anthropic error event", "text/event-stream", "", "event: error\ndata: {\"type\": \"error\", \"error\": {\"type\": \"overloaded_error\", \"message\": \"Overloaded\"}}\n\n"},
		{"not json", "text/plain", "", `{"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`},
		{"no content type", "", "", `{"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`},
		{"compressed", "application/json", "gzip", `{"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`},
		{"array", "application/json", "", `[{"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}]`},
		{"nested deeper", "application/json", "", `{"data":{"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}}`},
		{"usage null", "application/json", "", `{"usage":null}`},
		{"usage empty", "application/json", "", `{"usage":{}}`},
		{"stream without usage", "text/event-stream", "", readFixture(t, "openai_chat_stream_plain.txt")},
		{"anthropic start only", "text/event-stream", "", "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n"},
		{"ollama not done", "application/x-ndjson", "", `{"model":"llama3.2","response":"The","done":false}` + "\n"},
		{"ollama done without counts", "application/x-ndjson", "", `{"model":"llama3.2","response":"","done":true}` + "\n"},
		{"broken json", "application/json", "", `{"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := newRecorder()
			cw := Wrap(rec, Source{Count: Total})
			if tc.contentType != "" {
				cw.Header().Set("Content-Type", tc.contentType)
			}
			if tc.encoding != "" {
				cw.Header().Set("Content-Encoding", tc.encoding)
			}
			io.WriteString(cw, tc.body)
			checkCounts(t, cw, 0, 0, 0, false)
			if rec.body.String() != tc.body {
				t.Error("the body did not reach the client as it was")
			}
		})
	}
}

func readFixture(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestCounts covers the counts each format leaves out or gives as it may.
func TestCounts(t *testing.T) {
	for _, tc := range []struct {
		name, contentType, body string
		in, out, total          int64
		inOK, outOK, totalOK    bool
	}{
		{"invalid count", "application/json", `{"usage":{"prompt_tokens":-1,"completion_tokens":3}}`, 0, 3, 0, false, true, false},
		{"fraction", "application/json", `{"usage":{"prompt_tokens":1.5,"completion_tokens":3,"total_tokens":4}}`, 0, 3, 4, false, true, true},
		// A count of more than 18 digits is read as the largest of 18:
		// larger than any limit, not absent.
		{"too large", "application/json", `{"usage":{"prompt_tokens":1234567890123456789,"completion_tokens":3}}`, maxCount, 3, maxCount + 3, true, true, true},
		{"far too large", "application/json", `{"usage":{"prompt_tokens":1` + strings.Repeat("0", 40) + `,"completion_tokens":3,"total_tokens":` + strings.Repeat("9", 25) + `}}`, maxCount, 3, maxCount, true, true, true},
		{"string", "application/json", `{"usage":{"prompt_tokens":"1","completion_tokens":3}}`, 0, 3, 0, false, true, false},
		{"total only", "application/json", `{"usage":{"total_tokens":7}}`, 0, 0, 7, false, false, true},
		{"keys in another order, spaces", "application/json", "{ \"usage\" : { \"total_tokens\" : 30 , \"completion_tokens\" : 20 , \"prompt_tokens\" : 10 } , \"choices\" : [ ] }", 10, 20, 30, true, true, true},
		{"ollama omits a zero count", "application/x-ndjson", `{"done":true,"eval_count":5}` + "\n", 0, 5, 5, true, true, true},
		{"anthropic delta with input", "text/event-stream",
			"data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":3,\"cache_read_input_tokens\":4,\"output_tokens\":1}}}\n\n" +
				"data: {\"type\":\"message_delta\",\"usage\":{\"input_tokens\":5,\"output_tokens\":7}}\n\n" +
				"data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":9}}\n\n",
			9, 9, 18, true, true, true},
		{"responses incomplete", "text/event-stream",
			"event: response.incomplete\ndata: {\"type\":\"response.incomplete\",\"response\":{\"status\":\"incomplete\",\"usage\":{\"input_tokens\":8,\"output_tokens\":16,\"total_tokens\":24}}}\n\n",
			8, 16, 24, true, true, true},
		{"comments and other fields", "text/event-stream",
			": keep-alive\n\nid: 1\nretry: 100\nevent: x\ndatax: {\"usage\":{\"total_tokens\":1}}\ndata: {\"usage\":{\"total_tokens\":3}}\n\n",
			0, 0, 3, false, false, true},
		{"json seq with trailing text", "application/json", `{"usage":{"total_tokens":3}}` + "\n\n", 0, 0, 3, false, false, true},
		{"problem+json", "application/problem+json", `{"usage":{"total_tokens":3}}`, 0, 0, 3, false, false, true},
		{"escaped key, twice: the larger", "application/json", `{"usage":{"total_tokens":3,"total\u005ftokens":5}}`, 0, 0, 5, false, false, true},
		{"twice: the larger first", "application/json", `{"usage":{"total_tokens":5,"total_tokens":3}}`, 0, 0, 5, false, false, true},
		{"keys in any case", "application/json", "{\"USAGE\":{\"Prompt_Tokens\":1,\"COMPLETION_TO\u212aENS\":2,\"total_tokenſ\":3}}", 1, 2, 3, true, true, true},
		{"escapes in every key", "application/json", `{"\u0075sage":{"prompt\u005Ftokens":1,"completion_tokens\u0020":2,"\u0074otal_tokens":3}}`, 1, 0, 3, true, false, true},
		{"stream: usage in capitals", "text/event-stream", "data: {\"choices\":[],\"USAGE\":{\"total_tokens\":3}}\n\n", 0, 0, 3, false, false, true},
		{"stream: usage escaped", "text/event-stream", "data: {\"choices\":[],\"us\\u0061ge\":{\"total_tokens\":3}}\n\n", 0, 0, 3, false, false, true},
		{"stream: usage with a long s", "text/event-stream", "data: {\"choices\":[],\"uſage\":{\"total_tokens\":3}}\n\n", 0, 0, 3, false, false, true},
		{"ollama done in capitals", "application/x-ndjson", `{"DONE":true,"Eval_Count":5}` + "\n", 0, 5, 5, true, true, true},
		{"deep values are skipped", "application/json", `{"a":[{"usage":{"total_tokens":9}},"]}\"{"],"b":{"c":{"d":{"usage":{"total_tokens":8}}}},"usage":{"total_tokens":3}}`, 0, 0, 3, false, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cw, _ := serve(t, tc.contentType, Source{Count: Total}, false, []byte(tc.body))
			for _, c := range []struct {
				count Count
				want  int64
				ok    bool
			}{{Input, tc.in, tc.inOK}, {Output, tc.out, tc.outOK}, {Total, tc.total, tc.totalOK}} {
				got, ok := cw.Tokens(c.count)
				if ok != c.ok || ok && got != c.want {
					t.Errorf("Tokens(%d) = %d, %v; want %d, %v", c.count, got, ok, c.want, c.ok)
				}
			}
		})
	}
}

// TestUsageByKind reads each kind of token a price table prices apart,
// and the model the response names, whole and a byte at a time.
func TestUsageByKind(t *testing.T) {
	const oneEach = `{"prompt_tokens":1,"completion_tokens":1}`
	for _, tc := range []struct {
		name, contentType, body string
		want                    Usage
		model                   string
	}{
		{"openai: cached tokens are part of the prompt's", "application/json",
			`{"model":"gpt-4o-2024-08-06","usage":{"prompt_tokens":1117,"completion_tokens":46,"total_tokens":1163,"prompt_tokens_details":{"cached_tokens":1024,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":10}}}`,
			Usage{Input: 93, Output: 46, CacheRead: 1024}, "gpt-4o-2024-08-06"},
		{"openai stream: the last chunk's usage", "text/event-stream",
			"data: {\"model\":\"gpt-4o-mini\",\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n" +
				"data: {\"model\":\"gpt-4o-mini\",\"choices\":[],\"usage\":{\"prompt_tokens\":2000,\"completion_tokens\":5,\"prompt_tokens_details\":{\"cached_tokens\":1920}}}\n\ndata: [DONE]\n\n",
			Usage{Input: 80, Output: 5, CacheRead: 1920}, "gpt-4o-mini"},
		{"responses", "application/json",
			`{"model":"gpt-4.1","usage":{"input_tokens":328,"input_tokens_details":{"cached_tokens":128},"output_tokens":52,"total_tokens":380}}`,
			Usage{Input: 200, Output: 52, CacheRead: 128}, "gpt-4.1"},
		{"responses stream: response.usage, four levels down", "text/event-stream",
			"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"model\":\"gpt-4.1\",\"usage\":null}}\n\n" +
				"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"model\":\"gpt-4.1-2025-04-14\",\"usage\":{\"input_tokens\":37,\"input_tokens_details\":{\"cached_tokens\":30},\"output_tokens\":11}}}\n\n",
			Usage{Input: 7, Output: 11, CacheRead: 30}, "gpt-4.1-2025-04-14"},
		{"anthropic: cache reads and writes beside the input, 1-hour writes apart", "application/json",
			`{"model":"claude-sonnet-4-5","usage":{"input_tokens":2095,"cache_creation_input_tokens":100,"cache_read_input_tokens":1000,"cache_creation":{"ephemeral_5m_input_tokens":40,"ephemeral_1h_input_tokens":60},"output_tokens":503}}`,
			Usage{Input: 2095, Output: 503, CacheRead: 1000, CacheWrite: 40, CacheWrite1h: 60}, "claude-sonnet-4-5"},
		{"anthropic stream", "text/event-stream",
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-opus-4-1\",\"usage\":{\"input_tokens\":25,\"cache_creation_input_tokens\":300,\"cache_read_input_tokens\":10,\"cache_creation\":{\"ephemeral_1h_input_tokens\":200},\"output_tokens\":1}}}\n\n" +
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n",
			Usage{Input: 25, Output: 15, CacheRead: 10, CacheWrite: 100, CacheWrite1h: 200}, "claude-opus-4-1"},
		{"ollama", "application/json", `{"model":"llama3.2","done":true,"prompt_eval_count":26,"eval_count":298}`,
			Usage{Input: 26, Output: 298}, "llama3.2"},
		// A discount read one way by one server and another way by
		// another is none: the prompt is priced whole.
		{"cached tokens twice", "application/json",
			`{"usage":{"prompt_tokens":100,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":90,"Cached_Tokens":10}}}`,
			Usage{Input: 100, Output: 1}, ""},
		{"their object twice", "application/json",
			`{"usage":{"prompt_tokens":100,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":90},"prompt_tokens_details":{}}}`,
			Usage{Input: 100, Output: 1}, ""},
		{"usage twice", "application/json",
			`{"usage":{"prompt_tokens":100,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":90}},"usage":{"prompt_tokens":100,"completion_tokens":1}}`,
			Usage{Input: 100, Output: 1}, ""},
		{"more cached than the prompt: the prompt, cached", "application/json",
			`{"usage":{"prompt_tokens":10,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":90}}}`,
			Usage{Output: 1, CacheRead: 10}, ""},
		{"more 1-hour writes than writes: the writes, 1-hour", "application/json",
			`{"usage":{"input_tokens":1,"output_tokens":1,"cache_creation_input_tokens":5,"cache_creation":{"ephemeral_1h_input_tokens":9}}}`,
			Usage{Input: 1, Output: 1, CacheWrite1h: 5}, ""},
		{"the model given last counts", "application/json", `{"model":"a","role":"x","MODEL":"b","usage":` + oneEach + `}`, Usage{Input: 1, Output: 1}, "b"},
		{"a model with an escape is not read", "application/json", `{"model":"gpt\u002d4o","usage":` + oneEach + `}`, Usage{Input: 1, Output: 1}, ""},
		{"nor one too long", "application/json", `{"model":"` + strings.Repeat("x", maxModel+1) + `","usage":` + oneEach + `}`, Usage{Input: 1, Output: 1}, ""},
		{"a model that is no string is not read", "application/json", `{"model":7,"usage":` + oneEach + `}`, Usage{Input: 1, Output: 1}, ""},
		{"nor one deeper", "application/json", `{"choices":[{"model":"x"}],"metadata":{"model":"y"},"usage":` + oneEach + `}`, Usage{Input: 1, Output: 1}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := []byte(tc.body)
			pieces := make([][]byte, len(body))
			for i := range body {
				pieces[i] = body[i : i+1]
			}
			for _, p := range [][][]byte{{body}, pieces} {
				cw, _ := serve(t, tc.contentType, Source{Count: Total}, false, p...)
				got, ok := cw.Usage()
				if !ok || got != tc.want {
					t.Errorf("in %d pieces: Usage() = %+v, %v; want %+v", len(p), got, ok, tc.want)
				}
				if m := string(cw.Model()); m != tc.model {
					t.Errorf("in %d pieces: Model() = %q, want %q", len(p), m, tc.model)
				}
			}
		})
	}
}

// TestFixturesUsage: each fixture's usage, priced by kind, and the
// model it names, as its API documents them.
func TestFixturesUsage(t *testing.T) {
	want := map[string]struct {
		u     Usage
		model string
	}{
		"openai_chat.json":              {Usage{Input: 1117 - 1024, Output: 46, CacheRead: 1024}, "gpt-4o-2024-08-06"},
		"openai_chat_stream.txt":        {Usage{Input: 1, Output: 12, CacheRead: 8}, "gpt-4o-mini"},
		"openai_completions.json":       {Usage{Input: 5, Output: 7}, "gpt-3.5-turbo-instruct"},
		"openai_completions_stream.txt": {Usage{Input: 5, Output: 4}, "gpt-3.5-turbo-instruct"},
		"openai_responses.json":         {Usage{Input: 328 - 128, Output: 52, CacheRead: 128}, "gpt-4o-2024-08-06"},
		"openai_responses_stream.txt":   {Usage{Input: 37 - 32, Output: 11, CacheRead: 32}, "gpt-4.1-2025-04-14"},
		"anthropic_messages.json":       {Usage{Input: 2095, Output: 503, CacheRead: 1000, CacheWrite: 40, CacheWrite1h: 60}, "claude-sonnet-4-5-20250929"},
		"anthropic_stream.txt":          {Usage{Input: 25, Output: 15, CacheRead: 10}, "claude-sonnet-4-5-20250929"},
		"ollama_chat.json":              {Usage{Input: 26, Output: 298}, "llama3.2"},
		"ollama_chat_stream.ndjson":     {Usage{Input: 26, Output: 282}, "llama3.2"},
		"ollama_generate.json":          {Usage{Input: 26, Output: 290}, "llama3.2"},
		"ollama_generate_stream.ndjson": {Usage{Input: 26, Output: 259}, "llama3.2"},
		"gemini_generate.json":          {Usage{Input: 2209 - 2048, Output: 1193, CacheRead: 2048}, "gemini-2.5-flash"},
		"gemini_stream.txt":             {Usage{Input: 1065 - 512, Output: 405, CacheRead: 512}, "gemini-2.5-flash"},
		"gemini_stream_array.json":      {Usage{Input: 96, Output: 80}, "gemini-2.5-pro"},
		"vertex_stream.txt":             {Usage{Input: 12, Output: 9}, "gemini-2.5-flash-lite"},
	}
	for _, f := range fixtures {
		cw, _ := serve(t, f.contentType, Source{Count: Total}, false, f.body(t))
		u, ok := cw.Usage()
		if w := want[f.file]; !ok || u != w.u || string(cw.Model()) != w.model {
			t.Errorf("%s: Usage() = %+v, %v, Model() = %q; want %+v, %q", f.file, u, ok, cw.Model(), w.u, w.model)
		}
	}
}

// TestUsageWithoutInputOrOutput: a usage that gives its total alone, or
// one of input and output, cannot be priced.
func TestUsageWithoutInputOrOutput(t *testing.T) {
	for _, body := range []string{
		`{"usage":{"total_tokens":9}}`,
		`{"usage":{"prompt_tokens":9}}`,
		`{"usage":{"completion_tokens":9,"prompt_tokens_details":{"cached_tokens":1}}}`,
	} {
		cw, _ := serve(t, "application/json", Source{Count: Total}, false, []byte(body))
		if u, ok := cw.Usage(); ok {
			t.Errorf("%s: Usage() = %+v, true; want none", body, u)
		}
	}
}

func TestHeaderCost(t *testing.T) {
	for _, tc := range []struct {
		name string
		// before is set before the header is written, after once the
		// body is.
		before, after map[string]string
		want          int64
		ok            bool
	}{
		{"header", map[string]string{"X-Tokens": " 42 "}, nil, 42, true},
		{"zero", map[string]string{"X-Tokens": "0"}, nil, 0, true},
		{"absent", nil, nil, 0, false},
		{"negative", map[string]string{"X-Tokens": "-3"}, nil, 0, false},
		{"not a number", map[string]string{"X-Tokens": "12 tokens"}, nil, 0, false},
		{"18 digits", map[string]string{"X-Tokens": "123456789012345678"}, nil, 123456789012345678, true},
		{"too large", map[string]string{"X-Tokens": "1234567890123456789"}, nil, maxCount, true},
		{"far too large", map[string]string{"X-Tokens": strings.Repeat("9", 40)}, nil, maxCount, true},
		{"declared trailer", map[string]string{"Trailer": "X-Other, x-tokens"}, map[string]string{"X-Tokens": "17"}, 17, true},
		{"declared trailer never sent", map[string]string{"Trailer": "X-Tokens"}, nil, 0, false},
		{"trailer prefix", nil, map[string]string{http.TrailerPrefix + "X-Tokens": "19"}, 19, true},
		{"trailer prefix over header", map[string]string{"X-Tokens": "5"}, map[string]string{http.TrailerPrefix + "X-Tokens": "19"}, 19, true},
		// A header changed after it was sent is not what the client saw.
		{"undeclared change", map[string]string{"X-Tokens": "5"}, map[string]string{"X-Tokens": "6"}, 5, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := newRecorder()
			cw := Wrap(rec, Source{Header: "x-tokens"})
			for k, v := range tc.before {
				cw.Header().Set(k, v)
			}
			cw.Header().Set("Content-Type", "application/json")
			cw.WriteHeader(http.StatusOK)
			io.WriteString(cw, `{"usage":{"total_tokens":1000}}`)
			for k, v := range tc.after {
				cw.Header()[k] = []string{v}
			}
			if got, ok := cw.Cost(); ok != tc.ok || got != tc.want {
				t.Errorf("Cost() = %d, %v; want %d, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
	t.Run("nothing written", func(t *testing.T) {
		rec := newRecorder()
		cw := Wrap(rec, Source{Header: "X-Tokens"})
		cw.Header().Set("X-Tokens", "8")
		if got, ok := cw.Cost(); !ok || got != 8 {
			t.Errorf("Cost() = %d, %v; want 8, true", got, ok)
		}
	})
}

// TestInformational reads the format from the final header, not from an
// informational response's.
func TestInformational(t *testing.T) {
	rec := newRecorder()
	cw := Wrap(rec, Source{Count: Total})
	cw.Header().Set("Link", "</style.css>; rel=preload")
	cw.WriteHeader(http.StatusEarlyHints)
	cw.Header().Set("Content-Type", "application/json")
	cw.WriteHeader(http.StatusOK)
	io.WriteString(cw, `{"usage":{"total_tokens":3}}`)
	if got, ok := cw.Cost(); !ok || got != 3 {
		t.Errorf("Cost() = %d, %v; want 3, true", got, ok)
	}
}

// TestFlushPassesThrough checks that every write reaches the client as it
// is, before the next, and every flush after it.
func TestFlushPassesThrough(t *testing.T) {
	for _, f := range fixtures {
		t.Run(f.file, func(t *testing.T) {
			body := f.body(t)
			rec := newRecorder()
			cw := Wrap(rec, Source{Count: Total})
			cw.Header().Set("Content-Type", f.contentType)
			cw.WriteHeader(http.StatusOK)
			var want []string
			for i, line := range bytes.SplitAfter(body, []byte("\n")) {
				if len(line) == 0 {
					continue
				}
				cw.Write(line)
				want = append(want, "write "+string(line))
				if len(rec.log) != len(want) {
					t.Fatalf("after write %d, the client has %d writes", i, len(rec.log))
				}
				if i%2 == 0 {
					cw.Flush()
				} else if err := http.NewResponseController(cw).Flush(); err != nil {
					t.Fatal(err)
				}
				want = append(want, "flush")
			}
			if strings.Join(rec.log, "|") != strings.Join(want, "|") {
				t.Errorf("the client saw\n%q\nwant\n%q", rec.log, want)
			}
			checkCounts(t, cw, f.in, f.out, f.total, true)
		})
	}
}

func TestResponseController(t *testing.T) {
	rec := newRecorder()
	cw := Wrap(rec, Source{Count: Total})
	deadline := time.Unix(1700000000, 0)
	if err := http.NewResponseController(cw).SetWriteDeadline(deadline); err != nil {
		t.Fatal(err)
	}
	if !rec.deadline.Equal(deadline) {
		t.Error("SetWriteDeadline did not reach the wrapped ResponseWriter")
	}
}

func TestReadFrom(t *testing.T) {
	body := `{"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`
	t.Run("read", func(t *testing.T) {
		rec := readerFromRecorder{newRecorder()}
		cw := Wrap(rec, Source{Count: Total})
		cw.Header().Set("Content-Type", "application/json")
		if n, err := cw.ReadFrom(strings.NewReader(body)); n != int64(len(body)) || err != nil {
			t.Fatalf("ReadFrom = %d, %v", n, err)
		}
		if rec.readFrom != 0 {
			t.Error("the body went around the Writer")
		}
		if got, ok := cw.Cost(); !ok || got != 3 || rec.body.String() != body {
			t.Errorf("Cost() = %d, %v; body %q", got, ok, rec.body.String())
		}
	})
	t.Run("not read", func(t *testing.T) {
		rec := readerFromRecorder{newRecorder()}
		cw := Wrap(rec, Source{Header: "X-Tokens"})
		cw.Header().Set("Content-Type", "application/json")
		cw.ReadFrom(strings.NewReader(body))
		if rec.readFrom != 1 || rec.body.String() != body {
			t.Errorf("ReadFrom was not left to the wrapped ResponseWriter")
		}
	})
}

// TestWriteError passes on the error of a client gone.
func TestWriteError(t *testing.T) {
	for _, hide := range []bool{false, true} {
		rec := newRecorder()
		rec.failAfter = 10
		cw := Wrap(rec, Source{Count: Total})
		if hide {
			cw.HideStreamUsage()
		}
		cw.Header().Set("Content-Type", "text/event-stream")
		if _, err := io.WriteString(cw, readFixture(t, "openai_chat_stream.txt")); err == nil {
			t.Errorf("hide %v: no error", hide)
		}
	}
}

// hideCases are streams a request rewritten by RequestStreamUsage gets,
// and what its client must see.
func hideCases(t testing.TB) []struct{ name, in, want string } {
	cases := []struct{ name, in, want string }{
		{"chat", readFixture(t, "openai_chat_stream.txt"), readFixture(t, "openai_chat_stream_plain.txt")},
		{"completions", readFixture(t, "openai_completions_stream.txt"), readFixture(t, "openai_completions_stream_plain.txt")},
		{"usage first, spaces, comments",
			": keep-alive\n\ndata: {\"usage\": null , \"choices\":[{\"index\":0}]}\n\nevent: chunk\ndata: { \"usage\" : null }\n\ndata: {\"choices\" : [ ] , \"usage\" : {\"prompt_tokens\":9,\"completion_tokens\":12,\"total_tokens\":21}}\n\ndata: [DONE]\n\n",
			": keep-alive\n\ndata: {\"choices\":[{\"index\":0}]}\n\nevent: chunk\ndata: {  }\n\ndata: [DONE]\n\n"},
		{"over two data lines",
			"data: {\"choices\":[{\"index\":0}],\ndata: \"usage\":null}\n\ndata: {\"choices\":[],\ndata: \"usage\":{\"prompt_tokens\":9,\"completion_tokens\":12,\"total_tokens\":21}}\n\n",
			"data: {\"choices\":[{\"index\":0}]}\n\n"},
		{"not json", "data: {\"choices\":[]\n\ndata: hello\n\n", "data: {\"choices\":[]\n\ndata: hello\n\n"},
	}
	for _, c := range cases[:2] {
		cases = append(cases, struct{ name, in, want string }{c.name + " crlf",
			strings.ReplaceAll(c.in, "\n", "\r\n"), strings.ReplaceAll(c.want, "\n", "\r\n")})
		cases = append(cases, struct{ name, in, want string }{c.name + " cr",
			strings.ReplaceAll(c.in, "\n", "\r"), strings.ReplaceAll(c.want, "\n", "\r")})
	}
	return cases
}

// TestHideStreamUsage checks that the client sees the stream it asked for,
// whatever the writes, and that the usage is read.
func TestHideStreamUsage(t *testing.T) {
	for _, tc := range hideCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			in := []byte(tc.in)
			check := func(how string, pieces ...[]byte) {
				t.Helper()
				cw, rec := serve(t, "text/event-stream", Source{Count: Total}, true, pieces...)
				if rec.body.String() != tc.want {
					t.Fatalf("%s: the client saw\n%q\nwant\n%q", how, rec.body.String(), tc.want)
				}
				if strings.Contains(tc.in, `"total_tokens":21`) {
					checkCounts(t, cw, 9, 12, 21, true)
				}
			}
			check("one write", in)
			for k := 0; k <= len(in); k++ {
				check(fmt.Sprintf("split at %d", k), in[:k], in[k:])
			}
			for k := 1; k <= 7; k++ {
				var pieces [][]byte
				for i := 0; i < len(in); i += k {
					pieces = append(pieces, in[i:min(i+k, len(in))])
				}
				check(fmt.Sprintf("%d bytes at a time", k), pieces...)
			}
		})
	}
}

// TestHideLeavesOthers passes the other formats on as they are.
func TestHideLeavesOthers(t *testing.T) {
	for _, f := range fixtures {
		if f.last == "" || strings.HasPrefix(f.file, "openai_c") {
			continue
		}
		t.Run(f.file, func(t *testing.T) {
			body := f.body(t)
			for k := 0; k <= len(body); k += 7 {
				cw, rec := serve(t, f.contentType, Source{Count: Total}, true, body[:k], body[k:])
				if !bytes.Equal(rec.body.Bytes(), body) {
					t.Fatalf("split at %d: the client saw\n%s", k, rec.body.Bytes())
				}
				checkCounts(t, cw, f.in, f.out, f.total, true)
				if t.Failed() {
					t.Fatalf("split at %d", k)
				}
			}
		})
	}
}

// TestHideFlushes checks that under HideStreamUsage, an event whole in a
// write reaches the client before the write returns.
func TestHideFlushes(t *testing.T) {
	body := readFixture(t, "openai_chat_stream.txt")
	want := strings.SplitAfter(readFixture(t, "openai_chat_stream_plain.txt"), "\n\n")
	rec := newRecorder()
	cw := Wrap(rec, Source{Count: Total})
	cw.HideStreamUsage()
	cw.Header().Set("Content-Type", "text/event-stream")
	seen := 0
	for _, event := range strings.SplitAfter(body, "\n\n") {
		io.WriteString(cw, event)
		cw.Flush()
		if strings.Contains(event, `"choices":[]`) || event == "" {
			continue
		}
		if got := rec.body.String(); got != strings.Join(want[:seen+1], "") {
			t.Fatalf("after event %d the client has\n%s", seen, got)
		}
		seen++
	}
	if rec.flushes == 0 {
		t.Error("no flush reached the client")
	}
}

// TestHideLargeEvent passes on an event too large to hold as it comes.
func TestHideLargeEvent(t *testing.T) {
	event := `data: {"choices":[{"delta":{"content":"` + strings.Repeat("a", 2*maxHold) + `"}}],"usage":null}` + "\n\n"
	rec := newRecorder()
	cw := Wrap(rec, Source{Count: Total})
	cw.HideStreamUsage()
	cw.Header().Set("Content-Type", "text/event-stream")
	for i := 0; i < len(event); i += 1000 {
		io.WriteString(cw, event[i:min(i+1000, len(event))])
		if held := i + 1000 - rec.body.Len(); held > maxHold+1000 {
			t.Fatalf("%d bytes held", held)
		}
	}
	if rec.body.String() != event {
		t.Error("the large event did not reach the client as it was")
	}
}

// TestLargeBodyMemory writes 50 MiB bodies, made as they are written, in
// 32 KiB writes: the memory the Writer takes must not grow with them.
func TestLargeBodyMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 50 MiB bodies")
	}
	const size = 50 << 20
	fill := bytes.Repeat([]byte("abcdefghi "), 32<<10/10)
	for _, tc := range []struct {
		name, contentType, head, tail string
		hide                          bool
	}{
		{"json", "application/json", `{"id":"x","choices":[{"message":{"content":"`, `"}}],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`, false},
		{"json string at the top", "application/json", `{"response":"`, `","done":true,"prompt_eval_count":1,"eval_count":2}`, false},
		{"event", "text/event-stream", `data: {"choices":[{"delta":{"content":"`, `"}}],"usage":null}` + "\n\n" + `data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}` + "\n\n", false},
		{"event hidden", "text/event-stream", `data: {"choices":[{"delta":{"content":"`, `"}}],"usage":null}` + "\n\n" + `data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}` + "\n\n", true},
		{"deep arrays", "application/json", `{"a":` + strings.Repeat("[", 1000) + `"`, `"` + strings.Repeat("]", 1000) + `,"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := discard{h: http.Header{"Content-Type": {tc.contentType}}}
			cw := Wrap(&rec, Source{Count: Total})
			write := func() {
				cw.Reset(&rec, Source{Count: Total})
				if tc.hide {
					cw.HideStreamUsage()
				}
				cw.WriteHeader(http.StatusOK)
				io.WriteString(cw, tc.head)
				for n := 0; n < size; n += len(fill) {
					cw.Write(fill)
				}
				io.WriteString(cw, tc.tail)
			}
			write() // the hold buffer, once
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			write()
			runtime.ReadMemStats(&after)
			if got, ok := cw.Tokens(Total); !ok || got != 3 {
				t.Errorf("Tokens(Total) = %d, %v; want 3, true", got, ok)
			}
			// io.WriteString allocates a copy of its strings.
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 16<<10 && !race.Enabled {
				t.Errorf("writing 50 MiB allocated %d bytes", grew)
			}
		})
	}
}

// discard is a ResponseWriter that keeps nothing, for the benchmarks and
// the memory test.
type discard struct {
	h http.Header
	n int
}

func (d *discard) Header() http.Header { return d.h }
func (d *discard) WriteHeader(int)     {}
func (d *discard) Write(p []byte) (int, error) {
	d.n += len(p)
	return len(p), nil
}
func (d *discard) Flush() {}
