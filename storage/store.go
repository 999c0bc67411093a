// Package storage holds the counters behind rate_limit zones. A Store is a
// Caddy guest module in the http.handlers.rate_limit.stores namespace, so
// other stores can be plugged in without touching the handler.
package storage

import (
	"context"
	"errors"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
)

// Namespace is the Caddy module namespace of stores.
const Namespace = "http.handlers.rate_limit.stores"

// Request asks for Cost units of Key's budget in Zone.
type Request struct {
	Zone      string
	Key       string
	Algorithm algorithms.Algorithm
	Limit     algorithms.Limit
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

// ErrUnavailable wraps every error that means the store could not be asked,
// as opposed to a bug in the request.
var ErrUnavailable = errors.New("rate limit store unavailable")
