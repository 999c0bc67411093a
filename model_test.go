package ratelimit

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/d61b427a/caddy-rate-limit/algorithms/vectors"
	"github.com/d61b427a/caddy-rate-limit/costfrom"
)

// TestModelPlaceholder: {http.rate_limit.model} is the model a Gemini
// API or Vertex AI path names, or else the body's model, for a key and
// for the handlers after rate_limit; a request that names none falls
// through to the key's next alternative.
func TestModelPlaceholder(t *testing.T) {
	h := provisionHandler(t, `{"zones":[{"name":"unit_model",
		"key":["{http.rate_limit.model}","none"],"limit":100,"window":"1h"}]}`)
	withClock(t, h, vectors.Start)
	for _, c := range []struct {
		path, body, key string
		status          int
	}{
		{"/v1beta/models/gemini-2.5-flash:generateContent", `{"contents":[{"parts":[{"text":"Hi"}]}]}`, "gemini-2.5-flash", 200},
		{"/v1beta/models/gemini-2.5-flash:streamGenerateContent", `not json`, "gemini-2.5-flash", 200},
		// The path's model is the one the server runs, not the body's.
		{"/v1/projects/p/locations/us-central1/publishers/google/models/gemini-2.5-pro:generateContent", `{"model":"gemini-2.0-flash-lite"}`, "gemini-2.5-pro", 200},
		{"/v1/chat/completions", `{"model":"gpt-4o","messages":[]}`, "gpt-4o", 200},
		{"/v1/messages", `{"MODEL":"claude-sonnet-4-5"}`, "claude-sonnet-4-5", 200},
		{"/v1/chat/completions", `{"messages":[]}`, "none", 200},
		{"/v1/chat/completions", `{"model":"a","Model":"b"}`, "", http.StatusBadRequest},
	} {
		r, repl := testRequest(t.Context(), http.MethodPost, "192.0.2.1")
		r.URL.Path = c.path
		r.Body, r.ContentLength = io.NopCloser(strings.NewReader(c.body)), -1
		var seen, body string
		next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			seen, _ = repl.GetString(modelPlaceholder)
			b, _ := io.ReadAll(r.Body)
			body = string(b)
			return nil
		})
		w := httptest.NewRecorder()
		err := h.ServeHTTP(w, r, next)
		status := w.Code
		var he caddyhttp.HandlerError
		if errors.As(err, &he) {
			status = he.StatusCode
		}
		if status != c.status {
			t.Errorf("%s %s: status %d, want %d", c.path, c.body, status, c.status)
			continue
		}
		if c.status != http.StatusOK {
			continue
		}
		want := c.key
		if want == "none" {
			want = ""
		}
		if key := placeholder(repl, "key"); !strings.HasSuffix(key, c.key) || seen != want || body != c.body {
			t.Errorf("%s %s: key %q, model after it %q, body %q; want a key of %q, model %q, the body as sent", c.path, c.body, key, seen, body, c.key, want)
		}
	}
}

// TestGeminiMoneyReservation: a zone priced in money prices a Gemini
// request by the model its path names, whatever its body says, and
// reserves its maxOutputTokens times its candidateCount at that model's
// output price, with its body's bytes at its input price.
func TestGeminiMoneyReservation(t *testing.T) {
	flash := costfrom.Price{Input: 300_000, Output: 2_500_000, CacheRead: 75_000}
	pro := costfrom.Price{Input: 1_250_000, Output: 10_000_000, CacheRead: 310_000}
	m := meter{on: true, def: 100, prices: costfrom.Prices{
		{Model: "gemini-2.5-flash", Price: flash},
		{Model: "gemini-2.5-pro*", Price: pro},
	}}
	body := `{"model":"gemini-2.5-flash","contents":[],"generationConfig":{"maxOutputTokens":1000,"candidateCount":2}}`
	for _, c := range []struct {
		path string
		want int64
	}{
		{"/v1beta/models/gemini-2.5-flash:generateContent", 2000*flash.Output + int64(len(body))*flash.Input},
		{"/v1/projects/p/locations/global/publishers/google/models/gemini-2.5-pro:streamGenerateContent", 2000*pro.Output + int64(len(body))*pro.Input},
	} {
		var req costfrom.Request
		if err := req.Read(c.path, []byte(body)); err != nil {
			t.Fatal(err)
		}
		price, err := m.findPrice("z", &req)
		if err != nil {
			t.Fatalf("%s: %v", c.path, err)
		}
		if got := m.reservation(&req, 1<<62, price); got != c.want {
			t.Errorf("%s: reservation %d, want %d", c.path, got, c.want)
		}
	}
	var req costfrom.Request
	if err := req.Read("/v1beta/models/gemini-2.0-flash:generateContent", []byte(body)); err != nil {
		t.Fatal(err)
	}
	if _, err := m.findPrice("z", &req); err == nil || !strings.Contains(err.Error(), `"gemini-2.0-flash"`) {
		t.Errorf("a model no line prices: %v, want an error naming gemini-2.0-flash", err)
	}
}
