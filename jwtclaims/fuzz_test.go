package jwtclaims

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/golang-jwt/jwt/v5"

	"github.com/d61b427a/caddy-rate-limit/internal/clocktest"
	"github.com/d61b427a/caddy-rate-limit/internal/jwttest"
)

// FuzzTokenPlaceholder drives the whole token path, from an Authorization
// header to a {jwt.<path>} placeholder. Nothing may panic, and only the
// valid tokens minted here may ever yield claims: the fuzzer cannot forge
// a signature, so any other input that verified would be a bug.
func FuzzTokenPlaceholder(f *testing.F) {
	k := keys()
	ecFile := jwttest.WriteFile(f, "ec.pem", publicPEM(&k.EC256.PublicKey))
	clk := clocktest.New(epoch)
	cfg := provisioned(f, &Config{
		Secret:     testSecret,
		PublicKeys: []string{ecFile},
		Issuer:     "https://id.example.com",
		Leeway:     caddy.Duration(time.Second),
	}, clk)

	claims := jwt.MapClaims{
		"sub": "alice", "iss": "https://id.example.com", "exp": epoch.Add(time.Hour).Unix(),
		"org": map[string]any{"id": 42, "tier": "pro"}, "quota": 1e3, "roles": []string{"a"},
	}
	valid := map[string]bool{
		jwttest.Sign(f, jwt.SigningMethodHS256, []byte(testSecret), claims): true,
		jwttest.Sign(f, jwt.SigningMethodES256, k.EC256, claims):            true,
	}
	for tok := range valid {
		f.Add("Bearer "+tok, "sub")
		f.Add("Bearer "+tok, "org.id")
		f.Add("bearer "+tok+" ", "quota")
		f.Add("Bearer "+swapPayload(tok, jwt.MapClaims{"sub": "bob"}), "sub")
		f.Add("Bearer "+flipLastChar(tok), "sub")
	}
	f.Add("Bearer "+jwttest.Sign(f, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, claims), "sub")
	f.Add("Bearer "+jwttest.Sign(f, jwt.SigningMethodHS256, k.RSAPublicPEM, claims), "sub")
	f.Add("Bearer "+jwttest.Sign(f, jwt.SigningMethodHS256, []byte(testSecret), jwt.MapClaims{"sub": "x", "exp": epoch.Add(-time.Hour).Unix()}), "sub")
	f.Add("Bearer "+b64(`{"alg":"HS256"}`)+"."+b64(strings.Repeat(`{"a":`, 500))+".c2ln", "a.a.a")
	f.Add("Bearer "+strings.Repeat(".", 100), "sub")
	f.Add("Bearer !!!.???.***", "sub")
	f.Add("Basic YWxpY2U6cHc=", "sub")
	f.Add("", "")

	f.Fuzz(func(t *testing.T, auth, path string) {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("Authorization", auth)
		repl := caddy.NewReplacer()
		cfg.Register(repl, r)
		v, known := repl.Get(PlaceholderPrefix + path)
		if path == "" {
			if known {
				t.Fatal(`"jwt." answered`)
			}
			return
		}
		if !known {
			t.Fatalf("{jwt.%s} unknown", path)
		}
		if s, _ := v.(string); s != "" {
			tok := strings.TrimSpace(auth[len("Bearer "):])
			if !valid[tok] {
				t.Fatalf("claims from a token the test did not mint: %q -> %q", auth, s)
			}
		}
	})
}
