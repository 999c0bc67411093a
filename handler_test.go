package ratelimit

import (
	"context"
	"encoding/json"
	"errors"
	"github.com/d61b427a/caddy-rate-limit/internal/race"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/internal/clocktest"
	"github.com/d61b427a/caddy-rate-limit/storage"
	"github.com/d61b427a/caddy-rate-limit/storage/memory"
)

// provisionHandler provisions a handler from JSON the way Caddy would and
// validates it; the handler's store is cleaned up when tb ends.
func provisionHandler(tb testing.TB, config string) *Handler {
	tb.Helper()
	var h Handler
	if err := json.Unmarshal([]byte(config), &h); err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	tb.Cleanup(cancel)
	if err := h.Provision(ctx); err != nil {
		tb.Fatal(err)
	}
	if err := h.Validate(); err != nil {
		tb.Fatal(err)
	}
	// Out of the admin API's view of the running zones, which the
	// integration tests in this binary read.
	tb.Cleanup(func() { _ = h.Cleanup() })
	// Caddy logs at INFO by default; the context's bare logger would log
	// every rejection at DEBUG.
	h.logger = zap.NewNop()
	return &h
}

// withClock gives the handler a memory store of its own and reads both
// their times from a clock that starts at start and moves only when the
// test sets it, so that a test reaches a window's end without waiting.
func withClock(t *testing.T, h *Handler, start time.Time) *clocktest.Clock {
	t.Helper()
	c := clocktest.New(start)
	store := memory.New(0, c.Now)
	t.Cleanup(func() { _ = store.Cleanup() })
	h.store, h.now = store, c.Now
	for _, z := range h.Zones {
		z.admin = store
	}
	return c
}

// testRequest is a request as Caddy hands it to a handler: with a
// replacer and the client IP in its variables.
func testRequest(ctx context.Context, method, clientIP string, headers ...string) (*http.Request, *caddy.Replacer) {
	r := httptest.NewRequestWithContext(ctx, method, "/", nil)
	for _, h := range headers {
		name, value, _ := strings.Cut(h, ":")
		r.Header.Set(name, strings.TrimSpace(value))
	}
	vars := map[string]any{caddyhttp.ClientIPVarKey: clientIP}
	r = r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, vars))
	repl := caddyhttp.NewTestReplacer(r)
	return r, repl
}

// served is what one request through the handler gave.
type served struct {
	status  int // 200 when next ran, else the handler error's status
	header  http.Header
	repl    *caddy.Replacer
	reached bool
}

func serve(t *testing.T, h *Handler, ctx context.Context, method, clientIP string, headers ...string) served {
	t.Helper()
	r, repl := testRequest(ctx, method, clientIP, headers...)
	w := httptest.NewRecorder()
	var out served
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		out.reached = true
		return nil
	})
	err := h.ServeHTTP(w, r, next)
	out.status, out.header, out.repl = http.StatusOK, w.Header(), repl
	var he caddyhttp.HandlerError
	switch {
	case errors.As(err, &he):
		out.status = he.StatusCode
	case err != nil:
		t.Fatalf("ServeHTTP: %v", err)
	}
	return out
}

func placeholder(repl *caddy.Replacer, name string) string {
	v, _ := repl.GetString("http.rate_limit." + name)
	return v
}

// step is one request of a handler test and what it must give.
type step struct {
	method, ip string
	headers    []string
	status     int
	// want maps response headers and rate_limit placeholders (written
	// as {name}) to their values.
	want map[string]string
}

// TestHandlerDecisions drives the handler without a server: zones, costs,
// keys, headers, dry run and the all-or-nothing rule across zones. Zone
// names are unique to each case because the memory store is shared by the
// whole process.
func TestHandlerDecisions(t *testing.T) {
	cases := []struct {
		name, config string
		steps        []step
	}{
		{"allowed until the limit, then 429", `{"zones":[{"name":"unit_limit","limit":2,"window":"1h"}]}`, []step{
			{status: 200, want: map[string]string{"X-RateLimit-Limit": "2", "X-RateLimit-Remaining": "1", "X-RateLimit-Used": "1", "{exceeded}": "false"}},
			{status: 200, want: map[string]string{"X-RateLimit-Remaining": "0"}},
			{status: 429, want: map[string]string{"X-RateLimit-Remaining": "0", "{exceeded}": "true", "{zone}": "unit_limit", "{key}": "192.0.2.1"}},
		}},
		{"keys are per client", `{"zones":[{"name":"unit_clients","limit":1,"window":"1h"}]}`, []step{
			{ip: "192.0.2.1", status: 200},
			{ip: "192.0.2.2", status: 200},
			{ip: "192.0.2.1", status: 429},
		}},
		{"cost per method", `{"zones":[{"name":"unit_cost","limit":5,"window":"1h","cost":{"POST":3}}]}`, []step{
			{method: http.MethodPost, status: 200, want: map[string]string{"X-RateLimit-Remaining": "2"}},
			{method: http.MethodPost, status: 429},
			{status: 200, want: map[string]string{"X-RateLimit-Remaining": "1"}},
		}},
		{"key alternatives fall back to the client IP", `{"zones":[{"name":"unit_keys","key":["user:{http.request.header.X-User}"],"limit":1,"window":"1h"}]}`, []step{
			{headers: []string{"X-User: ann"}, status: 200, want: map[string]string{"{key}": "user:ann"}},
			{status: 200, want: map[string]string{"{key}": "192.0.2.1"}},
			{headers: []string{"X-User: ann"}, status: 429},
		}},
		{"limit alternatives", `{"zones":[{"name":"unit_limits","key":["{http.request.header.X-User}"],"limit":["{http.request.header.X-Quota}",1],"window":"1h"}]}`, []step{
			{headers: []string{"X-User: a", "X-Quota: 3"}, status: 200, want: map[string]string{"X-RateLimit-Limit": "3"}},
			{headers: []string{"X-User: b", "X-Quota: lots"}, status: 200, want: map[string]string{"X-RateLimit-Limit": "1"}},
		}},
		{"ipv6 prefix groups a network", `{"zones":[{"name":"unit_prefix","limit":1,"window":"1h","ipv6_prefix":64}]}`, []step{
			{ip: "2001:db8::1", status: 200, want: map[string]string{"{key}": "2001:db8::/64"}},
			{ip: "2001:db8::2", status: 429},
		}},
		{"dry run never rejects", `{"zones":[{"name":"unit_dry","limit":1,"window":"1h","dry_run":true}]}`, []step{
			{status: 200, want: map[string]string{"{exceeded}": "false"}},
			{status: 200, want: map[string]string{"{exceeded}": "true"}},
		}},
		{"ietf headers", `{"headers":"ietf","zones":[{"name":"unit_ietf","limit":3,"window":"90s"}]}`, []step{
			{status: 200, want: map[string]string{"RateLimit-Policy": `"unit_ietf";q=3;w=90`, "X-RateLimit-Limit": ""}},
		}},
		{"headers off", `{"headers":"off","zones":[{"name":"unit_off","limit":3,"window":"1m"}]}`, []step{
			{status: 200, want: map[string]string{"X-RateLimit-Limit": "", "RateLimit": ""}},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := provisionHandler(t, c.config)
			for i, s := range c.steps {
				if s.method == "" {
					s.method = http.MethodGet
				}
				if s.ip == "" {
					s.ip = "192.0.2.1"
				}
				got := serve(t, h, context.Background(), s.method, s.ip, s.headers...)
				if got.status != s.status || got.reached != (s.status == 200) {
					t.Fatalf("request %d: status %d (next ran: %v), want %d", i, got.status, got.reached, s.status)
				}
				if s.status == 429 && got.header.Get("Retry-After") == "" {
					t.Fatalf("request %d: 429 without Retry-After", i)
				}
				for name, want := range s.want {
					v := got.header.Get(name)
					if strings.HasPrefix(name, "{") {
						v = placeholder(got.repl, strings.Trim(name, "{}"))
					}
					if v != want {
						t.Fatalf("request %d: %s = %q, want %q", i, name, v, want)
					}
				}
			}
		})
	}

}

// TestHandlerAllOrNothing: a request rejected by one zone consumes nothing
// in the others; a handler with only the other zone (same name, so the
// same counters) shows it.
func TestHandlerAllOrNothing(t *testing.T) {
	both := provisionHandler(t, `{"zones":[
		{"name":"unit_narrow","limit":1,"window":"1h"},
		{"name":"unit_wide","limit":5,"window":"1h"}]}`)
	wide := provisionHandler(t, `{"zones":[{"name":"unit_wide","limit":5,"window":"1h"}]}`)
	for i, want := range []int{200, 429, 429} {
		if got := serve(t, both, context.Background(), http.MethodGet, "192.0.2.1"); got.status != want {
			t.Fatalf("request %d: %d, want %d", i, got.status, want)
		}
	}
	if got := serve(t, wide, context.Background(), http.MethodGet, "192.0.2.1"); got.header.Get("X-RateLimit-Remaining") != "3" {
		t.Fatalf("unit_wide remaining %q after one allowed and two rejected requests, want 3 (5 - 1 - this one)", got.header.Get("X-RateLimit-Remaining"))
	}
}

// TestHandlerStoreFailure points a Redis store at a closed port: with
// on_store_error allow the request passes without limit headers, with deny
// it gets 503 and Retry-After, with local it is decided in this
// instance's memory (alone, N = 1: the whole limit), and a request whose
// client has gone is 499 either way.
func TestHandlerStoreFailure(t *testing.T) {
	zone := `"zones":[{"name":"unit_store","limit":5,"window":"1m"}]`
	store := `"store":{"backend":"redis","addresses":["redis://127.0.0.1:1"],"timeout":"1s"}`
	for _, c := range []struct {
		mode        string
		status      int
		passes      bool
		retryAfter  string
		limitHeader string
	}{
		{"allow", 200, true, "", ""},
		{"deny", 503, false, "1", ""},
		{"local", 200, true, "", "5"},
	} {
		t.Run(c.mode, func(t *testing.T) {
			h := provisionHandler(t, `{`+store+`,"on_store_error":"`+c.mode+`",`+zone+`}`)
			got := serve(t, h, context.Background(), http.MethodGet, "192.0.2.1")
			if got.status != c.status || got.reached != c.passes || got.header.Get("Retry-After") != c.retryAfter || got.header.Get("X-RateLimit-Limit") != c.limitHeader {
				t.Fatalf("status %d, next ran %v, Retry-After %q, X-RateLimit-Limit %q; want %d, %v, %q, %q",
					got.status, got.reached, got.header.Get("Retry-After"), got.header.Get("X-RateLimit-Limit"), c.status, c.passes, c.retryAfter, c.limitHeader)
			}
			if c.mode == "local" {
				// The local counts hold the limit, until Redis answers.
				for i, want := range []int{200, 200, 200, 200, 429} {
					if got := serve(t, h, context.Background(), http.MethodGet, "192.0.2.1"); got.status != want {
						t.Fatalf("local request %d: %d, want %d", i+2, got.status, want)
					}
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if got := serve(t, h, ctx, http.MethodGet, "192.0.2.1"); got.status != statusClientClosedRequest || got.reached {
				t.Fatalf("client gone: status %d, next ran %v; want 499", got.status, got.reached)
			}
		})
	}
}

// TestLogKeys: rejections are logged at debug level and dry-run
// rejections at info, with zone and key: by default, and with log_keys
// off, the key's hash; with log_keys on, the key.
func TestLogKeys(t *testing.T) {
	for _, c := range []struct {
		logKeys string
		key     string
	}{
		{"", hiddenKey("192.0.2.7")},
		{"on", "192.0.2.7"},
		{"off", hiddenKey("192.0.2.7")},
	} {
		t.Run("log_keys "+c.logKeys, func(t *testing.T) {
			name := "unit_log_" + c.logKeys
			h := provisionHandler(t, `{"log_keys":"`+c.logKeys+`","zones":[
				{"name":"`+name+`","limit":1,"window":"1h"},
				{"name":"`+name+`_dry","limit":1,"window":"1h","dry_run":true}]}`)
			core, logs := observer.New(zap.DebugLevel)
			h.logger = zap.New(core)
			serve(t, h, context.Background(), http.MethodGet, "192.0.2.7")
			serve(t, h, context.Background(), http.MethodGet, "192.0.2.7")
			for _, want := range []struct {
				msg   string
				level zapcore.Level
				zone  string
			}{
				{"rate limit would be exceeded (dry run)", zap.InfoLevel, name + "_dry"},
				{"rate limit exceeded", zap.DebugLevel, name},
			} {
				entries := logs.FilterMessage(want.msg).All()
				if len(entries) != 1 {
					t.Fatalf("%d lines %q, want 1", len(entries), want.msg)
				}
				e := entries[0]
				if fields := e.ContextMap(); e.Level != want.level || fields["zone"] != want.zone || fields["key"] != c.key {
					t.Fatalf("%q at %v with %v; want %v, zone %s, key %s", want.msg, e.Level, fields, want.level, want.zone, c.key)
				}
			}
		})
	}
}

// TestConcurrencyReleasedOnEveryWayOut: a concurrency zone's units come
// back however the request ends: a response, a handler error, a panic
// further down, and a client gone while the request is being served; and
// a request rejected by another zone holds none, since a take is all or
// nothing.
func TestConcurrencyReleasedOnEveryWayOut(t *testing.T) {
	h := provisionHandler(t, `{"zones":[
		{"name":"conc_ways","limit":[3],"algorithm":"concurrency","cost":{"POST":2}},
		{"name":"posts_ways","match":[{"method":["POST"]}],"limit":[1],"window":"1h"}]}`)
	admin := h.store.(storage.Admin)
	held := func() int64 {
		t.Helper()
		st, err := admin.KeyState(context.Background(), "conc_ways", "192.0.2.7", algorithms.Rate{Window: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return st.Counts.Held()
	}
	// next checks the units are held while the request is served, then
	// ends it the way the case says.
	cases := []struct {
		name   string
		method string
		end    func(r *http.Request) error
	}{
		{"response", http.MethodGet, func(*http.Request) error { return nil }},
		{"handler error", http.MethodGet, func(*http.Request) error {
			return caddyhttp.Error(http.StatusBadGateway, errors.New("upstream down"))
		}},
		{"panic", http.MethodGet, func(*http.Request) error { panic("next handler panicked") }},
		{"client gone", http.MethodGet, func(r *http.Request) error {
			<-r.Context().Done()
			return r.Context().Err()
		}},
		// The first POST passes posts_ways and holds 2 units.
		{"post", http.MethodPost, func(*http.Request) error { return nil }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			r, _ := testRequest(ctx, c.method, "192.0.2.7")
			var during int64
			next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
				during = held()
				cancel() // the client gives up; only "client gone" waits for it
				return c.end(r)
			})
			func() {
				defer func() { _ = recover() }()
				_ = h.ServeHTTP(httptest.NewRecorder(), r, next)
			}()
			if want := map[string]int64{http.MethodGet: 1, http.MethodPost: 2}[c.method]; during != want {
				t.Fatalf("%d units held while served, want %d", during, want)
			}
			if n := held(); n != 0 {
				t.Fatalf("%d units held after the request ended, want 0", n)
			}
		})
	}

	t.Run("rejected by another zone", func(t *testing.T) {
		// posts_ways has taken its one POST: concurrency would admit this
		// one, but a take takes nothing in any zone when one of them
		// rejects.
		r, _ := testRequest(context.Background(), http.MethodPost, "192.0.2.7")
		reached := false
		err := h.ServeHTTP(httptest.NewRecorder(), r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
			reached = true
			return nil
		}))
		var he caddyhttp.HandlerError
		if !errors.As(err, &he) || he.StatusCode != http.StatusTooManyRequests || reached {
			t.Fatalf("got %v (reached next: %v), want a 429 from posts_ways", err, reached)
		}
		if n := held(); n != 0 {
			t.Fatalf("%d units held after the rejection, want 0", n)
		}
	})
}

// fakeShedder sheds the requests whose X-Priority header is "low", and
// counts the requests in flight, so that the handler's side of shedding
// is tested apart from the shedder's formula (package shed).
type fakeShedder struct {
	inFlight int
}

var errFakeShed = errors.New("shed by the fake shedder")

func (f *fakeShedder) Check(repl *caddy.Replacer) error {
	if p, _ := repl.GetString("http.request.header.X-Priority"); p == "low" {
		return errFakeShed
	}
	return nil
}

func (f *fakeShedder) Enter() { f.inFlight++ }
func (f *fakeShedder) Leave() { f.inFlight-- }

// TestHandlerShed: a shed request is answered with the shedder's status
// and Retry-After: 1, never reaches next, gets no zone headers and
// consumes nothing in any zone; a request that goes on is counted in
// flight while next has it, and only then.
func TestHandlerShed(t *testing.T) {
	h := provisionHandler(t, `{"shed":{"name":"unit_handler_shed","classes":["critical","low"],"capacity":4,"status":418},
		"zones":[{"name":"unit_handler_shed","key":"{http.request.header.X-Client}","limit":2,"window":"1h"}]}`)
	t.Cleanup(func() { _ = h.Cleanup() })
	fake := new(fakeShedder)
	h.shedder = fake
	var inFlightInNext int
	send := func(priority, client string) served {
		t.Helper()
		r, repl := testRequest(context.Background(), http.MethodGet, "192.0.2.1", "X-Priority: "+priority, "X-Client: "+client)
		w := httptest.NewRecorder()
		out := served{status: http.StatusOK, header: w.Header(), repl: repl}
		err := h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
			out.reached = true
			inFlightInNext = fake.inFlight
			return nil
		}))
		var he caddyhttp.HandlerError
		if errors.As(err, &he) {
			out.status = he.StatusCode
			if out.status == 418 && !errors.Is(err, errFakeShed) {
				t.Fatalf("shed with %v, want the shedder's error", err)
			}
		} else if err != nil {
			t.Fatal(err)
		}
		return out
	}
	for range 3 {
		got := send("low", "c")
		if got.status != 418 || got.reached || got.header.Get("Retry-After") != "1" || got.header.Get("X-RateLimit-Limit") != "" {
			t.Fatalf("shed: status %d, reached %v, headers %v; want 418, not reached, Retry-After 1 and no zone headers",
				got.status, got.reached, got.header)
		}
	}
	// The shed requests consumed nothing: client c still has its 2.
	for i, want := range []int{http.StatusOK, http.StatusOK, http.StatusTooManyRequests} {
		got := send("critical", "c")
		if got.status != want {
			t.Fatalf("request %d of client c after shedding: %d, want %d", i, got.status, want)
		}
		if want == http.StatusOK && (inFlightInNext != 1 || got.header.Get("X-RateLimit-Remaining") != strconv.Itoa(1-i)) {
			t.Fatalf("request %d: %d in flight in next, remaining %q; want 1, %d", i, inFlightInNext, got.header.Get("X-RateLimit-Remaining"), 1-i)
		}
	}
	if fake.inFlight != 0 {
		t.Fatalf("%d in flight after every request returned", fake.inFlight)
	}
}

// TestHandlerIdleShedAllocatesNothing: a shed block that is not shedding
// (its amount starts below 0) costs a request no allocation.
func TestHandlerIdleShedAllocatesNothing(t *testing.T) {
	if race.Enabled {
		t.Skip("allocation counts are not asserted under the race detector")
	}
	h := provisionHandler(t, `{"shed":{"name":"unit_idle_allocs","classes":["critical","low"],"capacity":4}}`)
	t.Cleanup(func() { _ = h.Cleanup() })
	req, _ := testRequest(context.Background(), http.MethodGet, "203.0.113.9", "X-Priority: low")
	req = req.WithContext(context.WithValue(req.Context(), caddyhttp.ServerCtxKey, new(caddyhttp.Server)))
	w := httptest.NewRecorder()
	if n := testing.AllocsPerRun(1000, func() { _ = h.ServeHTTP(w, req, nextOK) }); n != 0 {
		t.Fatalf("%v allocations per request through an idle shedder, want 0", n)
	}
}

// allowedRequestAllocs is how many allocations the handler makes for an
// allowed request on the memory store with the default headers: the
// request's placeholder state, the provider that answers from it, and the
// one string behind the four X-RateLimit values (docs/design.md, "Where
// the time goes", says why each stays).
const allowedRequestAllocs = 3

// TestAllowedRequestAllocs holds the memory store's allowed path to
// allowedRequestAllocs allocations, through the handler, each request a
// fresh one as Caddy hands it over (made before the count).
func TestAllowedRequestAllocs(t *testing.T) {
	if race.Enabled {
		t.Skip("allocation counts are not asserted under the race detector")
	}
	h := provisionHandler(t, `{"zones":[{"name":"unit_allowed_allocs","limit":[2000000000],"window":"1m"}]}`)
	t.Cleanup(func() { _ = h.Cleanup() })
	const runs = 1000
	reqs := make([]*http.Request, runs+1) // AllocsPerRun runs once more, to warm up
	target, apiKey := &url.URL{Path: "/"}, []string{"k-123"}
	for i := range reqs {
		reqs[i] = handlerRequest(target, apiKey)
	}
	w := httptest.NewRecorder()
	i := 0
	n := testing.AllocsPerRun(runs, func() {
		if err := h.ServeHTTP(w, reqs[i], nextOK); err != nil {
			t.Fatal(err)
		}
		i++
	})
	if n != allowedRequestAllocs {
		t.Fatalf("%v allocations per allowed request, want %d", n, allowedRequestAllocs)
	}
	if got := w.Header().Get("X-RateLimit-Remaining"); got == "" {
		t.Fatal("no X-RateLimit-Remaining: the requests were not allowed with the default headers")
	}
}

// TestBanLinesBounded: a flood of fresh keys, each banned at its second
// request, logs one ban line a second, not one a key, and the line counts
// the bans it stands for.
func TestBanLinesBounded(t *testing.T) {
	h := provisionHandler(t, `{"log_keys":"on","zones":[{"name":"unit_ban_flood","key":["{http.request.header.X-Key}"],"limit":[1],"window":"1m","ban":"1h"}]}`)
	t.Cleanup(func() { _ = h.Cleanup() })
	core, logs := observer.New(zap.InfoLevel)
	h.logger = zap.New(core)
	const keys = 1000
	for i := range keys {
		for try := range 2 {
			req, _ := testRequest(context.Background(), http.MethodGet, "203.0.113.9", "X-Key: k"+strconv.Itoa(i))
			if err := h.ServeHTTP(httptest.NewRecorder(), req, nextOK); (err == nil) != (try == 0) {
				t.Fatalf("key %d, request %d: %v, want the first allowed and the second refused and banned (a limit of 1)", i, try+1, err)
			}
		}
	}
	lines := logs.FilterMessage("rate limit ban").All()
	if len(lines) == 0 || len(lines) > 2 {
		t.Fatalf("%d ban lines for %d bans in about a second, want one (two if the second turned)", len(lines), keys)
	}
	var total int64
	for _, l := range lines {
		total += l.ContextMap()["bans_since_last_log"].(int64)
	}
	if total > keys || total < 1 {
		t.Fatalf("the lines count %d bans, want at most %d", total, keys)
	}
}
