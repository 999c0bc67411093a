package ratelimit

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/d61b427a/caddy-rate-limit/algorithms/vectors"
	"github.com/d61b427a/caddy-rate-limit/costfrom"
)

// bodyServed is what one request with a body through the handler gave.
type bodyServed struct {
	served
	// body is what the next handler read of the body, and unread tells
	// that it got the body as the client sent it, not read by then.
	body   string
	unread bool
	// model is {body.model} as the next handler saw it.
	model string
	// err is the handler's error, which names why a request was
	// refused outside a Caddy server (see hasErrorRoutes).
	err error
}

// serveBody sends a POST with body (of unknown length, as a chunked
// upload is) through h, with the headers given, and providers registered
// on its replacer before the handler runs, as a map handler before
// rate_limit registers one.
func serveFields(t *testing.T, h *Handler, body string, providers func(*caddy.Replacer), headers ...string) bodyServed {
	t.Helper()
	r, repl := testRequest(t.Context(), http.MethodPost, "192.0.2.1", headers...)
	r.Body, r.ContentLength = io.NopCloser(strings.NewReader(body)), -1
	if providers != nil {
		providers(repl)
	}
	original := r.Body
	var out bodyServed
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		out.reached = true
		out.unread = r.Body == original
		b, _ := io.ReadAll(r.Body)
		out.body = string(b)
		out.model, _ = repl.GetString("body.model")
		return nil
	})
	w := httptest.NewRecorder()
	err := h.ServeHTTP(w, r, next)
	out.status, out.header, out.repl, out.err = w.Code, w.Header(), repl, err
	var he caddyhttp.HandlerError
	switch {
	case errors.As(err, &he):
		out.status = he.StatusCode
	case err != nil:
		t.Fatalf("ServeHTTP: %v", err)
	}
	return out
}

// TestBodyFieldKeys: {body.<field>} in a key is the field's decoded
// value, a number in its shortest decimal form, so that a field's
// spellings are one key; a body that does not give it, or is not JSON,
// falls through to the next alternative; the body is handed on as it
// came, and later handlers see the field.
func TestBodyFieldKeys(t *testing.T) {
	h := provisionHandler(t, `{"zones":[{"name":"unit_body_keys",
		"key":["{http.request.header.X-User}:{body.model}","{body.metadata.user_id}"],"limit":100,"window":"1h"}]}`)
	withClock(t, h, vectors.Start)
	for _, c := range []struct {
		body, user, key, model string
	}{
		{`{"model":"gpt-4o","messages":[]}`, "ann", "ann:gpt-4o", "gpt-4o"},
		{`{"MODEL":"gpt-4o"}`, "ann", "ann:gpt-4o", "gpt-4o"},
		{`{"mod\u0065l":"gpt-4o"}`, "ann", "ann:gpt-4o", "gpt-4o"},
		{`{"model":1000}`, "ann", "ann:1000", "1000"},
		{`{"model":1e3}`, "ann", "ann:1000", "1000"},
		{`{"model":"\u0031000"}`, "ann", "ann:1000", "1000"},
		{`{"model":true}`, "ann", "ann:true", "true"},
		// Not a value, not given, not JSON: the next alternative.
		{`{"model":null,"metadata":{"user_id":"u-7"}}`, "ann", "u-7", ""},
		{`{"model":{"id":"x"},"metadata":{"User_Id":42}}`, "ann", "42", ""},
		{`{"metadata":{"user_id":"u-7"}}`, "ann", "u-7", ""},
		{`{"model":"gpt-4o","metadata":{"user_id":"u-7"}}`, "", "u-7", "gpt-4o"},
		{`model=gpt-4o`, "ann", "192.0.2.1", ""},
		{``, "ann", "192.0.2.1", ""},
	} {
		got := serveFields(t, h, c.body, nil, "X-User: "+c.user)
		if got.status != http.StatusOK || got.body != c.body {
			t.Errorf("%s: status %d, next read %q; want 200 and the body as sent", c.body, got.status, got.body)
			continue
		}
		if key := placeholder(got.repl, "key"); key != c.key || got.model != c.model {
			t.Errorf("%s, X-User %q: key %q, {body.model} %q after it; want %q, %q", c.body, c.user, key, got.model, c.key, c.model)
		}
	}
	// Two models of one user count apart; 1000, 1e3 and "\u0031000" are
	// one key.
	userModel := "{http.request.header.X-User}:{body.model}"
	for key, want := range map[string]int64{
		spaceTag(userModel) + "ann:1000":            3,
		spaceTag(userModel) + "ann:gpt-4o":          3,
		spaceTag(userModel) + "ann:true":            1,
		spaceTag("{body.metadata.user_id}") + "u-7": 3,
		"192.0.2.1": 2,
	} {
		if n := used(t, h, "unit_body_keys", key); n != want {
			t.Errorf("%s used %d, want %d", key, n, want)
		}
	}
}

// TestBodyFieldRefused: a body that gives a field a zone reads twice,
// under any spelling, is answered 400 naming it, and one larger than
// MaxBody 413; neither reaches the next handler or takes anything.
func TestBodyFieldRefused(t *testing.T) {
	h := provisionHandler(t, `{"zones":[{"name":"unit_body_refused",
		"key":["{body.metadata.user_id}"],"limit":100,"window":"1h"}]}`)
	withClock(t, h, vectors.Start)
	for _, c := range []struct {
		body, field string
	}{
		{`{"metadata":{"user_id":"a","USER_ID":"b"}}`, "metadata.user_id"},
		{`{"metadata":{"user_id":"a"},"Metadata":{"user_id":"b"}}`, "metadata"},
		{`{"metadata":{"user_id":"a","user_\u0069d":"b"}}`, "metadata.user_id"},
	} {
		got := serveFields(t, h, c.body, nil)
		var dup *costfrom.DuplicateError
		if got.status != http.StatusBadRequest || got.reached || !errors.As(got.err, &dup) || dup.Field != c.field {
			t.Errorf("%s: status %d (next ran: %v), %v; want 400 naming %s", c.body, got.status, got.reached, got.err, c.field)
		}
	}
	big := `{"metadata":{"user_id":"big"},"pad":"` + strings.Repeat("a", MaxBody) + `"}`
	if got := serveFields(t, h, big, nil); got.status != http.StatusRequestEntityTooLarge || got.reached {
		t.Errorf("a body over MaxBody: status %d (next ran: %v), want 413", got.status, got.reached)
	}
	user := spaceTag("{body.metadata.user_id}")
	for _, key := range []string{user + "a", user + "b", user + "big", "192.0.2.1"} {
		if n := used(t, h, "unit_body_refused", key); n != 0 {
			t.Errorf("%s used %d after refusals", key, n)
		}
	}
}

// TestBodyFieldThroughAMap: a limit whose placeholder a handler before
// rate_limit answers from {body.model}, as Caddy's map does, resolves
// from the body, and its fallback applies to a model it does not map.
func TestBodyFieldThroughAMap(t *testing.T) {
	h := provisionHandler(t, `{"zones":[{"name":"unit_body_map",
		"key":["{http.request.header.X-User}"],"limit":["{model_tpm}",5],"window":"1h"}]}`)
	withClock(t, h, vectors.Start)
	tpm := func(repl *caddy.Replacer) {
		repl.Map(func(key string) (any, bool) {
			if key != "model_tpm" {
				return nil, false
			}
			switch repl.ReplaceAll("{body.model}", "") {
			case "gpt-4o":
				return "30000", true
			case "gpt-4o-mini":
				return "200000", true
			}
			return nil, true
		})
	}
	for body, want := range map[string]string{
		`{"model":"gpt-4o"}`:      "30000",
		`{"model":"gpt-4o-mini"}`: "200000",
		`{"model":"other"}`:       "5",
		`not json`:                "5",
	} {
		got := serveFields(t, h, body, tpm, "X-User: u"+body)
		if limit := got.header.Get("X-RateLimit-Limit"); got.status != http.StatusOK || limit != want || got.body != body {
			t.Errorf("%s: status %d, limit %s, next read %q; want 200, limit %s, the body as sent", body, got.status, limit, got.body, want)
		}
	}
}

// TestBodyReadOnlyWhenNeeded: a zone that asks for no field of the body
// (nor reserves by it) hands it on unread, whatever later handlers ask
// for, and they find {body.*} empty; a zone that reserves by it lets
// them see its fields.
func TestBodyReadOnlyWhenNeeded(t *testing.T) {
	for _, c := range []struct {
		name, zone string
		read       bool
	}{
		{"plain", `"key":["{http.request.header.X-User}"],"limit":[100],"window":"1h"`, false},
		{"reserve units", `"key":["{http.request.header.X-User}"],"limit":[100],"window":"1h","cost_from":{"header":"X-Cost"},"reserve":{"units":5}`, false},
		{"alternative not reached", `"key":["{http.request.header.X-User}","{body.model}"],"limit":[100],"window":"1h"`, false},
		{"reserve max_tokens", `"key":["{http.request.header.X-User}"],"limit":[100000],"window":"1h","cost_from":{"usage":"total"},"reserve":{"max_tokens":5}`, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := provisionHandler(t, `{"zones":[{"name":"unit_body_needed_`+strings.ReplaceAll(c.name, " ", "_")+`",`+c.zone+`}]}`)
			withClock(t, h, vectors.Start)
			body := `{"model":"gpt-4o"}`
			got := serveFields(t, h, body, nil, "X-User: ann")
			if got.status != http.StatusOK || got.body != body {
				t.Fatalf("status %d, next read %q; want 200 and the body", got.status, got.body)
			}
			if got.unread == c.read {
				t.Errorf("the next handler got the body unread: %v, want %v", got.unread, !c.read)
			}
			if want := map[bool]string{true: "gpt-4o"}[c.read]; got.model != want {
				t.Errorf("{body.model} in the next handler %q, want %q", got.model, want)
			}
		})
	}
}

// TestCostPlaceholders: {http.rate_limit.cost} is what the request took
// in the zone the headers describe, and {http.rate_limit.cost.<zone>} in
// each cost_from zone: their reservations at admission, what the
// response showed once it is done, and 0 for a refused request.
func TestCostPlaceholders(t *testing.T) {
	h := provisionHandler(t, `{"zones":[
		{"name":"unit_cost_a","key":["{http.request.header.X-User}"],"limit":100,"window":"1h","algorithm":"fixed_window","cost_from":{"header":"X-Cost"},"reserve":{"units":30}},
		{"name":"unit_cost_b","key":["{http.request.header.X-User}"],"limit":1000,"window":"1h","algorithm":"fixed_window","cost_from":{"header":"X-Cost-B"},"reserve":{"units":10}}]}`)
	withClock(t, h, vectors.Start)
	send := func(costA, costB string) (status int, during, after map[string]string) {
		t.Helper()
		r, repl := testRequest(t.Context(), http.MethodGet, "192.0.2.1", "X-User: ann")
		read := func() map[string]string {
			out := map[string]string{}
			for _, name := range []string{"zone", "cost", "cost.unit_cost_a", "cost.unit_cost_b", "cost.elsewhere"} {
				v, ok := repl.GetString("http.rate_limit." + name)
				if !ok {
					v = "unknown"
				}
				out[name] = v
			}
			return out
		}
		next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			during = read()
			w.Header().Set("X-Cost", costA)
			w.Header().Set("X-Cost-B", costB)
			w.WriteHeader(http.StatusOK)
			return nil
		})
		w := httptest.NewRecorder()
		err := h.ServeHTTP(w, r, next)
		status = w.Code
		var he caddyhttp.HandlerError
		if errors.As(err, &he) {
			status = he.StatusCode
		}
		return status, during, read()
	}
	status, during, after := send("20", "7")
	if status != http.StatusOK ||
		during["zone"] != "unit_cost_a" || during["cost"] != "30" || during["cost.unit_cost_a"] != "30" || during["cost.unit_cost_b"] != "10" ||
		after["cost"] != "20" || after["cost.unit_cost_a"] != "20" || after["cost.unit_cost_b"] != "7" || after["cost.elsewhere"] != "unknown" {
		t.Errorf("admitted: status %d, during the response %v, after it %v", status, during, after)
	}
	// 20 + 70 leaves 10 in unit_cost_a, less than its reservation.
	if status, _, _ := send("70", "1"); status != http.StatusOK {
		t.Fatalf("second request: %d", status)
	}
	status, during, after = send("1", "1")
	if status != http.StatusTooManyRequests || during != nil ||
		after["zone"] != "unit_cost_a" || after["cost"] != "0" || after["cost.unit_cost_a"] != "0" || after["cost.unit_cost_b"] != "0" {
		t.Errorf("refused: status %d, after it %v; want 429 and costs of 0", status, after)
	}
}

// TestCostPlaceholderTakesNothing: {http.rate_limit.cost} is 0 for a
// request whose cost count_status released once its response was done,
// and for one a dry-run zone would have refused, which took nothing
// there, as {http.rate_limit.cost.<zone>} says for a cost_from zone.
func TestCostPlaceholderTakesNothing(t *testing.T) {
	h := provisionHandler(t, `{"zones":[
		{"name":"unit_cost_released","key":["{http.request.header.X-User}"],"limit":100,"window":"1h","cost":{"*":5},"count_status":["401"],"match":[{"path":["/released"]}]},
		{"name":"unit_cost_dry","key":["{http.request.header.X-User}"],"limit":10,"window":"1h","dry_run":true,"cost_from":{"header":"X-Cost"},"reserve":{"units":8},"match":[{"path":["/dry"]}]}]}`)
	withClock(t, h, vectors.Start)
	send := func(path string) (during, after string, zoneCost string) {
		t.Helper()
		r, repl := testRequest(t.Context(), http.MethodGet, "192.0.2.1", "X-User: ann")
		r.URL.Path = path
		next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			during, _ = repl.GetString("http.rate_limit.cost")
			w.Header().Set("X-Cost", "3")
			w.WriteHeader(http.StatusOK)
			return nil
		})
		if err := h.ServeHTTP(httptest.NewRecorder(), r, next); err != nil {
			t.Fatal(err)
		}
		after, _ = repl.GetString("http.rate_limit.cost")
		zoneCost, _ = repl.GetString("http.rate_limit.cost.unit_cost_dry")
		return during, after, zoneCost
	}
	if during, after, _ := send("/released"); during != "5" || after != "0" {
		t.Errorf("count_status released: cost %s while the response ran, %s after it; want 5, then 0", during, after)
	}
	if during, after, dry := send("/dry"); during != "8" || after != "3" || dry != "3" {
		t.Errorf("dry run, room left: cost %s, then %s (zone %s); want 8, then 3 (3)", during, after, dry)
	}
	// 3 used, and 8 more would be over 10.
	if during, after, dry := send("/dry"); during != "0" || after != "0" || dry != "0" {
		t.Errorf("dry run that would refuse: cost %s, then %s (zone %s); want 0 throughout", during, after, dry)
	}
}
