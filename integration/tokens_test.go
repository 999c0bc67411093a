package integration

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
	"github.com/d61b427a/caddy-rate-limit/internal/wait"
)

// This file tests zones that limit what responses cost (cost_from,
// reserve, usage_in_stream) through Caddy, in front of an upstream that
// answers as LLM APIs do: OpenAI's Chat Completions, in JSON and in an
// event stream, Anthropic's Messages stream, Ollama's NDJSON stream, and
// a cost in a header. The answers are the costfrom package's fixtures.

// llm is an upstream that answers as an LLM API, and records the bodies
// of the requests it got.
type llm struct {
	url  string // host:port
	hits atomic.Int64

	mu     sync.Mutex
	bodies []string
}

// fixture reads one of the costfrom package's fixtures.
func fixture(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "costfrom", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// newLLM starts an upstream that answers by path:
//
//	/v1/chat/completions  OpenAI's answer: JSON, or a stream with its usage
//	                      chunk only if the request asked for it
//	/v1/messages          Anthropic's answer: JSON, or its stream
//	/v1/responses         OpenAI's Responses API: JSON, or its stream
//	/api/chat             Ollama's NDJSON stream
//	/cost?n=<n>           "ok" with X-Cost: n, or no X-Cost without n
//	/usage?n=<n>&status=  JSON with a usage of n total tokens
//	/cut                  the first half of an OpenAI stream, then the
//	                      connection is closed
//	.../models/<model>:generateContent, :streamGenerateContent
//	                      Google's Gemini API and Vertex AI (see serveGemini)
func newLLM(t *testing.T) *llm {
	t.Helper()
	u := new(llm)
	files := map[string]string{}
	for _, f := range []string{"openai_chat.json", "openai_chat_stream.txt", "openai_chat_stream_plain.txt", "openai_responses.json", "openai_responses_stream.txt", "anthropic_messages.json", "anthropic_stream.txt", "ollama_chat_stream.ndjson",
		"gemini_generate.json", "gemini_stream.txt", "gemini_stream_array.json", "vertex_stream.txt"} {
		files[f] = fixture(t, f)
	}
	stream := func(w http.ResponseWriter, contentType, body, sep string) {
		w.Header().Set("Content-Type", contentType)
		for part := range strings.SplitAfterSeq(body, sep) {
			io.WriteString(w, part)
			http.NewResponseController(w).Flush()
		}
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		b, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.bodies = append(u.bodies, string(b))
		u.mu.Unlock()
		switch r.URL.Path {
		case "/v1/chat/completions":
			switch {
			case !bytes.Contains(b, []byte(`"stream":true`)):
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, files["openai_chat.json"])
			case bytes.Contains(b, []byte(`"include_usage":true`)):
				stream(w, "text/event-stream; charset=utf-8", files["openai_chat_stream.txt"], "\n\n")
			default:
				stream(w, "text/event-stream; charset=utf-8", files["openai_chat_stream_plain.txt"], "\n\n")
			}
		case "/v1/messages":
			if !bytes.Contains(b, []byte(`"stream":true`)) {
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, files["anthropic_messages.json"])
				break
			}
			stream(w, "text/event-stream; charset=utf-8", files["anthropic_stream.txt"], "\n\n")
		case "/v1/responses":
			if !bytes.Contains(b, []byte(`"stream":true`)) {
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, files["openai_responses.json"])
				break
			}
			stream(w, "text/event-stream; charset=utf-8", files["openai_responses_stream.txt"], "\n\n")
		case "/api/chat":
			stream(w, "application/x-ndjson", files["ollama_chat_stream.ndjson"], "\n")
		case "/cost":
			if n := r.URL.Query().Get("n"); n != "" {
				w.Header().Set("X-Cost", n)
			}
			io.WriteString(w, "ok")
		case "/usage":
			w.Header().Set("Content-Type", "application/json")
			if s, _ := strconv.Atoi(r.URL.Query().Get("status")); s != 0 {
				w.WriteHeader(s)
			}
			fmt.Fprintf(w, `{"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":%s}}`, r.URL.Query().Get("n"))
		case "/cut":
			s := files["openai_chat_stream.txt"]
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, s[:len(s)/2])
			http.NewResponseController(w).Flush()
			panic(http.ErrAbortHandler)
		default:
			if !serveGemini(w, r, files, stream) {
				http.NotFound(w, r)
			}
		}
	}))
	t.Cleanup(srv.Close)
	u.url = strings.TrimPrefix(srv.URL, "http://")
	return u
}

// lastBody is the body of the last request the upstream got.
func (u *llm) lastBody(t *testing.T) string {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.bodies) == 0 {
		t.Fatal("the upstream got no request")
	}
	return u.bodies[len(u.bodies)-1]
}

// tokenSite is a site on siteAddr that proxies to upstream, with one
// zone, name, keyed by X-Client, whose lines are zone, in the store
// block store ("" for the memory store), and an access log in accessLog
// with the request's cost. Each test names its zone, whose metrics
// outlive the test in the process.
func tokenSite(accessLog, upstream, store, name, zone string) string {
	return fmt.Sprintf(`
`+siteAddr+` {
	log {
		output file %s
		format json
	}
	log_append cost {http.rate_limit.cost}
	rate_limit {
		%s
		zone %s {
			key {header.X-Client}
			%s
		}
	}
	reverse_proxy %s
}
`, accessLog, store, name, zone, upstream)
}

// costUnits is zone's series of cost_units_total of kind, for a zone
// that counts tokens; costUnitsIn for one that counts unit.
func costUnits(zone, kind string) string { return costUnitsIn(zone, kind, "tokens") }

func costUnitsIn(zone, kind, unit string) string {
	return fmt.Sprintf(`caddy_http_rate_limit_cost_units_total{kind=%q,unit=%q,zone=%q}`, kind, unit, zone)
}

// waitTaken waits until zone, which counts tokens, has taken want units
// in all, once the responses are done: the handler trues up after the
// client has its answer. waitTakenIn waits for a zone that counts unit.
func waitTaken(t *testing.T, zone string, want int) { t.Helper(); waitTakenIn(t, zone, "tokens", want) }

func waitTakenIn(t *testing.T, zone, unit string, want int) {
	t.Helper()
	wait.For(t, fmt.Sprintf("zone %s to have taken %d %s", zone, want, unit), func() bool {
		return metricCount(t, adminURL, costUnitsIn(zone, "taken", unit)) == want
	})
}

// loggedCost waits for the access log line of the request with X-Client
// client and returns its cost.
func loggedCost(t *testing.T, accessLog, client string) string {
	t.Helper()
	var cost string
	wait.For(t, "the access log line of "+client, func() bool {
		for _, e := range logEntries(logLines(accessLog)) {
			if r, _ := e["request"].(map[string]any); r != nil && fmt.Sprint(r["headers"].(map[string]any)["X-Client"]) == "["+client+"]" {
				cost = fmt.Sprint(e["cost"])
				return true
			}
		}
		return false
	})
	return cost
}

// TestCostFromOpenAIThroughCaddy: a zone that reserves by max_tokens and
// the prompt's bytes admits a request if its key has room for that, says
// so in its headers, hands the body on as it came, and keeps, once the
// response is done, the total tokens its usage showed: in JSON, in a
// stream whose usage the client asked for (seen as it came), and in one
// whose usage the client did not ask for, asked for on its behalf and
// hidden from it (the client sees the stream it would have had).
func TestCostFromOpenAIThroughCaddy(t *testing.T) {
	u := newLLM(t)
	const zone = "tokens_openai"
	accessLog := filepath.Join(t.TempDir(), "access.log")
	startCaddy(t, tokenSite(accessLog, u.url, "", zone, `limit 100000
			window 1h
			algorithm fixed_window
			cost_from usage total
			reserve max_tokens 500
			usage_in_stream on`))
	url := siteURL + "/v1/chat/completions"
	taken := 0
	for _, c := range []struct {
		client, body string
		reserved     int // what the body reserves beside its bytes
		cost         int
		answer       string // the fixture the client sees
		rewritten    bool   // the upstream gets the body asking for the stream's usage
	}{
		{"json", `{"model":"gpt-4o","max_tokens":2000,"messages":[{"role":"user","content":"Hello"}]}`, 2000, 1163, "openai_chat.json", false},
		{"asked", `{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Hello"}]}`, 500, 21, "openai_chat_stream.txt", false},
		{"hidden", `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"Hello"}]}`, 500, 21, "openai_chat_stream_plain.txt", true},
	} {
		reservation := c.reserved + len(c.body)
		resp, answer := request(t, client, http.MethodPost, url, c.body, "X-Client: "+c.client, "Content-Type: application/json")
		status(t, resp, http.StatusOK)
		if got, want := resp.Header.Get("X-RateLimit-Used"), strconv.Itoa(reservation); got != want {
			t.Errorf("%s: X-RateLimit-Used %s at admission, want the reservation %s", c.client, got, want)
		}
		if got, want := resp.Header.Get("X-RateLimit-Remaining"), strconv.Itoa(100000-reservation); got != want {
			t.Errorf("%s: X-RateLimit-Remaining %s at admission, want %s", c.client, got, want)
		}
		if answer != fixture(t, c.answer) {
			t.Errorf("%s: the client saw\n%q\nwant %s", c.client, answer, c.answer)
		}
		got := u.lastBody(t)
		if c.rewritten {
			if want := strings.Replace(c.body, `{`, `{"stream_options":{"include_usage":true},`, 1); got != want {
				t.Errorf("%s: the upstream got\n%s\nwant\n%s", c.client, got, want)
			}
		} else if got != c.body {
			t.Errorf("%s: the upstream got\n%s\nwant the body sent\n%s", c.client, got, c.body)
		}
		taken += c.cost
		waitTaken(t, zone, taken)
		if used := keyState(t, adminURL, zone, c.client).Used; used != int64(c.cost) {
			t.Errorf("%s: the key uses %d once the response is done, want its cost %d", c.client, used, c.cost)
		}
		if got := loggedCost(t, accessLog, c.client); got != strconv.Itoa(c.cost) {
			t.Errorf("%s: {http.rate_limit.cost} %s in the access log, want %d", c.client, got, c.cost)
		}
	}
	reserved, released := metricCount(t, adminURL, costUnits(zone, "reserved")), metricCount(t, adminURL, costUnits(zone, "released"))
	if debt := metricCount(t, adminURL, costUnits(zone, "debt")); reserved-released+debt != taken || debt != 0 {
		t.Errorf("reserved %d, released %d, debt %d: want taken = %d = reserved - released + debt, with no debt", reserved, released, debt, taken)
	}
}

// TestCostFromStreamsThroughCaddy: the output tokens of Anthropic's
// Messages stream (the last message_delta's) and of Ollama's NDJSON
// stream are what their keys keep of a fixed reservation.
func TestCostFromStreamsThroughCaddy(t *testing.T) {
	u := newLLM(t)
	const zone = "tokens_streams"
	accessLog := filepath.Join(t.TempDir(), "access.log")
	startCaddy(t, tokenSite(accessLog, u.url, "", zone, `limit 100000
			window 1h
			cost_from usage output
			reserve 1000`))
	taken := 0
	for _, c := range []struct {
		client, path, body, answer string
		cost                       int
	}{
		{"anthropic", "/v1/messages", `{"model":"claude-sonnet-4-5","max_tokens":1024,"stream":true,"messages":[{"role":"user","content":"Hello"}]}`, "anthropic_stream.txt", 15},
		{"ollama", "/api/chat", `{"model":"llama3.2","messages":[{"role":"user","content":"why is the sky blue?"}]}`, "ollama_chat_stream.ndjson", 282},
	} {
		resp, answer := request(t, client, http.MethodPost, siteURL+c.path, c.body, "X-Client: "+c.client)
		status(t, resp, http.StatusOK)
		if got := resp.Header.Get("X-RateLimit-Used"); got != "1000" {
			t.Errorf("%s: X-RateLimit-Used %s at admission, want the reservation 1000", c.client, got)
		}
		if answer != fixture(t, c.answer) {
			t.Errorf("%s: the client saw\n%q\nwant %s", c.client, answer, c.answer)
		}
		if got := u.lastBody(t); got != c.body {
			t.Errorf("%s: the upstream got\n%s\nwant\n%s", c.client, got, c.body)
		}
		taken += c.cost
		waitTaken(t, zone, taken)
		if used := keyState(t, adminURL, zone, c.client).Used; used != int64(c.cost) {
			t.Errorf("%s: the key uses %d, want its cost %d", c.client, used, c.cost)
		}
	}
}

// The true-up tests run on the memory store here, and on the Redis store
// in TestCostFromTrueUpsRedis: each takes the store block (store, "" for
// the memory store) and its zone's name.

// TestCostFromHeaderThroughCaddy: a cost in a response header is what
// the key keeps; a response without the header keeps the reservation,
// and the access log shows it.
func TestCostFromHeaderThroughCaddy(t *testing.T) { testCostFromHeader(t, "", "tokens_header") }

func testCostFromHeader(t *testing.T, store, zone string) {
	u := newLLM(t)
	accessLog := filepath.Join(t.TempDir(), "access.log")
	startCaddy(t, tokenSite(accessLog, u.url, store, zone, `limit 1000
			window 1h
			cost_from header X-Cost
			reserve 50`))
	resp, _ := do(t, http.MethodGet, siteURL+"/cost?n=7", "X-Client: told")
	status(t, resp, http.StatusOK)
	waitTakenIn(t, zone, "units", 7)
	waitUsed(t, adminURL, zone, "told", 7)
	resp, _ = do(t, http.MethodGet, siteURL+"/cost", "X-Client: untold")
	status(t, resp, http.StatusOK)
	waitTakenIn(t, zone, "units", 7+50)
	waitUsed(t, adminURL, zone, "untold", 50)
	if got := loggedCost(t, accessLog, "untold"); got != "50" {
		t.Errorf("{http.rate_limit.cost} %s without X-Cost, want the reservation 50", got)
	}
	if got := metricCount(t, adminURL, costUnitsIn(zone, "released", "units")); got != 50-7 {
		t.Errorf("released %d, want %d", got, 50-7)
	}
}

// TestCostFromDebtThroughCaddy: a response that cost more than its key
// had room for leaves the key in debt, refused until its window has room
// again.
func TestCostFromDebtThroughCaddy(t *testing.T) { testCostFromDebt(t, "", "tokens_debt") }

func testCostFromDebt(t *testing.T, store, zone string) {
	u := newLLM(t)
	const window = 3 * time.Second
	startCaddy(t, tokenSite(filepath.Join(t.TempDir(), "access.log"), u.url, store, zone, `limit 100
			window 3s
			algorithm fixed_window
			cost_from usage total
			reserve 10`))
	roomInWindow(window, 2*time.Second)
	resp, _ := do(t, http.MethodGet, siteURL+"/usage?n=250", "X-Client: heavy")
	status(t, resp, http.StatusOK)
	waitTaken(t, zone, 250)
	if debt := metricCount(t, adminURL, costUnits(zone, "debt")); debt != 240 {
		t.Errorf("debt %d, want 250 - 10", debt)
	}
	// A key owes at most one limit past its limit: 10 + 240 counts as 200.
	waitUsed(t, adminURL, zone, "heavy", 200)
	resp, _ = do(t, http.MethodGet, siteURL+"/usage?n=1", "X-Client: heavy")
	status(t, resp, http.StatusTooManyRequests)
	hits := u.hits.Load()
	wait.For(t, "the key's next window to admit it", func() bool {
		resp, _ := do(t, http.MethodGet, siteURL+"/usage?n=1", "X-Client: heavy")
		return resp.StatusCode == http.StatusOK
	})
	if got := u.hits.Load(); got != hits+1 {
		t.Errorf("the upstream got %d requests while the key was in debt", got-hits-1)
	}
}

// TestCostFromCutStreamKeepsReservation: a stream cut off before its
// usage shows no cost, and the key keeps its reservation.
func TestCostFromCutStreamKeepsReservation(t *testing.T) { testCostFromCutStream(t, "", "tokens_cut") }

func testCostFromCutStream(t *testing.T, store, zone string) {
	u := newLLM(t)
	startCaddy(t, tokenSite(filepath.Join(t.TempDir(), "access.log"), u.url, store, zone, `limit 1000
			window 1h
			cost_from usage total
			reserve 300`))
	req, _ := http.NewRequest(http.MethodPost, siteURL+"/cut", strings.NewReader(`{"model":"gpt-4o","stream":true}`))
	req.Header.Set("X-Client", "cut")
	if resp, err := client.Do(req); err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	waitTaken(t, zone, 300)
	if used := keyState(t, adminURL, zone, "cut").Used; used != 300 {
		t.Errorf("the key uses %d after a cut stream, want the reservation 300", used)
	}
	if released := metricCount(t, adminURL, costUnits(zone, "released")); released != 0 {
		t.Errorf("released %d of a cut stream, want 0", released)
	}
}

// TestCostFromBodyTooLarge: a zone that reads bodies answers 413 to one
// larger than 1 MiB, whether its length is told or not, and takes
// nothing; the upstream never sees it.
func TestCostFromBodyTooLarge(t *testing.T) {
	u := newLLM(t)
	const zone = "tokens_large"
	startCaddy(t, tokenSite(filepath.Join(t.TempDir(), "access.log"), u.url, "", zone, `limit 10000000
			window 1h
			cost_from usage total
			reserve max_tokens 100`))
	// The metric is the process's: another run of this test (-count) left
	// its own in it.
	reservedBefore := metricCount(t, adminURL, costUnits(zone, "reserved"))
	big := `{"model":"gpt-4o","messages":[{"role":"user","content":"` + strings.Repeat("a", 2<<20) + `"}]}`
	resp, _ := request(t, client, http.MethodPost, siteURL+"/v1/chat/completions", big, "X-Client: big")
	status(t, resp, http.StatusRequestEntityTooLarge)
	// Without a Content-Length: chunked, read until it passes the bound.
	req, _ := http.NewRequest(http.MethodPost, siteURL+"/v1/chat/completions", io.MultiReader(strings.NewReader(big)))
	req.Header.Set("X-Client", "big")
	resp = send(t, func() (*http.Response, error) { return client.Do(req) })
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("chunked: status %d, want 413", resp.StatusCode)
	}
	if used := keyState(t, adminURL, zone, "big").Used; used != 0 {
		t.Errorf("the key uses %d after bodies refused, want 0", used)
	}
	if n := metricCount(t, adminURL, costUnits(zone, "reserved")) - reservedBefore; n != 0 {
		t.Errorf("reserved %d for bodies refused", n)
	}
	if n := u.hits.Load(); n != 0 {
		t.Errorf("the upstream got %d requests", n)
	}
	// A body just under the bound goes through whole.
	small := `{"model":"gpt-4o","messages":[{"role":"user","content":"` + strings.Repeat("a", 1<<20-100) + `"}]}`
	resp, _ = request(t, client, http.MethodPost, siteURL+"/v1/chat/completions", small, "X-Client: small")
	status(t, resp, http.StatusOK)
	if got := u.lastBody(t); got != small {
		t.Errorf("the upstream got %d bytes of a body of %d", len(got), len(small))
	}
}

// TestCostFromCountStatusReleases: with count_status, a response whose
// status is not counted releases the whole reservation, whatever usage
// it shows; a counted one keeps its cost.
func TestCostFromCountStatusReleases(t *testing.T) { testCostFromCountStatus(t, "", "tokens_status") }

func testCostFromCountStatus(t *testing.T, store, zone string) {
	u := newLLM(t)
	startCaddy(t, tokenSite(filepath.Join(t.TempDir(), "access.log"), u.url, store, zone, `limit 1000
			window 1h
			count_status 2xx
			cost_from usage total
			reserve 100`))
	resp, _ := do(t, http.MethodGet, siteURL+"/usage?n=40&status=500", "X-Client: failed")
	status(t, resp, http.StatusInternalServerError)
	wait.For(t, "the reservation of a failed response to be released", func() bool {
		return metricCount(t, adminURL, costUnits(zone, "released")) == 100
	})
	waitUsed(t, adminURL, zone, "failed", 0)
	resp, _ = do(t, http.MethodGet, siteURL+"/usage?n=40", "X-Client: served")
	status(t, resp, http.StatusOK)
	waitTaken(t, zone, 40)
	waitUsed(t, adminURL, zone, "served", 40)
}

// TestCostFromTrueUpsRedis runs the true-up tests on the Redis store,
// with lease off and on: a true-up releases what its cost did not use, a
// debt refuses the key until its window has room, a cut stream keeps its
// reservation, and an uncounted status releases it all. With lease on,
// as off, a reservation takes no lease and its true-up is settled in
// Redis, where it is kept in flight until then.
func TestCostFromTrueUpsRedis(t *testing.T) {
	s := redistest.Standalone(t)
	for _, lease := range []string{"off", "on"} {
		store := redisStore("address " + s.URL() + "\nlease " + lease)
		t.Run("lease_"+lease, func(t *testing.T) {
			for _, c := range []struct {
				name string
				test func(t *testing.T, store, zone string)
			}{
				{"header", testCostFromHeader},
				{"debt", testCostFromDebt},
				{"cut", testCostFromCutStream},
				{"status", testCostFromCountStatus},
			} {
				t.Run(c.name, func(t *testing.T) { c.test(t, store, "tokens_"+c.name+"_redis_lease_"+lease) })
			}
		})
	}
}

// TestZoneWithoutCostFromUnchanged: a zone without cost_from counts its
// requests as it always did, never reads their bodies (a 2 MiB body goes
// through), and has no cost series.
func TestZoneWithoutCostFromUnchanged(t *testing.T) {
	u := newLLM(t)
	const zone = "tokens_none"
	startCaddy(t, tokenSite(filepath.Join(t.TempDir(), "access.log"), u.url, "", zone, `limit 5
			window 1h`))
	big := strings.Repeat("a", 2<<20)
	resp, _ := request(t, client, http.MethodPost, siteURL+"/cost?n=900", big, "X-Client: plain")
	status(t, resp, http.StatusOK)
	if got := u.lastBody(t); got != big {
		t.Errorf("the upstream got %d bytes of a body of %d", len(got), len(big))
	}
	if got := resp.Header.Get("X-RateLimit-Used"); got != "1" {
		t.Errorf("X-RateLimit-Used %s, want 1", got)
	}
	waitUsed(t, adminURL, zone, "plain", 1)
	if v := metricValue(t, adminURL, costUnits(zone, "reserved")); v != "" {
		t.Errorf("a zone without cost_from has a cost series: %s", v)
	}
}

// TestCostFromInUnitsThroughCaddy runs caddy rate-limit against a
// running Caddy whose cost_from zone clients use: the zone list shows the
// limit in units, the top keys count the tokens each key took (a
// rejected request none) rather than its requests, in the admin API as
// in the command, and a key whose response cost more than its
// reservation shows its debt, the units it stands past its limit.
func TestCostFromInUnitsThroughCaddy(t *testing.T) {
	u := newLLM(t)
	const zone = "tokens_units"
	roomInWindow(time.Hour, time.Minute)
	in := startInstance(t, `	rate_limit {
		log_keys on
		zone `+zone+` {
			key {header.X-Client}
			limit 200
			window 1h
			algorithm fixed_window
			cost_from usage total
			reserve 10
		}
	}
	reverse_proxy `+u.url+`
`, "")
	cli := commandAt(t, in)

	for _, c := range []struct {
		client, path string
		status       int
	}{
		{"light", "/usage?n=30", http.StatusOK},
		{"light", "/usage?n=20", http.StatusOK},
		{"heavy", "/usage?n=250", http.StatusOK},
		{"heavy", "/usage?n=1", http.StatusTooManyRequests},
	} {
		resp, _ := do(t, http.MethodGet, in.url+c.path, "X-Client: "+c.client)
		status(t, resp, c.status)
		if c.status == http.StatusOK {
			// Counted once Caddy is done with the response.
			wait.For(t, "the response's cost counted", func() bool {
				return keyState(t, in.admin, zone, c.client).Used > 10
			})
		}
	}

	// The probe that Caddy is up (/ready, no X-Client) is counted too,
	// under its address, at its reservation: its answer shows no usage.
	var a topAnswer
	wait.For(t, "the top keys in units", func() bool {
		a = readAdmin[topAnswer](t, in.admin, "/rate_limit/zones/"+zone+"/top")
		return len(a.Keys) >= 2 && a.Keys[1].Units == 50
	})
	if !a.Units || a.Keys[0].Key != "heavy" || a.Keys[0].Units != 250 || a.Keys[0].Rejected != 1 || a.Keys[0].Requests != 0 || a.Keys[1].Key != "light" || a.Keys[1].Requests != 0 {
		t.Fatalf("top: %+v, want units: heavy with 250 and 1 rejected, light with 50, no requests", a)
	}

	if got, want := tableRow(cli("zones"), zone), []string{zone, "fixed_window", "200", "units", "1h0m0s", "memory", "-", "-"}; !slices.Equal(got, want) {
		t.Errorf("zones row %q, want %q", got, want)
	}
	top := cli("top", zone)
	if got := strings.Fields(strings.SplitN(top, "\n", 2)[0]); !slices.Equal(got, []string{"KEY", "UNITS", "REJECTED", "FROM"}) {
		t.Errorf("top header %q, want KEY UNITS REJECTED FROM", got)
	}
	const from = "{http.request.header.X-Client}"
	if rows := topRows(top); len(rows) < 2 || !slices.Equal(rows[0], []string{"heavy", "250", "1", from}) || !slices.Equal(rows[1], []string{"light", "50", "0", from}) {
		t.Errorf("top rows %q, want heavy 250 1, light 50 0, from %s", rows, from)
	}
	if !strings.Contains(top, "\nUnits over about the last minute") {
		t.Errorf("top footer of\n%s\nwant units", top)
	}

	key := cli("key", zone, "heavy")
	if got := tableRow(key, "debt"); !slices.Equal(got, []string{"debt", "50"}) {
		t.Errorf("key heavy: debt %q, want 250 - 200 = 50", got)
	}
	if got := tableRow(cli("key", zone, "light"), "debt"); !slices.Equal(got, []string{"debt", "0"}) {
		t.Errorf("key light: debt %q, want 0", got)
	}
	if info := keyState(t, in.admin, zone, "heavy"); info.Debt == nil || *info.Debt != 50 || info.Used != 250 {
		t.Errorf("admin API's key heavy: %+v, want used 250, debt 50", info)
	}
}

// heldStream is an upstream that answers OpenAI's Chat Completions
// stream (with its usage) in two parts: its first chunk at once, and the
// rest once release is closed, so that a response stays in flight for
// as long as a test needs. started gets a value once the first chunk is
// sent.
type heldStream struct {
	url     string // host:port
	started chan struct{}
	release chan struct{}
}

func newHeldStream(t *testing.T) *heldStream {
	t.Helper()
	u := &heldStream{started: make(chan struct{}, 1), release: make(chan struct{})}
	answer := fixture(t, "openai_chat_stream.txt")
	first, rest, _ := strings.Cut(answer, "\n\n")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		io.WriteString(w, first+"\n\n")
		http.NewResponseController(w).Flush()
		select {
		case u.started <- struct{}{}:
		default:
		}
		select {
		case <-u.release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, rest)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		select {
		case <-u.release:
		default:
			close(u.release)
		}
	})
	u.url = strings.TrimPrefix(srv.URL, "http://")
	return u
}

// TestCostFromReservedInFlight: while a streamed response is held open
// by the upstream, its key shows, in the admin API and caddy rate-limit
// key, the units reserved by its request (in flight, not trued up yet)
// within what it uses; once the stream ends, none reserved, and the key
// keeps the cost its usage showed. On the memory store, and on Redis
// with leases, where a fleet's other instance shows what the first has
// in flight.
func TestCostFromReservedInFlight(t *testing.T) {
	const zone = "fleet"
	lines := `key {header.X-Client}
			limit 100000
			window 1h
			algorithm fixed_window
			cost_from usage output
			reserve 1000`
	t.Run("memory", func(t *testing.T) {
		u := newHeldStream(t)
		in := startInstance(t, `	rate_limit {
		zone `+zone+` {
			`+lines+`
		}
	}
	reverse_proxy `+u.url+`
`, "/work")
		testReservedInFlight(t, u, in, in)
	})
	t.Run("redis", func(t *testing.T) {
		s := redistest.Standalone(t)
		u := newHeldStream(t)
		fleet := startFleet(t, 2, fleetSpec{store: "address " + s.URL() + "\nlease on", zone: lines, upstream: u.url})
		testReservedInFlight(t, u, fleet[0], fleet[1])
	})
}

// testReservedInFlight streams a request of zone fleet through via, held
// open by u, and reads its key through shown's admin API and command.
func testReservedInFlight(t *testing.T, u *heldStream, via, shown instance) {
	const zone, key = "fleet", "streamer"
	roomInWindow(time.Hour, time.Minute)
	address := strings.TrimPrefix(shown.admin, "http://")
	keyRows := func() (used, reserved []string) {
		t.Helper()
		out, _, err := rateLimitCLI(t, "key", zone, key, "--address", address)
		if err != nil {
			t.Fatalf("caddy rate-limit key: %v", err)
		}
		return tableRow(out, "used"), tableRow(out, "reserved")
	}

	type answer struct {
		status int
		body   string
		err    error
	}
	done := make(chan answer, 1)
	go func() {
		req, err := http.NewRequest(http.MethodPost, via.url, strings.NewReader(`{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Hello"}]}`))
		if err != nil {
			done <- answer{err: err}
			return
		}
		req.Header.Set("X-Client", key)
		resp, err := client.Do(req)
		if err != nil {
			done <- answer{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- answer{resp.StatusCode, string(b), err}
	}()
	select {
	case <-u.started:
	case a := <-done:
		t.Fatalf("the request ended before its stream began: %+v", a)
	case <-time.After(30 * time.Second):
		t.Fatal("the upstream got no request")
	}

	if info := keyState(t, shown.admin, zone, key); info.Reserved == nil || *info.Reserved != 1000 || info.Used != 1000 {
		t.Errorf("admin API, stream in flight: used %d, reserved %v, want 1000 of 1000 used reserved", info.Used, fmtPtr(info.Reserved))
	}
	if used, reserved := keyRows(); !slices.Equal(used, []string{"used", "1000"}) || !slices.Equal(reserved, []string{"reserved", "1000"}) {
		t.Errorf("caddy rate-limit key, stream in flight: %q, %q, want used 1000, reserved 1000", used, reserved)
	}

	close(u.release)
	a := <-done
	if a.err != nil || a.status != http.StatusOK || a.body != fixture(t, "openai_chat_stream.txt") {
		t.Fatalf("the stream: status %d, error %v, body\n%s\nwant 200 and the whole stream", a.status, a.err, a.body)
	}
	// The usage shows 12 completion tokens; the true-up follows the
	// response.
	wait.For(t, "the stream's true-up", func() bool {
		info := keyState(t, shown.admin, zone, key)
		return info.Used == 12 && info.Reserved != nil && *info.Reserved == 0
	})
	if used, reserved := keyRows(); !slices.Equal(used, []string{"used", "12"}) || !slices.Equal(reserved, []string{"reserved", "0"}) {
		t.Errorf("caddy rate-limit key, stream done: %q, %q, want used 12, reserved 0", used, reserved)
	}
}

// fmtPtr shows a number that may be absent.
func fmtPtr(n *int64) string {
	if n == nil {
		return "absent"
	}
	return strconv.FormatInt(*n, 10)
}

// TestCostFromCostTooLargeToReadIsDebt: a cost too large to read (19
// digits and more, in a header or in a usage) is a debt past the limit,
// capped at one limit as any debt, not no cost: the key does not keep
// its smaller reservation.
func TestCostFromCostTooLargeToReadIsDebt(t *testing.T) {
	huge := strings.Repeat("9", 19)
	for _, c := range []struct{ name, from, path string }{
		{"header", "cost_from header X-Cost", "/cost?n=" + huge},
		{"usage", "cost_from usage total", "/usage?n=" + huge},
	} {
		t.Run(c.name, func(t *testing.T) {
			u := newLLM(t)
			zone := "tokens_huge_" + c.name
			startCaddy(t, tokenSite(filepath.Join(t.TempDir(), "access.log"), u.url, "", zone, `limit 100
			window 1h
			algorithm fixed_window
			`+c.from+`
			reserve 10`))
			resp, _ := do(t, http.MethodGet, siteURL+c.path, "X-Client: huge")
			status(t, resp, http.StatusOK)
			// A key owes at most one limit past its limit.
			waitUsed(t, adminURL, zone, "huge", 200)
			resp, _ = do(t, http.MethodGet, siteURL+"/cost?n=1", "X-Client: huge")
			status(t, resp, http.StatusTooManyRequests)
		})
	}
}

// TestCostThatCanNeverPassAnswers413: a request whose reservation is
// more than its zone lets pass at once, a gcra zone's burst or the limit
// in force (the key's override raises it), is answered 413 with a JSON
// body naming the zone, the cost and the limit, and no Retry-After; it
// takes nothing and the upstream never sees it. With handle_errors, the
// error's message is that JSON.
func TestCostThatCanNeverPassAnswers413(t *testing.T) {
	u := newLLM(t)
	site := func(errors string) string {
		return `
` + siteAddr + ` {
	rate_limit {
		zone tokens_burst {
			match {
				path /v1/chat/completions
			}
			key {header.X-Client}
			limit 10
			window 1s
			algorithm gcra
			burst 3
			cost_from header X-Cost
			reserve max_tokens 1
		}
		zone tokens_limit {
			match {
				path /v1/messages
			}
			key {header.X-Client}
			limit 100
			window 1h
			algorithm fixed_window
			cost_from header X-Cost
			reserve max_tokens 1
			ban 1h
		}
	}
	reverse_proxy ` + u.url + `
	` + errors + `
}
`
	}
	startCaddy(t, site(""))
	tooLarge := func(t *testing.T, path, key string, maxTokens int, want string) {
		t.Helper()
		resp, body := request(t, client, http.MethodPost, siteURL+path, fmt.Sprintf(`{"max_tokens":%d}`, maxTokens), "X-Client: "+key)
		status(t, resp, http.StatusRequestEntityTooLarge)
		if body != want || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s: body %s (%s), want application/json %s", path, body, resp.Header.Get("Content-Type"), want)
		}
		if ra := resp.Header.Get("Retry-After"); ra != "" {
			t.Errorf("%s: Retry-After %q, want none", path, ra)
		}
	}
	tooLarge(t, "/v1/chat/completions", "a", 5, `{"error":"request cost exceeds the zone's burst","zone":"tokens_burst","cost":5,"limit":10,"burst":3}`)
	tooLarge(t, "/v1/messages", "a", 500, `{"error":"request cost exceeds the zone's limit","zone":"tokens_limit","cost":500,"limit":100}`)
	if n := u.hits.Load(); n != 0 {
		t.Errorf("the upstream got %d requests that can never pass", n)
	}
	for _, zone := range []string{"tokens_burst", "tokens_limit"} {
		if used := keyState(t, adminURL, zone, "a").Used; used != 0 {
			t.Errorf("zone %s: the key uses %d after requests that can never pass, want 0", zone, used)
		}
	}
	// A cost that can never pass says nothing of the key's other
	// requests: it bans nobody.
	if ends := keyState(t, adminURL, "tokens_limit", "a").BanEnds; !ends.IsZero() {
		t.Errorf("zone tokens_limit: the key is banned until %s after a request that can never pass, want no ban", ends)
	}
	resp, _ := request(t, client, http.MethodPost, siteURL+"/v1/chat/completions", `{"max_tokens":3}`, "X-Client: a")
	status(t, resp, http.StatusOK)
	// The key's override is the limit in force.
	if code, body := adminJSON(t, adminURL, http.MethodPut, "/rate_limit/zones/tokens_limit/keys/vip/limit", `{"limit":1000}`); code != http.StatusOK {
		t.Fatalf("override: %d %s", code, body)
	}
	resp, _ = request(t, client, http.MethodPost, siteURL+"/v1/messages", `{"max_tokens":500}`, "X-Client: vip")
	status(t, resp, http.StatusOK)
	tooLarge(t, "/v1/messages", "vip", 1500, `{"error":"request cost exceeds the zone's limit","zone":"tokens_limit","cost":1500,"limit":1000}`)

	// As docs/reference.md shows it.
	mustReload(t, site(`handle_errors 413 {
		header Content-Type application/json
		respond "{err.message}" 413
	}`))
	tooLarge(t, "/v1/messages", "b", 500, `{"error":"request cost exceeds the zone's limit","zone":"tokens_limit","cost":500,"limit":100}`)
}
