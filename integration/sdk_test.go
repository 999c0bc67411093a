package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// This file runs the official OpenAI, Anthropic and Google Gen AI
// clients for Node (testdata/sdk) against Caddy in front of the upstream
// of tokens_test.go: the clients parse strictly, so what Caddy passes on of
// an answer, and the 429 it answers itself, must be what the APIs send.

// sdkSeen is what a script of testdata/sdk printed: what the client saw.
type sdkSeen struct {
	Text        string         `json:"text"`
	Usage       map[string]any `json:"usage"`
	Chunks      int            `json:"chunks"`
	UsageChunks int            `json:"usageChunks"`
	Finish      string         `json:"finish"`
	Error       *struct {
		Status     int    `json:"status"`
		Class      string `json:"class"`
		RateLimit  bool   `json:"rateLimit"`
		Message    string `json:"message"`
		RetryAfter string `json:"retryAfter"`
	} `json:"error"`
}

// tokens is what a usage counts as cost_from usage total does: its
// total_tokens (OpenAI) or totalTokenCount (Gemini), or its input,
// cached input and output tokens (Anthropic).
func (s sdkSeen) tokens() int {
	n := func(k string) int { f, _ := s.Usage[k].(float64); return int(f) }
	if _, ok := s.Usage["total_tokens"]; ok {
		return n("total_tokens")
	}
	if _, ok := s.Usage["totalTokenCount"]; ok {
		return n("totalTokenCount")
	}
	return n("input_tokens") + n("cache_creation_input_tokens") + n("cache_read_input_tokens") + n("output_tokens")
}

// sdkDir returns the directory of testdata/sdk's scripts with their
// node_modules: testdata/sdk itself once `npm ci` ran there (as .ci/run
// does), else a copy in a temporary directory where the test runs it.
// Without node or npm it skips t, or fails it under CI=true: CI must
// install them.
func sdkDir(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"node", "npm"} {
		if _, err := exec.LookPath(name); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("no %s on PATH; CI must install it (Debian: apt-get install nodejs npm)", name)
			}
			t.Skipf("no %s on PATH; install Node.js 20 or later and npm to run the official clients' tests", name)
		}
	}
	src, err := filepath.Abs(filepath.Join("testdata", "sdk"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(src, "node_modules")); err == nil {
		return src
	}
	dir := t.TempDir()
	files, _ := filepath.Glob(filepath.Join(src, "*"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in a copy of %s: %v\n%s", src, err, out)
	}
	return dir
}

// runSDK runs script of dir (openai.mjs, anthropic.mjs or gemini.mjs) in mode with
// baseURL and apiKey, and returns what the client saw. The script runs
// with no environment but PATH and HOME, so that no OPENAI_* or
// ANTHROPIC_* variable of the machine's changes what the client sends.
func runSDK(t *testing.T, dir, script, baseURL, apiKey, mode string) sdkSeen {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", script, baseURL, apiKey, mode)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node %s %s: %v\nstdout: %s\nstderr: %s", script, mode, err, out, stderr.String())
	}
	var seen sdkSeen
	if err := json.Unmarshal(out, &seen); err != nil {
		t.Fatalf("node %s %s printed %q: %v", script, mode, out, err)
	}
	return seen
}

// sdkSite is a site that proxies to upstream, with a token zone, name,
// of limit tokens an hour, keyed by the client's API key: as
// Authorization: Bearer, as OpenAI's and Anthropic's clients send it, as
// X-Api-Key, as Anthropic's API also takes it, or as X-Goog-Api-Key, as
// Google's client sends it.
func sdkSite(upstream, name string, limit int) string {
	return fmt.Sprintf(`
`+siteAddr+` {
	rate_limit {
		zone %s {
			key {header.Authorization} {header.X-Api-Key} {header.X-Goog-Api-Key}
			limit %d
			window 1h
			algorithm fixed_window
			cost_from usage total
			reserve max_tokens 500
			usage_in_stream on
		}
	}
	reverse_proxy %s
}
`, name, limit, upstream)
}

// TestSDKClientsThroughCaddy: the official clients, streaming and not,
// parse every answer that passes Caddy; each key keeps the tokens of the
// usage the upstream reported, which the client saw unless it streamed
// without asking for it: then Caddy asked for it on the client's behalf
// and the client's stream, which has no usage chunk, ends as it would
// have. A key over its limit gets a 429 each client throws as its
// RateLimitError, with the Retry-After it would wait.
func TestSDKClientsThroughCaddy(t *testing.T) {
	integration(t)
	dir := sdkDir(t)

	t.Run("usage", func(t *testing.T) {
		u := newLLM(t)
		const zone = "sdk_tokens"
		startCaddy(t, sdkSite(u.url, zone, 100000))
		chatText := "The image shows a wooden boardwalk path running through a lush green field or meadow. The sky is bright blue with some scattered clouds, giving the scene a serene and peaceful atmosphere. \"Quoted\" and escaped \\ text."
		streamText := `Hello there, "friend" {[\`
		tideText := "The tide is pulled by the Moon's gravity: the ocean on the side facing it bulges toward it, and a second bulge forms on the far side, where the Moon pulls the Earth away from the water. \"Quoted\" and escaped \\ text."
		taken := 0
		for _, c := range []struct {
			script, mode, key string
			text, finish      string
			chunks, usageSeen int // chunks (events) the client saw, and those with usage
			cost              int // the tokens of the upstream's usage
		}{
			{"openai.mjs", "chat", "sk-chat", chatText, "", 1, 1, 1163},
			{"openai.mjs", "chat-stream-usage", "sk-asked", streamText, "stop", 5, 1, 21},
			{"openai.mjs", "chat-stream", "sk-hidden", streamText, "stop", 4, 0, 21},
			{"openai.mjs", "responses-stream", "sk-responses", "Hi there! How can I assist you today?", "completed", 9, 1, 48},
			{"anthropic.mjs", "messages", "sk-ant-json", "Hi! My name is Claude.", "end_turn", 1, 1, 2095 + 100 + 1000 + 503},
			// The fixture's 8 events but its ping, which the client
			// does not yield.
			{"anthropic.mjs", "messages-stream", "sk-ant-stream", "Hello!", "end_turn", 7, 2, 25 + 10 + 15},
			// Each of Gemini's chunks has its usageMetadata so far;
			// Vertex AI's only the last.
			{"gemini.mjs", "generate", "gk-json", tideText, "STOP", 1, 1, 3402},
			{"gemini.mjs", "generate-stream", "gk-stream", "Two bulges of water follow the Moon, one on each side of the Earth.", "STOP", 4, 4, 1470},
			{"gemini.mjs", "vertex-stream", "gk-vertex", "Neap tides come when they pull at right angles.", "STOP", 2, 1, 21},
		} {
			baseURL, key := siteURL+"/v1", "Bearer "+c.key
			switch c.script {
			case "anthropic.mjs":
				baseURL = siteURL
			case "gemini.mjs":
				baseURL, key = siteURL, c.key
			}
			name := c.script + " " + c.mode
			seen := runSDK(t, dir, c.script, baseURL, c.key, c.mode)
			if seen.Error != nil {
				t.Fatalf("%s: the client threw %+v", name, *seen.Error)
			}
			if seen.Text != c.text {
				t.Errorf("%s: the client saw the text %q, want %q", name, seen.Text, c.text)
			}
			if c.finish != "" && seen.Finish != c.finish {
				t.Errorf("%s: the client saw it end with %q, want %q", name, seen.Finish, c.finish)
			}
			if seen.Chunks != c.chunks || seen.UsageChunks != c.usageSeen {
				t.Errorf("%s: the client saw %d chunks, %d with usage; want %d, %d with usage", name, seen.Chunks, seen.UsageChunks, c.chunks, c.usageSeen)
			}
			switch {
			case c.usageSeen == 0 && seen.Usage != nil:
				t.Errorf("%s: the client, which asked for no usage, saw %v", name, seen.Usage)
			case c.usageSeen > 0 && seen.tokens() != c.cost:
				t.Errorf("%s: the client saw a usage of %d tokens (%v), want the upstream's %d", name, seen.tokens(), seen.Usage, c.cost)
			}
			if c.mode == "chat-stream" && !strings.Contains(u.lastBody(t), `"include_usage":true`) {
				t.Errorf("%s: the upstream got %s, not asking for the stream's usage", name, u.lastBody(t))
			}
			taken += c.cost
			waitTaken(t, zone, taken)
			if used := keyState(t, adminURL, zone, key).Used; used != int64(c.cost) {
				t.Errorf("%s: the key uses %d, want the %d tokens of the upstream's usage", name, used, c.cost)
			}
		}
	})

	t.Run("over the limit", func(t *testing.T) {
		u := newLLM(t)
		const zone = "sdk_over"
		startCaddy(t, sdkSite(u.url, zone, 3000))
		for _, c := range []struct {
			script, first, then, key, baseURL string
			used                              int // after the first request
		}{
			// Its reservation (max_tokens 2000 and the body) and the
			// 1163 tokens the first took are more than 3000.
			{"openai.mjs", "chat", "chat", "sk-over", siteURL + "/v1", 1163},
			// 3698 tokens, over the limit: the key is in debt.
			{"anthropic.mjs", "messages", "messages-stream", "sk-ant-over", siteURL, 3698},
			// 3402 tokens, over the limit: the key is in debt.
			{"gemini.mjs", "generate", "generate-stream", "gk-over", siteURL, 3402},
		} {
			name := c.script + " " + c.then
			if seen := runSDK(t, dir, c.script, c.baseURL, c.key, c.first); seen.Error != nil {
				t.Fatalf("%s %s: the client threw %+v", c.script, c.first, *seen.Error)
			}
			key := "Bearer " + c.key
			if c.script == "gemini.mjs" {
				key = c.key
			}
			waitUsed(t, adminURL, zone, key, int64(c.used))
			hits := u.hits.Load()
			seen := runSDK(t, dir, c.script, c.baseURL, c.key, c.then)
			switch e := seen.Error; {
			case e == nil:
				t.Errorf("%s: the client got an answer over the limit: %+v", name, seen)
			case e.Status != 429 || !e.RateLimit:
				t.Errorf("%s: the client threw %s with status %d (%s), want its RateLimitError for a 429", name, e.Class, e.Status, e.Message)
			case e.RetryAfter == "":
				t.Errorf("%s: the client's RateLimitError has no Retry-After", name)
			}
			if got := u.hits.Load(); got != hits {
				t.Errorf("%s: the upstream got a request refused", name)
			}
		}
	})
}
