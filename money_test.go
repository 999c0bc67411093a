package ratelimit

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/d61b427a/caddy-rate-limit/algorithms/vectors"
	"github.com/d61b427a/caddy-rate-limit/costfrom"
	"github.com/d61b427a/caddy-rate-limit/internal/money"
)

// TestMoneyCaddyfile: cost_from usage price and its lines are the zone's
// price table as written, and a limit in dollars is kept as written.
func TestMoneyCaddyfile(t *testing.T) {
	block := `rate_limit {
zone spend {
	key {header.X-User}
	limit {http.vars.budget} $50
	window 720h
	cost_from usage price {
		gpt-4o-mini      input 0.15 output 0.60 cache_read 0.075
		claude-sonnet-4* input 3.00 output 15.00 cache_read 0.30 cache_write 3.75 cache_write_1h 6
		*                input 1 output 4
	}
	reserve max_tokens 4096
}
}`
	tokens, err := caddyfile.Tokenize([]byte(block), "Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	var h Handler
	if err := h.UnmarshalCaddyfile(caddyfile.NewDispenser(tokens)); err != nil {
		t.Fatal(err)
	}
	z := h.Zones[0]
	got, _ := json.Marshal(struct {
		Limit    Alternatives `json:"limit"`
		CostFrom *CostFrom    `json:"cost_from"`
	}{z.LimitAlternatives, z.CostFrom})
	want := `{"limit":["{http.vars.budget}","$50"],"cost_from":{"usage":"price","price":[` +
		`{"model":"gpt-4o-mini","input":"0.15","output":"0.60","cache_read":"0.075"},` +
		`{"model":"claude-sonnet-4*","input":"3.00","output":"15.00","cache_read":"0.30","cache_write":"3.75","cache_write_1h":"6"},` +
		`{"model":"*","input":"1","output":"4"}]}}`
	if string(got) != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	// The JSON a program writes reads the same, prices given as numbers
	// too, kept as written.
	var back CostFrom
	if err := json.Unmarshal([]byte(`{"usage":"price","price":[{"model":"m","input":0.075,"output":"1e3"}]}`), &back); err != nil {
		t.Fatal(err)
	}
	if back.Price[0].Input != "0.075" || back.Price[0].Output != "1e3" {
		t.Errorf("prices read as %q and %q", back.Price[0].Input, back.Price[0].Output)
	}
}

// moneyZone is a zone priced in money, on the memory store, with a price
// table of three lines, the last for any model.
const moneyZone = `{"name":%q,"key":"{http.request.header.X-User}","limit":["{http.request.header.X-Budget}","$0.05"],"window":"1h",
	"algorithm":"fixed_window","cost_from":{"usage":"price","price":[
		{"model":"gpt-4o-mini","input":"0.15","output":"0.60","cache_read":"0.075"},
		{"model":"claude-sonnet-4*","input":"3","output":"15","cache_read":"0.30","cache_write":"3.75","cache_write_1h":"6"}%s]},
	"reserve":{"max_tokens":1000}}`

// moneyRequest sends a request with body through h for user, whose next
// handler answers answer as JSON (if it is reached): its status, the
// response, and whether the next handler was reached. The request is
// served as by a server without error routes, which the handler answers
// itself.
func moneyRequest(t *testing.T, h *Handler, user, body, answer string, headers ...string) (int, *httptest.ResponseRecorder, bool) {
	t.Helper()
	r, _ := testRequest(t.Context(), http.MethodPost, "192.0.2.1", append([]string{"X-User: " + user}, headers...)...)
	r = r.WithContext(context.WithValue(r.Context(), caddyhttp.ServerCtxKey, new(caddyhttp.Server)))
	r.Body, r.ContentLength = io.NopCloser(strings.NewReader(body)), int64(len(body))
	reached := false
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		reached = true
		w.Header().Set("Content-Type", "application/json")
		_, err := io.WriteString(w, answer)
		return err
	})
	w := httptest.NewRecorder()
	if err := h.ServeHTTP(w, r, next); err != nil {
		t.Fatal(err)
	}
	return w.Code, w, reached
}

// userUsed is what the key of the X-User header's value user used in
// zone, in the current window.
func userUsed(t *testing.T, h *Handler, zone, user string) int64 {
	t.Helper()
	return used(t, h, zone, spaceTag("{http.request.header.X-User}")+user)
}

// TestMoneyZone: a zone priced in money reserves the request's bound and
// body at its model's prices, in picodollars, trues up to what the
// response's usage costs by kind of token, to the unit, and reports
// picodollars in its headers, which name the unit.
func TestMoneyZone(t *testing.T) {
	h := provisionHandler(t, `{"headers":"both","zones":[`+fmt.Sprintf(moneyZone, "unit_money", `,{"model":"*","input":"1","output":"4"}`)+`]}`)
	withClock(t, h, vectors.Start)
	body := `{"model":"claude-sonnet-4-5","max_tokens":1000,"messages":[{"role":"user","content":"hi"}]}`
	// 1000 tokens out at $15 a million, and the body at the highest
	// input-side price, the 1-hour write's $6.
	reservation := int64(1000*15_000_000 + len(body)*6_000_000)
	answer := `{"model":"claude-sonnet-4-5-20250929","usage":{"input_tokens":20,"cache_creation_input_tokens":30,"cache_read_input_tokens":40,` +
		`"cache_creation":{"ephemeral_1h_input_tokens":10},"output_tokens":50}}`
	cost := int64(20*3_000_000 + 20*3_750_000 + 10*6_000_000 + 40*300_000 + 50*15_000_000)
	if unit := h.Zones[0].Info().Unit; unit != money.Unit {
		t.Errorf("the admin API's zone has unit %q, want %s", unit, money.Unit)
	}
	status, w, reached := moneyRequest(t, h, "alice", body, answer)
	if status != http.StatusOK || !reached {
		t.Fatalf("status %d, reached %v", status, reached)
	}
	limit := int64(50_000_000_000) // $0.05
	for name, want := range map[string]string{
		"X-Ratelimit-Limit":     strconv.FormatInt(limit, 10),
		"X-Ratelimit-Remaining": strconv.FormatInt(limit-reservation, 10),
		"Ratelimit-Policy":      `"unit_money";q=50000000000;qu="picodollars";w=3600`,
	} {
		if got := w.Header().Get(name); got != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}
	if got := userUsed(t, h, "unit_money", "alice"); got != cost {
		t.Errorf("used %d after the true-up, want %d", got, cost)
	}

	// The true-up prices by the model the response names when a line
	// prices it: a router's alias, priced at admission by *, costs what
	// the model behind it does.
	moneyRequest(t, h, "bob", `{"model":"my-alias","max_tokens":10}`,
		`{"model":"gpt-4o-mini","usage":{"prompt_tokens":1000,"completion_tokens":100,"prompt_tokens_details":{"cached_tokens":800}}}`)
	if got, want := userUsed(t, h, "unit_money", "bob"), int64(200*150_000+800*75_000+100*600_000); got != want {
		t.Errorf("bob: used %d, want %d (priced as gpt-4o-mini)", got, want)
	}

	// A limit from a placeholder is read in dollars, with or without $.
	for _, budget := range []string{"$0.01", "0.01"} {
		_, w, _ := moneyRequest(t, h, "carol", `{"model":"gpt-4o-mini","max_tokens":1}`, `{}`, "X-Budget: "+budget)
		if got := w.Header().Get("X-Ratelimit-Limit"); got != "10000000000" {
			t.Errorf("budget %s: X-RateLimit-Limit %q, want 10000000000", budget, got)
		}
	}
	// One that is not money falls back to the next alternative.
	if _, w, _ := moneyRequest(t, h, "dave", `{"model":"gpt-4o-mini","max_tokens":1}`, `{}`, "X-Budget: lots"); w.Header().Get("X-Ratelimit-Limit") != strconv.FormatInt(limit, 10) {
		t.Errorf("budget lots: X-RateLimit-Limit %q, want the zone's $0.05", w.Header().Get("X-Ratelimit-Limit"))
	}
}

// TestMoneyRefusesAModelWithoutAPrice: without a line for the request's
// model, and without *, a request is answered 400 with a body that names
// the model, before anything is taken, and the next handler never sees
// it; as is one that names no model.
func TestMoneyRefusesAModelWithoutAPrice(t *testing.T) {
	h := provisionHandler(t, `{"zones":[`+fmt.Sprintf(moneyZone, "unit_unpriced", "")+`]}`)
	withClock(t, h, vectors.Start)
	for _, c := range []struct{ body, code, names string }{
		{`{"model":"gpt-5","max_tokens":10}`, "model_not_priced", `"gpt-5"`},
		{`{"max_tokens":10}`, "model_missing", "no model"},
		{`not json`, "model_missing", "no model"},
	} {
		status, w, reached := moneyRequest(t, h, "erin", c.body, `{}`)
		var answer fieldError
		if err := json.Unmarshal(w.Body.Bytes(), &answer); err != nil {
			t.Fatalf("%s: answer %q: %v", c.body, w.Body, err)
		}
		if status != http.StatusBadRequest || reached || answer.Error.Code != c.code || answer.Error.Param != "model" ||
			!strings.Contains(answer.Error.Message, c.names) || !strings.Contains(answer.Error.Message, "unit_unpriced") {
			t.Errorf("%s: status %d, reached %v, answer %s; want 400 %s naming %s", c.body, status, reached, w.Body, c.code, c.names)
		}
	}
	// What the key holds after one request priced: that request's cost
	// alone, the refused ones took nothing.
	moneyRequest(t, h, "erin", `{"model":"gpt-4o-mini"}`, `{"usage":{"prompt_tokens":10,"completion_tokens":10}}`)
	if got, want := userUsed(t, h, "unit_unpriced", "erin"), int64(10*150_000+10*600_000); got != want {
		t.Errorf("used %d, want %d: the refused requests took %d", got, want, got-want)
	}
	// A dry-run zone never refuses: it does not count what it cannot
	// price.
	dry := provisionHandler(t, `{"zones":[`+strings.Replace(fmt.Sprintf(moneyZone, "unit_unpriced_dry", ""), `"window"`, `"dry_run":true,"window"`, 1)+`]}`)
	withClock(t, dry, vectors.Start)
	if status, _, reached := moneyRequest(t, dry, "erin", `{"model":"gpt-5"}`, `{}`); status != http.StatusOK || !reached {
		t.Errorf("dry run: status %d, reached %v; want 200 and reached", status, reached)
	}
}

// TestMoneyReservation: the bound times its choices at the output price,
// the body's bytes at the highest input-side price; a bound that means
// none, the whole limit at least.
func TestMoneyReservation(t *testing.T) {
	price := &costfrom.Price{Input: 3, Output: 15, CacheRead: 1, CacheWrite: 4, CacheWrite1h: 6}
	m := meter{on: true, def: 100, prices: costfrom.Prices{{Model: "*", Price: *price}}}
	for _, c := range []struct {
		body string
		want int64
	}{
		{`{"max_tokens":300,"n":2}`, 600*15 + 24*6},
		{`{}`, 100*15 + 2*6},
		{`{"max_tokens":-1}`, 5000},
	} {
		var req costfrom.Request
		if err := req.Read("", []byte(c.body)); err != nil {
			t.Fatal(err)
		}
		if got := m.reservation(&req, 5000, price); got != c.want {
			t.Errorf("%s: reservation %d, want %d", c.body, got, c.want)
		}
	}
}

// TestMoneyLeastReservation: the least reservation of a zone priced in
// money, which a key the store already refuses is asked for before its
// body is read, is no more than any request reserves: one token at the
// lowest output price, 0 where a line prices a free model.
func TestMoneyLeastReservation(t *testing.T) {
	for _, c := range []struct {
		name  string
		lines costfrom.Prices
		least int64
	}{
		{"paid", costfrom.Prices{{Model: "gpt-4o*", Price: costfrom.Price{Input: 2_500_000, Output: 10_000_000}},
			{Model: "*", Price: costfrom.Price{Input: 150_000, Output: 600_000}}}, 600_000},
		{"a free model", costfrom.Prices{{Model: "local-*", Price: costfrom.Price{}},
			{Model: "*", Price: costfrom.Price{Input: 150_000, Output: 600_000}}}, 0},
	} {
		m := meter{on: true, def: 100, prices: c.lines}
		least := m.leastReservation()
		if least != c.least {
			t.Errorf("%s: least reservation %d, want %d", c.name, least, c.least)
		}
		for _, body := range []string{`{"model":"gpt-4o","max_tokens":1}`, `{"model":"local-llama","max_tokens":1}`, `{"max_tokens":1}`, ``} {
			var req costfrom.Request
			if err := req.Read("", []byte(body)); err != nil {
				t.Fatal(err)
			}
			price, unpriced := m.findPrice("z", &req)
			if unpriced != nil {
				t.Fatalf("%s: %s: %v", c.name, body, unpriced)
			}
			if r := m.reservation(&req, 5000, price); r < least {
				t.Errorf("%s: %s reserves %d, less than the least reservation %d", c.name, body, r, least)
			}
		}
	}
}
