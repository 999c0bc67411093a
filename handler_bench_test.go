package ratelimit

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

var nextOK = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return nil })

// BenchmarkHandler measures one request through ServeHTTP with the memory
// store, on the allowed path and on the reject path, without the network.
//
// Every iteration gets a request of its own, as Caddy hands it to a
// handler: a fresh replacer (with Caddy's own providers, so registering
// the rate_limit placeholders appends within capacity, as it does in a
// server) and fresh variables. The requests are made in batches outside
// the timed loop, so only the handler's own work is measured.
func BenchmarkHandler(b *testing.B) {
	cases := []struct {
		name, config string
		// rotate gives every request an API key of its own, never seen
		// before: a flood of fresh keys.
		rotate bool
	}{
		// The floor: the zone does not match, so nothing is decided.
		{"no_match", `{"zones":[{"name":"bench_no_match","match":[{"path":["/elsewhere"]}],"limit":[1],"window":"1m"}]}`, false},
		{"allowed", `{"zones":[{"name":"bench_allowed","limit":[2000000000],"window":"1m"}]}`, false},
		{"rejected", `{"zones":[{"name":"bench_rejected","limit":[1],"window":"1h"}]}`, false},
		// allowed in a calendar month in New York, answering every
		// header, the period's length among them.
		{"allowed_month_all_headers", `{"headers":"both","zones":[{"name":"bench_month","limit":[2000000000],"window":"month","timezone":"America/New_York"}]}`, false},
		// allowed, answering every header: X-RateLimit-* and the IETF
		// RateLimit and RateLimit-Policy, which carry the zone's name.
		{"allowed_all_headers", `{"headers":"both","zones":[{"name":"bench_all_headers","limit":[2000000000],"window":"1m"}]}`, false},
		// allowed, each request with a key never seen before.
		{"allowed_rotating", `{"zones":[{"name":"bench_rotating","key":["{http.request.header.X-Api-Key}"],"limit":[2000000000],"window":"1m"}]}`, true},
		{"gcra_allowed", `{"zones":[{"name":"bench_gcra","limit":[2000000000],"window":"1m","algorithm":"gcra"}]}`, false},
		// allowed, and released after the response: its status, 200,
		// is not one the zone counts.
		{"count_status_allowed", `{"zones":[{"name":"bench_count_status","limit":[2000000000],"window":"1m","count_status":["401"]}]}`, false},
		// Taken and released on every request: the key's slot is made
		// and forgotten each time.
		{"concurrency_allowed", `{"zones":[{"name":"bench_conc","limit":[1000],"algorithm":"concurrency"}]}`, false},
		{"two_zones_api_key", `{"zones":[
			{"name":"bench_ip","limit":[2000000000],"window":"1m"},
			{"name":"bench_key","key":["key:{http.request.header.X-Api-Key}","{http.vars.client_ip}"],"limit":[2000000000],"window":"1s","cost":{"POST":5}}]}`, false},
		// allowed behind a load shedder that is not shedding: one atomic
		// read before the zone, one add and one subtract around next.
		{"allowed_idle_shed", `{"shed":{"name":"bench_idle","classes":["critical","low"],"capacity":4},
			"zones":[{"name":"bench_allowed_shed","limit":[2000000000],"window":"1m"}]}`, false},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			h := provisionHandler(b, c.config)
			benchmarkRequests(b, c.rotate, func(req *http.Request, w http.ResponseWriter) {
				_ = h.ServeHTTP(w, req, nextOK)
			})
		})
	}
}

// benchmarkRequests calls serve once per iteration, each time with a
// request of its own, made outside the timed loop. With rotate, each
// request's X-Api-Key is one no request had before.
func benchmarkRequests(b *testing.B, rotate bool, serve func(*http.Request, http.ResponseWriter)) {
	const batch = 64
	reqs := make([]*http.Request, batch)
	target := &url.URL{Path: "/"}
	apiKey := []string{"k-123"}
	fresh := 0
	fill := func() {
		for i := range reqs {
			if rotate {
				fresh++
				apiKey = []string{"k-" + strconv.Itoa(fresh)}
			}
			reqs[i] = handlerRequest(target, apiKey)
		}
	}
	fill()
	w := httptest.NewRecorder()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if i == batch {
			b.StopTimer()
			fill()
			b.StartTimer()
			i = 0
		}
		serve(reqs[i], w)
		i++
	}
}

// handlerRequest is a GET of target with apiKey as its X-Api-Key, as
// Caddy hands it to a handler: with its own replacer and variables, in a
// server without handle_errors, as Caddy serves by default. It is made by
// hand, not by httptest.NewRequest, whose 4 KiB read buffer would make
// the garbage collector, and so a timed loop, busy with a benchmark's own
// garbage.
func handlerRequest(target *url.URL, apiKey []string) *http.Request {
	req := &http.Request{
		Method:     http.MethodGet,
		URL:        target,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     http.Header{"X-Api-Key": apiKey},
		Host:       "example.com",
		RemoteAddr: "203.0.113.9:1234",
	}
	vars := map[string]any{caddyhttp.ClientIPVarKey: "203.0.113.9"}
	ctx := context.WithValue(context.Background(), caddyhttp.VarsCtxKey, vars)
	ctx = context.WithValue(ctx, caddyhttp.ServerCtxKey, new(caddyhttp.Server))
	req = req.WithContext(ctx)
	caddyhttp.NewTestReplacer(req)
	return req
}

// BenchmarkHandlerBody measures one request with a 2 KiB Chat Completions
// body through a zone that reads it: to reserve by its bound (reserve
// max_tokens, the read a token zone makes), to key on its model
// ({body.model}), or both, on the allowed path with the memory store.
func BenchmarkHandlerBody(b *testing.B) {
	body := chatRequest2K()
	for _, c := range []struct{ name, zone string }{
		{"reserve_max_tokens", `"key":["{http.request.header.X-Api-Key}"],"cost_from":{"usage":"total"},"reserve":{"max_tokens":512}`},
		{"key_body_model", `"key":["{http.request.header.X-Api-Key}:{body.model}"]`},
		{"key_body_model_reserve_max_tokens", `"key":["{http.request.header.X-Api-Key}:{body.model}"],"cost_from":{"usage":"total"},"reserve":{"max_tokens":512}`},
	} {
		b.Run(c.name, func(b *testing.B) {
			h := provisionHandler(b, `{"zones":[{"name":"bench_body_`+c.name+`","limit":[2000000000],"window":"1m",`+c.zone+`}]}`)
			benchmarkBodies(b, body, func(req *http.Request, w http.ResponseWriter) {
				_ = h.ServeHTTP(w, req, nextOK)
			})
		})
	}
}

// chatRequest2K is a Chat Completions request of 2 KiB.
func chatRequest2K() []byte {
	head := `{"model":"gpt-4o-mini","max_tokens":512,"stream":false,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"`
	tail := `"}],"temperature":0.7,"metadata":{"user_id":"user-1234"}}`
	content := strings.Repeat("Why is the sky blue at noon and red at sunset? Explain it to a child, then to a physicist. ", 30)
	return []byte(head + content[:2048-len(head)-len(tail)] + tail)
}

// benchmarkBodies is benchmarkRequests for POST requests with body, each
// with a reader of its own.
func benchmarkBodies(b *testing.B, body []byte, serve func(*http.Request, http.ResponseWriter)) {
	const batch = 64
	reqs := make([]*http.Request, batch)
	target := &url.URL{Path: "/v1/chat/completions"}
	apiKey := []string{"k-123"}
	length := []string{strconv.Itoa(len(body))}
	fill := func() {
		for i := range reqs {
			req := handlerRequest(target, apiKey)
			req.Method = http.MethodPost
			req.Header["Content-Length"] = length
			req.Body = io.NopCloser(bytes.NewReader(body))
			req.ContentLength = int64(len(body))
			reqs[i] = req
		}
	}
	fill()
	w := httptest.NewRecorder()
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	i := 0
	for b.Loop() {
		if i == batch {
			b.StopTimer()
			fill()
			b.StartTimer()
			i = 0
		}
		serve(reqs[i], w)
		i++
	}
}
