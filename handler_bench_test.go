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
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			req.Header.Set("X-Api-Key", "k-123")
			ctx := context.WithValue(req.Context(), caddyhttp.VarsCtxKey, map[string]any{caddyhttp.ClientIPVarKey: "203.0.113.9"})
			req = req.WithContext(ctx)
			caddyhttp.NewTestReplacer(req)
			w := httptest.NewRecorder()
			b.ReportAllocs()
			for b.Loop() {
				_ = h.ServeHTTP(w, req, nextOK)
			}
		})
	}
}
