package jwtclaims

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// testSecret is 32 bytes, the shortest secret accepted without a warning.
const testSecret = "0123456789abcdef0123456789abcdef"

// testKeys are generated once per test binary: RSA generation is slow.
type testKeys struct {
	rsa, rsaOther   *rsa.PrivateKey
	ec256, ec384    *ecdsa.PrivateKey
	ed, edOther     ed25519.PrivateKey
	ec256Other      *ecdsa.PrivateKey
	rsaPublicKeyPEM []byte
}

var keys = sync.OnceValue(func() *testKeys {
	k := new(testKeys)
	var err error
	if k.rsa, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
		panic(err)
	}
	if k.rsaOther, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
		panic(err)
	}
	if k.ec256, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		panic(err)
	}
	if k.ec256Other, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		panic(err)
	}
	if k.ec384, err = ecdsa.GenerateKey(elliptic.P384(), rand.Reader); err != nil {
		panic(err)
	}
	if _, k.ed, err = ed25519.GenerateKey(rand.Reader); err != nil {
		panic(err)
	}
	if _, k.edOther, err = ed25519.GenerateKey(rand.Reader); err != nil {
		panic(err)
	}
	k.rsaPublicKeyPEM = publicPEM(&k.rsa.PublicKey)
	return k
})

// publicPEM encodes a public key as a PKIX "PUBLIC KEY" block.
func publicPEM(pub any) []byte {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		panic(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

// writeFile writes data into a file in a temporary directory and returns
// its path.
func writeFile(t testing.TB, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// sign mints a token.
func sign(t testing.TB, method jwt.SigningMethod, key any, claims jwt.MapClaims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(method, claims).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// clock is a settable time for tests.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// provisioned returns cfg provisioned on clk, failing the test if it is
// refused.
func provisioned(t testing.TB, cfg *Config, clk *clock) *Config {
	t.Helper()
	if clk != nil {
		cfg.now = clk.now
	}
	if err := cfg.Provision(nil); err != nil {
		t.Fatalf("Provision: %v", err)
	}
	return cfg
}
