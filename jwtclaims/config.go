// Package jwtclaims makes the claims of a verified JSON Web Token available
// to Caddy placeholders as {jwt.<claim>}, so that a rate limit can key on
// the user rather than the client's address and take a per-user quota from
// the token.
//
// Only a token whose signature verifies against a configured key, with an
// allowed algorithm, and whose time, issuer and audience checks pass yields
// claims. Any other token yields none: every {jwt.*} placeholder is empty,
// so a key template that uses one falls back to the next alternative.
// Parsing and verification are github.com/golang-jwt/jwt/v5's.
package jwtclaims

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/golang-jwt/jwt/v5"
	"go.uber.org/zap"
)

// Config says where a request's token is and how to verify it.
type Config struct {
	// Where the token is. Default: the Authorization header, with the
	// Bearer scheme.
	From *TokenSource `json:"from,omitempty"`

	// The HMAC secret that verifies HS256, HS384 and HS512 tokens, as
	// bytes. Global placeholders such as {env.JWT_SECRET} or
	// {file./etc/caddy/jwt.secret} are resolved when the config loads.
	// A secret shorter than 32 bytes is accepted with a warning.
	Secret string `json:"secret,omitempty"`

	// PEM files holding the public keys that verify RS*, PS*, ES* and
	// EdDSA tokens: RSA, ECDSA (P-256, P-384, P-521) or Ed25519 keys, as
	// "PUBLIC KEY", "RSA PUBLIC KEY" or "CERTIFICATE" blocks. Every block
	// of every file is a key; a token verifies if any key of its
	// algorithm accepts it.
	PublicKeys []string `json:"public_keys,omitempty"`

	// The signature algorithms accepted (e.g. "RS256", "ES256", "HS256",
	// "EdDSA"). Default: every algorithm the configured keys can verify.
	// Each one listed needs a key that can verify it. "none" is never
	// accepted.
	Algorithms []string `json:"algorithms,omitempty"`

	// If set, the token's "iss" claim must equal it.
	Issuer string `json:"issuer,omitempty"`

	// If set, the token's "aud" claim must contain one of these.
	Audience []string `json:"audience,omitempty"`

	// Clock skew tolerated when checking "exp" and "nbf". Default: 0.
	Leeway caddy.Duration `json:"leeway,omitempty"`

	parser *jwt.Parser
	// keys holds, for each accepted algorithm, the key or the
	// jwt.VerificationKeySet that verifies it.
	keys   map[string]any
	cache  *tokenCache
	logger *zap.Logger
	// now is the clock, replaceable in tests.
	now func() time.Time
	// cacheSize bounds the verified-token cache; 0 before Provision
	// means DefaultCacheSize, a negative value turns the cache off.
	cacheSize int
	// verifications counts tokens handed to the parser, for tests.
	verifications atomic.Uint64
}

// TokenSource names where the token is: exactly one of a header, a cookie
// or a query parameter.
type TokenSource struct {
	// A request header. In the Authorization header the token must use
	// the Bearer scheme; in other headers a "Bearer " prefix is optional.
	Header string `json:"header,omitempty"`

	// A cookie.
	Cookie string `json:"cookie,omitempty"`

	// A query string parameter.
	Query string `json:"query,omitempty"`
}

// DefaultHeader is where the token is looked for by default.
const DefaultHeader = "Authorization"

// minSecretLen is the HMAC secret length below which a warning is logged:
// RFC 7518, section 3.2, asks for a key at least as long as the hash output.
const minSecretLen = 32

// minRSABits refuses RSA keys that crypto/rsa would refuse at every
// verification anyway, so the mistake shows at load instead of as tokens
// that silently never verify.
const minRSABits = 1024

// Algorithm families, by the key that verifies them.
var (
	hmacAlgorithms  = []string{"HS256", "HS384", "HS512"}
	rsaAlgorithms   = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"}
	ecdsaAlgorithms = map[string]string{"P-256": "ES256", "P-384": "ES384", "P-521": "ES512"}
	eddsaAlgorithms = []string{"EdDSA"}
)

// checkAlgorithm refuses "none" and names jwt does not know.
func checkAlgorithm(alg string) error {
	if strings.EqualFold(alg, "none") {
		return errors.New(`"none" is never accepted: tokens must be signed`)
	}
	if slices.Contains(hmacAlgorithms, alg) || slices.Contains(rsaAlgorithms, alg) ||
		slices.Contains(eddsaAlgorithms, alg) || alg == "ES256" || alg == "ES384" || alg == "ES512" {
		return nil
	}
	return fmt.Errorf("unknown algorithm %q (want HS256, HS384, HS512, RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, ES512 or EdDSA)", alg)
}

// check refuses a source that names none or several places.
func (s *TokenSource) check() error {
	n := 0
	for _, v := range []string{s.Header, s.Cookie, s.Query} {
		if v != "" {
			n++
		}
	}
	if n != 1 {
		return errors.New("from: set exactly one of header, cookie or query")
	}
	return nil
}

// Provision loads the keys and builds the verifier. It refuses a config
// without a key, with a key file that cannot be read or parsed, or with an
// algorithm no configured key can verify.
func (c *Config) Provision(logger *zap.Logger) error {
	if logger == nil {
		logger = zap.NewNop()
	}
	c.logger = logger
	if c.now == nil {
		c.now = time.Now
	}
	if c.From == nil {
		c.From = &TokenSource{Header: DefaultHeader}
	}
	if err := c.From.check(); err != nil {
		return err
	}
	if c.Leeway < 0 {
		return fmt.Errorf("leeway: want a duration of 0 or more, got %s", time.Duration(c.Leeway))
	}

	repl := caddy.NewReplacer()
	keys := make(map[string][]any)
	if c.Secret != "" {
		secret := repl.ReplaceKnown(c.Secret, "")
		if secret == "" {
			// Name the template, never the value.
			return fmt.Errorf("secret: %q resolves to an empty string (is the variable set?)", c.Secret)
		}
		if len(secret) < minSecretLen {
			logger.Warn("jwt secret is shorter than 32 bytes; HMAC tokens are easier to forge by guessing the secret",
				zap.Int("length", len(secret)))
		}
		for _, alg := range hmacAlgorithms {
			keys[alg] = append(keys[alg], []byte(secret))
		}
	}
	for _, name := range c.PublicKeys {
		file := repl.ReplaceKnown(name, "")
		fileKeys, err := readPublicKeys(file)
		if err != nil {
			return fmt.Errorf("public_key: want a readable PEM file with a public key, got %q: %w", file, err)
		}
		for _, k := range fileKeys {
			algs, err := algorithmsFor(k)
			if err != nil {
				return fmt.Errorf("public_key %q: %w", file, err)
			}
			for _, alg := range algs {
				keys[alg] = append(keys[alg], k)
			}
		}
	}
	if len(keys) == 0 {
		return errors.New("no key: want secret or public_key")
	}

	algs := c.Algorithms
	if len(algs) == 0 {
		for alg := range keys {
			algs = append(algs, alg)
		}
		slices.Sort(algs)
	}
	c.keys = make(map[string]any, len(algs))
	for _, alg := range algs {
		if err := checkAlgorithm(alg); err != nil {
			return fmt.Errorf("algorithms: %w", err)
		}
		ks := keys[alg]
		switch len(ks) {
		case 0:
			return fmt.Errorf("algorithms: no configured key can verify %s (%s)", alg, keyNeeded(alg))
		case 1:
			c.keys[alg] = ks[0]
		default:
			set := jwt.VerificationKeySet{}
			for _, k := range ks {
				set.Keys = append(set.Keys, k)
			}
			c.keys[alg] = set
		}
	}

	opts := []jwt.ParserOption{
		jwt.WithValidMethods(algs),
		jwt.WithJSONNumber(),
		// Refuse non-zero padding bits, so one signature has one spelling.
		jwt.WithStrictDecoding(),
		jwt.WithTimeFunc(c.now),
		jwt.WithLeeway(time.Duration(c.Leeway)),
	}
	if c.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(c.Issuer))
	}
	if len(c.Audience) > 0 {
		opts = append(opts, jwt.WithAudience(c.Audience...))
	}
	c.parser = jwt.NewParser(opts...)

	size := c.cacheSize
	if size == 0 {
		size = DefaultCacheSize
	}
	if size > 0 {
		c.cache = newTokenCache(size, DefaultCacheTTL)
	}
	return nil
}

// keyNeeded says which key verifies alg, for error messages.
func keyNeeded(alg string) string {
	switch {
	case strings.HasPrefix(alg, "HS"):
		return "needs secret"
	case strings.HasPrefix(alg, "RS"), strings.HasPrefix(alg, "PS"):
		return "needs an RSA public_key"
	case alg == "EdDSA":
		return "needs an Ed25519 public_key"
	}
	for curve, a := range ecdsaAlgorithms {
		if a == alg {
			return "needs an ECDSA " + curve + " public_key"
		}
	}
	return "no key type verifies it"
}

// readPublicKeys returns every public key in a PEM file.
func readPublicKeys(file string) ([]any, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var keys []any
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		var key any
		switch block.Type {
		case "PUBLIC KEY":
			key, err = x509.ParsePKIXPublicKey(block.Bytes)
		case "RSA PUBLIC KEY":
			key, err = x509.ParsePKCS1PublicKey(block.Bytes)
		case "CERTIFICATE":
			var cert *x509.Certificate
			if cert, err = x509.ParseCertificate(block.Bytes); err == nil {
				key = cert.PublicKey
			}
		default:
			if strings.Contains(block.Type, "PRIVATE KEY") {
				return nil, fmt.Errorf("holds a private key (%s); give the public key only", block.Type)
			}
			return nil, fmt.Errorf("unsupported PEM block %q (want PUBLIC KEY, RSA PUBLIC KEY or CERTIFICATE)", block.Type)
		}
		if err != nil {
			return nil, fmt.Errorf("parsing %s block: %w", block.Type, err)
		}
		keys = append(keys, key)
	}
	if len(keys) == 0 {
		return nil, errors.New("no PEM block found")
	}
	return keys, nil
}

// algorithmsFor returns the algorithms a public key verifies.
func algorithmsFor(key any) ([]string, error) {
	switch k := key.(type) {
	case *rsa.PublicKey:
		if k.N.BitLen() < minRSABits {
			return nil, fmt.Errorf("RSA key of %d bits is too short (at least %d)", k.N.BitLen(), minRSABits)
		}
		return rsaAlgorithms, nil
	case *ecdsa.PublicKey:
		if k.Curve == nil {
			return nil, errors.New("ECDSA key without a curve")
		}
		alg, ok := ecdsaAlgorithms[k.Curve.Params().Name]
		if !ok || (k.Curve != elliptic.P256() && k.Curve != elliptic.P384() && k.Curve != elliptic.P521()) {
			return nil, fmt.Errorf("unsupported ECDSA curve %s (want P-256, P-384 or P-521)", k.Curve.Params().Name)
		}
		return []string{alg}, nil
	case ed25519.PublicKey:
		return eddsaAlgorithms, nil
	}
	return nil, fmt.Errorf("unsupported key type %T (want RSA, ECDSA or Ed25519)", key)
}
