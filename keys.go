package ratelimit

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"

	"go.uber.org/zap"
)

// Keys are whatever clients send, and often credentials: an API key, a
// session cookie, a token. So wherever the module shows a key to someone
// other than the request's own handlers (log lines, events, top keys on
// the admin API, the status page and the command), it shows a keyed hash
// of it, unless the handler's log_keys is on. The placeholder
// {http.rate_limit.key} holds the key as it is: it is for the operator's
// own handlers, which can read the request anyway.

// keyHashKey keys the hash that stands for a hidden key. It is drawn when
// Caddy starts, so a key's hash is the same in every log line, event and
// answer until the process ends (across config reloads), while nobody
// without it can find a key by hashing guesses, which an unkeyed hash of
// a short key (an IPv4 address has 2^32) would allow. Another process,
// or a restart, shows other hashes.
var keyHashKey = func() []byte {
	k := make([]byte, 32)
	_, _ = rand.Read(k) // never fails: crypto/rand crashes the program instead
	return k
}()

// hiddenKey is how a hidden key is shown: "#" and 16 hex digits of its
// HMAC-SHA256 under keyHashKey, enough to tell keys apart and to follow
// one from line to line, not to read it.
func hiddenKey(key string) string {
	mac := hmac.New(sha256.New, keyHashKey)
	_, _ = io.WriteString(mac, key)
	return "#" + hex.EncodeToString(mac.Sum(nil)[:8])
}

// shownKey is key as it is shown: itself if show (log_keys on), else its
// hash.
func shownKey(key string, show bool) string {
	if show {
		return key
	}
	return hiddenKey(key)
}

// keyField is the key as a log field, shown as log_keys says.
func (h *Handler) keyField(key string) zap.Field {
	return zap.String("key", shownKey(key, h.showKeys))
}

// hash is the hash that stands for key in the zone's logs, events and top
// keys, or "" if the zone shows keys as they are.
func (z *Zone) hash(key string) string {
	if z.showKeys {
		return ""
	}
	return hiddenKey(key)
}
