package jwtclaims

import (
	"encoding/base64"
	"encoding/json"
	"github.com/d61b427a/caddy-rate-limit/internal/race"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/golang-jwt/jwt/v5"

	"github.com/d61b427a/caddy-rate-limit/internal/clocktest"
	"github.com/d61b427a/caddy-rate-limit/internal/jwttest"
)

var epoch = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// TestVerify shows which tokens yield claims: only those whose signature
// verifies with a configured key under an allowed algorithm and whose
// time, issuer and audience checks pass; none of the forgeries
// (jwttest.Forgeries) does.
func TestVerify(t *testing.T) {
	k := keys()
	clk := clocktest.New(epoch)
	rsaFile := jwttest.WriteFile(t, "rsa.pem", k.RSAPublicPEM)
	ecFile := jwttest.WriteFile(t, "ec.pem", publicPEM(&k.EC256.PublicKey))
	edFile := jwttest.WriteFile(t, "ed.pem", publicPEM(k.Ed.Public()))
	cfg := provisioned(t, &Config{
		Secret:     testSecret,
		PublicKeys: []string{rsaFile, ecFile, edFile},
		Issuer:     "https://id.example.com",
		Audience:   []string{"api", "other-api"},
		Leeway:     caddy.Duration(30 * time.Second),
	}, clk)
	// rsaOnly has the same RSA key and nothing else: the target of an
	// algorithm confusion attack.
	rsaOnly := provisioned(t, &Config{PublicKeys: []string{rsaFile}}, clk)

	now := epoch.Unix()
	good := func(extra jwt.MapClaims) jwt.MapClaims {
		return jwttest.Claims(jwt.MapClaims{"sub": "alice", "iss": "https://id.example.com", "aud": "api", "exp": now + 3600}, extra)
	}
	none := jwttest.Sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, good(nil))

	tests := []struct {
		name  string
		cfg   *Config
		token string
		ok    bool
	}{
		{"HS256", cfg, jwttest.Sign(t, jwt.SigningMethodHS256, []byte(testSecret), good(nil)), true},
		{"HS512", cfg, jwttest.Sign(t, jwt.SigningMethodHS512, []byte(testSecret), good(nil)), true},
		{"RS256", cfg, jwttest.Sign(t, jwt.SigningMethodRS256, k.RSA, good(nil)), true},
		{"PS384", cfg, jwttest.Sign(t, jwt.SigningMethodPS384, k.RSA, good(nil)), true},
		{"ES256", cfg, jwttest.Sign(t, jwt.SigningMethodES256, k.EC256, good(nil)), true},
		{"EdDSA", cfg, jwttest.Sign(t, jwt.SigningMethodEdDSA, k.Ed, good(nil)), true},
		{"audience in a list", cfg, jwttest.Sign(t, jwt.SigningMethodHS256, []byte(testSecret), good(jwt.MapClaims{"aud": []string{"x", "other-api"}})), true},
		{"expired within leeway", cfg, jwttest.Sign(t, jwt.SigningMethodHS256, []byte(testSecret), good(jwt.MapClaims{"exp": now - 10})), true},
		{"no exp", cfg, jwttest.Sign(t, jwt.SigningMethodHS256, []byte(testSecret), good(jwt.MapClaims{"exp": nil})), true},

		{"empty", cfg, "", false},
		{"not a JWT", cfg, "hello", false},
		{"two parts", cfg, "a.b", false},
		{"four parts", cfg, "a.b.c.d", false},
		{"invalid base64", cfg, "!!!.???.***", false},
		{"header not JSON", cfg, b64("not json") + "." + b64(`{"sub":"alice"}`) + ".c2ln", false},
		{"expired", cfg, jwttest.Sign(t, jwt.SigningMethodHS256, []byte(testSecret), good(jwt.MapClaims{"exp": now - 31})), false},
		{"not yet valid", cfg, jwttest.Sign(t, jwt.SigningMethodHS256, []byte(testSecret), good(jwt.MapClaims{"nbf": now + 31})), false},
		{"another secret", cfg, jwttest.Sign(t, jwt.SigningMethodHS256, []byte("another secret, also 32 bytes..."), good(nil)), false},
		{"another RSA key", cfg, jwttest.Sign(t, jwt.SigningMethodRS256, k.RSAOther, good(nil)), false},
		{"another ECDSA key", cfg, jwttest.Sign(t, jwt.SigningMethodES256, k.EC256Other, good(nil)), false},
		{"another Ed25519 key", cfg, jwttest.Sign(t, jwt.SigningMethodEdDSA, k.EdOther, good(nil)), false},
		{"ES384 without a P-384 key", cfg, jwttest.Sign(t, jwt.SigningMethodES384, k.EC384, good(nil)), false},
		{"alg none", cfg, none, false},
		{"alg none, signature stripped", cfg, strings.TrimSuffix(none, "."), false},
		{"alg confusion: HS256 with the RSA public key as secret", rsaOnly,
			jwttest.Sign(t, jwt.SigningMethodHS256, k.RSAPublicPEM, good(nil)), false},
		{"alg confusion against a config that also has a secret", cfg,
			jwttest.Sign(t, jwt.SigningMethodHS256, k.RSAPublicPEM, good(nil)), false},
		{"wrong issuer", cfg, jwttest.Sign(t, jwt.SigningMethodHS256, []byte(testSecret), good(jwt.MapClaims{"iss": "https://evil.example.com"})), false},
		{"no issuer", cfg, jwttest.Sign(t, jwt.SigningMethodHS256, []byte(testSecret), good(jwt.MapClaims{"iss": nil})), false},
		{"wrong audience", cfg, jwttest.Sign(t, jwt.SigningMethodHS256, []byte(testSecret), good(jwt.MapClaims{"aud": "admin"})), false},
		{"no audience", cfg, jwttest.Sign(t, jwt.SigningMethodHS256, []byte(testSecret), good(jwt.MapClaims{"aud": nil})), false},
		{"payload swapped under a valid signature", cfg, swapPayload(jwttest.Sign(t, jwt.SigningMethodHS256, []byte(testSecret), good(nil)), good(jwt.MapClaims{"sub": "bob"})), false},
		{"signature with non-zero padding bits", cfg, flipLastChar(jwttest.Sign(t, jwt.SigningMethodHS256, []byte(testSecret), good(nil))), false},
		{"oversized", cfg, jwttest.Sign(t, jwt.SigningMethodHS256, []byte(testSecret), good(jwt.MapClaims{"pad": strings.Repeat("x", MaxTokenSize)})), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			claims := tt.cfg.verify(tt.token)
			if got := claims != nil; got != tt.ok {
				t.Fatalf("verified = %v, want %v", got, tt.ok)
			}
			if tt.ok && Lookup(claims, "sub") != "alice" {
				t.Fatalf("sub = %q", Lookup(claims, "sub"))
			}
		})
	}
	for _, f := range jwttest.Forgeries(t, k, []byte(testSecret), good(nil)) {
		t.Run(f.Name, func(t *testing.T) {
			if claims := cfg.verify(f.Token); claims != nil {
				t.Fatalf("a forged token yielded claims: %v", claims)
			}
		})
	}
}

func b64(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

// swapPayload replaces the claims of a signed token, keeping its signature.
func swapPayload(token string, claims jwt.MapClaims) string {
	parts := strings.Split(token, ".")
	payload, _ := json.Marshal(claims)
	return parts[0] + "." + b64(string(payload)) + "." + parts[2]
}

// flipLastChar changes the last character of the signature to one that
// decodes to the same bytes when padding bits are ignored.
func flipLastChar(token string) string {
	last := token[len(token)-1]
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	i := strings.IndexByte(alphabet, last)
	return token[:len(token)-1] + string(alphabet[i^1])
}

func TestLookup(t *testing.T) {
	var claims map[string]any
	dec := json.NewDecoder(strings.NewReader(`{
		"sub": "alice",
		"org": {"id": 42, "name": "Acme", "team": {"id": "t-1"}},
		"a.b": "dotted name",
		"big": 12345678901234567890,
		"neg": -7,
		"exp3": 1e3,
		"float": 1.5,
		"whole": 2.0,
		"huge": 1e400,
		"tiny": 1e-7,
		"flag": true,
		"off": false,
		"nothing": null,
		"roles": ["admin", "user"],
		"empty": ""
	}`))
	dec.UseNumber()
	if err := dec.Decode(&claims); err != nil {
		t.Fatal(err)
	}
	tests := map[string]string{
		"sub":          "alice",
		"org.id":       "42",
		"org.name":     "Acme",
		"org.team.id":  "t-1",
		"a.b":          "dotted name",
		"big":          "12345678901234567890",
		"neg":          "-7",
		"exp3":         "1000",
		"float":        "1.5",
		"whole":        "2",
		"huge":         "",
		"tiny":         "0.0000001",
		"flag":         "true",
		"off":          "false",
		"nothing":      "",
		"roles":        "",
		"roles.0":      "",
		"org":          "",
		"org.team":     "",
		"org.missing":  "",
		"missing":      "",
		"sub.x":        "",
		"empty":        "",
		"":             "",
		".":            "",
		"org.":         "",
		"org..id":      "",
		"org.id.extra": "",
	}
	for path, want := range tests {
		if got := Lookup(claims, path); got != want {
			t.Errorf("Lookup(%q) = %q, want %q", path, got, want)
		}
	}
	if got := Lookup(nil, "sub"); got != "" {
		t.Errorf("Lookup(nil) = %q", got)
	}
}

// TestTokenSources reads the token from each kind of source.
func TestTokenSources(t *testing.T) {
	token := jwttest.Sign(t, jwt.SigningMethodHS256, []byte(testSecret), jwt.MapClaims{"sub": "alice"})
	tests := []struct {
		name  string
		from  *TokenSource
		setup func(r *http.Request)
		ok    bool
	}{
		{"default: Authorization Bearer", nil, func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+token) }, true},
		{"scheme is case-insensitive", nil, func(r *http.Request) { r.Header.Set("Authorization", "bearer   "+token) }, true},
		{"Authorization without scheme", nil, func(r *http.Request) { r.Header.Set("Authorization", token) }, false},
		{"Authorization Basic", nil, func(r *http.Request) { r.SetBasicAuth("alice", "pw") }, false},
		{"none", nil, func(r *http.Request) {}, false},
		{"custom header, raw", &TokenSource{Header: "X-Token"}, func(r *http.Request) { r.Header.Set("X-Token", token) }, true},
		{"custom header, Bearer", &TokenSource{Header: "X-Token"}, func(r *http.Request) { r.Header.Set("X-Token", "Bearer "+token) }, true},
		{"custom header, other header set", &TokenSource{Header: "X-Token"}, func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+token) }, false},
		{"cookie", &TokenSource{Cookie: "session"}, func(r *http.Request) {
			r.AddCookie(&http.Cookie{Name: "other", Value: "x"})
			r.AddCookie(&http.Cookie{Name: "session", Value: token})
		}, true},
		{"cookie missing", &TokenSource{Cookie: "session"}, func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+token) }, false},
		{"query", &TokenSource{Query: "access_token"}, func(r *http.Request) { r.URL.RawQuery = "a=1&access_token=" + token }, true},
		{"query missing", &TokenSource{Query: "access_token"}, func(r *http.Request) { r.URL.RawQuery = "token=" + token }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := provisioned(t, &Config{Secret: testSecret, From: tt.from}, nil)
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			tt.setup(r)
			claims := cfg.Claims(r)
			if got := claims != nil; got != tt.ok {
				t.Fatalf("verified = %v, want %v", got, tt.ok)
			}
		})
	}
}

// TestRegister shows that {jwt.*} placeholders are resolved lazily, at
// most once per request, and that they are known but empty without a
// verified token.
func TestRegister(t *testing.T) {
	token := jwttest.Sign(t, jwt.SigningMethodHS256, []byte(testSecret), jwt.MapClaims{"sub": "alice", "org": map[string]any{"id": 7}})
	cfg := provisioned(t, &Config{Secret: testSecret, cacheSize: -1}, nil)

	newRequest := func(auth string) (*caddy.Replacer, *http.Request) {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		repl := caddy.NewReplacer()
		cfg.Register(repl, r)
		return repl, r
	}

	repl, _ := newRequest("Bearer " + token)
	if _, ok := repl.Get("http.request.uri"); ok {
		t.Fatal("unrelated placeholder answered by the jwt provider")
	}
	if _, ok := repl.Get("jwt"); ok {
		t.Fatal(`"jwt" alone is not a claim`)
	}
	if n := cfg.verifications.Load(); n != 0 {
		t.Fatalf("verified %d tokens before any {jwt.*} was asked for", n)
	}
	if got := repl.ReplaceAll("user:{jwt.sub} org:{jwt.org.id} {jwt.missing}.", ""); got != "user:alice org:7 ." {
		t.Fatalf("replaced: %q", got)
	}
	repl.ReplaceAll("{jwt.sub}{jwt.sub}", "")
	if n := cfg.verifications.Load(); n != 1 {
		t.Fatalf("verified %d times in one request, want 1", n)
	}

	// A second request verifies its own token (the cache is off here).
	repl, _ = newRequest("Bearer " + token)
	repl.ReplaceAll("{jwt.sub}", "")
	if n := cfg.verifications.Load(); n != 2 {
		t.Fatalf("verified %d times in two requests, want 2", n)
	}

	// Without a token the placeholder is known and empty.
	repl, _ = newRequest("")
	v, ok := repl.Get("jwt.sub")
	if !ok || v != "" {
		t.Fatalf("{jwt.sub} without token = %v, %v; want known and empty", v, ok)
	}
}

// TestCachedVerification shows that the cache spares the signature check
// for a token seen before, and forgets the token when it expires.
func TestCachedVerification(t *testing.T) {
	clk := clocktest.New(epoch)
	cfg := provisioned(t, &Config{Secret: testSecret, Leeway: caddy.Duration(5 * time.Second)}, clk)
	token := jwttest.Sign(t, jwt.SigningMethodHS256, []byte(testSecret), jwt.MapClaims{"sub": "alice", "exp": epoch.Add(20 * time.Second).Unix()})

	for range 3 {
		if cfg.verify(token) == nil {
			t.Fatal("valid token refused")
		}
	}
	if n := cfg.verifications.Load(); n != 1 {
		t.Fatalf("verified %d times, want 1 (then cached)", n)
	}
	clk.Add(24 * time.Second) // exp + leeway - 1s
	if cfg.verify(token) == nil {
		t.Fatal("token refused within its leeway")
	}
	clk.Add(time.Second) // exp + leeway: expired
	if cfg.verify(token) != nil {
		t.Fatal("expired token served from the cache")
	}

	// A forged token is never cached, and a cached valid token does not
	// vouch for a forgery that differs from it.
	forged := swapPayload(token, jwt.MapClaims{"sub": "bob"})
	before := cfg.verifications.Load()
	for range 2 {
		if cfg.verify(forged) != nil {
			t.Fatal("forged token accepted")
		}
	}
	if n := cfg.verifications.Load() - before; n != 2 {
		t.Fatalf("forged token verified %d times, want 2 (never cached)", n)
	}
}

func TestCacheTTLAndBound(t *testing.T) {
	clk := clocktest.New(epoch)
	cfg := provisioned(t, &Config{Secret: testSecret, cacheSize: 8}, clk)

	// No exp: remembered for the TTL only.
	token := jwttest.Sign(t, jwt.SigningMethodHS256, []byte(testSecret), jwt.MapClaims{"sub": "alice"})
	cfg.verify(token)
	clk.Add(DefaultCacheTTL - time.Second)
	cfg.verify(token)
	if n := cfg.verifications.Load(); n != 1 {
		t.Fatalf("verified %d times within the TTL, want 1", n)
	}
	clk.Add(time.Second)
	cfg.verify(token)
	if n := cfg.verifications.Load(); n != 2 {
		t.Fatalf("verified %d times after the TTL, want 2", n)
	}

	for i := range 100 {
		tok := jwttest.Sign(t, jwt.SigningMethodHS256, []byte(testSecret), jwt.MapClaims{"sub": "user", "n": i})
		if cfg.verify(tok) == nil {
			t.Fatal("valid token refused")
		}
		if n := cfg.cache.len(); n > 8 {
			t.Fatalf("cache holds %d entries, bound is 8", n)
		}
	}
}

// TestBadInputIsCheap feeds hostile input to the token path: none may
// panic or yield claims, and what each may cost is bounded by counts, not
// timed (BenchmarkHostileTokens measures the time each takes):
//
//   - Input longer than MaxTokenSize, or without exactly two dots, is
//     refused before the parser runs: the verifications counter does not
//     move. Only the size cap refuses the 10,000-deep document so.
//   - Whatever gets to the parser costs at most maxAllocs allocations
//     (testing.AllocsPerRun). The parser decodes the claims before it
//     checks the signature, so its cost grows with the number and nesting
//     of the JSON's values, which the size cap bounds: the costliest input
//     here, 1,000 nested objects in 8 KiB, takes about 2,100 allocations.
//     The bound, one allocation per byte the cap lets through, leaves four
//     times that for changes in the parser; the 10,000-deep document, let
//     through, would take about 20,000.
func TestBadInputIsCheap(t *testing.T) {
	const maxAllocs = MaxTokenSize
	cfg := provisioned(t, &Config{Secret: testSecret, cacheSize: -1}, nil)
	hostile := jwttest.HostileAuthorizations()
	beforeParser := []string{"1 MB", "10,000 dots", "JSON nested 10,000 deep"}
	for _, name := range beforeParser {
		if _, ok := hostile[name]; !ok {
			t.Fatalf("no hostile input named %q", name)
		}
	}
	for name, auth := range hostile {
		t.Run(name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.Header.Set("Authorization", auth)
			before := cfg.verifications.Load()
			if cfg.Claims(r) != nil {
				t.Fatal("hostile input yielded claims")
			}
			parsed := cfg.verifications.Load() != before
			if parsed && slices.Contains(beforeParser, name) {
				t.Errorf("a token of %d bytes went to the parser; want it refused before", len(strings.TrimPrefix(auth, "Bearer ")))
			}
			allocs := testing.AllocsPerRun(10, func() { cfg.Claims(r) })
			if allocs > maxAllocs && !race.Enabled {
				t.Errorf("%.0f allocations, want at most %d", allocs, maxAllocs)
			}
			t.Logf("went to the parser: %v; %.0f allocations", parsed, allocs)
		})
	}

	// The parser refuses the 10,000-deep document too, but only at the
	// signature, once it has decoded all of it: the size cap is what keeps
	// that cost from the token path.
	token := strings.TrimPrefix(hostile["JSON nested 10,000 deep"], "Bearer ")
	parse := func() error {
		_, err := cfg.parser.ParseWithClaims(token, jwt.MapClaims{}, cfg.keyFor)
		return err
	}
	if err := parse(); err == nil {
		t.Fatal("the parser accepted a 10,000-deep document")
	} else {
		t.Logf("the parser on the 10,000-deep document (%d bytes): %v; %.0f allocations",
			len(token), err, testing.AllocsPerRun(1, func() { _ = parse() }))
	}
}

// TestKeyRotation: with two public keys for one algorithm, tokens signed
// by either verify.
func TestKeyRotation(t *testing.T) {
	k := keys()
	cfg := provisioned(t, &Config{PublicKeys: []string{
		jwttest.WriteFile(t, "old.pem", k.RSAPublicPEM),
		jwttest.WriteFile(t, "new.pem", publicPEM(&k.RSAOther.PublicKey)),
	}}, nil)
	for name, key := range map[string]any{"old": k.RSA, "new": k.RSAOther} {
		if cfg.verify(jwttest.Sign(t, jwt.SigningMethodRS256, key, jwt.MapClaims{"sub": name})) == nil {
			t.Errorf("token signed with the %s key refused", name)
		}
	}
}

// TestNamespacedClaim: a claim named like a URL, as some issuers use, is a
// usable placeholder.
func TestNamespacedClaim(t *testing.T) {
	token := jwttest.Sign(t, jwt.SigningMethodHS256, []byte(testSecret), jwt.MapClaims{"https://example.com/tier": "pro"})
	cfg := provisioned(t, &Config{Secret: testSecret}, nil)
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("Authorization", "Bearer "+token)
	repl := caddy.NewReplacer()
	cfg.Register(repl, r)
	if got := repl.ReplaceAll("{jwt.https://example.com/tier}", ""); got != "pro" {
		t.Fatalf("got %q", got)
	}
}
