// Package jwttest holds what the JWT tests of several packages share: the
// signing keys, generated once per test binary because RSA key generation
// is slow; token minting and key files; forged tokens; and Authorization
// headers built to be hostile to a token parser.
package jwttest

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"maps"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/golang-jwt/jwt/v5"
)

// Keys are private keys of every type the jwt block verifies, two of some
// so a test can sign with a key the config does not trust.
type Keys struct {
	RSA, RSAOther     *rsa.PrivateKey
	EC256, EC256Other *ecdsa.PrivateKey
	EC384             *ecdsa.PrivateKey
	Ed, EdOther       ed25519.PrivateKey
	// RSAPublicPEM is RSA's public key as PEM.
	RSAPublicPEM []byte
}

// Generate returns the keys, the same ones on every call.
var Generate = sync.OnceValue(func() *Keys {
	k := new(Keys)
	var err error
	for _, p := range []**rsa.PrivateKey{&k.RSA, &k.RSAOther} {
		if *p, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			panic(err)
		}
	}
	for _, p := range []struct {
		key   **ecdsa.PrivateKey
		curve elliptic.Curve
	}{{&k.EC256, elliptic.P256()}, {&k.EC256Other, elliptic.P256()}, {&k.EC384, elliptic.P384()}} {
		if *p.key, err = ecdsa.GenerateKey(p.curve, rand.Reader); err != nil {
			panic(err)
		}
	}
	for _, p := range []*ed25519.PrivateKey{&k.Ed, &k.EdOther} {
		if _, *p, err = ed25519.GenerateKey(rand.Reader); err != nil {
			panic(err)
		}
	}
	k.RSAPublicPEM = PublicPEM(&k.RSA.PublicKey)
	return k
})

// PublicPEM encodes a public key as a PKIX "PUBLIC KEY" block.
func PublicPEM(pub any) []byte {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		panic(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

// Sign mints a token: claims signed with key by method. A method and key
// that do not go together fail tb.
func Sign(tb testing.TB, method jwt.SigningMethod, key any, claims jwt.MapClaims) string {
	tb.Helper()
	s, err := jwt.NewWithClaims(method, claims).SignedString(key)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// Claims returns base with extra's claims added, or removed where extra
// holds nil: claims that pass a test config's checks, changed as a case
// needs.
func Claims(base, extra jwt.MapClaims) jwt.MapClaims {
	for k, v := range extra {
		if v == nil {
			delete(base, k)
		} else {
			base[k] = v
		}
	}
	return base
}

// WriteFile writes data, readable by its owner only, to a file called
// name in a new temporary directory of tb's, and returns the file's path.
func WriteFile(tb testing.TB, name string, data []byte) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		tb.Fatal(err)
	}
	return path
}

// HostileAuthorizations returns Authorization header values, by name, each
// built to make a token parser slow or crash: a megabyte of token, ten
// thousand dots, parts that are not base64, and claims nested deep enough
// to exhaust a recursive JSON decoder, both over and under a size cap of
// 8 KiB.
func HostileAuthorizations() map[string]string {
	b64 := base64.RawURLEncoding.EncodeToString
	header := b64([]byte(`{"alg":"HS256","typ":"JWT"}`))
	deep := func(n int) string {
		return b64([]byte(strings.Repeat(`{"a":`, n) + "1" + strings.Repeat("}", n)))
	}
	return map[string]string{
		"1 MB":                             "Bearer " + strings.Repeat("A", 1<<20),
		"10,000 dots":                      "Bearer " + strings.Repeat(".", 10000),
		"invalid base64":                   "Bearer " + strings.Repeat("!", 3000) + "." + strings.Repeat("*", 3000) + ".x",
		"JSON nested 10,000 deep":          "Bearer " + header + "." + deep(10000) + ".c2ln",
		"JSON nested 1,000 deep (in 8KiB)": "Bearer " + header + "." + deep(1000) + ".c2ln",
		"arrays nested 4,000 deep":         "Bearer " + header + "." + b64([]byte(strings.Repeat("[", 4000))) + ".c2ln",
	}
}

// A Forgery is a token that must yield no claims, named for the attack it
// makes.
type Forgery struct {
	Name, Token string
}

// Forgeries returns tokens made without a key the config trusts, or
// tampered with after signing, or that bend the format, for a config
// that verifies HMAC tokens with secret and RSA tokens with k.RSA's
// public key, and whose checks claims pass: each carries claims (or
// wraps a token that does), and each must yield none. The attacks: alg
// none in other spellings, or missing; alg confusion, with the RSA
// public key as an HMAC secret in other forms and under other HMAC
// algorithms; a signature moved from another token or algorithm, empty,
// padded, or an ECDSA signature of zeros (CVE-2022-21449, "psychic
// signatures"); a key the token carries (jwk, jku, x5u) or names (kid);
// an empty HMAC secret; a token nested in another; a JWE's shape; and
// claims of the wrong type for their checks.
func Forgeries(tb testing.TB, k *Keys, secret []byte, claims jwt.MapClaims) []Forgery {
	tb.Helper()
	with := func(extra jwt.MapClaims) jwt.MapClaims { return Claims(maps.Clone(claims), extra) }
	raw := func(header map[string]any, payload any) string {
		h, err := json.Marshal(header)
		if err != nil {
			tb.Fatal(err)
		}
		p, err := json.Marshal(payload)
		if err != nil {
			tb.Fatal(err)
		}
		return b64(h) + "." + b64(p)
	}
	// hs256 signs an unsigned token's header and payload with key by
	// HMAC-SHA256, as HS256 does, whatever its header says.
	hs256 := func(unsigned string, key []byte) string {
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(unsigned))
		return unsigned + "." + b64(mac.Sum(nil))
	}
	signWith := func(method jwt.SigningMethod, key any, header map[string]any) string {
		t := jwt.NewWithClaims(method, with(nil))
		maps.Copy(t.Header, header)
		s, err := t.SignedString(key)
		if err != nil {
			tb.Fatal(err)
		}
		return s
	}
	swapSignature := func(token, from string) string {
		return token[:strings.LastIndexByte(token, '.')] + from[strings.LastIndexByte(from, '.'):]
	}
	swapHeader := func(token string, header map[string]any) string {
		h, err := json.Marshal(header)
		if err != nil {
			tb.Fatal(err)
		}
		return b64(h) + token[strings.IndexByte(token, '.'):]
	}

	valid := Sign(tb, jwt.SigningMethodHS256, secret, with(nil))
	rs256 := Sign(tb, jwt.SigningMethodRS256, k.RSA, with(nil))
	der, err := x509.MarshalPKIXPublicKey(&k.RSA.PublicKey)
	if err != nil {
		tb.Fatal(err)
	}
	attacker := map[string]any{"kty": "RSA", "n": b64(k.RSAOther.N.Bytes()), "e": b64(big.NewInt(int64(k.RSAOther.E)).Bytes())}
	return []Forgery{
		{"alg None", raw(map[string]any{"alg": "None", "typ": "JWT"}, with(nil)) + "."},
		{"alg NONE", raw(map[string]any{"alg": "NONE", "typ": "JWT"}, with(nil)) + "."},
		{"alg none with a valid token's signature", swapHeader(valid, map[string]any{"alg": "none", "typ": "JWT"})},
		{"alg missing, HMAC-signed with the secret", hs256(raw(map[string]any{"typ": "JWT"}, with(nil)), secret)},
		{"alg empty, HMAC-signed with the secret", hs256(raw(map[string]any{"alg": "", "typ": "JWT"}, with(nil)), secret)},
		{"alg confusion: HS384 with the RSA public key PEM", Sign(tb, jwt.SigningMethodHS384, k.RSAPublicPEM, with(nil))},
		{"alg confusion: HS512 with the RSA public key PEM", Sign(tb, jwt.SigningMethodHS512, k.RSAPublicPEM, with(nil))},
		{"alg confusion: HS256 with the RSA public key DER", Sign(tb, jwt.SigningMethodHS256, der, with(nil))},
		{"alg confusion: HS256 with the RSA public key PEM, trimmed", Sign(tb, jwt.SigningMethodHS256, []byte(strings.TrimSpace(string(k.RSAPublicPEM))), with(nil))},
		{"RS256 signature under alg HS256", swapHeader(rs256, map[string]any{"alg": "HS256", "typ": "JWT"})},
		{"RS256 signature under alg PS256", swapHeader(rs256, map[string]any{"alg": "PS256", "typ": "JWT"})},
		{"HS256 signature under alg HS512", swapHeader(valid, map[string]any{"alg": "HS512", "typ": "JWT"})},
		{"another token's signature", swapSignature(valid, Sign(tb, jwt.SigningMethodHS256, secret, with(jwt.MapClaims{"sub": "someone-else"})))},
		{"empty signature", swapSignature(valid, ".")},
		{"signature padded", valid + "="},
		{"ECDSA signature of zeros (psychic signature)", raw(map[string]any{"alg": "ES256", "typ": "JWT"}, with(nil)) + "." + b64(make([]byte, 64))},
		{"an attacker's key in the header (jwk)", signWith(jwt.SigningMethodRS256, k.RSAOther, map[string]any{"jwk": attacker})},
		{"an attacker's key set named in the header (jku)", signWith(jwt.SigningMethodRS256, k.RSAOther, map[string]any{"jku": "http://127.0.0.1:9/jwks.json", "kid": "attacker"})},
		{"an attacker's certificate named in the header (x5u)", signWith(jwt.SigningMethodRS256, k.RSAOther, map[string]any{"x5u": "http://127.0.0.1:9/cert.pem"})},
		{"kid naming an empty file, HMAC-signed with no secret", hs256(raw(map[string]any{"alg": "HS256", "typ": "JWT", "kid": "../../../../../../dev/null"}, with(nil)), nil)},
		{"HMAC-signed with an empty secret", hs256(raw(map[string]any{"alg": "HS256", "typ": "JWT"}, with(nil)), nil)},
		{"a valid token nested in an unsigned one", raw(map[string]any{"alg": "none", "cty": "JWT"}, valid) + "."},
		{"a valid token nested in one signed with another secret", hs256(raw(map[string]any{"alg": "HS256", "cty": "JWT"}, valid), []byte("another secret, also 32 bytes..."))},
		{"the shape of a JWE (five parts)", valid + "..x.y"},
		{"exp not a number", Sign(tb, jwt.SigningMethodHS256, secret, with(jwt.MapClaims{"exp": "9999999999"}))},
		{"nbf not a number", Sign(tb, jwt.SigningMethodHS256, secret, with(jwt.MapClaims{"nbf": "0"}))},
		{"iss a list", Sign(tb, jwt.SigningMethodHS256, secret, with(jwt.MapClaims{"iss": []any{claims["iss"], "https://evil.example.com"}}))},
		{"aud an object", Sign(tb, jwt.SigningMethodHS256, secret, with(jwt.MapClaims{"aud": map[string]any{"aud": claims["aud"]}}))},
		{"claims a list", hs256(raw(map[string]any{"alg": "HS256", "typ": "JWT"}, []any{with(nil)}), secret)},
	}
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }
