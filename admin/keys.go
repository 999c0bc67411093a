package admin

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"go.uber.org/zap"

	"github.com/d61b427a/caddy-rate-limit/storage"
)

// How an admin request names a key. The key routes take the key's value,
// as clients send it, and, where the zone's key has several alternatives
// (ZoneInfo.Key, each a key space of its own), the one it came from:
// ?from=<alternative>, as the zone lists it or in the Caddyfile's
// shorthand ({header.X-Api-Key}, {client_ip}). Without from, the key is
// the one of the only alternative that could have given the value (an
// API key that is no IP address cannot be the client's address; key:c42
// can only be key:{header.X-Api-Key}'s), or else of the one among them
// under which it holds something (counts, a ban, an override). A key
// that holds something under several is refused (409) naming them, for
// a change made to the wrong one would be reported as done; a key that
// holds nothing under any is shown with no use, and not changed: there
// is nothing to reset (404), and which one an override is meant for
// cannot be known (409).
//
// A key may also be named by its hash, as logs, events and top keys show
// keys under log_keys off ('#' and 16 hex digits). A hash cannot be
// turned back into its key, so it is looked up among this instance's top
// keys of the zone, which keep the keys themselves; one that is not
// there is refused, saying to pass the key itself. A '#' and 32 hex
// digits is storage.BoundKey's own form of a long key, as top keys show
// it under log_keys on, and is taken as it is.

var (
	// shownHash is a key's hash as it is shown under log_keys off.
	shownHash = regexp.MustCompile(`^#[0-9a-f]{16}$`)
	// boundHash is a long key as storage.BoundKey keeps it.
	boundHash = regexp.MustCompile(`^#[0-9a-f]{32}$`)
)

// namedKey is a key an admin request names, in one key space of its
// zone, with what the store holds for it.
type namedKey struct {
	stored string
	info   KeyInfo
}

// fields are the log fields of an admin change to k: the key, as the
// zone shows it, and its alternative.
func (k namedKey) fields(z target) []zap.Field {
	return []zap.Field{zap.String("key", z.ShownKey(k.stored)), zap.String("from", k.info.From)}
}

// namedKeys returns the keys that raw (the key's path segment, unescaped)
// and from (?from=, or "") name in z: the key under the alternative from,
// or, without from, under each of the zone's alternatives that could
// have given it (each of them if none could); for a hash, the one key
// among the zone's top keys that has it.
func (z target) namedKeys(ctx context.Context, raw, from string) ([]namedKey, error) {
	spaces := z.info.Key
	if from != "" {
		alt, err := z.alternative(from)
		if err != nil {
			return nil, err
		}
		spaces = []string{alt}
	}
	if shownHash.MatchString(raw) {
		return z.hashedKey(ctx, raw, spaces)
	}
	key := raw
	if !boundHash.MatchString(raw) {
		key = storage.BoundKey(raw)
	}
	if from == "" {
		if alts := keySpaces(z.info.Name, key); len(alts) > 0 {
			spaces = alts
		}
	}
	out := make([]namedKey, 0, len(spaces))
	for _, alt := range spaces {
		k, err := z.read(ctx, z.StoredKey(key, alt))
		if err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, nil
}

// hashedKey returns the key among the zone's top keys, under one of the
// alternatives spaces, whose hash is hash. The answer shows the hash in
// place of the key, which it stands for because the key is hidden.
func (z target) hashedKey(ctx context.Context, hash string, spaces []string) ([]namedKey, error) {
	top, _ := z.Top(MaxTopKeys)
	for _, t := range top {
		if z.ShownKey(t.Key) != hash || !slices.Contains(spaces, t.From) {
			continue
		}
		k, err := z.read(ctx, t.Key)
		k.info.Key = hash
		return []namedKey{k}, err
	}
	return nil, apiError(http.StatusNotFound, fmt.Errorf("zone %q: key %q: a key's hash, as logs and top keys show keys under log_keys off, and none of this instance's top keys of the zone (about the last minute's) has it; pass the key itself",
		z.info.Name, hash))
}

// read reads a stored key's state.
func (z target) read(ctx context.Context, stored string) (namedKey, error) {
	info, err := z.KeyInfo(ctx, stored)
	if err != nil {
		return namedKey{}, apiError(http.StatusBadGateway, err)
	}
	z.inDollars(&info)
	return namedKey{stored: stored, info: info}, nil
}

// alternative returns the alternative of the zone's key that from names,
// as the zone lists it or in the Caddyfile's shorthand.
func (z target) alternative(from string) (string, error) {
	if slices.Contains(z.info.Key, from) {
		return from, nil
	}
	written := caddyfile.Segment{{Text: from}}
	httpcaddyfile.NewShorthandReplacer().ApplyToSegment(&written)
	if slices.Contains(z.info.Key, written[0].Text) {
		return written[0].Text, nil
	}
	return "", apiError(http.StatusBadRequest, fmt.Errorf("from: want an alternative of zone %q's key (%s), got %q",
		z.info.Name, strings.Join(z.info.Key, ", "), from))
}

// pick returns the key of keys, named by raw, that a request acts on:
// the only one, or else the only one for which holds is true; ok is
// false if there is none such. Several are refused, naming them.
func (z target) pick(keys []namedKey, raw string, holds func(KeyInfo) bool) (k namedKey, ok bool, err error) {
	if len(keys) == 1 {
		return keys[0], true, nil
	}
	var found []namedKey
	var froms []string
	for _, k := range keys {
		if holds(k.info) {
			found = append(found, k)
			froms = append(froms, k.info.From)
		}
	}
	switch len(found) {
	case 0:
		return namedKey{}, false, nil
	case 1:
		return found[0], true, nil
	}
	return namedKey{}, false, apiError(http.StatusConflict, fmt.Errorf("zone %q: key %q holds something under several alternatives of the zone's key (%s); name the one to act on with ?from=<alternative> (caddy rate-limit: --from <alternative>)",
		z.info.Name, raw, strings.Join(froms, ", ")))
}

// holdsState reports whether a key holds anything now: counts, units in
// flight, a ban or an override.
func holdsState(k KeyInfo) bool {
	now := time.Now()
	return k.Used > 0 || k.Current > 0 || k.Previous > 0 || k.Reserved != nil && *k.Reserved > 0 ||
		k.BanEnds.After(now) || k.Override != nil && k.Override.Active(now)
}
