package costfrom

import (
	"errors"
	"testing"

	"github.com/d61b427a/caddy-rate-limit/internal/race"
)

// The paths of Google's Gemini API and Vertex AI, which name the model.
const (
	geminiPath = "/v1beta/models/gemini-2.5-flash:generateContent"
	vertexPath = "/v1/projects/my-project/locations/us-central1/publishers/google/models/gemini-2.5-pro:streamGenerateContent"
)

func TestPathModel(t *testing.T) {
	for _, tc := range []struct {
		path, model string
	}{
		{geminiPath, "gemini-2.5-flash"},
		{"/v1beta/models/gemini-2.5-flash:streamGenerateContent", "gemini-2.5-flash"},
		{"/v1/models/gemini-2.0-flash:countTokens", "gemini-2.0-flash"},
		{vertexPath, "gemini-2.5-pro"},
		{"/v1beta1/projects/p/locations/global/publishers/google/models/gemini-2.5-flash-lite:generateContent", "gemini-2.5-flash-lite"},
		// A proxy's own prefix, and "models" in other case.
		{"/google/v1beta/models/gemini-2.5-flash:generateContent", "gemini-2.5-flash"},
		{"/v1beta/Models/gemini-2.5-flash:generateContent", "gemini-2.5-flash"},
		// Google's routes match the model up to the method after the
		// last colon.
		{"/v1beta/models/a:b:generateContent", "a:b"},
		// A dot segment before the last: the last segment is what any
		// server that resolves it reads too.
		{"/v1beta/models/cheap/../models/gemini-2.5-pro:generateContent", "gemini-2.5-pro"},

		{"/v1/chat/completions", ""},
		{"/v1beta/models/gemini-2.5-flash", ""},
		{"/v1beta/models/:generateContent", ""},
		{"/v1beta/tunedModels/my-model:generateContent", ""},
		{"/v1beta/models", ""},
		{"models/x:y", "x"},
		{"", ""},
	} {
		model, ok := PathModel(tc.path)
		if model != tc.model || ok != (tc.model != "") {
			t.Errorf("PathModel(%q) = %q, %v; want %q", tc.path, model, ok, tc.model)
		}
	}
}

func TestGeminiMaxTokens(t *testing.T) {
	for _, tc := range []struct {
		name, path, body string
		want             int64
		none             bool
	}{
		{"gemini", geminiPath, `{"contents":[{"parts":[{"text":"Hi"}]}],"generationConfig":{"maxOutputTokens":800}}`, 800, false},
		{"vertex", vertexPath, `{"contents":[],"generationConfig":{"maxOutputTokens":800,"temperature":0.2}}`, 800, false},
		{"protocol buffer names", geminiPath, `{"generation_config":{"max_output_tokens":800}}`, 800, false},
		{"mixed names", geminiPath, `{"generationConfig":{"max_output_tokens":800}}`, 800, false},
		{"candidates", geminiPath, `{"generationConfig":{"maxOutputTokens":800,"candidateCount":3}}`, 2400, false},
		{"candidates, protocol buffer name", geminiPath, `{"generation_config":{"candidate_count":2,"maxOutputTokens":800}}`, 1600, false},
		{"candidates as a string", geminiPath, `{"generationConfig":{"maxOutputTokens":800,"candidateCount":"2"}}`, 1600, false},
		{"escape", geminiPath, `{"generationConfig":{"maxOutput\u0054okens":800}}`, 800, true},
		// Thoughts count within maxOutputTokens: the budget adds nothing.
		{"thinking budget", geminiPath, `{"generationConfig":{"maxOutputTokens":800,"thinkingConfig":{"thinkingBudget":4096}}}`, 800, false},
		{"fraction rounds up", geminiPath, `{"generationConfig":{"maxOutputTokens":10.5}}`, 11, false},

		// No bound the server is sure to read: the model's own maximum.
		{"absent", geminiPath, `{"contents":[{"parts":[{"text":"Hi"}]}]}`, 0, true},
		{"zero is unset", geminiPath, `{"generationConfig":{"maxOutputTokens":0}}`, 0, true},
		{"negative", geminiPath, `{"generationConfig":{"maxOutputTokens":-1}}`, 0, true},
		{"a string", geminiPath, `{"generationConfig":{"maxOutputTokens":"800"}}`, 800, true},
		{"other case", geminiPath, `{"GenerationConfig":{"MaxOutputTokens":800}}`, 800, true},
		{"at the top", geminiPath, `{"maxOutputTokens":800}`, 0, true},
		{"other formats' bounds are not Gemini's", geminiPath, `{"max_tokens":100,"n":3,"options":{"num_predict":50}}`, 0, true},
		{"infinite", geminiPath, `{"generationConfig":{"maxOutputTokens":Infinity}}`, 0, true},

		// Another path reads the other formats' bounds only.
		{"not a gemini path", "/v1/chat/completions", `{"max_tokens":100,"generationConfig":{"maxOutputTokens":800}}`, 100, false},
	} {
		var r Request
		if err := r.Read(tc.path, []byte(tc.body)); err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if got, none := r.MaxTokens(4096); got != tc.want || none != tc.none {
			t.Errorf("%s: MaxTokens = %d, %v; want %d, %v", tc.name, got, none, tc.want, tc.none)
		}
	}
}

func TestGeminiDuplicates(t *testing.T) {
	for _, tc := range []struct {
		name, body, field string
	}{
		{"both objects", `{"generationConfig":{"maxOutputTokens":10},"generation_config":{"temperature":1}}`, "generationConfig"},
		{"both bounds", `{"generationConfig":{"maxOutputTokens":10,"max_output_tokens":9000}}`, "generationConfig.maxOutputTokens"},
		{"both candidate counts", `{"generation_config":{"candidateCount":1,"candidate_count":8}}`, "generationConfig.candidateCount"},
		{"same spelling twice", `{"generationConfig":{"maxOutputTokens":10,"maxOutputTokens":9000}}`, "generationConfig.maxOutputTokens"},
		{"other case", `{"generationConfig":{"maxOutputTokens":10,"MAXOUTPUTTOKENS":9000}}`, "generationConfig.maxOutputTokens"},
		{"escaped", `{"generationConfig":{"maxOutputTokens":10},"generationConfi\u0067":{}}`, "generationConfig"},
	} {
		for _, path := range []string{geminiPath, vertexPath, "/v1/chat/completions"} {
			var r Request
			err := r.Read(path, []byte(tc.body))
			var dup *DuplicateError
			if !errors.As(err, &dup) || dup.Field != tc.field {
				t.Errorf("%s, %s: Read = %v, want a duplicate %s", tc.name, path, err, tc.field)
				continue
			}
			if n, none := r.MaxTokens(4096); path != "/v1/chat/completions" && (n != 0 || !none) {
				t.Errorf("%s: a body refused still reads as MaxTokens %d, %v", tc.name, n, none)
			}
		}
	}
}

func TestGeminiModel(t *testing.T) {
	for _, tc := range []struct {
		path, body, model string
	}{
		{geminiPath, `{"contents":[]}`, "gemini-2.5-flash"},
		// The body's model is not the one the server runs.
		{vertexPath, `{"model":"gemini-2.0-flash-lite","contents":[]}`, "gemini-2.5-pro"},
		{"/v1/chat/completions", `{"model":"gemini-2.0-flash-lite"}`, "gemini-2.0-flash-lite"},
	} {
		var r Request
		if err := r.Read(tc.path, []byte(tc.body)); err != nil {
			t.Fatal(err)
		}
		if m, ok := r.Model(); m != tc.model || !ok {
			t.Errorf("%s %s: Model() = %q, %v; want %q", tc.path, tc.body, m, ok, tc.model)
		}
	}
	// A Request read again forgets the path's model.
	var r Request
	_ = r.Read(geminiPath, []byte(`{}`))
	_ = r.Read("/v1/messages", []byte(`{}`))
	if m, ok := r.Model(); ok || r.Gemini() {
		t.Errorf("read again: Model() = %q, true, want none", m)
	}
}

// TestGeminiReadAllocations: a Gemini request is read, its bound and its
// model, without allocating.
func TestGeminiReadAllocations(t *testing.T) {
	if race.Enabled {
		t.Skip("the race detector allocates")
	}
	body := []byte(`{"contents":[{"role":"user","parts":[{"text":"Tell me about the sky."}]}],"generationConfig":{"maxOutputTokens":512,"candidateCount":2}}`)
	var r Request
	allocs := testing.AllocsPerRun(100, func() {
		if err := r.Read(vertexPath, body); err != nil {
			t.Fatal(err)
		}
		if n, _ := r.MaxTokens(100); n != 1024 {
			t.Fatal("read wrong")
		}
		if m, _ := r.ModelName(); string(m) != "gemini-2.5-pro" {
			t.Fatal("model read wrong")
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations a read", allocs)
	}
}
