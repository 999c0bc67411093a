package costfrom

import (
	"strings"
	"testing"
)

// TestGeminiUsage covers what Gemini's usageMetadata leaves out or gives
// as it may, and when a stream of it has a cost.
func TestGeminiUsage(t *testing.T) {
	const (
		jsonType = "application/json; charset=UTF-8"
		sseType  = "text/event-stream"
	)
	chunk := func(usage string, finish bool) string {
		c := `{"candidates":[{"content":{"parts":[{"text":"Hi"}],"role":"model"},"index":0`
		if finish {
			c += `,"finishReason":"STOP"`
		}
		return c + `}],"usageMetadata":` + usage + `,"modelVersion":"gemini-2.5-flash"}`
	}
	sse := func(chunks ...string) string {
		var b strings.Builder
		for _, c := range chunks {
			b.WriteString("data: " + c + "\r\n\r\n")
		}
		return b.String()
	}
	first := chunk(`{"promptTokenCount":10,"candidatesTokenCount":1,"totalTokenCount":11}`, false)
	last := chunk(`{"promptTokenCount":10,"candidatesTokenCount":5,"totalTokenCount":20,"thoughtsTokenCount":5}`, true)
	for _, tc := range []struct {
		name, contentType, body string
		in, out, total          int64
		ok                      bool
	}{
		{"json", jsonType, last, 10, 10, 20, true},
		{"sse", sseType, sse(first, last), 10, 10, 20, true},
		{"array", jsonType, "[" + first + ",\r\n" + last + "]", 10, 10, 20, true},
		{"array with spaces", jsonType, " [ " + first + " , " + last + " ] ", 10, 10, 20, true},
		// The chunks before the last, passed over unread when they are
		// valid JSON, or read (and no further) when they are not.
		{"array of three", jsonType, "[" + first + ",\r\n" + first + ",\r\n" + last + "]", 10, 10, 20, true},
		{"array, a chunk not JSON before the last", jsonType, "[" + `{"usageMetadata" {"promptTokenCount":1}}` + "," + last + "]", 0, 0, 0, false},
		{"array, a chunk with a trailing comma", jsonType, "[" + `{"usageMetadata":{"promptTokenCount":1,}}` + "," + last + "]", 0, 0, 0, false},
		{"array, a chunk with a bad literal", jsonType, "[" + `{"candidates":[{"index":tru}]}` + "," + last + "]", 0, 0, 0, false},
		{"array, a chunk with brackets crossed", jsonType, "[" + `{"candidates":[{"index":0]}}` + "," + last + "]", 0, 0, 0, false},
		{"array, a chunk after the last", jsonType, "[" + last + "," + first + "]", 10, 1, 11, true},
		// A stream cut before its last chunk: the reservation stands.
		{"sse cut", sseType, sse(first), 0, 0, 0, false},
		{"array cut", jsonType, "[" + first + ",\r\n", 0, 0, 0, false},
		// Vertex AI's chunks before the last carry only the traffic type.
		{"vertex traffic type only", sseType, sse(chunk(`{"trafficType":"ON_DEMAND"}`, true)), 0, 0, 0, false},
		// Counts of 0 are left out, as protocol buffers leave them.
		{"blocked prompt", jsonType, `{"promptFeedback":{"blockReason":"SAFETY"},"usageMetadata":{"promptTokenCount":8,"totalTokenCount":8},"modelVersion":"gemini-2.5-flash"}`, 8, 0, 8, true},
		{"blocked prompt streamed", sseType, sse(`{"promptFeedback":{"blockReason":"PROHIBITED_CONTENT"},"usageMetadata":{"promptTokenCount":8,"totalTokenCount":8}}`), 8, 0, 8, true},
		{"no total", jsonType, chunk(`{"promptTokenCount":7,"candidatesTokenCount":3}`, true), 7, 3, 10, true},
		{"finish null", sseType, sse(`{"candidates":[{"finishReason":null}],"usageMetadata":{"promptTokenCount":7}}`), 0, 0, 0, false},
		{"protocol buffer names", sseType, sse(`{"candidates":[{"finish_reason":"STOP"}],"usage_metadata":{"prompt_token_count":7,"candidates_token_count":3,"thoughts_token_count":2,"tool_use_prompt_token_count":1,"total_token_count":13}}`), 8, 5, 13, true},
		{"key given twice: the larger", jsonType, chunk(`{"promptTokenCount":7,"PROMPTTOKENCOUNT":70,"candidatesTokenCount":3}`, true), 70, 3, 73, true},
		{"second candidate finishes", sseType, sse(`{"candidates":[{"index":0},{"index":1,"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":7,"candidatesTokenCount":6}}`), 7, 6, 13, true},
		// Other formats' usage in a streamed array is not read.
		{"openai usage in an array", jsonType, `[{"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}]`, 0, 0, 0, false},
		{"after the array", jsonType, "[" + first + "]" + last, 0, 0, 0, false},
		{"nested deeper", jsonType, `{"response":` + last + `}`, 0, 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := []byte(tc.body)
			for k := 0; k <= len(body); k++ {
				cw, rec := serve(t, tc.contentType, Source{Count: Total}, false, body[:k], body[k:])
				if rec.body.String() != tc.body {
					t.Fatal("the body did not reach the client as it was")
				}
				checkCounts(t, cw, tc.in, tc.out, tc.total, tc.ok)
				if t.Failed() {
					t.Fatalf("split at %d", k)
				}
			}
		})
	}
}

// TestGeminiCachedUsage: Gemini's cached tokens are part of its prompt's,
// priced as cache reads; given twice, they are none, as OpenAI's are.
func TestGeminiCachedUsage(t *testing.T) {
	for _, tc := range []struct {
		usage string
		want  Usage
	}{
		{`{"promptTokenCount":100,"cachedContentTokenCount":60,"candidatesTokenCount":5,"thoughtsTokenCount":3,"toolUsePromptTokenCount":4}`, Usage{Input: 44, CacheRead: 60, Output: 8}},
		{`{"promptTokenCount":100,"cachedContentTokenCount":60,"cached_content_token_count":90,"candidatesTokenCount":5}`, Usage{Input: 100, Output: 5}},
		{`{"promptTokenCount":10,"cachedContentTokenCount":60,"candidatesTokenCount":5}`, Usage{CacheRead: 10, Output: 5}},
	} {
		body := `{"candidates":[{"finishReason":"STOP"}],"usageMetadata":` + tc.usage + `}`
		cw, _ := serve(t, "application/json", Source{Count: Total}, false, []byte(body))
		if u, ok := cw.Usage(); !ok || u != tc.want {
			t.Errorf("%s: Usage() = %+v, %v; want %+v", tc.usage, u, ok, tc.want)
		}
	}
}
