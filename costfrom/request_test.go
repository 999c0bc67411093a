package costfrom

import (
	"encoding/json"
	"reflect"
	"testing"
)

func TestMaxTokens(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       int64
	}{
		{"chat", `{"model":"gpt-4o","messages":[{"role":"user","content":"Hi"}],"max_tokens":300}`, 300},
		{"chat max_completion_tokens", `{"model":"o3","messages":[],"max_completion_tokens":2048}`, 2048},
		{"both: the larger", `{"max_tokens":100,"messages":[],"max_completion_tokens":50}`, 100},
		{"twice: the larger", `{"max_tokens":100,"max_tokens":5000}`, 5000},
		{"responses", `{"model":"gpt-4.1","input":"Hi","max_output_tokens":1000}`, 1000},
		{"anthropic", `{"model":"claude-sonnet-4-5","max_tokens":1024,"messages":[{"role":"user","content":"Hello, world"}]}`, 1024},
		{"ollama", `{"model":"llama3.2","prompt":"Why?","options":{"temperature":0.2,"num_predict":128}}`, 128},
		{"ollama infinite", `{"model":"llama3.2","prompt":"Why?","options":{"num_predict":-1}}`, 4096},
		{"absent", `{"model":"gpt-4o","messages":[{"role":"user","content":"max_tokens: 5"}]}`, 4096},
		{"nested elsewhere", `{"metadata":{"max_tokens":5},"messages":[{"max_tokens":6}]}`, 4096},
		{"zero", `{"max_tokens":0}`, 4096},
		{"fraction", `{"max_tokens":10.5}`, 4096},
		{"string", `{"max_tokens":"10"}`, 4096},
		{"null", `{"max_tokens":null}`, 4096},
		{"not an object", `[{"max_tokens":10}]`, 4096},
		{"cut", `{"max_tokens":10,"messages":[`, 4096},
		{"trailing garbage", `{"max_tokens":10}x`, 4096},
		{"trailing space", "{\"max_tokens\":10}\n", 10},
		{"empty", ``, 4096},
	} {
		if got := MaxTokens([]byte(tc.body), 4096); got != tc.want {
			t.Errorf("%s: MaxTokens = %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestRequestStreamUsage(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       string // "" if the body is not changed
	}{
		{"chat",
			`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Hi"}],"stream":true}`,
			`{"stream_options":{"include_usage":true},"model":"gpt-4o-mini","messages":[{"role":"user","content":"Hi"}],"stream":true}`},
		{"completions, spaces kept",
			"{ \"model\": \"gpt-3.5-turbo-instruct\",\n  \"prompt\": \"Say this is a test\",\n  \"stream\": true }",
			"{\"stream_options\":{\"include_usage\":true}, \"model\": \"gpt-3.5-turbo-instruct\",\n  \"prompt\": \"Say this is a test\",\n  \"stream\": true }"},
		{"include_usage false",
			`{"messages":[],"stream":true,"stream_options":{"include_usage":false}}`,
			`{"messages":[],"stream":true,"stream_options":{"include_usage":true}}`},
		{"stream_options empty",
			`{"messages":[],"stream":true,"stream_options":{ }}`,
			`{"messages":[],"stream":true,"stream_options":{"include_usage":true }}`},
		{"stream_options with another member",
			`{"messages":[],"stream":true,"stream_options":{"include_obfuscation":false}}`,
			`{"messages":[],"stream":true,"stream_options":{"include_usage":true,"include_obfuscation":false}}`},
		{"stream_options null",
			`{"messages":[],"stream":true,"stream_options":null}`,
			`{"messages":[],"stream":true,"stream_options":{"include_usage":true}}`},
		{"stream_options twice: the last",
			`{"messages":[],"stream":true,"stream_options":{"include_usage":true},"stream_options":{}}`,
			`{"messages":[],"stream":true,"stream_options":{"include_usage":true},"stream_options":{"include_usage":true}}`},
		{"usage asked", `{"messages":[],"stream":true,"stream_options":{"include_usage":true}}`, ""},
		{"not streamed", `{"messages":[],"stream":false}`, ""},
		{"stream absent", `{"messages":[]}`, ""},
		{"stream not true", `{"messages":[],"stream":"true"}`, ""},
		{"responses", `{"model":"gpt-4.1","input":"Hi","stream":true}`, ""},
		{"neither messages nor prompt", `{"model":"x","stream":true}`, ""},
		{"not json", `{"messages":[],"stream":true`, ""},
		{"not an object", `[{"messages":[],"stream":true}]`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, changed := RequestStreamUsage([]byte(tc.body))
			if tc.want == "" {
				if changed || string(got) != tc.body {
					t.Errorf("changed to %s", got)
				}
				return
			}
			if !changed || string(got) != tc.want {
				t.Fatalf("got %s, %v\nwant %s", got, changed, tc.want)
			}
			// Nothing else changes: decoded, the body is the request's
			// with stream_options.include_usage true.
			var before, after map[string]any
			if err := json.Unmarshal([]byte(tc.body), &before); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(got, &after); err != nil {
				t.Fatalf("not valid JSON: %v", err)
			}
			opts, _ := before["stream_options"].(map[string]any)
			if opts == nil {
				opts = map[string]any{}
			}
			opts["include_usage"] = true
			before["stream_options"] = opts
			if !reflect.DeepEqual(before, after) {
				t.Errorf("decoded, got %v\nwant %v", after, before)
			}
		})
	}
}
