package jwtclaims

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/d61b427a/caddy-rate-limit/internal/jwttest"
)

func TestProvisionRefuses(t *testing.T) {
	k := keys()
	rsaFile := jwttest.WriteFile(t, "rsa.pem", k.RSAPublicPEM)
	ecFile := jwttest.WriteFile(t, "ec.pem", publicPEM(&k.EC256.PublicKey))
	privDER, err := x509.MarshalPKCS8PrivateKey(k.EC256)
	if err != nil {
		t.Fatal(err)
	}
	privFile := jwttest.WriteFile(t, "private.pem", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: privDER}))
	p224, err := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p224File := jwttest.WriteFile(t, "p224.pem", publicPEM(&p224.PublicKey))
	garbage := jwttest.WriteFile(t, "garbage.pem", []byte("this is not PEM"))
	badDER := jwttest.WriteFile(t, "bad.pem", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: []byte("junk")}))
	missing := filepath.Join(t.TempDir(), "missing.pem")
	unreadable := jwttest.WriteFile(t, "unreadable.pem", k.RSAPublicPEM)
	if err := os.Chmod(unreadable, 0); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name string
		cfg  *Config
		want string
	}{
		{"no key", &Config{}, "no key"},
		{"secret from an unset variable", &Config{Secret: "{env.JWTCLAIMS_TEST_UNSET}"}, `secret: "{env.JWTCLAIMS_TEST_UNSET}" resolves to an empty string`},
		{"missing file", &Config{PublicKeys: []string{missing}}, "public_key: want a readable PEM file with a public key, got " + `"` + missing + `"` + ": open"},
		{"not PEM", &Config{PublicKeys: []string{garbage}}, "no PEM block found"},
		{"bad DER", &Config{PublicKeys: []string{badDER}}, "parsing PUBLIC KEY block"},
		{"private key", &Config{PublicKeys: []string{privFile}}, "holds a private key"},
		{"unsupported curve", &Config{PublicKeys: []string{p224File}}, "unsupported ECDSA curve P-224"},
		{"algorithm without key", &Config{Secret: testSecret, Algorithms: []string{"HS256", "ES256"}}, "no configured key can verify ES256 (needs an ECDSA P-256 public_key)"},
		{"RSA algorithm with an EC key", &Config{PublicKeys: []string{ecFile}, Algorithms: []string{"RS256"}}, "no configured key can verify RS256 (needs an RSA public_key)"},
		{"ES384 with a P-256 key", &Config{PublicKeys: []string{ecFile}, Algorithms: []string{"ES384"}}, "needs an ECDSA P-384 public_key"},
		{"HMAC algorithm with only an RSA key", &Config{PublicKeys: []string{rsaFile}, Algorithms: []string{"HS256"}}, "no configured key can verify HS256 (needs secret)"},
		{"none", &Config{Secret: testSecret, Algorithms: []string{"none"}}, `"none" is never accepted`},
		{"unknown algorithm", &Config{Secret: testSecret, Algorithms: []string{"HS1"}}, `unknown algorithm "HS1"`},
		{"two sources", &Config{Secret: testSecret, From: &TokenSource{Header: "X", Cookie: "y"}}, "from: set exactly one"},
		{"empty source", &Config{Secret: testSecret, From: &TokenSource{}}, "from: set exactly one"},
		{"negative leeway", &Config{Secret: testSecret, Leeway: -1}, "leeway: want a duration of 0 or more"},
	}
	if os.Geteuid() != 0 { // root reads any file
		tests = append(tests, struct {
			name string
			cfg  *Config
			want string
		}{"unreadable file", &Config{PublicKeys: []string{unreadable}}, "permission denied"})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Provision(nil)
			if err == nil {
				t.Fatalf("accepted, want an error containing %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestDefaultAlgorithms(t *testing.T) {
	k := keys()
	rsaFile := jwttest.WriteFile(t, "rsa.pem", k.RSAPublicPEM)
	// Several keys in one file, and a certificate-free PKCS #1 block.
	pkcs1 := pem.EncodeToMemory(&pem.Block{Type: "RSA PUBLIC KEY", Bytes: x509.MarshalPKCS1PublicKey(&k.RSAOther.PublicKey)})
	multi := jwttest.WriteFile(t, "multi.pem", slices.Concat(publicPEM(&k.EC256.PublicKey), publicPEM(&k.EC384.PublicKey), publicPEM(k.Ed.Public()), pkcs1))

	tests := []struct {
		name string
		cfg  *Config
		want []string
	}{
		{"secret", &Config{Secret: testSecret}, []string{"HS256", "HS384", "HS512"}},
		{"RSA", &Config{PublicKeys: []string{rsaFile}}, []string{"PS256", "PS384", "PS512", "RS256", "RS384", "RS512"}},
		{"EC, Ed25519 and RSA in one file", &Config{PublicKeys: []string{multi}}, []string{"ES256", "ES384", "EdDSA", "PS256", "PS384", "PS512", "RS256", "RS384", "RS512"}},
		{"explicit list", &Config{Secret: testSecret, PublicKeys: []string{rsaFile}, Algorithms: []string{"RS256"}}, []string{"RS256"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := provisioned(t, tt.cfg, nil)
			var got []string
			for alg := range cfg.keys {
				got = append(got, alg)
			}
			slices.Sort(got)
			if !slices.Equal(got, tt.want) {
				t.Fatalf("algorithms %v, want %v", got, tt.want)
			}
		})
	}
}

func TestSecretFromEnvironment(t *testing.T) {
	t.Setenv("JWTCLAIMS_TEST_SECRET", testSecret)
	cfg := provisioned(t, &Config{Secret: "{env.JWTCLAIMS_TEST_SECRET}"}, nil)
	if got := string(cfg.keys["HS256"].([]byte)); got != testSecret {
		t.Fatalf("secret %q, want the variable's value", got)
	}
}

func TestSecretFromFile(t *testing.T) {
	file := jwttest.WriteFile(t, "jwt.secret", []byte(testSecret+"\n"))
	cfg := provisioned(t, &Config{Secret: "{file." + file + "}"}, nil)
	if got := string(cfg.keys["HS256"].([]byte)); got != testSecret {
		t.Fatalf("secret %q, want the file's content without its newline", got)
	}
}

func TestShortSecretWarns(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	cfg := &Config{Secret: "short"}
	if err := cfg.Provision(zap.New(core)); err != nil {
		t.Fatalf("short secret refused: %v", err)
	}
	entries := logs.FilterMessageSnippet("shorter than 32 bytes").All()
	if len(entries) != 1 {
		t.Fatalf("want one warning about the short secret, got %v", logs.All())
	}
	for name, v := range entries[0].ContextMap() {
		if fmt.Sprint(v) == "short" {
			t.Fatalf("warning leaks the secret in field %q", name)
		}
	}

	core, logs = observer.New(zap.WarnLevel)
	if err := (&Config{Secret: testSecret}).Provision(zap.New(core)); err != nil {
		t.Fatal(err)
	}
	if logs.Len() != 0 {
		t.Fatalf("32-byte secret warned: %v", logs.All())
	}
}

func TestUnmarshalCaddyfile(t *testing.T) {
	tests := []struct {
		name  string
		input string
		want  *Config
		err   string
	}{
		{
			name: "everything",
			input: `jwt {
				from cookie session
				secret {env.JWT_SECRET}
				public_key /etc/keys/a.pem
				public_key /etc/keys/b.pem
				algorithms RS256 ES256
				algorithms HS256
				issuer https://id.example.com
				audience api web
				leeway 30s
			}`,
			want: &Config{
				From:       &TokenSource{Cookie: "session"},
				Secret:     "{env.JWT_SECRET}",
				PublicKeys: []string{"/etc/keys/a.pem", "/etc/keys/b.pem"},
				Algorithms: []string{"RS256", "ES256", "HS256"},
				Issuer:     "https://id.example.com",
				Audience:   []string{"api", "web"},
				Leeway:     30e9,
			},
		},
		{name: "header", input: "jwt {\n from header X-Token\n secret s\n}", want: &Config{From: &TokenSource{Header: "X-Token"}, Secret: "s"}},
		{name: "query", input: "jwt {\n from query access_token\n secret s\n}", want: &Config{From: &TokenSource{Query: "access_token"}, Secret: "s"}},
		{name: "no key", input: "jwt {\n issuer x\n}", err: "no key"},
		{name: "empty", input: "jwt", err: "no key"},
		{name: "argument", input: "jwt x {\n secret s\n}", err: "wrong argument count"},
		{name: "bad source", input: "jwt {\n from body x\n secret s\n}", err: `unknown source "body"`},
		{name: "from without name", input: "jwt {\n from header\n secret s\n}", err: "from: want header|cookie|query <name>"},
		{name: "none", input: "jwt {\n secret s\n algorithms HS256 none\n}", err: `"none" is never accepted`},
		{name: "unknown algorithm", input: "jwt {\n secret s\n algorithms XS256\n}", err: `unknown algorithm "XS256"`},
		{name: "bad leeway", input: "jwt {\n secret s\n leeway soon\n}", err: `leeway: want a non-negative duration, got "soon"`},
		{name: "negative leeway", input: "jwt {\n secret s\n leeway -1s\n}", err: "leeway"},
		{name: "two secrets on a line", input: "jwt {\n secret a b\n}", err: "wrong argument count"},
		{name: "unknown", input: "jwt {\n secret s\n kid x\n}", err: `unknown subdirective "kid"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := caddyfile.NewTestDispenser(tt.input)
			d.Next()
			got := new(Config)
			err := got.UnmarshalCaddyfile(d)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want one containing %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !equalConfig(got, tt.want) {
				t.Fatalf("got %+v (from %+v), want %+v (from %+v)", got, got.From, tt.want, tt.want.From)
			}
		})
	}
}

func equalConfig(a, b *Config) bool {
	sameFrom := (a.From == nil && b.From == nil) || (a.From != nil && b.From != nil && *a.From == *b.From)
	return sameFrom && a.Secret == b.Secret && slices.Equal(a.PublicKeys, b.PublicKeys) &&
		slices.Equal(a.Algorithms, b.Algorithms) && a.Issuer == b.Issuer &&
		slices.Equal(a.Audience, b.Audience) && a.Leeway == b.Leeway
}
