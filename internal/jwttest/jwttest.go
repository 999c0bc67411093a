// Package jwttest holds what the JWT tests of several packages share: the
// signing keys, generated once per test binary because RSA key generation
// is slow; token minting and key files; and Authorization headers built to
// be hostile to a token parser.
package jwttest

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
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
