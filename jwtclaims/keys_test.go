package jwtclaims

import (
	"testing"

	"github.com/d61b427a/caddy-rate-limit/internal/clocktest"
	"github.com/d61b427a/caddy-rate-limit/internal/jwttest"
)

// testSecret is 32 bytes, the shortest secret accepted without a warning.
const testSecret = "0123456789abcdef0123456789abcdef"

// keys are the test signing keys, shared with the root package's tests.
var keys = jwttest.Generate

// publicPEM encodes a public key as a PKIX "PUBLIC KEY" block.
var publicPEM = jwttest.PublicPEM

// provisioned returns cfg provisioned on clk, failing the test if it is
// refused.
func provisioned(t testing.TB, cfg *Config, clk *clocktest.Clock) *Config {
	t.Helper()
	if clk != nil {
		cfg.now = clk.Now
	}
	if err := cfg.Provision(nil); err != nil {
		t.Fatalf("Provision: %v", err)
	}
	return cfg
}
