package ratelimit

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/d61b427a/caddy-rate-limit/internal/jwttest"
	"github.com/golang-jwt/jwt/v5"
)

// TestJWTConfigRefusedAtLoad: bad jwt blocks are refused by /load with a
// message naming the problem; a short secret loads (with a warning).
func TestJWTConfigRefusedAtLoad(t *testing.T) {
	t.Setenv(jwtSecretEnv, jwtSecret)
	t.Setenv("RL_TEST_JWT_SHORT", "short")
	garbage := jwtKeyFile(t, []byte("not a PEM file"))
	missing := filepath.Join(t.TempDir(), "missing.pem")
	site := func(jwtBlock string) string {
		return fmt.Sprintf(`
:9080 {
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
	startCaddy(t, ":9080 {\n\trespond \"before\"\n}\n")
	for _, tt := range tests {
		code, body := loadConfig(t, site(tt.block))
		if code == http.StatusOK || !strings.Contains(body, tt.want) {
			t.Errorf("%s: /load answered %d %s; want a refusal containing %q", tt.name, code, body, tt.want)
		}
	}
	if code, body := loadConfig(t, site("secret {env.RL_TEST_JWT_SHORT}")); code != http.StatusOK {
		t.Fatalf("short secret refused: %d %s", code, body)
	}
}

// TestJWTJSONConfig: the jwt block in JSON.
func TestJWTJSONConfig(t *testing.T) {
	t.Setenv(jwtSecretEnv, jwtSecret)
	zone := jwtZone("jwt_json")
	tc := caddytest.NewTester(t)
	tc.InitServer(fmt.Sprintf(`{
	"admin": {"listen": "localhost:2999"},
	"apps": {"http": {"http_port": 9080, "servers": {"srv": {
		"listen": [":9080"],
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
}`, jwtSecretEnv, jwtKeyFile(t, jwttest.PublicPEM(&jwtKeys().EC256.PublicKey)), jwtIssuer, zone), "json")
	if t.Failed() {
		t.FailNow()
	}
	now := time.Now().Unix()
	tests := []struct {
		name, token, key, limit string
	}{
		{"HS256", jwtHS256(t, jwt.MapClaims{"sub": "json-hs", "quota": 7}), "user:json-hs", "7"},
		{"ES256", jwtSign(t, jwt.SigningMethodES256, jwtKeys().EC256, jwtClaims(jwt.MapClaims{"sub": "json-es"})), "user:json-es", "600"},
		{"expired within leeway", jwtHS256(t, jwt.MapClaims{"sub": "json-late", "exp": now - 10}), "user:json-late", "600"},
		{"HS384 not listed", jwtSign(t, jwt.SigningMethodHS384, []byte(jwtSecret), jwtClaims(jwt.MapClaims{"sub": "json-384"})), "ip:", "600"},
	}
	for _, tt := range tests {
		got := jwtGet(t, tc, siteURL+"/", "X-Token: "+tt.token)
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
	site := func(secretVar string) string {
		return fmt.Sprintf(`
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
	respond "{http.rate_limit.key}|"
}
`, secretVar, zone)
	}
	tc := startJWTCaddy(t, "", site(jwtSecretEnv))
	token := jwtHS256(t, jwt.MapClaims{"sub": "alice"})
	for range 2 { // the second is served from the cache
		if got := jwtGet(t, tc, siteURL+"/", bearer(token)); got.key != "user:alice" {
			t.Fatalf("before reload: key %q", got.key)
		}
	}
	if code, body := loadConfig(t, site("RL_TEST_JWT_NEW_SECRET")); code != http.StatusOK {
		t.Fatalf("reload: %d %s", code, body)
	}
	if got := jwtGet(t, tc, siteURL+"/", bearer(token)); !strings.HasPrefix(got.key, "ip:") {
		t.Fatalf("after reload with a new secret: key %q, want the IP", got.key)
	}
}

// TestJWTFirstHandlerAnswers: with two rate_limit handlers with jwt blocks
// in one route, {jwt.*} comes from the first, for both.
func TestJWTFirstHandlerAnswers(t *testing.T) {
	t.Setenv("RL_TEST_JWT_SECOND_SECRET", "the second handler's secret, 32B")
	tc := startJWTCaddy(t, "", fmt.Sprintf(`
:9080 {
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
	second := jwtSign(t, jwt.SigningMethodHS256, []byte("the second handler's secret, 32B"), jwtClaims(jwt.MapClaims{"sub": "bob"}))
	// {http.rate_limit.key} is the second handler's key: it runs last.
	if got := jwtGet(t, tc, siteURL+"/", bearer(first)); got.body != "user:alice|alice" {
		t.Fatalf("first handler's token: %q", got.body)
	}
	if got := jwtGet(t, tc, siteURL+"/", bearer(second)); !strings.HasPrefix(got.body, "ip:") || !strings.HasSuffix(got.body, "|") {
		t.Fatalf("second handler's token: %q, want the IP and no {jwt.sub}", got.body)
	}
}
