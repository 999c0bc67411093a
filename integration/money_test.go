package integration

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/d61b427a/caddy-rate-limit/admin"
	"github.com/d61b427a/caddy-rate-limit/internal/docs"
	"github.com/d61b427a/caddy-rate-limit/internal/jwttest"
	"github.com/d61b427a/caddy-rate-limit/internal/money"
	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
)

// This file tests zones priced in money (cost_from usage price) through
// Caddy: the official clients' requests reserved and trued up to what
// their answers cost at each model's prices, to the picodollar, on the
// memory store and on Redis; a fleet that never takes past a limit in
// dollars; a model without a price refused; and the dollars the admin
// API, the command and the status page show.

// price is a line of the test's price table in picodollars a token
// (dollars per million tokens, at six decimals).
type price struct{ in, out, read, write, write1h int64 }

// The lines of moneyPrices, as the test prices by hand.
var (
	gpt4oMini  = price{in: 150_000, out: 600_000, read: 75_000, write: 150_000, write1h: 150_000}
	gpt4oDated = price{in: 2_500_000, out: 10_000_000, read: 1_250_000, write: 2_500_000, write1h: 2_500_000}
	gpt41      = price{in: 2_000_000, out: 8_000_000, read: 500_000, write: 2_000_000, write1h: 2_000_000}
	claude     = price{in: 3_000_000, out: 15_000_000, read: 300_000, write: 3_750_000, write1h: 6_000_000}
)

// moneyPrices prices the models the clients ask for and those the
// upstream's answers name: the answers' (gpt-4o-2024-08-06, gpt-4o-mini)
// apart from the request's gpt-4o, which gpt-4o* prices higher, so that a
// true-up priced by the request's model would not come out as the test
// prices it.
const moneyPrices = `cost_from usage price {
				gpt-4o-mini       input 0.15 output 0.60 cache_read 0.075
				gpt-4o-2024-08-06 input 2.50 output 10.00 cache_read 1.25
				gpt-4o*           input 5.00 output 15.00 cache_read 2.50
				gpt-4.1*          input 2.00 output 8.00 cache_read 0.50
				claude-sonnet-4*  input 3.00 output 15.00 cache_read 0.30 cache_write 3.75 cache_write_1h 6.00
			}`

// costOf prices, by hand, the usage a client saw: OpenAI's cached tokens
// (within prompt_tokens, or the Responses API's input_tokens) at the
// cache read price and the rest of the prompt at the input price;
// Anthropic's cache reads and writes beside its input, its 1-hour writes
// (within its writes) at their own price.
func (p price) costOf(u map[string]any) int64 {
	n := func(m map[string]any, k string) int64 { f, _ := m[k].(float64); return int64(f) }
	sub := func(k string) map[string]any { m, _ := u[k].(map[string]any); return m }
	if _, ok := u["prompt_tokens"]; ok {
		cached := n(sub("prompt_tokens_details"), "cached_tokens")
		return (n(u, "prompt_tokens")-cached)*p.in + cached*p.read + n(u, "completion_tokens")*p.out
	}
	if d := sub("input_tokens_details"); d != nil {
		cached := n(d, "cached_tokens")
		return (n(u, "input_tokens")-cached)*p.in + cached*p.read + n(u, "output_tokens")*p.out
	}
	write1h := n(sub("cache_creation"), "ephemeral_1h_input_tokens")
	return n(u, "input_tokens")*p.in + n(u, "cache_read_input_tokens")*p.read +
		(n(u, "cache_creation_input_tokens")-write1h)*p.write + write1h*p.write1h + n(u, "output_tokens")*p.out
}

// moneySite is a site that proxies to upstream, with a zone, name, of $1
// an hour, priced by moneyPrices, keyed by the client's API key, in the
// store block store ("" for the memory store), with every header.
func moneySite(upstream, store, name string) string {
	return fmt.Sprintf(`
`+siteAddr+` {
	rate_limit {
		headers both
		%s
		zone %s {
			key {header.Authorization} {header.X-Api-Key}
			limit $1
			window 1h
			algorithm fixed_window
			%s
			reserve max_tokens 500
			usage_in_stream on
		}
	}
	reverse_proxy %s
}
`, store, name, moneyPrices, upstream)
}

// TestMoneyThroughCaddy: the official clients, streaming and not, on the
// memory store and on Redis, each key keeping what the answer it got
// cost at the model the answer names, to the picodollar, its cached
// tokens and cache writes at their own prices; the admin API, top keys
// and the command show it in dollars; headers carry picodollars and
// name them; a model without a price is refused with 400, naming it,
// before the upstream or the store sees it.
func TestMoneyThroughCaddy(t *testing.T) {
	integration(t)
	dir := sdkDir(t)
	s := redistest.Standalone(t)
	for _, store := range memoryAndRedis(s) {
		t.Run(store.name, func(t *testing.T) {
			u := newLLM(t)
			zone := "money_" + store.name
			startCaddy(t, moneySite(u.url, store.block, zone))
			var streamUsage map[string]any
			for _, c := range []struct {
				script, mode, key string
				price             price // the line of the answer's model
			}{
				{"openai.mjs", "chat", "sk-money-chat", gpt4oDated},
				{"openai.mjs", "chat-stream-usage", "sk-money-asked", gpt4oMini},
				// The client asks for no usage: Caddy asks for it, and
				// hides it; the answer is chat-stream-usage's.
				{"openai.mjs", "chat-stream", "sk-money-hidden", gpt4oMini},
				{"openai.mjs", "responses-stream", "sk-money-responses", gpt41},
				{"anthropic.mjs", "messages", "sk-money-ant", claude},
				{"anthropic.mjs", "messages-stream", "sk-money-ant-stream", claude},
			} {
				baseURL := siteURL + "/v1"
				if c.script == "anthropic.mjs" {
					baseURL = siteURL
				}
				name := c.script + " " + c.mode
				seen := runSDK(t, dir, c.script, baseURL, c.key, c.mode)
				if seen.Error != nil {
					t.Fatalf("%s: the client threw %+v", name, *seen.Error)
				}
				usage := seen.Usage
				switch c.mode {
				case "chat-stream-usage":
					streamUsage = usage
				case "chat-stream":
					if usage != nil {
						t.Errorf("%s: the client, which asked for no usage, saw %v", name, usage)
					}
					usage = streamUsage
				}
				cost := c.price.costOf(usage)
				key := "Bearer " + c.key
				waitUsed(t, adminURL, zone, key, cost)
				k := keyState(t, adminURL, zone, key)
				t.Logf("%s: %v costs %d picodollars, %s", name, usage, cost, k.Dollars["used"])
				if k.Unit != money.Unit || k.Dollars["used"] != money.Format(cost) || k.Reserved == nil || *k.Reserved != 0 {
					t.Errorf("%s: the admin API shows %+v, want used %s in dollars and nothing reserved", name, k, money.Format(cost))
				}
			}
			// What a key spent, in dollars, in top keys and in the
			// command.
			spent := claude.costOf(runSDK(t, dir, "anthropic.mjs", siteURL, "sk-money-sum", "messages").Usage)
			waitUsed(t, adminURL, zone, "Bearer sk-money-sum", spent)
			top := readAdmin[admin.TopInfo](t, adminURL, "/rate_limit/zones/"+zone+"/top?n=128")
			i := slices.IndexFunc(top.Keys, func(k admin.TopKey) bool { return k.Units == spent })
			if top.Unit != money.Unit || i < 0 || top.Keys[i].Dollars != money.Format(spent) {
				t.Errorf("top keys %+v, want a key that took %s", top, money.Format(spent))
			}
			out := inProcessCLI(t)("key", zone, "Bearer sk-money-sum")
			if row := tableRow(out, "used"); len(row) != 2 || row[1] != money.Format(spent) {
				t.Errorf("caddy rate-limit key printed\n%s\nwant used %s", out, money.Format(spent))
			}

			// Headers count picodollars, and name them: $1 is 10^12.
			body := `{"model":"gpt-4o-mini","max_tokens":100,"messages":[{"role":"user","content":"Hello"}]}`
			resp, _ := request(t, http.DefaultClient, http.MethodPost, siteURL+"/v1/chat/completions", body, "Authorization: Bearer sk-money-headers")
			status(t, resp, http.StatusOK)
			reservation := 100*gpt4oMini.out + int64(len(body))*gpt4oMini.in
			for name, want := range map[string]string{
				"X-RateLimit-Limit":     "1000000000000",
				"X-RateLimit-Remaining": strconv.FormatInt(money.PerDollar-reservation, 10),
				"RateLimit-Policy":      `"` + zone + `";q=1000000000000;qu="picodollars";w=3600`,
			} {
				if got := resp.Header.Get(name); got != want {
					t.Errorf("%s: %q, want %q", name, got, want)
				}
			}

			// The answer, openai_chat.json, names gpt-4o-2024-08-06: it is
			// priced so, whatever the request asked for.
			cost := gpt4oDated.costOf(fixtureUsage(t, "openai_chat.json"))
			waitUsed(t, adminURL, zone, "Bearer sk-money-headers", cost)

			// A model without a price, and no * line: 400 naming it, the
			// upstream never asked, and the key's count unchanged.
			hits := u.hits.Load()
			for _, c := range []struct{ body, code, names string }{
				{`{"model":"gpt-5","max_tokens":10,"messages":[]}`, "model_not_priced", `"gpt-5"`},
				{`{"max_tokens":10,"messages":[]}`, "model_missing", "no model"},
			} {
				resp, answer := request(t, http.DefaultClient, http.MethodPost, siteURL+"/v1/chat/completions", c.body, "Authorization: Bearer sk-money-headers")
				var e struct {
					Error struct{ Type, Code, Param, Message string } `json:"error"`
				}
				if err := json.Unmarshal([]byte(answer), &e); resp.StatusCode != http.StatusBadRequest || err != nil ||
					e.Error.Code != c.code || e.Error.Param != "model" || !strings.Contains(e.Error.Message, c.names) {
					t.Errorf("%s: %d %s, want 400 %s naming %s", c.body, resp.StatusCode, answer, c.code, c.names)
				}
			}
			if got := u.hits.Load(); got != hits {
				t.Errorf("the upstream got %d requests refused for their model", got-hits)
			}
			if used := keyState(t, adminURL, zone, "Bearer sk-money-headers").Used; used != cost {
				t.Errorf("the key used %d after requests refused for their model, want its one answer's %d", used, cost)
			}
		})
	}
}

// fixtureUsage is the usage of the costfrom package's fixture name, a
// JSON answer.
func fixtureUsage(t *testing.T, name string) map[string]any {
	t.Helper()
	var answer struct {
		Usage map[string]any `json:"usage"`
	}
	if err := json.Unmarshal([]byte(fixture(t, name)), &answer); err != nil {
		t.Fatal(err)
	}
	return answer.Usage
}

// moneyZone is a zone of $0.20 an hour per X-Client, priced at $2.50 a
// million input tokens and $10 a million output tokens whatever the
// model: tokenCounter's answers (9 prompt tokens, and at most the
// request's max_tokens out) each cost at most their reservation.
const moneyZone = `			key {header.X-Client}
			limit $0.20
			window 1h
			cost_from usage price {
				* input 2.50 output 10.00
			}
			reserve max_tokens 500`

// moneyLimit is moneyZone's limit in picodollars.
const moneyLimit = 200_000_000_000

// spent is what tokenCounter's answers cost at moneyZone's prices.
func spent(u *tokenCounter) int64 {
	requests, tokens, _ := u.counts()
	return requests*9*2_500_000 + tokens*10_000_000
}

// TestMoneyNeverTakesPastTheLimit: 50 clients at once on one key ask for random
// max_tokens until they are refused, on one Caddy (the memory store) and
// on a fleet of three sharing Redis, with lease off and on. Every answer
// costs at most its reservation, so what the admitted requests cost adds
// up to no more than the limit in dollars; once every response is done,
// the key's count is exactly that, to the picodollar.
func TestMoneyNeverTakesPastTheLimit(t *testing.T) {
	integration(t)
	answer := func(maxTokens int64) int64 { return rand.Int64N(maxTokens + 1) }
	check := func(t *testing.T, u *tokenCounter, admitted int64, admin, zone, key string) {
		t.Helper()
		requests, _, _ := u.counts()
		cost := spent(u)
		t.Logf("admitted %d requests costing %s of %s: %.4f of the limit", requests, money.Format(cost), money.Format(moneyLimit), float64(cost)/moneyLimit)
		if requests != admitted {
			t.Errorf("the upstream got %d requests, %d were admitted", requests, admitted)
		}
		if cost > moneyLimit {
			t.Errorf("the admitted requests cost %s, past the limit of %s", money.Format(cost), money.Format(moneyLimit))
		}
		waitUsed(t, admin, zone, key, cost)
	}
	t.Run("memory", func(t *testing.T) {
		u := newTokenCounter(t, answer)
		const zone = "money_memory_drain"
		startCaddy(t, fmt.Sprintf("%s {\n\trate_limit {\n\t\tzone %s {\n%s\n\t\t}\n\t}\n\treverse_proxy %s\n}\n", siteAddr, zone, moneyZone, u.url))
		admitted := drainTokens(t, []instance{{url: siteURL}}, "drained")
		check(t, u, admitted, adminURL, zone, "drained")
	})
	s := redistest.Standalone(t)
	for _, lease := range []string{"off", "on"} {
		t.Run("fleet_lease_"+lease, func(t *testing.T) {
			u := newTokenCounter(t, answer)
			fleet := startFleet(t, 3, fleetSpec{store: "address " + s.URL() + "\nlease " + lease, zone: moneyZone, upstream: u.url})
			waitForFleet(t, fleet)
			key := "money-" + lease
			admitted := drainTokens(t, fleet, key)
			check(t, u, admitted, fleet[0].admin, "fleet", key)
		})
	}
}

// TestMoneyAndModelTokensRecipe runs docs/llm-tokens.md's recipe "$50 a
// month per user, with token rates by model" as written, but for its
// address, its issuer's key and its upstream: each model's tokens a
// minute come from the map of {body.model} (gpt-4o's 30,000, gpt-4o-mini's
// 200,000, 20,000 for a model it does not name), each user and model
// counted apart, while one budget in dollars, counted to the month's end
// in New York, holds a user's spending on every model: once it is
// spent, every model is refused, where the models' tokens have room, and
// another user is not.
func TestMoneyAndModelTokensRecipe(t *testing.T) {
	integration(t)
	var recipe string
	for _, block := range docs.FencedBlocks(docs.Read(t, "../docs/llm-tokens.md"), "caddyfile") {
		if strings.Contains(block, "limit $50") && strings.Contains(block, "{model_tpm}") {
			recipe = block
		}
	}
	if !strings.Contains(recipe, "zone spend {") || !strings.Contains(recipe, "zone model_tokens {") || !strings.Contains(recipe, "window month") {
		t.Fatalf("docs/llm-tokens.md has no recipe of a month's budget in dollars beside token rates by model:\n%s", recipe)
	}
	// The upstream answers the model asked for, 10 prompt tokens and as
	// many generated as the request's bound.
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Model     string `json:"model"`
			MaxTokens int64  `json:"max_tokens"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-1","object":"chat.completion","model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":%d,"total_tokens":%d}}`,
			body.Model, body.MaxTokens, body.MaxTokens+10)
	}))
	t.Cleanup(upstream.Close)
	replace := map[string]string{
		"llm.example.com":       siteAddr,
		"/etc/caddy/issuer.pem": jwttest.WriteFile(t, "issuer.pem", jwtKeys().RSAPublicPEM),
		"127.0.0.1:8000":        strings.TrimPrefix(upstream.URL, "http://"),
	}
	site := recipe
	for from, to := range replace {
		if !strings.Contains(site, from) {
			t.Fatalf("the recipe has no %s to replace:\n%s", from, recipe)
		}
		site = strings.ReplaceAll(site, from, to)
	}
	startCaddy(t, "\n"+site+"\n")

	token := func(sub string) string {
		return bearer(jwttest.Sign(t, jwt.SigningMethodRS256, jwtKeys().RSA,
			jwt.MapClaims{"iss": "https://id.example.com", "aud": "llm", "sub": sub, "exp": time.Now().Add(time.Hour).Unix()}))
	}
	alice, bob := token("alice"), token("bob")
	chat := func(auth, model string, maxTokens int64) (*http.Response, string) {
		t.Helper()
		body := fmt.Sprintf(`{"model":%q,"max_tokens":%d,"messages":[{"role":"user","content":"Hi"}]}`, model, maxTokens)
		return request(t, client, http.MethodPost, siteURL+"/v1/chat/completions", body, auth, "Content-Type: application/json")
	}
	// Picodollars a token, as the recipe prices them.
	prices := map[string]price{"gpt-4o": {in: 2_500_000, out: 10_000_000}, "gpt-4o-mini": {in: 150_000, out: 600_000}, "o3": {in: 1_000_000, out: 4_000_000}}
	costOf := func(model string, maxTokens int64) int64 { p := prices[model]; return 10*p.in + maxTokens*p.out }

	// Each model's rate from the map (the headers describe the zone with
	// the fewest units left: the tokens'), its tokens counted apart, all
	// in one minute of model_tokens.
	roomInWindow(time.Minute, 30*time.Second)
	var spent int64
	for model, limit := range map[string]string{"gpt-4o": "30000", "gpt-4o-mini": "200000", "o3": "20000"} {
		resp, answer := chat(alice, model, 100)
		status(t, resp, http.StatusOK)
		if got := resp.Header.Get("X-Ratelimit-Limit"); got != limit {
			t.Errorf("%s: X-RateLimit-Limit %s, want the map's %s tokens a minute (%s)", model, got, limit, answer)
		}
		waitUsed(t, adminURL, "model_tokens", "alice:"+model, 110)
		spent += costOf(model, 100)
	}
	waitUsed(t, adminURL, "spend", "alice", spent)

	// gpt-4o's minute is all but used: its next request is refused,
	// while gpt-4o-mini's rate has room for the same.
	resp, _ := chat(alice, "gpt-4o", 20000)
	status(t, resp, http.StatusOK)
	spent += costOf("gpt-4o", 20000)
	waitUsed(t, adminURL, "model_tokens", "alice:gpt-4o", 110+20010)
	if resp, answer := chat(alice, "gpt-4o", 10000); resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("X-Ratelimit-Limit") != "30000" {
		t.Errorf("gpt-4o past its 30,000 tokens: %d, X-RateLimit-Limit %s (%s), want 429 from its rate", resp.StatusCode, resp.Header.Get("X-Ratelimit-Limit"), answer)
	}
	resp, _ = chat(alice, "gpt-4o-mini", 10000)
	status(t, resp, http.StatusOK)
	spent += costOf("gpt-4o-mini", 10000)
	waitUsed(t, adminURL, "spend", "alice", spent)

	// One budget, in dollars, to the end of the month in New York.
	month := calendarPeriod{"month", "America/New_York"}
	var k admin.KeyInfo
	_, end, _, _ := month.during(t, func() { k = keyState(t, adminURL, "spend", "alice") })
	if !k.Reset.Equal(end) || k.Dollars["used"] != money.Format(spent) {
		t.Errorf("spend's key alice: reset %s, used %s, want the month's end in New York, %s, and %s", k.Reset, k.Dollars["used"], end, money.Format(spent))
	}

	// Alice's budget, made a tenth of a cent more than she spent, is
	// spent by gpt-4o-mini's bound of 2000 tokens and gpt-4o's of 100
	// alike, which their rates have room for; Bob's is whole.
	budget := spent + money.PerDollar/1000
	if code, answer := adminJSON(t, adminURL, http.MethodPut, "/rate_limit/zones/spend/keys/alice/limit", fmt.Sprintf(`{"limit": %q}`, money.Format(budget))); code != http.StatusOK {
		t.Fatalf("PUT alice's budget: %d %s", code, answer)
	}
	for model, maxTokens := range map[string]int64{"gpt-4o-mini": 2000, "gpt-4o": 100} {
		if resp, answer := chat(alice, model, maxTokens); resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("X-Ratelimit-Limit") != strconv.FormatInt(budget, 10) {
			t.Errorf("alice, %s, past her budget: %d, X-RateLimit-Limit %s (%s), want 429 from the budget of %d picodollars", model, resp.StatusCode, resp.Header.Get("X-Ratelimit-Limit"), answer, budget)
		}
	}
	resp, _ = chat(bob, "gpt-4o", 100)
	status(t, resp, http.StatusOK)
	if used := keyState(t, adminURL, "spend", "alice").Used; used != spent {
		t.Errorf("alice used %d after her refusals, want %d", used, spent)
	}
}
