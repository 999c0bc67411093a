package ratelimit

// Tests of the jwt block (SPEC §3) through a real in-process Caddy, with
// tokens minted here. Zones get a fresh name per test run, because the
// memory store keeps counters across config loads.

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/golang-jwt/jwt/v5"

	"github.com/d61b427a/caddy-rate-limit/internal/jwttest"
)

// jwtSecret is the HMAC secret of the test configs, given to Caddy through
// the environment as {env.RL_TEST_JWT_SECRET}.
const (
	jwtSecret    = "test-secret-of-at-least-32-bytes!"
	jwtSecretEnv = "RL_TEST_JWT_SECRET"
	jwtIssuer    = "https://id.example.com"
)

// jwtKeys are the test signing keys, shared with jwtclaims' tests.
var jwtKeys = jwttest.Generate

// jwtKeyFile writes a PEM file and returns its path.
func jwtKeyFile(t *testing.T, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "key.pem")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// jwtSign mints a token.
func jwtSign(t *testing.T, method jwt.SigningMethod, key any, claims jwt.MapClaims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(method, claims).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// jwtClaims returns claims that pass the test configs' checks, with extra
// claims added (or removed, if nil).
func jwtClaims(extra jwt.MapClaims) jwt.MapClaims {
	c := jwt.MapClaims{"iss": jwtIssuer, "aud": "api", "exp": time.Now().Add(time.Hour).Unix()}
	for k, v := range extra {
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
	}
	return c
}

// jwtHS256 mints a valid HS256 token with the test secret.
func jwtHS256(t *testing.T, extra jwt.MapClaims) string {
	return jwtSign(t, jwt.SigningMethodHS256, []byte(jwtSecret), jwtClaims(extra))
}

func bearer(token string) string { return "Authorization: Bearer " + token }

// jwtZone names a zone uniquely for this test run.
func jwtZone(name string) string {
	return fmt.Sprintf("%s_%d", name, time.Now().UnixNano())
}

// startJWTCaddy sets the secret's environment variable and loads the
// Caddyfile sites, with extra global options if given.
func startJWTCaddy(t *testing.T, extraGlobals, sites string) *caddytest.Tester {
	t.Helper()
	t.Setenv(jwtSecretEnv, jwtSecret)
	globals := globalOptions
	if extraGlobals != "" {
		globals = strings.Replace(globalOptions, "grace_period 1ns\n", "grace_period 1ns\n"+extraGlobals+"\n", 1)
	}
	tc := caddytest.NewTester(t)
	tc.InitServer(globals+sites, "caddyfile")
	if t.Failed() {
		t.FailNow()
	}
	return tc
}

// jwtResult is what a test site reports about a request.
type jwtResult struct {
	status int
	key    string // {http.rate_limit.key}
	limit  string // X-RateLimit-Limit
	used   int    // X-RateLimit-Used
	body   string
}

// jwtGet sends a GET to the test site. The sites respond with
// "{http.rate_limit.key}|<anything>", so the key is the body up to "|".
func jwtGet(t *testing.T, tc *caddytest.Tester, url string, headers ...string) jwtResult {
	t.Helper()
	resp, body := do(t, tc, http.MethodGet, url, headers...)
	used, _ := strconv.Atoi(resp.Header.Get("X-RateLimit-Used"))
	key, _, _ := strings.Cut(body, "|")
	return jwtResult{status: resp.StatusCode, key: key, limit: resp.Header.Get("X-RateLimit-Limit"), used: used, body: body}
}

// jwtUserSite limits by verified user, falling back to the client IP.
func jwtUserSite(t *testing.T, zone, limit string) string {
	return fmt.Sprintf(`
:9080 {
	rate_limit {
		jwt {
			secret {env.%s}
			public_key %s
			issuer %s
			audience api
		}
		zone %s {
			key user:{jwt.sub} ip:{client_ip}
			limit %s
			window 1h
		}
	}
	respond "{http.rate_limit.key}|sub={jwt.sub}"
}
`, jwtSecretEnv, jwtKeyFile(t, jwtKeys().RSAPublicPEM), jwtIssuer, zone, limit)
}

// TestJWTUserBeforeIP: a verified token keys the request by user, whatever
// its algorithm; no token keys it by IP; later handlers see {jwt.sub}.
func TestJWTUserBeforeIP(t *testing.T) {
	k := jwtKeys()
	tc := startJWTCaddy(t, "", jwtUserSite(t, jwtZone("jwt_user"), "100"))

	anon := jwtGet(t, tc, siteURL+"/")
	if !strings.HasPrefix(anon.key, "ip:") || anon.used != 1 || anon.body != anon.key+"|sub=" {
		t.Fatalf("no token: %+v, want key ip:<client ip>, used 1, empty {jwt.sub}", anon)
	}
	steps := []struct {
		name  string
		token string
		key   string
		used  int
	}{
		{"alice HS256", jwtHS256(t, jwt.MapClaims{"sub": "alice"}), "user:alice", 1},
		{"alice RS256", jwtSign(t, jwt.SigningMethodRS256, k.RSA, jwtClaims(jwt.MapClaims{"sub": "alice"})), "user:alice", 2},
		{"bob", jwtHS256(t, jwt.MapClaims{"sub": "bob"}), "user:bob", 1},
		{"alice again", jwtHS256(t, jwt.MapClaims{"sub": "alice"}), "user:alice", 3},
		{"no token again", "", anon.key, 2},
	}
	for _, s := range steps {
		var hdr []string
		if s.token != "" {
			hdr = append(hdr, bearer(s.token))
		}
		got := jwtGet(t, tc, siteURL+"/", hdr...)
		if got.status != http.StatusOK || got.key != s.key || got.used != s.used {
			t.Fatalf("%s: %+v, want key %q used %d", s.name, got, s.key, s.used)
		}
		if s.token != "" && got.body != s.key+"|sub="+strings.TrimPrefix(s.key, "user:") {
			t.Fatalf("%s: body %q: respond does not see {jwt.sub}", s.name, got.body)
		}
	}
}

// TestJWTRejectedTokensFallBackToIP sends every kind of bad token and shows
// that each is counted in the client IP's bucket (its counter goes up by
// one each time), not in a fresh bucket of the claimed user.
func TestJWTRejectedTokensFallBackToIP(t *testing.T) {
	k := jwtKeys()
	tc := startJWTCaddy(t, "", jwtUserSite(t, jwtZone("jwt_forged"), "1000"))
	now := time.Now().Unix()
	mallory := jwt.MapClaims{"sub": "mallory"}
	valid := jwtHS256(t, mallory)
	parts := strings.Split(valid, ".")
	bobPayload := base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"bob","iss":"` + jwtIssuer + `","aud":"api"}`))

	bad := []struct{ name, header string }{
		{"missing", ""},
		{"malformed", "Authorization: Bearer not-a-jwt"},
		{"invalid base64", "Authorization: Bearer !!!.???.***"},
		{"Basic scheme", "Authorization: Basic YWxpY2U6cHc="},
		{"no Bearer scheme", "Authorization: " + valid},
		{"expired", bearer(jwtHS256(t, jwt.MapClaims{"sub": "mallory", "exp": now - 60}))},
		{"not yet valid", bearer(jwtHS256(t, jwt.MapClaims{"sub": "mallory", "nbf": now + 60}))},
		{"another secret", bearer(jwtSign(t, jwt.SigningMethodHS256, []byte("another secret of 32 bytes......."), jwtClaims(mallory)))},
		{"another RSA key", bearer(jwtSign(t, jwt.SigningMethodRS256, k.RSAOther, jwtClaims(mallory)))},
		{"an unconfigured algorithm (ES256)", bearer(jwtSign(t, jwt.SigningMethodES256, k.EC256, jwtClaims(mallory)))},
		{"alg none", bearer(jwtSign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, jwtClaims(mallory)))},
		{"alg confusion: HS256 signed with the RSA public key PEM", bearer(jwtSign(t, jwt.SigningMethodHS256, k.RSAPublicPEM, jwtClaims(mallory)))},
		{"wrong issuer", bearer(jwtHS256(t, jwt.MapClaims{"sub": "mallory", "iss": "https://evil.example.com"}))},
		{"wrong audience", bearer(jwtHS256(t, jwt.MapClaims{"sub": "mallory", "aud": "admin"}))},
		{"claims swapped under a valid signature", bearer(parts[0] + "." + bobPayload + "." + parts[2])},
		{"oversized", bearer(jwtHS256(t, jwt.MapClaims{"sub": "mallory", "pad": strings.Repeat("x", 9000)}))},
	}
	base := jwtGet(t, tc, siteURL+"/")
	if !strings.HasPrefix(base.key, "ip:") {
		t.Fatalf("no token: key %q", base.key)
	}
	for i, b := range bad {
		var hdr []string
		if b.header != "" {
			hdr = append(hdr, b.header)
		}
		got := jwtGet(t, tc, siteURL+"/", hdr...)
		if got.key != base.key || got.used != base.used+i+1 || got.body != base.key+"|sub=" {
			t.Errorf("%s: %+v, want key %q with used %d and no {jwt.sub}", b.name, got, base.key, base.used+i+1)
		}
	}
	// The valid token this test forged from is a bucket of its own.
	if got := jwtGet(t, tc, siteURL+"/", bearer(valid)); got.key != "user:mallory" || got.used != 1 {
		t.Fatalf("valid token: %+v", got)
	}
}

// TestJWTForgedTokenDoesNotEscapeAnExhaustedIP: once the IP's bucket is
// spent, a forged token is rejected with it, while a real user is not.
func TestJWTForgedTokenDoesNotEscapeAnExhaustedIP(t *testing.T) {
	tc := startJWTCaddy(t, "", jwtUserSite(t, jwtZone("jwt_exhausted"), "2"))
	for i := 0; i < 2; i++ {
		if got := jwtGet(t, tc, siteURL+"/"); got.status != http.StatusOK {
			t.Fatalf("request %d: %+v", i, got)
		}
	}
	if got := jwtGet(t, tc, siteURL+"/"); got.status != http.StatusTooManyRequests {
		t.Fatalf("third anonymous request: %+v, want 429", got)
	}
	forged := jwtSign(t, jwt.SigningMethodHS256, []byte("not the secret, but 32 bytes long"), jwtClaims(jwt.MapClaims{"sub": "fresh-user"}))
	if got := jwtGet(t, tc, siteURL+"/", bearer(forged)); got.status != http.StatusTooManyRequests {
		t.Fatalf("forged token: %+v, want 429 (the IP's bucket)", got)
	}
	if got := jwtGet(t, tc, siteURL+"/", bearer(jwtHS256(t, jwt.MapClaims{"sub": "fresh-user"}))); got.status != http.StatusOK || got.key != "user:fresh-user" {
		t.Fatalf("valid token: %+v, want 200 in the user's bucket", got)
	}
}

// TestJWTPublicKeyTypes verifies RSA, ECDSA and Ed25519 tokens against
// repeated public_key files, with the default algorithm list.
func TestJWTPublicKeyTypes(t *testing.T) {
	k := jwtKeys()
	tc := startJWTCaddy(t, "", fmt.Sprintf(`
:9080 {
	rate_limit {
		jwt {
			public_key %s
			public_key %s
			public_key %s
			public_key %s
		}
		zone %s {
			key user:{jwt.sub} ip:{client_ip}
			limit 100
			window 1h
		}
	}
	respond "{http.rate_limit.key}|"
}
`, jwtKeyFile(t, k.RSAPublicPEM), jwtKeyFile(t, jwttest.PublicPEM(&k.EC256.PublicKey)), jwtKeyFile(t, jwttest.PublicPEM(&k.EC384.PublicKey)),
		jwtKeyFile(t, jwttest.PublicPEM(k.Ed.Public())), jwtZone("jwt_keys")))

	tests := []struct {
		method jwt.SigningMethod
		key    any
	}{
		{jwt.SigningMethodRS256, k.RSA},
		{jwt.SigningMethodRS512, k.RSA},
		{jwt.SigningMethodPS256, k.RSA},
		{jwt.SigningMethodES256, k.EC256},
		{jwt.SigningMethodES384, k.EC384},
		{jwt.SigningMethodEdDSA, k.Ed},
	}
	for _, tt := range tests {
		alg := tt.method.Alg()
		got := jwtGet(t, tc, siteURL+"/", bearer(jwtSign(t, tt.method, tt.key, jwtClaims(jwt.MapClaims{"sub": alg}))))
		if got.key != "user:"+alg {
			t.Errorf("%s: key %q, want user:%s", alg, got.key, alg)
		}
	}
	// No secret is configured, so no HMAC token verifies.
	if got := jwtGet(t, tc, siteURL+"/", bearer(jwtHS256(t, jwt.MapClaims{"sub": "hs"}))); !strings.HasPrefix(got.key, "ip:") {
		t.Errorf("HS256 without a secret: key %q", got.key)
	}
}

// TestJWTTokenSources reads the token from a cookie, a query parameter and
// a custom header.
func TestJWTTokenSources(t *testing.T) {
	token := jwtHS256(t, jwt.MapClaims{"sub": "alice"})
	tests := []struct {
		from, url string
		headers   []string
	}{
		{"cookie session", siteURL + "/", []string{"Cookie: theme=dark; session=" + token}},
		{"query access_token", siteURL + "/?x=1&access_token=" + token, nil},
		{"header X-Token", siteURL + "/", []string{"X-Token: " + token}},
	}
	for _, tt := range tests {
		t.Run(tt.from, func(t *testing.T) {
			tc := startJWTCaddy(t, "", fmt.Sprintf(`
:9080 {
	rate_limit {
		jwt {
			from %s
			secret {env.%s}
		}
		zone %s {
			key user:{jwt.sub} ip:{client_ip}
			limit 100
			window 1h
		}
	}
	respond "{http.rate_limit.key}|"
}
`, tt.from, jwtSecretEnv, jwtZone("jwt_sources")))
			if got := jwtGet(t, tc, tt.url, tt.headers...); got.key != "user:alice" {
				t.Fatalf("key %q, want user:alice", got.key)
			}
			// The default place, the Authorization header, is not read.
			if got := jwtGet(t, tc, siteURL+"/", bearer(token)); !strings.HasPrefix(got.key, "ip:") {
				t.Fatalf("Authorization header read although from is %s: key %q", tt.from, got.key)
			}
		})
	}
}

// TestJWTClaimsForLaterHandlers: a proxied application receives the user
// from header_up, and respond renders dotted paths, numbers and
// unusable values.
func TestJWTClaimsForLaterHandlers(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "user="+r.Header.Get("X-User")+" org="+r.Header.Get("X-Org"))
	}))
	t.Cleanup(backend.Close)
	tc := startJWTCaddy(t, "", fmt.Sprintf(`
:9080 {
	rate_limit {
		jwt {
			secret {env.%s}
		}
		zone %s {
			key user:{jwt.sub} ip:{client_ip}
			limit 100
			window 1h
		}
	}
	handle /proxy {
		reverse_proxy %s {
			header_up X-User {jwt.sub}
			header_up X-Org {jwt.org.id}
		}
	}
	respond "{http.rate_limit.key}|{jwt.org.id}|{jwt.org.name}|{jwt.big}|{jwt.exp3}|{jwt.ratio}|{jwt.flag}|{jwt.roles}|{jwt.org}|{jwt.missing}|"
}
`, jwtSecretEnv, jwtZone("jwt_later"), strings.TrimPrefix(backend.URL, "http://")))

	token := jwtRawHS256(`{"sub":"alice","org":{"id":42,"name":"Acme"},"big":12345678901234567890,` +
		`"exp3":1e3,"ratio":2.5e-1,"flag":true,"roles":["a","b"]}`)

	_, body := do(t, tc, http.MethodGet, siteURL+"/proxy", bearer(token))
	if body != "user=alice org=42" {
		t.Fatalf("proxied: %q", body)
	}
	_, body = do(t, tc, http.MethodGet, siteURL+"/proxy")
	if body != "user= org=" {
		t.Fatalf("proxied without token: %q", body)
	}
	// Big integers keep their digits, other numbers lose their exponent,
	// arrays, objects and missing claims are empty.
	got := jwtGet(t, tc, siteURL+"/", bearer(token))
	want := "user:alice|42|Acme|12345678901234567890|1000|0.25|true||||"
	if got.body != want {
		t.Fatalf("respond:\n got %q\nwant %q", got.body, want)
	}
}

// jwtRawHS256 signs a payload given as JSON text, so the test controls
// exactly how numbers are written.
func jwtRawHS256(payload string) string {
	enc := base64.RawURLEncoding
	signing := enc.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`)) + "." + enc.EncodeToString([]byte(payload))
	sig, err := jwt.SigningMethodHS256.Sign(signing, []byte(jwtSecret))
	if err != nil {
		panic(err)
	}
	return signing + "." + enc.EncodeToString(sig)
}

// TestJWTQuotaClaim: `limit {jwt.quota} 600` takes a sensible positive
// integer from a verified token, and the default otherwise.
func TestJWTQuotaClaim(t *testing.T) {
	tc := startJWTCaddy(t, "", fmt.Sprintf(`
:9080 {
	rate_limit {
		jwt {
			secret {env.%s}
		}
		zone %s {
			key user:{jwt.sub} ip:{client_ip}
			limit {jwt.quota} 600
			window 1h
		}
	}
	respond "{http.rate_limit.key}|"
}
`, jwtSecretEnv, jwtZone("jwt_quota")))

	tests := []struct {
		name, quota string // quota: the claim as raw JSON; "" for none
		limit       string
	}{
		{"integer", `5`, "5"},
		{"integer as a string", `"50"`, "50"},
		{"exponent", `1e3`, "1000"},
		{"whole float", `70.0`, "70"},
		{"largest", `2147483647`, "2147483647"},
		{"absurd: 2^31", `2147483648`, "600"},
		{"absurd: 1e30", `1e30`, "600"},
		{"absurd: beyond float64", `1e400`, "600"},
		{"zero", `0`, "600"},
		{"negative", `-5`, "600"},
		{"fraction", `1.5`, "600"},
		{"text", `"12abc"`, "600"},
		{"empty text", `""`, "600"},
		{"boolean", `true`, "600"},
		{"null", `null`, "600"},
		{"array", `[5]`, "600"},
		{"object", `{"n":5}`, "600"},
		{"no quota claim", ``, "600"},
	}
	for i, tt := range tests {
		payload := fmt.Sprintf(`{"sub":"quota-%d"}`, i)
		if tt.quota != "" {
			payload = fmt.Sprintf(`{"sub":"quota-%d","quota":%s}`, i, tt.quota)
		}
		got := jwtGet(t, tc, siteURL+"/", bearer(jwtRawHS256(payload)))
		if got.status != http.StatusOK || got.limit != tt.limit || got.key != fmt.Sprintf("user:quota-%d", i) {
			t.Errorf("%s (quota %s): %+v, want limit %s", tt.name, tt.quota, got, tt.limit)
		}
	}

	forged := jwtSign(t, jwt.SigningMethodHS256, []byte("not the secret, but 32 bytes long"), jwt.MapClaims{"sub": "quota-forged", "quota": 100000})
	if got := jwtGet(t, tc, siteURL+"/", bearer(forged)); got.limit != "600" || !strings.HasPrefix(got.key, "ip:") {
		t.Fatalf("forged quota: %+v, want the default 600 in the IP's bucket", got)
	}
	if got := jwtGet(t, tc, siteURL+"/"); got.limit != "600" {
		t.Fatalf("no token: limit %s, want 600", got.limit)
	}

	// The quota is enforced.
	small := jwtRawHS256(`{"sub":"quota-small","quota":2}`)
	for i, want := range []int{200, 200, 429} {
		if got := jwtGet(t, tc, siteURL+"/", bearer(small)); got.status != want {
			t.Fatalf("quota 2, request %d: status %d, want %d", i+1, got.status, want)
		}
	}
}

const jwtTierSite = `
:9080 {
	map {jwt.tier} {tier_limit} {
		free 100
		pro 1000
		default 10
	}
	rate_limit {
		jwt {
			secret {env.%s}
		}
		zone %s {
			key user:{jwt.sub} ip:{client_ip}
			limit {tier_limit}
			window 1h
		}
	}
	respond "{http.rate_limit.key}|{tier_limit}"
}
`

// TestJWTTiersWithMap: Caddy's map turns the tier claim into a limit; a
// forged "pro" token gets the default.
func TestJWTTiersWithMap(t *testing.T) {
	site := fmt.Sprintf(jwtTierSite, jwtSecretEnv, jwtZone("jwt_tiers"))

	// map must come before rate_limit in the route for {tier_limit} to be
	// known when the limit is resolved; the directive order puts it there.
	adapted, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(globalOptions+site), nil)
	if err != nil {
		t.Fatal(err)
	}
	order := strings.Join(handlerOrder(t, adapted), ",")
	if m, rl := strings.Index(order, "map,"), strings.Index(order, "rate_limit,"); m < 0 || rl < 0 || m > rl {
		t.Fatalf("handler order %s, want map before rate_limit", order)
	}

	tc := startJWTCaddy(t, "", site)
	tests := []struct {
		name, token, limit string
	}{
		{"free", jwtHS256(t, jwt.MapClaims{"sub": "tier-free", "tier": "free"}), "100"},
		{"pro", jwtHS256(t, jwt.MapClaims{"sub": "tier-pro", "tier": "pro"}), "1000"},
		{"unknown tier", jwtHS256(t, jwt.MapClaims{"sub": "tier-gold", "tier": "gold"}), "10"},
		{"no tier claim", jwtHS256(t, jwt.MapClaims{"sub": "tier-none"}), "10"},
		{"forged pro", jwtSign(t, jwt.SigningMethodHS256, []byte("not the secret, but 32 bytes long"), jwtClaims(jwt.MapClaims{"sub": "tier-forged", "tier": "pro"})), "10"},
		{"no token", "", "10"},
	}
	for _, tt := range tests {
		var hdr []string
		if tt.token != "" {
			hdr = append(hdr, bearer(tt.token))
		}
		if got := jwtGet(t, tc, siteURL+"/", hdr...); got.limit != tt.limit {
			t.Errorf("%s: %+v, want limit %s", tt.name, got, tt.limit)
		}
	}
}

// handlerOrder lists the "handler" values of an adapted JSON config in
// document order.
func handlerOrder(t *testing.T, config []byte) []string {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(string(config)))
	var out []string
	wantValue := false
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		s, isString := tok.(string)
		if wantValue && isString {
			out = append(out, s)
		}
		wantValue = isString && s == "handler" && !wantValue
	}
}

// TestJWTCustomerWideLimit: per API key and per customer at three times
// that, as in the README (40/s and 120/s there; 4 and 12 per minute here,
// so timing cannot make the test flaky). A customer's keys together stop
// at the customer limit; another customer is unaffected.
func TestJWTCustomerWideLimit(t *testing.T) {
	tc := startJWTCaddy(t, "", fmt.Sprintf(`
:9080 {
	rate_limit {
		jwt {
			secret {env.%s}
		}
		zone %s {
			key {header.X-Api-Key}
			limit 4
			window 1h
		}
		zone %s {
			key customer:{jwt.customer} ip:{client_ip}
			limit 12
			window 1h
		}
	}
	respond "{http.rate_limit.key}|"
}
`, jwtSecretEnv, jwtZone("per_key"), jwtZone("per_customer")))

	acme := bearer(jwtHS256(t, jwt.MapClaims{"sub": "u1", "customer": "acme"}))
	send := func(apiKey, token string) int {
		return jwtGet(t, tc, siteURL+"/", "X-Api-Key: "+apiKey, token).status
	}
	// Key A spends its 4; its 5th is rejected by per_key and costs the
	// customer nothing.
	for i := 1; i <= 5; i++ {
		want := http.StatusOK
		if i == 5 {
			want = http.StatusTooManyRequests
		}
		if got := send("acme-A", acme); got != want {
			t.Fatalf("acme-A request %d: %d, want %d", i, got, want)
		}
	}
	// Keys B and C bring the customer to 12.
	for _, apiKey := range []string{"acme-B", "acme-C"} {
		for i := 1; i <= 4; i++ {
			if got := send(apiKey, acme); got != http.StatusOK {
				t.Fatalf("%s request %d: %d, want 200", apiKey, i, got)
			}
		}
	}
	// A fresh key of the same customer is over the customer limit.
	if got := send("acme-D", acme); got != http.StatusTooManyRequests {
		t.Fatalf("acme-D: %d, want 429 from per_customer", got)
	}
	// Another customer is not affected.
	other := bearer(jwtHS256(t, jwt.MapClaims{"sub": "u2", "customer": "globex"}))
	if got := send("globex-A", other); got != http.StatusOK {
		t.Fatalf("globex-A: %d, want 200", got)
	}
}

// TestJWTBadInputThroughCaddy sends hostile Authorization headers through
// Caddy (with max_header_size raised so that 1 MB reaches the handler).
// Each must be answered normally, counted by IP. Round trips are logged;
// BenchmarkHostileTokens in jwtclaims measures the token path alone.
func TestJWTBadInputThroughCaddy(t *testing.T) {
	tc := startJWTCaddy(t, "servers {\n\t\tmax_header_size 4MB\n\t}", jwtUserSite(t, jwtZone("jwt_hostile"), "1000"))
	header := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`))
	deep := func(n int) string {
		return base64.RawURLEncoding.EncodeToString([]byte(strings.Repeat(`{"a":`, n) + "1" + strings.Repeat("}", n)))
	}
	inputs := []struct{ name, auth string }{
		{"1 MB", "Bearer " + strings.Repeat("A", 1<<20)},
		{"10,000 dots", "Bearer " + strings.Repeat(".", 10000)},
		{"invalid base64", "Bearer " + strings.Repeat("!", 3000) + "." + strings.Repeat("*", 3000) + ".x"},
		{"JSON nested 10,000 deep", "Bearer " + header + "." + deep(10000) + ".c2ln"},
		{"JSON nested 1,000 deep (under the size cap)", "Bearer " + header + "." + deep(1000) + ".c2ln"},
	}
	base := jwtGet(t, tc, siteURL+"/")
	for i, in := range inputs {
		start := time.Now()
		got := jwtGet(t, tc, siteURL+"/", "Authorization: "+in.auth)
		took := time.Since(start)
		t.Logf("%s (%d bytes): round trip %v", in.name, len(in.auth), took)
		if got.status != http.StatusOK || got.key != base.key || got.used != base.used+i+1 {
			t.Errorf("%s: %+v, want 200 in the IP's bucket", in.name, got)
		}
	}
}
