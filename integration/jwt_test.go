package integration

// Tests of the jwt block through a real in-process Caddy, with
// tokens minted here. Zones get a fresh name per test run, because the
// memory store keeps counters across config loads.

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
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

// jwtClaims returns claims that pass the test configs' checks, with extra
// claims added (or removed, if nil).
func jwtClaims(extra jwt.MapClaims) jwt.MapClaims {
	return jwttest.Claims(jwt.MapClaims{"iss": jwtIssuer, "aud": "api", "exp": time.Now().Add(time.Hour).Unix()}, extra)
}

// jwtHS256 mints a valid HS256 token with the test secret.
func jwtHS256(t *testing.T, extra jwt.MapClaims) string {
	return jwttest.Sign(t, jwt.SigningMethodHS256, []byte(jwtSecret), jwtClaims(extra))
}

func bearer(token string) string { return "Authorization: Bearer " + token }

// jwtZone names a zone uniquely for this test run.
func jwtZone(name string) string {
	return fmt.Sprintf("%s_%d", name, time.Now().UnixNano())
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
func jwtGet(t *testing.T, url string, headers ...string) jwtResult {
	t.Helper()
	resp, body := do(t, http.MethodGet, url, headers...)
	used, _ := strconv.Atoi(resp.Header.Get("X-RateLimit-Used"))
	key, _, _ := strings.Cut(body, "|")
	return jwtResult{status: resp.StatusCode, key: key, limit: resp.Header.Get("X-RateLimit-Limit"), used: used, body: body}
}

// jwtSite is a site on siteAddr whose zone limits each verified user,
// falling back to the client IP, to limit (its limit alternatives) an
// hour: jwt holds the jwt block's lines, and the response is the key,
// "|" and then body.
func jwtSite(jwt, zone, limit, body string) string {
	return fmt.Sprintf(`
`+siteAddr+` {
	rate_limit {
		jwt {
			%s
		}
		zone %s {
			key user:{jwt.sub} ip:{client_ip}
			limit %s
			window 1h
		}
	}
	respond "{http.rate_limit.key}|%s"
}
`, jwt, zone, limit, body)
}

// jwtUserSite is jwtSite with the secret and the RSA key, an issuer and an
// audience; it answers the key and the sub claim.
func jwtUserSite(t *testing.T, zone, limit string) string {
	jwt := fmt.Sprintf("secret {env.%s}\n\t\t\tpublic_key %s\n\t\t\tissuer %s\n\t\t\taudience api",
		jwtSecretEnv, jwttest.WriteFile(t, "key.pem", jwtKeys().RSAPublicPEM), jwtIssuer)
	return jwtSite(jwt, zone, limit, "sub={jwt.sub}")
}

// TestJWTUserBeforeIP: a verified token keys the request by user, whatever
// its algorithm; no token keys it by IP; later handlers see {jwt.sub}.
func TestJWTUserBeforeIP(t *testing.T) {
	k := jwtKeys()
	t.Setenv(jwtSecretEnv, jwtSecret)
	startCaddy(t, jwtUserSite(t, jwtZone("jwt_user"), "100"))

	anon := jwtGet(t, siteURL+"/")
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
		{"alice RS256", jwttest.Sign(t, jwt.SigningMethodRS256, k.RSA, jwtClaims(jwt.MapClaims{"sub": "alice"})), "user:alice", 2},
		{"bob", jwtHS256(t, jwt.MapClaims{"sub": "bob"}), "user:bob", 1},
		{"alice again", jwtHS256(t, jwt.MapClaims{"sub": "alice"}), "user:alice", 3},
		{"no token again", "", anon.key, 2},
	}
	for _, s := range steps {
		var hdr []string
		if s.token != "" {
			hdr = append(hdr, bearer(s.token))
		}
		got := jwtGet(t, siteURL+"/", hdr...)
		if got.status != http.StatusOK || got.key != s.key || got.used != s.used {
			t.Fatalf("%s: %+v, want key %q used %d", s.name, got, s.key, s.used)
		}
		if s.token != "" && got.body != s.key+"|sub="+strings.TrimPrefix(s.key, "user:") {
			t.Fatalf("%s: body %q: respond does not see {jwt.sub}", s.name, got.body)
		}
	}
}

// TestJWTRejectedTokensFallBackToIP sends every kind of bad token, the
// forgeries of jwttest.Forgeries among them, and shows that each is
// counted in the client IP's bucket (its counter goes up by one each
// time), not in a fresh bucket of the claimed user.
func TestJWTRejectedTokensFallBackToIP(t *testing.T) {
	k := jwtKeys()
	t.Setenv(jwtSecretEnv, jwtSecret)
	startCaddy(t, jwtUserSite(t, jwtZone("jwt_forged"), "1000"))
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
		{"another secret", bearer(jwttest.Sign(t, jwt.SigningMethodHS256, []byte("another secret of 32 bytes......."), jwtClaims(mallory)))},
		{"another RSA key", bearer(jwttest.Sign(t, jwt.SigningMethodRS256, k.RSAOther, jwtClaims(mallory)))},
		{"an unconfigured algorithm (ES256)", bearer(jwttest.Sign(t, jwt.SigningMethodES256, k.EC256, jwtClaims(mallory)))},
		{"alg none", bearer(jwttest.Sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, jwtClaims(mallory)))},
		{"alg confusion: HS256 signed with the RSA public key PEM", bearer(jwttest.Sign(t, jwt.SigningMethodHS256, k.RSAPublicPEM, jwtClaims(mallory)))},
		{"wrong issuer", bearer(jwtHS256(t, jwt.MapClaims{"sub": "mallory", "iss": "https://evil.example.com"}))},
		{"wrong audience", bearer(jwtHS256(t, jwt.MapClaims{"sub": "mallory", "aud": "admin"}))},
		{"claims swapped under a valid signature", bearer(parts[0] + "." + bobPayload + "." + parts[2])},
		{"oversized", bearer(jwtHS256(t, jwt.MapClaims{"sub": "mallory", "pad": strings.Repeat("x", 9000)}))},
	}
	for _, f := range jwttest.Forgeries(t, k, []byte(jwtSecret), jwtClaims(mallory)) {
		bad = append(bad, struct{ name, header string }{f.Name, bearer(f.Token)})
	}
	base := jwtGet(t, siteURL+"/")
	if !strings.HasPrefix(base.key, "ip:") {
		t.Fatalf("no token: key %q", base.key)
	}
	for i, b := range bad {
		var hdr []string
		if b.header != "" {
			hdr = append(hdr, b.header)
		}
		got := jwtGet(t, siteURL+"/", hdr...)
		if got.key != base.key || got.used != base.used+i+1 || got.body != base.key+"|sub=" {
			t.Errorf("%s: %+v, want key %q with used %d and no {jwt.sub}", b.name, got, base.key, base.used+i+1)
		}
	}
	// The valid token this test forged from is a bucket of its own.
	if got := jwtGet(t, siteURL+"/", bearer(valid)); got.key != "user:mallory" || got.used != 1 {
		t.Fatalf("valid token: %+v", got)
	}
}

// TestJWTForgedTokenDoesNotEscapeAnExhaustedIP: once the IP's bucket is
// empty, a forged token is rejected with it, while a real user is not.
func TestJWTForgedTokenDoesNotEscapeAnExhaustedIP(t *testing.T) {
	t.Setenv(jwtSecretEnv, jwtSecret)
	startCaddy(t, jwtUserSite(t, jwtZone("jwt_exhausted"), "2"))
	for i := 0; i < 2; i++ {
		if got := jwtGet(t, siteURL+"/"); got.status != http.StatusOK {
			t.Fatalf("request %d: %+v", i, got)
		}
	}
	if got := jwtGet(t, siteURL+"/"); got.status != http.StatusTooManyRequests {
		t.Fatalf("third anonymous request: %+v, want 429", got)
	}
	forged := jwttest.Sign(t, jwt.SigningMethodHS256, []byte("not the secret, but 32 bytes long"), jwtClaims(jwt.MapClaims{"sub": "fresh-user"}))
	if got := jwtGet(t, siteURL+"/", bearer(forged)); got.status != http.StatusTooManyRequests {
		t.Fatalf("forged token: %+v, want 429 (the IP's bucket)", got)
	}
	if got := jwtGet(t, siteURL+"/", bearer(jwtHS256(t, jwt.MapClaims{"sub": "fresh-user"}))); got.status != http.StatusOK || got.key != "user:fresh-user" {
		t.Fatalf("valid token: %+v, want 200 in the user's bucket", got)
	}
}

// TestJWTPublicKeyTypes verifies RSA, ECDSA and Ed25519 tokens against
// repeated public_key files, with the default algorithm list.
func TestJWTPublicKeyTypes(t *testing.T) {
	k := jwtKeys()
	var keys []string
	for _, pem := range [][]byte{k.RSAPublicPEM, jwttest.PublicPEM(&k.EC256.PublicKey), jwttest.PublicPEM(&k.EC384.PublicKey), jwttest.PublicPEM(k.Ed.Public())} {
		keys = append(keys, "public_key "+jwttest.WriteFile(t, "key.pem", pem))
	}
	t.Setenv(jwtSecretEnv, jwtSecret)
	startCaddy(t, jwtSite(strings.Join(keys, "\n\t\t\t"), jwtZone("jwt_keys"), "100", ""))

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
		got := jwtGet(t, siteURL+"/", bearer(jwttest.Sign(t, tt.method, tt.key, jwtClaims(jwt.MapClaims{"sub": alg}))))
		if got.key != "user:"+alg {
			t.Errorf("%s: key %q, want user:%s", alg, got.key, alg)
		}
	}
	// No secret is configured, so no HMAC token verifies.
	if got := jwtGet(t, siteURL+"/", bearer(jwtHS256(t, jwt.MapClaims{"sub": "hs"}))); !strings.HasPrefix(got.key, "ip:") {
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
			t.Setenv(jwtSecretEnv, jwtSecret)
			startCaddy(t, jwtSite(fmt.Sprintf("from %s\n\t\t\tsecret {env.%s}", tt.from, jwtSecretEnv), jwtZone("jwt_sources"), "100", ""))
			if got := jwtGet(t, tt.url, tt.headers...); got.key != "user:alice" {
				t.Fatalf("key %q, want user:alice", got.key)
			}
			// The default place, the Authorization header, is not read.
			if got := jwtGet(t, siteURL+"/", bearer(token)); !strings.HasPrefix(got.key, "ip:") {
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
	t.Setenv(jwtSecretEnv, jwtSecret)
	startCaddy(t, fmt.Sprintf(`
`+siteAddr+` {
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

	_, body := do(t, http.MethodGet, siteURL+"/proxy", bearer(token))
	if body != "user=alice org=42" {
		t.Fatalf("proxied: %q", body)
	}
	_, body = do(t, http.MethodGet, siteURL+"/proxy")
	if body != "user= org=" {
		t.Fatalf("proxied without token: %q", body)
	}
	// Big integers keep their digits, other numbers lose their exponent,
	// arrays, objects and missing claims are empty.
	got := jwtGet(t, siteURL+"/", bearer(token))
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
	t.Setenv(jwtSecretEnv, jwtSecret)
	startCaddy(t, jwtSite("secret {env."+jwtSecretEnv+"}", jwtZone("jwt_quota"), "{jwt.quota} 600", ""))

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
		got := jwtGet(t, siteURL+"/", bearer(jwtRawHS256(payload)))
		if got.status != http.StatusOK || got.limit != tt.limit || got.key != fmt.Sprintf("user:quota-%d", i) {
			t.Errorf("%s (quota %s): %+v, want limit %s", tt.name, tt.quota, got, tt.limit)
		}
	}

	forged := jwttest.Sign(t, jwt.SigningMethodHS256, []byte("not the secret, but 32 bytes long"), jwt.MapClaims{"sub": "quota-forged", "quota": 100000})
	if got := jwtGet(t, siteURL+"/", bearer(forged)); got.limit != "600" || !strings.HasPrefix(got.key, "ip:") {
		t.Fatalf("forged quota: %+v, want the default 600 in the IP's bucket", got)
	}
	if got := jwtGet(t, siteURL+"/"); got.limit != "600" {
		t.Fatalf("no token: limit %s, want 600", got.limit)
	}

	// The quota is enforced.
	small := jwtRawHS256(`{"sub":"quota-small","quota":2}`)
	for i, want := range []int{200, 200, 429} {
		if got := jwtGet(t, siteURL+"/", bearer(small)); got.status != want {
			t.Fatalf("quota 2, request %d: status %d, want %d", i+1, got.status, want)
		}
	}
}

var jwtTierSite = `
` + siteAddr + ` {
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

	t.Setenv(jwtSecretEnv, jwtSecret)
	startCaddy(t, site)
	tests := []struct {
		name, token, limit string
	}{
		{"free", jwtHS256(t, jwt.MapClaims{"sub": "tier-free", "tier": "free"}), "100"},
		{"pro", jwtHS256(t, jwt.MapClaims{"sub": "tier-pro", "tier": "pro"}), "1000"},
		{"unknown tier", jwtHS256(t, jwt.MapClaims{"sub": "tier-gold", "tier": "gold"}), "10"},
		{"no tier claim", jwtHS256(t, jwt.MapClaims{"sub": "tier-none"}), "10"},
		{"forged pro", jwttest.Sign(t, jwt.SigningMethodHS256, []byte("not the secret, but 32 bytes long"), jwtClaims(jwt.MapClaims{"sub": "tier-forged", "tier": "pro"})), "10"},
		{"no token", "", "10"},
	}
	for _, tt := range tests {
		var hdr []string
		if tt.token != "" {
			hdr = append(hdr, bearer(tt.token))
		}
		if got := jwtGet(t, siteURL+"/", hdr...); got.limit != tt.limit {
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
// that, as in docs/jwt.md (40/s and 120/s there; 4 and 12 per minute here,
// so timing cannot make the test flaky). A customer's keys together stop
// at the customer limit; another customer is unaffected.
func TestJWTCustomerWideLimit(t *testing.T) {
	t.Setenv(jwtSecretEnv, jwtSecret)
	startCaddy(t, fmt.Sprintf(`
`+siteAddr+` {
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
		return jwtGet(t, siteURL+"/", "X-Api-Key: "+apiKey, token).status
	}
	// Key A takes its 4; its 5th is rejected by per_key and costs the
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
	t.Setenv(jwtSecretEnv, jwtSecret)
	startCaddy(t, withGlobals("servers {\n\t\tmax_header_size 4MB\n\t}")+jwtUserSite(t, jwtZone("jwt_hostile"), "1000"))
	base := jwtGet(t, siteURL+"/")
	sent := 0
	for name, auth := range jwttest.HostileAuthorizations() {
		start := time.Now()
		got := jwtGet(t, siteURL+"/", "Authorization: "+auth)
		took := time.Since(start)
		sent++
		t.Logf("%s (%d bytes): round trip %v", name, len(auth), took)
		if got.status != http.StatusOK || got.key != base.key || got.used != base.used+sent {
			t.Errorf("%s: %+v, want 200 in the IP's bucket", name, got)
		}
	}
}

// TestJWTConfigRefusedAtLoad: bad jwt blocks are refused by /load with a
// message naming the problem; a short secret loads (with a warning).
func TestJWTConfigRefusedAtLoad(t *testing.T) {
	t.Setenv(jwtSecretEnv, jwtSecret)
	t.Setenv("RL_TEST_JWT_SHORT", "short")
	garbage := jwttest.WriteFile(t, "key.pem", []byte("not a PEM file"))
	missing := filepath.Join(t.TempDir(), "missing.pem")
	site := func(jwtBlock string) string {
		return fmt.Sprintf(`
`+siteAddr+` {
	rate_limit {
		jwt {
			%s
		}
		zone %s {
			key user:{jwt.sub}
			limit 10
			window 1h
		}
	}
	respond "ok"
}
`, jwtBlock, jwtZone("jwt_load"))
	}
	tests := []struct {
		name, block, want string
	}{
		{"no key", "issuer x", "jwt: no key"},
		{"missing PEM file", "public_key " + missing, "public_key: want a readable PEM file with a public key, got \\\"" + missing},
		{"unparsable PEM", "public_key " + garbage, "no PEM block found"},
		{"algorithm without a key", "secret {env." + jwtSecretEnv + "}\n algorithms HS256 ES256", "no configured key can verify ES256"},
		{"none", "secret {env." + jwtSecretEnv + "}\n algorithms none", "never accepted"},
		{"unset secret variable", "secret {env.RL_TEST_JWT_UNSET}", "resolves to an empty string"},
		{"unknown subdirective", "secret x\n kid 1", `unknown subdirective \"kid\"`},
	}
	// The refusals go to a running Caddy's /load, as an operator's would.
	startCaddy(t, siteAddr+" {\n\trespond \"before\"\n}\n")
	for _, tt := range tests {
		code, body := reload(t, site(tt.block))
		if code == http.StatusOK || !strings.Contains(body, tt.want) {
			t.Errorf("%s: /load answered %d %s; want a refusal containing %q", tt.name, code, body, tt.want)
		}
	}
	if code, body := reload(t, site("secret {env.RL_TEST_JWT_SHORT}")); code != http.StatusOK {
		t.Fatalf("short secret refused: %d %s", code, body)
	}
}

// TestJWTJSONConfig: the jwt block in JSON.
func TestJWTJSONConfig(t *testing.T) {
	t.Setenv(jwtSecretEnv, jwtSecret)
	zone := jwtZone("jwt_json")
	startCaddy(t, fmt.Sprintf(`{
	"apps": {"http": {"http_port": `+fmt.Sprint(sitePort)+`, "servers": {"srv": {
		"listen": ["`+siteListen+`"],
		"routes": [{"handle": [
			{
				"handler": "rate_limit",
				"jwt": {
					"from": {"header": "X-Token"},
					"secret": "{env.%s}",
					"public_keys": [%q],
					"algorithms": ["HS256", "ES256"],
					"issuer": %q,
					"audience": ["api"],
					"leeway": "30s"
				},
				"zones": [{
					"name": %q,
					"key": ["user:{jwt.sub}", "ip:{http.vars.client_ip}"],
					"limit": ["{jwt.quota}", 600],
					"window": "1h"
				}]
			},
			{"handler": "static_response", "body": "{http.rate_limit.key}|"}
		]}]
	}}}}
}`, jwtSecretEnv, jwttest.WriteFile(t, "key.pem", jwttest.PublicPEM(&jwtKeys().EC256.PublicKey)), jwtIssuer, zone))
	now := time.Now().Unix()
	tests := []struct {
		name, token, key, limit string
	}{
		{"HS256", jwtHS256(t, jwt.MapClaims{"sub": "json-hs", "quota": 7}), "user:json-hs", "7"},
		{"ES256", jwttest.Sign(t, jwt.SigningMethodES256, jwtKeys().EC256, jwtClaims(jwt.MapClaims{"sub": "json-es"})), "user:json-es", "600"},
		{"expired within leeway", jwtHS256(t, jwt.MapClaims{"sub": "json-late", "exp": now - 10}), "user:json-late", "600"},
		{"HS384 not listed", jwttest.Sign(t, jwt.SigningMethodHS384, []byte(jwtSecret), jwtClaims(jwt.MapClaims{"sub": "json-384"})), "ip:", "600"},
	}
	for _, tt := range tests {
		got := jwtGet(t, siteURL+"/", "X-Token: "+tt.token)
		if !strings.HasPrefix(got.key, tt.key) || got.limit != tt.limit {
			t.Errorf("%s: %+v, want key %q limit %s", tt.name, got, tt.key, tt.limit)
		}
	}
}

// TestJWTReloadDropsOldKey: after a reload with another secret, a token
// signed with the old one no longer verifies, even though it was cached.
func TestJWTReloadDropsOldKey(t *testing.T) {
	t.Setenv("RL_TEST_JWT_NEW_SECRET", "a brand new secret of 32 bytes..")
	zone := jwtZone("jwt_reload")
	site := func(secretVar string) string { return jwtSite("secret {env."+secretVar+"}", zone, "100", "") }
	t.Setenv(jwtSecretEnv, jwtSecret)
	startCaddy(t, site(jwtSecretEnv))
	token := jwtHS256(t, jwt.MapClaims{"sub": "alice"})
	for range 2 { // the second is served from the cache
		if got := jwtGet(t, siteURL+"/", bearer(token)); got.key != "user:alice" {
			t.Fatalf("before reload: key %q", got.key)
		}
	}
	if code, body := reload(t, site("RL_TEST_JWT_NEW_SECRET")); code != http.StatusOK {
		t.Fatalf("reload: %d %s", code, body)
	}
	if got := jwtGet(t, siteURL+"/", bearer(token)); !strings.HasPrefix(got.key, "ip:") {
		t.Fatalf("after reload with a new secret: key %q, want the IP", got.key)
	}
}

// TestJWTFirstHandlerAnswers: with two rate_limit handlers with jwt blocks
// in one route, {jwt.*} comes from the first, for both.
func TestJWTFirstHandlerAnswers(t *testing.T) {
	t.Setenv("RL_TEST_JWT_SECOND_SECRET", "the second handler's secret, 32B")
	t.Setenv(jwtSecretEnv, jwtSecret)
	startCaddy(t, fmt.Sprintf(`
`+siteAddr+` {
	route {
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
		rate_limit {
			jwt {
				secret {env.RL_TEST_JWT_SECOND_SECRET}
			}
			zone %s {
				key user:{jwt.sub} ip:{client_ip}
				limit 100
				window 1h
			}
		}
		respond "{http.rate_limit.key}|{jwt.sub}"
	}
}
`, jwtSecretEnv, jwtZone("jwt_first"), jwtZone("jwt_second")))
	first := jwtHS256(t, jwt.MapClaims{"sub": "alice"})
	second := jwttest.Sign(t, jwt.SigningMethodHS256, []byte("the second handler's secret, 32B"), jwtClaims(jwt.MapClaims{"sub": "bob"}))
	// {http.rate_limit.key} is the second handler's key: it runs last.
	if got := jwtGet(t, siteURL+"/", bearer(first)); got.body != "user:alice|alice" {
		t.Fatalf("first handler's token: %q", got.body)
	}
	if got := jwtGet(t, siteURL+"/", bearer(second)); !strings.HasPrefix(got.body, "ip:") || !strings.HasSuffix(got.body, "|") {
		t.Fatalf("second handler's token: %q, want the IP and no {jwt.sub}", got.body)
	}
}
