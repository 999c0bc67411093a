package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
)

// This file tests how a zone that reserves by the request's body reads
// it: as leniently as the most lenient server behind it, so that a client
// cannot spell a field so that the zone reserves for one bound and the
// server generates for another.

// model is an upstream that reads a Chat Completions request as Ollama
// does, with Go's encoding/json (keys matched without regard to case,
// escapes decoded, the first JSON value of the body), and answers as a
// model whose answer is modelLength tokens long, or as long as the
// request's max_tokens allows if that is less. Its stream ends with the
// usage only if the request asked for it. It records what it read of
// each request.
type model struct {
	url string

	mu   sync.Mutex
	read []modelRead
}

// modelRead is what the model read of a request.
type modelRead struct {
	MaxTokens    *int
	Stream       bool
	IncludeUsage bool
}

// modelLength is the length, in tokens, of the model's answer when
// nothing bounds it lower.
const modelLength = 8000

func newModel(t *testing.T) *model {
	t.Helper()
	m := new(model)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Stream        bool `json:"stream"`
			StreamOptions *struct {
				IncludeUsage bool `json:"include_usage"`
			} `json:"stream_options"`
			MaxTokens *int `json:"max_tokens"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprintf(w, `{"error":{"message":%q}}`, err.Error())
			return
		}
		read := modelRead{MaxTokens: req.MaxTokens, Stream: req.Stream, IncludeUsage: req.StreamOptions != nil && req.StreamOptions.IncludeUsage}
		m.mu.Lock()
		m.read = append(m.read, read)
		m.mu.Unlock()
		n := modelLength
		if req.MaxTokens != nil && *req.MaxTokens > 0 {
			n = min(n, *req.MaxTokens)
		}
		usage := fmt.Sprintf(`{"prompt_tokens":5,"completion_tokens":%d,"total_tokens":%d}`, n, 5+n)
		if !req.Stream {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"length"}],"usage":%s}`, usage)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		chunk := `{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]`
		if read.IncludeUsage {
			chunk += `,"usage":null`
		}
		fmt.Fprintf(w, "data: %s}\n\n", chunk)
		http.NewResponseController(w).Flush()
		if read.IncludeUsage {
			fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":%s}\n\n", usage)
		}
		io.WriteString(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	m.url = strings.TrimPrefix(srv.URL, "http://")
	return m
}

// reads returns what the model read of the requests it got.
func (m *model) reads() []modelRead {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]modelRead(nil), m.read...)
}

// lenientZone is the zone of the tests of this file: 10000 tokens an
// hour, each request reserving its max_tokens, or 100 if it gives none,
// and asked for its stream's usage.
const lenientZone = `limit 10000
			window 1h
			cost_from usage output
			reserve max_tokens 100
			usage_in_stream on`

// TestReservationReadsKeysAsTheUpstream: a client that spells stream with
// an escape and max_tokens in capitals, which Go's encoding/json (as
// Ollama reads a request) reads as stream and max_tokens, is reserved its
// bound, 9000 tokens, and asked for its stream's usage: one such request
// is admitted, the next ones are refused, and the key keeps the tokens
// the model generated. Read otherwise, 100 requests would each reserve
// the default 100 and have the model generate 8000 tokens, with no usage
// to true them up.
func TestReservationReadsKeysAsTheUpstream(t *testing.T) {
	testReadsKeysAsTheUpstream(t, "", "tokens_lenient")
}

func TestReservationReadsKeysAsTheUpstreamRedis(t *testing.T) {
	s := redistest.Standalone(t)
	testReadsKeysAsTheUpstream(t, redisStore("address "+s.URL()), "tokens_lenient_redis")
}

func testReadsKeysAsTheUpstream(t *testing.T, store, zone string) {
	m := newModel(t)
	roomInWindow(time.Hour, time.Minute)
	startCaddy(t, tokenSite(filepath.Join(t.TempDir(), "access.log"), m.url, store, zone, lenientZone))
	body := `{"messages":[],"str\u0065am":true,"MAX_TOKENS":9000}`
	admitted := 0
	for range 105 {
		resp, answer := request(t, client, http.MethodPost, siteURL+"/v1/chat/completions", body, "X-Client: spelled", "Content-Type: application/json")
		switch resp.StatusCode {
		case http.StatusOK:
			admitted++
			if strings.Contains(answer, `"usage"`) {
				t.Errorf("the client, which asked for no usage, saw it:\n%s", answer)
			}
		case http.StatusTooManyRequests:
		default:
			t.Fatalf("status %d: %s", resp.StatusCode, answer)
		}
	}
	reads := m.reads()
	generated := 0
	for _, r := range reads {
		if r.MaxTokens == nil || *r.MaxTokens != 9000 || !r.Stream || !r.IncludeUsage {
			t.Errorf("the model read max_tokens %s, stream %v, include_usage %v; want 9000, true, true", fmtInt(r.MaxTokens), r.Stream, r.IncludeUsage)
			break
		}
	}
	for _, r := range reads {
		n := modelLength
		if r.MaxTokens != nil && *r.MaxTokens > 0 {
			n = min(n, *r.MaxTokens)
		}
		generated += n
	}
	if admitted != 1 || len(reads) != 1 {
		t.Fatalf("%d of 105 requests admitted, the model generated %d tokens for %d: want 1 admitted, reserved its max_tokens 9000 of the limit 10000", admitted, generated, len(reads))
	}
	// Trued up once the response is done: 9000 reserved, 8000 generated.
	waitUsed(t, adminURL, zone, "spelled", modelLength)
	if info := keyState(t, adminURL, zone, "spelled"); info.Debt == nil || *info.Debt != 0 {
		t.Errorf("the key's debt is %s, want 0", fmtPtr(info.Debt))
	}
}

// fmtInt shows a number that may be absent.
func fmtInt(n *int) string {
	if n == nil {
		return "absent"
	}
	return strconv.Itoa(*n)
}

// TestReservationReadsValuesAsTheUpstream: a bound is read as the most
// lenient server reads it (a Python server validating with pydantic
// takes "9000" and 9e3 for 9000), multiplied by the choices asked for,
// and a bound that means none (Ollama's num_predict -1) reserves the
// zone's whole limit.
func TestReservationReadsValuesAsTheUpstream(t *testing.T) {
	m := newModel(t)
	const zone = "tokens_lenient_values"
	startCaddy(t, tokenSite(filepath.Join(t.TempDir(), "access.log"), m.url, "", zone, lenientZone))
	for _, c := range []struct {
		client, body string
		reserved     int
	}{
		{"string", `{"messages":[],"max_tokens":"9000"}`, 9000},
		{"exponent", `{"messages":[],"max_tokens":9e3}`, 9000},
		{"fraction", `{"messages":[],"max_completion_tokens":8999.5}`, 9000},
		{"choices", `{"messages":[],"max_tokens":100,"n":3}`, 300},
		{"unbounded", `{"model":"llama3.2","prompt":"Why?","options":{"num_predict":-1}}`, 10000},
		{"plain", `{"messages":[],"max_tokens":700}`, 700},
	} {
		resp, answer := request(t, client, http.MethodPost, siteURL+"/v1/chat/completions", c.body, "X-Client: "+c.client, "Content-Type: application/json")
		if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("%s: status %d: %s", c.client, resp.StatusCode, answer)
		}
		if got := resp.Header.Get("X-RateLimit-Used"); got != strconv.Itoa(c.reserved) {
			t.Errorf("%s: X-RateLimit-Used %s at admission, want the reservation %d", c.client, got, c.reserved)
		}
	}
}

// TestDuplicateFieldRefused: a body that gives a field a zone reads
// twice, under any spelling, is answered 400 with a JSON error naming the
// field, before any zone takes anything; the upstream never sees it.
func TestDuplicateFieldRefused(t *testing.T) {
	m := newModel(t)
	const zone = "tokens_duplicate"
	startCaddy(t, tokenSite(filepath.Join(t.TempDir(), "access.log"), m.url, "", zone, lenientZone))
	reservedBefore := metricCount(t, adminURL, costUnits(zone, "reserved"))
	for _, c := range []struct {
		name, body, field string
	}{
		{"cased", `{"messages":[],"max_tokens":10,"MAX_TOKENS":9000}`, "max_tokens"},
		{"escaped", `{"messages":[],"max_tokens":10,"max_tok\u0065ns":9000}`, "max_tokens"},
		{"folded", `{"messages":[],"max_tokens":10,"max_to\u212aens":9000}`, "max_tokens"},
		{"stream", `{"messages":[],"stream":false,"Stream":true}`, "stream"},
		{"object on the path", `{"prompt":"Why?","options":{"num_predict":10},"Options":{"num_predict":9000}}`, "options"},
		{"nested", `{"prompt":"Why?","options":{"num_predict":10,"NUM_PREDICT":9000}}`, "options.num_predict"},
	} {
		resp, answer := request(t, client, http.MethodPost, siteURL+"/v1/chat/completions", c.body, "X-Client: duplicate", "Content-Type: application/json")
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("%s: status %d (%s), want 400", c.name, resp.StatusCode, answer)
		}
		var e struct {
			Error struct {
				Type    string `json:"type"`
				Code    string `json:"code"`
				Param   string `json:"param"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(answer), &e); err != nil || resp.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("%s: a body that is not JSON (%s, %v): %s", c.name, resp.Header.Get("Content-Type"), err, answer)
		}
		if e.Error.Type != "invalid_request_error" || e.Error.Code != "duplicate_field" || e.Error.Param != c.field || !strings.Contains(e.Error.Message, c.field) {
			t.Errorf("%s: answered %s, want an invalid_request_error duplicate_field naming %s", c.name, answer, c.field)
		}
	}
	if reads := m.reads(); len(reads) != 0 {
		t.Errorf("the upstream got %d requests refused", len(reads))
	}
	if used := keyState(t, adminURL, zone, "duplicate").Used; used != 0 {
		t.Errorf("the key uses %d after its requests were refused, want 0", used)
	}
	if n := metricCount(t, adminURL, costUnits(zone, "reserved")) - reservedBefore; n != 0 {
		t.Errorf("reserved %d for requests refused", n)
	}
	// The same key is admitted with one of each.
	resp, _ := request(t, client, http.MethodPost, siteURL+"/v1/chat/completions", `{"messages":[],"max_tokens":10}`, "X-Client: duplicate", "Content-Type: application/json")
	status(t, resp, http.StatusOK)
	waitUsed(t, adminURL, zone, "duplicate", 10)
}
