package ratelimit

import (
	"encoding/json"
	"errors"
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
)

// TestCostFromCaddyfile: each form of cost_from, reserve and
// usage_in_stream is the zone's JSON field it stands for.
func TestCostFromCaddyfile(t *testing.T) {
	for _, c := range []struct{ lines, want string }{
		{"cost_from usage output\nreserve 1000", `{"usage":"output"} {"units":1000} ""`},
		{"cost_from usage total\nreserve max_tokens 4096\nusage_in_stream on", `{"usage":"total"} {"max_tokens":4096} "on"`},
		{"cost_from header X-Cost\nreserve 5", `{"header":"X-Cost"} {"units":5} ""`},
	} {
		block := "rate_limit {\nzone z {\nlimit 100000\nwindow 1m\n" + c.lines + "\n}\n}"
		tokens, err := caddyfile.Tokenize([]byte(block), "Caddyfile")
		if err != nil {
			t.Fatal(err)
		}
		var h Handler
		if err := h.UnmarshalCaddyfile(caddyfile.NewDispenser(tokens)); err != nil {
			t.Fatalf("%q: %v", c.lines, err)
		}
		z := h.Zones[0]
		from, _ := json.Marshal(z.CostFrom)
		reserve, _ := json.Marshal(z.Reserve)
		if got := string(from) + " " + string(reserve) + " " + strconv.Quote(z.UsageInStream); got != c.want {
			t.Errorf("%q: %s, want %s", c.lines, got, c.want)
		}
	}
}

// TestReservation: reserve <n> is n whatever the body; reserve max_tokens
// is the body's bound times its choices, or the default, plus the body's
// bytes for a count that includes the prompt, and never more than any
// limit; a bound that means none is the whole limit.
func TestReservation(t *testing.T) {
	body := []byte(`{"max_tokens":300,"messages":[]}`)
	huge := []byte(`{"max_tokens":99999999999}`)
	unbounded := []byte(`{"prompt":"Why?","options":{"num_predict":-1}}`)
	for _, c := range []struct {
		from    CostFrom
		reserve Reserve
		body    []byte
		want    int64
	}{
		{CostFrom{Usage: "output"}, Reserve{Units: 70}, body, 70},
		{CostFrom{Usage: "output"}, Reserve{MaxTokens: 50}, body, 300},
		{CostFrom{Usage: "output"}, Reserve{MaxTokens: 50}, []byte(`{"max_tokens":300,"n":2}`), 600},
		{CostFrom{Usage: "output"}, Reserve{MaxTokens: 50}, []byte(`not json`), 50},
		{CostFrom{Usage: "total"}, Reserve{MaxTokens: 50}, body, 300 + int64(len(body))},
		{CostFrom{Usage: "input"}, Reserve{MaxTokens: 50}, nil, 50},
		{CostFrom{Header: "X-Cost"}, Reserve{MaxTokens: 50}, body, 300},
		{CostFrom{Usage: "total"}, Reserve{MaxTokens: 50}, huge, maxLimit},
		{CostFrom{Usage: "output"}, Reserve{MaxTokens: 50}, unbounded, 5000},
		{CostFrom{Usage: "total"}, Reserve{MaxTokens: 50}, unbounded, 5000},
		{CostFrom{Usage: "output"}, Reserve{Units: 70}, unbounded, 70},
		{CostFrom{Usage: "output"}, Reserve{MaxTokens: 50}, []byte(`{"max_tokens":9000,"options":{"num_predict":-1}}`), 9000},
	} {
		m := newMeter(&Zone{Name: "z", CostFrom: &c.from, Reserve: &c.reserve}, true)
		var req costfrom.Request
		if err := req.Read("", c.body); err != nil {
			t.Fatal(err)
		}
		if got := m.reservation(&req, 5000, nil); got != c.want {
			t.Errorf("%+v %+v, body %q: reservation %d, want %d", c.from, c.reserve, c.body, got, c.want)
		}
	}
}

// TestCostFromHandsTheBodyOn: the next handler reads the body the client
// sent, with a Content-Length that matches, or the body asking for a
// stream's usage; a body over MaxBody is answered 413 and takes nothing;
// a zone without cost_from leaves the body unread.
func TestCostFromHandsTheBodyOn(t *testing.T) {
	h := provisionHandler(t, `{"zones":[
		{"name":"unit_body","key":"{http.request.header.X-Client}","limit":100000000,"window":"1h","algorithm":"fixed_window",
		 "cost_from":{"usage":"total"},"reserve":{"max_tokens":10},"usage_in_stream":"on","match":[{"path":["/tokens"]}]},
		{"name":"unit_plain","key":"{http.request.header.X-Client}","limit":10,"window":"1h","match":[{"path":["/plain"]}]}]}`)
	withClock(t, h, vectors.Start)
	send := func(path, client, body string, length int64, headers ...string) (status int, got string, gotLen int64, header string, unread bool) {
		t.Helper()
		r, _ := testRequest(t.Context(), http.MethodPost, "192.0.2.1", append([]string{"X-Client: " + client}, headers...)...)
		r.URL.Path = path
		r.Body, r.ContentLength = io.NopCloser(strings.NewReader(body)), length
		if length >= 0 {
			r.Header.Set("Content-Length", strconv.FormatInt(length, 10))
		}
		original := r.Body
		next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			unread = r.Body == original
			b, _ := io.ReadAll(r.Body)
			got, gotLen, header = string(b), r.ContentLength, r.Header.Get("Content-Length")
			return nil
		})
		w := httptest.NewRecorder()
		err := h.ServeHTTP(w, r, next)
		var he caddyhttp.HandlerError
		status = w.Code
		if errors.As(err, &he) {
			status = he.StatusCode
		} else if err != nil {
			t.Fatal(err)
		}
		return status, got, gotLen, header, unread
	}
	body := `{"model":"m","max_tokens":5,"messages":[]}`
	for _, length := range []int64{int64(len(body)), -1} {
		status, got, gotLen, header, _ := send("/tokens", "a", body, length)
		if status != http.StatusOK || got != body || gotLen != int64(len(body)) || header != strconv.Itoa(len(body)) {
			t.Errorf("length %d: status %d, next read %q, ContentLength %d, Content-Length %q; want 200 and the body as sent", length, status, got, gotLen, header)
		}
	}
	stream := `{"model":"m","stream":true,"messages":[]}`
	var req costfrom.Request
	if err := req.Read("", []byte(stream)); err != nil {
		t.Fatal(err)
	}
	want, _ := req.StreamUsage()
	if status, got, gotLen, header, _ := send("/tokens", "a", stream, int64(len(stream))); status != http.StatusOK || got != string(want) || gotLen != int64(len(want)) || header != strconv.Itoa(len(want)) {
		t.Errorf("stream: status %d, next read %q (%d, %q), want %s", status, got, gotLen, header, want)
	}
	// Anthropic refuses stream_options: its requests, which carry
	// anthropic-version, are handed on as sent.
	if status, got, _, _, _ := send("/tokens", "a", stream, int64(len(stream)), "Anthropic-Version: 2023-06-01"); status != http.StatusOK || got != stream {
		t.Errorf("an Anthropic stream: status %d, next read %q, want 200 and the body as sent", status, got)
	}
	big := strings.Repeat("a", MaxBody+1)
	for _, length := range []int64{int64(len(big)), -1} {
		if status, _, _, _, _ := send("/tokens", "big", big, length); status != http.StatusRequestEntityTooLarge {
			t.Errorf("length %d: a body of MaxBody+1 bytes answered %d, want 413", length, status)
		}
	}
	client := compileKeyTemplate("{http.request.header.X-Client}")
	if n := used(t, h, "unit_body", client.storedKey("a")); n == 0 {
		t.Errorf("the bodies of client a took nothing, want their reservations")
	}
	if n := used(t, h, "unit_body", client.storedKey("big")); n != 0 {
		t.Errorf("bodies refused took %d", n)
	}
	if status, got, _, _, unread := send("/plain", "p", big, int64(len(big))); status != http.StatusOK || got != big || !unread {
		t.Errorf("a zone without cost_from: status %d, next read %d bytes (the body untouched: %v), want 200 and the body untouched", status, len(got), unread)
	}
	// A body that gives a field twice is refused, and takes nothing.
	if status, got, _, _, _ := send("/tokens", "twice", `{"max_tokens":5,"MAX_TOKENS":9000,"messages":[]}`, -1); status != http.StatusBadRequest || got != "" {
		t.Errorf("a field twice: status %d, next read %q; want 400, the next handler not called", status, got)
	}
	if n := used(t, h, "unit_body", client.storedKey("twice")); n != 0 {
		t.Errorf("a body refused took %d", n)
	}
}

// TestCostFromAsksForAnAnswerItCanRead: a zone that reads a usage takes
// the client's Accept-Encoding off the request, so that no handler or
// upstream compresses the answer it reads; one that reads a header, and
// a zone without cost_from, leave it.
func TestCostFromAsksForAnAnswerItCanRead(t *testing.T) {
	h := provisionHandler(t, `{"zones":[
		{"name":"unit_usage","key":"{http.request.header.X-Client}","limit":100000,"window":"1h","algorithm":"fixed_window",
		 "cost_from":{"usage":"output"},"reserve":{"units":10},"match":[{"path":["/usage"]}]},
		{"name":"unit_header","key":"{http.request.header.X-Client}","limit":100000,"window":"1h","algorithm":"fixed_window",
		 "cost_from":{"header":"X-Cost"},"reserve":{"units":10},"match":[{"path":["/header"]}]},
		{"name":"unit_fixed","key":"{http.request.header.X-Client}","limit":10,"window":"1h","match":[{"path":["/plain"]}]}]}`)
	withClock(t, h, vectors.Start)
	for path, want := range map[string]string{"/usage": "", "/header": "gzip", "/plain": "gzip"} {
		r, _ := testRequest(t.Context(), http.MethodGet, "192.0.2.1", "X-Client: a", "Accept-Encoding: gzip")
		r.URL.Path = path
		var got string
		next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			got = r.Header.Get("Accept-Encoding")
			return nil
		})
		if err := h.ServeHTTP(httptest.NewRecorder(), r, next); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s: the next handler saw Accept-Encoding %q, want %q", path, got, want)
		}
	}
}
