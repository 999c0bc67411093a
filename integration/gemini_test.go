package integration

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/d61b427a/caddy-rate-limit/internal/money"
	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
)

// This file tests zones in front of Google's Gemini API and Vertex AI,
// whose requests name their model in the path and bound their output in
// generationConfig, and whose answers report usageMetadata: through
// Caddy, on the memory store and on Redis, with raw requests and with
// Google's official client (@google/genai), counted in tokens and in
// dollars priced per Gemini model.

// serveGemini answers, for newLLM, a request to a path that names a
// model as Google's APIs do: :generateContent with the Gemini API's
// JSON answer; :streamGenerateContent with its chunks as server-sent
// events (alt=sse; Vertex AI's on a Vertex path, whose chunks before the
// last carry no counts), or else as a JSON array, each written and
// flushed apart; with cut=1, the first half of the event stream, then
// the connection closed. It reports whether it answered.
func serveGemini(w http.ResponseWriter, r *http.Request, files map[string]string, stream func(w http.ResponseWriter, contentType, body, sep string)) bool {
	path := r.URL.Path
	if !strings.Contains(path, "/models/") {
		return false
	}
	vertex := strings.Contains(path, "/publishers/google/")
	q := r.URL.Query()
	switch {
	case strings.HasSuffix(path, ":generateContent"):
		w.Header().Set("Content-Type", "application/json; charset=UTF-8")
		io.WriteString(w, files["gemini_generate.json"])
	case !strings.HasSuffix(path, ":streamGenerateContent"):
		return false
	case q.Get("cut") == "1":
		s := files["gemini_stream.txt"]
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, s[:len(s)/2])
		http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler)
	case q.Get("alt") == "sse" && vertex:
		stream(w, "text/event-stream", files["vertex_stream.txt"], "\r\n\r\n")
	case q.Get("alt") == "sse":
		stream(w, "text/event-stream", files["gemini_stream.txt"], "\r\n\r\n")
	default:
		stream(w, "application/json; charset=UTF-8", files["gemini_stream_array.json"], ",\r\n")
	}
	return true
}

// The paths of the Gemini API and of Vertex AI the tests ask.
const (
	geminiFlash    = "/v1beta/models/gemini-2.5-flash"
	geminiPro      = "/v1beta/models/gemini-2.5-pro"
	vertexFlashLit = "/v1/projects/tides/locations/us-central1/publishers/google/models/gemini-2.5-flash-lite"
)

// TestCostFromGeminiThroughCaddy: a zone that reserves by max_tokens
// reserves a Gemini request's maxOutputTokens times its candidateCount,
// and its bytes; the whole limit for one without a bound; and keeps, once
// the response is done, the total its usageMetadata showed: in JSON, in
// an event stream (alt=sse) of the Gemini API and of Vertex AI, and in
// the streamed JSON array. The client sees each answer as the upstream
// sent it. A stream cut before its last chunk keeps its reservation; a
// bound given under both its names is refused before anything is taken.
func TestCostFromGeminiThroughCaddy(t *testing.T) {
	integration(t)
	t.Run("memory", func(t *testing.T) { testCostFromGemini(t, "", "tokens_gemini_memory") })
	t.Run("redis", func(t *testing.T) {
		s := redistest.Standalone(t)
		testCostFromGemini(t, redisStore("address "+s.URL()), "tokens_gemini_redis")
	})
}

func testCostFromGemini(t *testing.T, store, zone string) {
	u := newLLM(t)
	accessLog := filepath.Join(t.TempDir(), "access.log")
	const limit = 100000
	startCaddy(t, tokenSite(accessLog, u.url, store, zone, `limit 100000
			window 1h
			algorithm fixed_window
			cost_from usage total
			reserve max_tokens 500`))
	prompt := `"contents":[{"role":"user","parts":[{"text":"Why are there two tides a day?"}]}]`
	taken := 0
	for _, c := range []struct {
		client, path, body string
		bound              int // what the body reserves beside its bytes; -1: the whole limit
		cost               int
		answer             string
	}{
		{"json", geminiFlash + ":generateContent", `{` + prompt + `,"generationConfig":{"maxOutputTokens":2000}}`, 2000, 3402, "gemini_generate.json"},
		{"sse", geminiFlash + ":streamGenerateContent?alt=sse", `{` + prompt + `,"generationConfig":{"maxOutputTokens":1000,"candidateCount":2}}`, 2000, 1470, "gemini_stream.txt"},
		{"array", geminiPro + ":streamGenerateContent", `{` + prompt + `,"generation_config":{"max_output_tokens":300}}`, 300, 176, "gemini_stream_array.json"},
		{"vertex", vertexFlashLit + ":streamGenerateContent?alt=sse", `{` + prompt + `,"generationConfig":{"maxOutputTokens":100,"thinkingConfig":{"thinkingBudget":0}}}`, 100, 21, "vertex_stream.txt"},
		// No bound: the model's own maximum, which the request does not
		// say.
		{"unbounded", geminiFlash + ":generateContent", `{` + prompt + `}`, -1, 3402, "gemini_generate.json"},
	} {
		reservation := c.bound + len(c.body)
		if c.bound < 0 {
			reservation = limit
		}
		resp, answer := request(t, client, http.MethodPost, siteURL+c.path, c.body, "X-Client: "+c.client, "Content-Type: application/json")
		status(t, resp, http.StatusOK)
		if got, want := resp.Header.Get("X-RateLimit-Used"), strconv.Itoa(reservation); got != want {
			t.Errorf("%s: X-RateLimit-Used %s at admission, want the reservation %s", c.client, got, want)
		}
		if answer != fixture(t, c.answer) {
			t.Errorf("%s: the client saw\n%q\nwant %s", c.client, answer, c.answer)
		}
		if got := u.lastBody(t); got != c.body {
			t.Errorf("%s: the upstream got\n%s\nwant the body sent\n%s", c.client, got, c.body)
		}
		taken += c.cost
		waitTaken(t, zone, taken)
		if used := keyState(t, adminURL, zone, c.client).Used; used != int64(c.cost) {
			t.Errorf("%s: the key uses %d once the response is done, want its cost %d", c.client, used, c.cost)
		}
		if got := loggedCost(t, accessLog, c.client); got != strconv.Itoa(c.cost) {
			t.Errorf("%s: the access log's cost is %s, want %d", c.client, got, c.cost)
		}
	}

	// Cut before its last chunk: the reservation stands.
	body := `{` + prompt + `,"generationConfig":{"maxOutputTokens":700}}`
	req, _ := http.NewRequest(http.MethodPost, siteURL+geminiFlash+":streamGenerateContent?alt=sse&cut=1", strings.NewReader(body))
	req.Header.Set("X-Client", "cut")
	if resp, err := client.Do(req); err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	taken += 700 + len(body)
	waitTaken(t, zone, taken)
	if used := keyState(t, adminURL, zone, "cut").Used; used != int64(700+len(body)) {
		t.Errorf("the key uses %d after a cut stream, want the reservation %d", used, 700+len(body))
	}

	// A bound under both of its names: refused, naming it, before the
	// upstream or the store sees it.
	hits := u.hits.Load()
	resp, answer := request(t, client, http.MethodPost, siteURL+geminiFlash+":generateContent",
		`{`+prompt+`,"generationConfig":{"maxOutputTokens":10,"max_output_tokens":60000}}`, "X-Client: dup")
	status(t, resp, http.StatusBadRequest)
	if !strings.Contains(answer, `"code":"duplicate_field"`) || !strings.Contains(answer, `"param":"generationConfig.maxOutputTokens"`) {
		t.Errorf("the client saw %s, want a duplicate_field naming generationConfig.maxOutputTokens", answer)
	}
	if u.hits.Load() != hits {
		t.Error("the upstream got a request refused")
	}
	if used := keyState(t, adminURL, zone, "dup").Used; used != 0 {
		t.Errorf("a request refused took %d", used)
	}
}

// geminiPrice is a line of the Gemini price table, in picodollars a
// token.
type geminiPrice struct{ in, out, read int64 }

// The lines of geminiPrices.
var (
	flashLitePrice = geminiPrice{in: 100_000, out: 400_000, read: 25_000}
	flashPrice     = geminiPrice{in: 300_000, out: 2_500_000, read: 75_000}
	proPrice       = geminiPrice{in: 1_250_000, out: 10_000_000, read: 310_000}
)

// costOf prices, by hand, the usageMetadata a client saw: the prompt
// less its cached content, and the tool-use prompt, at the input price;
// the cached content at the cache read price; the candidates and the
// thoughts at the output price.
func (p geminiPrice) costOf(u map[string]any) int64 {
	n := func(k string) int64 { f, _ := u[k].(float64); return int64(f) }
	cached := n("cachedContentTokenCount")
	return (n("promptTokenCount")-cached+n("toolUsePromptTokenCount"))*p.in + cached*p.read +
		(n("candidatesTokenCount")+n("thoughtsTokenCount"))*p.out
}

// geminiMoneySite is a site with a zone, name, of $1 an hour per Gemini
// API key, priced per Gemini model, in the store block store.
func geminiMoneySite(upstream, store, name string) string {
	return fmt.Sprintf(`
`+siteAddr+` {
	rate_limit {
		%s
		zone %s {
			key {header.X-Goog-Api-Key}
			limit $1
			window 1h
			algorithm fixed_window
			cost_from usage price {
				gemini-2.5-flash-lite input 0.10 output 0.40 cache_read 0.025
				gemini-2.5-flash      input 0.30 output 2.50 cache_read 0.075
				gemini-2.5-pro*       input 1.25 output 10.00 cache_read 0.31
			}
			reserve max_tokens 500
		}
	}
	reverse_proxy %s
}
`, store, name, upstream)
}

// TestGeminiMoneyThroughCaddy: Google's official client, on the Gemini
// API (JSON and alt=sse) and on Vertex AI, through a zone priced per
// Gemini model, on the memory store and on Redis: each key keeps what
// the answer cost at the prices of the model the path names, its cached
// content at the cache read price and its thoughts at the output price,
// to the picodollar; a model without a price is refused with 400 naming
// it.
func TestGeminiMoneyThroughCaddy(t *testing.T) {
	integration(t)
	dir := sdkDir(t)
	s := redistest.Standalone(t)
	for _, store := range memoryAndRedis(s) {
		t.Run(store.name, func(t *testing.T) {
			u := newLLM(t)
			zone := "money_gemini_" + store.name
			startCaddy(t, geminiMoneySite(u.url, store.block, zone))
			for _, c := range []struct {
				mode, key string
				price     geminiPrice
			}{
				{"generate", "gm-json", flashPrice},
				{"generate-stream", "gm-stream", flashPrice},
				{"vertex-stream", "gm-vertex", flashLitePrice},
			} {
				seen := runSDK(t, dir, "gemini.mjs", siteURL, c.key, c.mode)
				if seen.Error != nil {
					t.Fatalf("gemini.mjs %s: the client threw %+v", c.mode, *seen.Error)
				}
				cost := c.price.costOf(seen.Usage)
				waitUsed(t, adminURL, zone, c.key, cost)
				if k := keyState(t, adminURL, zone, c.key); k.Unit != money.Unit || k.Dollars["used"] != money.Format(cost) {
					t.Errorf("gemini.mjs %s: the admin API shows %+v, want used %s", c.mode, k, money.Format(cost))
				}
			}

			// The streamed array of gemini-2.5-pro, asked without the
			// client: priced at pro's line, whatever the body says.
			body := `{"model":"gemini-2.5-flash-lite","contents":[{"parts":[{"text":"Spring tides?"}]}],"generationConfig":{"maxOutputTokens":100}}`
			resp, _ := request(t, client, http.MethodPost, siteURL+geminiPro+":streamGenerateContent", body, "X-Goog-Api-Key: gm-array")
			status(t, resp, http.StatusOK)
			if got, want := resp.Header.Get("X-RateLimit-Used"), strconv.FormatInt(100*proPrice.out+int64(len(body))*proPrice.in, 10); got != want {
				t.Errorf("X-RateLimit-Used %s at admission, want the reservation at pro's prices %s", got, want)
			}
			waitUsed(t, adminURL, zone, "gm-array", 96*proPrice.in+(16+64)*proPrice.out)

			// No line prices gemini-2.0-flash: 400, naming it.
			hits := u.hits.Load()
			resp, answer := request(t, client, http.MethodPost, siteURL+"/v1beta/models/gemini-2.0-flash:generateContent", body, "X-Goog-Api-Key: gm-unpriced")
			status(t, resp, http.StatusBadRequest)
			if !strings.Contains(answer, `"code":"model_not_priced"`) || !strings.Contains(answer, `gemini-2.0-flash`) {
				t.Errorf("the client saw %s, want model_not_priced naming gemini-2.0-flash", answer)
			}
			if u.hits.Load() != hits {
				t.Error("the upstream got a request refused")
			}
		})
	}
}
