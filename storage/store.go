// Package storage holds the counters behind rate_limit zones. A Store is a
// Caddy guest module in the http.handlers.rate_limit.stores namespace, so
// other stores can be plugged in without touching the handler.
package storage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
)

// Namespace is the Caddy module namespace of stores.
const Namespace = "http.handlers.rate_limit.stores"

// Request asks for Cost units of Key's budget in Zone. Key has been
// bounded by BoundKey; stores keep it as it is.
type Request struct {
	Zone      string
	Key       string
	Algorithm algorithms.Algorithm
	Rate      algorithms.Rate
	Cost      int64
}

// Store keeps counters per zone and key.
type Store interface {
	// Take decides every request in reqs and writes one decision per
	// request into decisions, which has the same length. Only if every
	// request is allowed are they all charged; otherwise nothing is, so a
	// request rejected by one zone consumes nothing in the others. A
	// non-nil error means no decision was made; a remote store whose
	// answer timed out may still have charged the request.
	Take(ctx context.Context, reqs []Request, decisions []algorithms.Decision) error
}

// MaxKeyLen is the longest key every store keeps as it is.
const MaxKeyLen = 64

// BoundKey is the one rule that bounds keys, for every store. A key that
// is empty, longer than MaxKeyLen bytes, starts with '#' or contains a
// brace becomes '#' and 32 hex digits of its SHA-256. So a hostile key (a
// megabyte header, say) cannot bloat a store, nor break out of a Redis
// Cluster hash tag, nor, since a key kept as it is never starts with '#',
// take over the counter of a hashed one.
func BoundKey(key string) string {
	if len(key) > 0 && len(key) <= MaxKeyLen && key[0] != '#' && !strings.ContainsAny(key, "{}") {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "#" + hex.EncodeToString(sum[:16])
}
