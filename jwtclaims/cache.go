package jwtclaims

import (
	"crypto/sha256"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// DefaultCacheSize bounds how many verified tokens are remembered.
const DefaultCacheSize = 10000

// DefaultCacheTTL bounds how long a verified token is remembered; a token
// that expires sooner is forgotten when it expires.
const DefaultCacheTTL = time.Minute

// tokenCache remembers the claims of tokens that verified, so a client
// sending the same token again costs a hash instead of a signature check.
// It holds SHA-256 digests, not tokens, and only tokens that verified, so
// an attacker can neither fill it with forgeries nor read tokens from it.
type tokenCache struct {
	mu      sync.RWMutex
	entries map[[sha256.Size]byte]cacheEntry
	size    int
	ttl     time.Duration
}

type cacheEntry struct {
	claims  map[string]any
	expires time.Time
}

func newTokenCache(size int, ttl time.Duration) *tokenCache {
	return &tokenCache{entries: make(map[[sha256.Size]byte]cacheEntry), size: size, ttl: ttl}
}

// digest is what the cache keeps of a token.
func digest(token string) [sha256.Size]byte { return sha256.Sum256([]byte(token)) }

func (tc *tokenCache) get(sum [sha256.Size]byte, now time.Time) (map[string]any, bool) {
	tc.mu.RLock()
	e, ok := tc.entries[sum]
	tc.mu.RUnlock()
	if !ok || !now.Before(e.expires) {
		return nil, false
	}
	return e.claims, true
}

// put remembers claims for the token with digest sum until expires.
// When the cache is full, one pass drops every expired entry and, while
// more than three quarters remain, whichever entries it meets first (map
// order is random), so a full cache costs one sweep per size/4 insertions.
func (tc *tokenCache) put(sum [sha256.Size]byte, claims map[string]any, expires, now time.Time) {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if len(tc.entries) >= tc.size {
		keep := tc.size * 3 / 4
		for k, e := range tc.entries {
			if len(tc.entries) > keep || !now.Before(e.expires) {
				delete(tc.entries, k)
			}
		}
	}
	tc.entries[sum] = cacheEntry{claims: claims, expires: expires}
}

func (tc *tokenCache) len() int {
	tc.mu.RLock()
	defer tc.mu.RUnlock()
	return len(tc.entries)
}

// cacheUntil is when a token verified at now must be verified again: after
// the cache's TTL, or when it expires (allowing the leeway) if sooner.
func (c *Config) cacheUntil(claims map[string]any, now time.Time) time.Time {
	until := now.Add(c.cache.ttl)
	exp, err := jwt.MapClaims(claims).GetExpirationTime()
	if err == nil && exp != nil {
		if t := exp.Add(time.Duration(c.Leeway)); t.Before(until) {
			until = t
		}
	}
	return until
}
