package jwtclaims

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/golang-jwt/jwt/v5"

	"github.com/d61b427a/caddy-rate-limit/internal/jwttest"
)

// BenchmarkVerifyAndKey measures what a request with a token costs the
// rate limiter: register the provider, read and verify the token, and
// render the key "user:{jwt.sub}". "uncached" verifies every time (the
// cost of a new token, or of a forged one); "cached" is a client sending
// the same token again.
func BenchmarkVerifyAndKey(b *testing.B) {
	k := keys()
	ecFile := jwttest.WriteFile(b, "ec.pem", publicPEM(&k.EC256.PublicKey))
	claims := jwt.MapClaims{
		"sub": "user-1234", "iss": "https://id.example.com", "aud": "api",
		"exp": time.Now().Add(time.Hour).Unix(), "iat": time.Now().Unix(), "quota": 600,
	}
	tokens := map[string]string{
		"HS256": jwttest.Sign(b, jwt.SigningMethodHS256, []byte(testSecret), claims),
		"ES256": jwttest.Sign(b, jwt.SigningMethodES256, k.EC256, claims),
	}
	for _, alg := range []string{"HS256", "ES256"} {
		for _, cached := range []bool{false, true} {
			name := alg + "/uncached"
			size := -1
			if cached {
				name, size = alg+"/cached", 0
			}
			b.Run(name, func(b *testing.B) {
				cfg := provisioned(b, &Config{
					Secret: testSecret, PublicKeys: []string{ecFile},
					Issuer: "https://id.example.com", Audience: []string{"api"},
					cacheSize: size,
				}, nil)
				r := httptest.NewRequest(http.MethodGet, "/", nil)
				r.Header.Set("Authorization", "Bearer "+tokens[alg])
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					repl := caddy.NewReplacer()
					cfg.Register(repl, r)
					if key := repl.ReplaceAll("user:{jwt.sub}", ""); key != "user:user-1234" {
						b.Fatalf("key %q", key)
					}
				}
			})
		}
	}
}

// BenchmarkNoToken is the cost for a request without a token.
func BenchmarkNoToken(b *testing.B) {
	cfg := provisioned(b, &Config{Secret: testSecret}, nil)
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	b.ReportAllocs()
	for b.Loop() {
		repl := caddy.NewReplacer()
		cfg.Register(repl, r)
		repl.ReplaceAll("user:{jwt.sub}", "")
	}
}

// BenchmarkHostileTokens is the cost of each hostile Authorization header
// (jwttest.HostileAuthorizations, which TestBadInputIsCheap feeds too):
// what an attacker can make one request cost.
func BenchmarkHostileTokens(b *testing.B) {
	cfg := provisioned(b, &Config{Secret: testSecret, cacheSize: -1}, nil)
	for name, auth := range jwttest.HostileAuthorizations() {
		b.Run(strings.NewReplacer(" ", "_", ",", "").Replace(name), func(b *testing.B) {
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.Header.Set("Authorization", auth)
			b.ReportAllocs()
			for b.Loop() {
				if cfg.Claims(r) != nil {
					b.Fatal("hostile input yielded claims")
				}
			}
		})
	}
}
