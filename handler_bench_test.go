package ratelimit

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

var nextOK = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return nil })

// BenchmarkHandler measures one request through ServeHTTP with the memory
// store, on the allowed path and on the reject path, without the network.
func BenchmarkHandler(b *testing.B) {
	cases := []struct{ name, config string }{
		{"allowed", `{"zones":[{"name":"bench_allowed","limit":[2000000000],"window":"1m"}]}`},
		{"rejected", `{"zones":[{"name":"bench_rejected","limit":[1],"window":"1h"}]}`},
		{"two_zones_api_key", `{"zones":[
			{"name":"bench_ip","limit":[2000000000],"window":"1m"},
			{"name":"bench_key","key":["key:{http.request.header.X-Api-Key}","{http.vars.client_ip}"],"limit":[2000000000],"window":"1s","cost":{"POST":5}}]}`},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			h := provisionHandler(b, c.config)
			// A fresh request every 256 iterations: each request registers
			// its placeholders with its own replacer, which a request
			// reused forever would grow without end.
			fresh := func() (*http.Request, map[string]any) {
				req := httptest.NewRequest(http.MethodGet, "/", nil)
				req.Header.Set("X-Api-Key", "k-123")
				vars := map[string]any{caddyhttp.ClientIPVarKey: "203.0.113.9"}
				ctx := context.WithValue(req.Context(), caddyhttp.VarsCtxKey, vars)
				// A server without handle_errors, as Caddy serves by default.
				ctx = context.WithValue(ctx, caddyhttp.ServerCtxKey, new(caddyhttp.Server))
				req = req.WithContext(ctx)
				caddyhttp.NewTestReplacer(req)
				return req, vars
			}
			req, vars := fresh()
			w := httptest.NewRecorder()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if i++; i%256 == 0 {
					req, vars = fresh()
				}
				// Each request registers its placeholders afresh.
				delete(vars, placeholdersVar)
				_ = h.ServeHTTP(w, req, nextOK)
			}
		})
	}
}
