// Package jwttest holds the signing keys that the JWT tests of several
// packages use, generated once per test binary because RSA key generation
// is slow.
package jwttest

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"sync"
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
