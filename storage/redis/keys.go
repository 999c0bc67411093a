package redis

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"hash"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// This file is how the store names a key's counters in Redis, and the
// fleet-wide secret their cluster hash tag is derived from.
//
// A key's counters are the hash <prefix>{<tag>}{<key>}:<zone>. On a Redis
// Cluster the tag alone chooses the slot, and so the node. Were it the
// key itself, a client choosing its keys (an API key, a header, a cookie)
// could choose their node: keys picked for one CRC16 slot all landed on
// one master. The tag is a keyed hash of the key (HMAC-SHA256, with a
// secret the fleet keeps in Redis), so a client cannot tell which of its
// keys share a slot. The tag depends on the key, not the zone: a
// request's zones of one key share a slot and one script call decides
// them, and a key's current and previous window, ban, override and costs
// in flight live in one hash. One server or a Sentinel's master has no
// slots; the tag costs it nothing but a few bytes a key, and the names
// are the same in every mode.

// tagSecretKey names the fleet's secret, <prefix>tag_secret: the one key
// the store writes without a TTL unless an operator asked (a dial or an
// override for good, the admin epoch). Each instance creates it if Redis
// has none (SET NX) and reads it back once a second, in the round trip
// that announces the instance (see dialWatcher.refresh): when it is lost
// (a FLUSHALL, a failover that lost its write), the first instance to
// come by writes its own, and the fleet agrees on it within a second.
func (r *Store) tagSecretKey() string { return r.KeyPrefix + "tag_secret" }

// tagBytes is how many bytes of the keyed hash a tag keeps (shown as hex):
// far more than the 14 bits of a cluster slot, so keys spread evenly.
const tagBytes = 4

// newTagSecret returns a secret this instance offers the fleet: 32 random
// bytes, as hex.
func newTagSecret() string {
	var b [32]byte
	rand.Read(b[:]) // never fails (crypto/rand panics rather)
	return hex.EncodeToString(b[:])
}

// keyNames names a store's keys with its prefix and the fleet's secret.
type keyNames struct {
	prefix string
	secret string
	// macs holds *tagMACs keyed with the secret, reset between uses: a
	// fresh one hashes the secret's two padded blocks first.
	macs sync.Pool
}

// A tagMAC is an HMAC keyed with the secret and the buffers it hashes a
// key into and its sum out of: the hash is an interface, through which a
// key's bytes and the sum would escape, and so be allocated at every
// decision, were they not kept with it.
type tagMAC struct {
	mac hash.Hash
	key []byte
	sum [sha256.Size]byte
}

func newKeyNames(prefix, secret string) *keyNames {
	n := &keyNames{prefix: prefix, secret: secret}
	n.macs.New = func() any { return &tagMAC{mac: hmac.New(sha256.New, []byte(secret))} }
	return n
}

// counter names the Redis hash holding the counters of key in zone:
// <prefix>{<tag>}{<key>}:<zone>. The key is there in full, so that
// distinct keys never share a hash, in braces, so that no key and zone
// run into another's: BoundKey has made sure the key holds no brace.
// The name is the one allocation: the tag is put together on the stack.
func (n *keyNames) counter(zone, key string) string {
	tag := n.tag(key)
	return n.prefix + "{" + string(tag[:]) + "}{" + key + "}:" + zone
}

// tag returns key's hash tag: the first tagBytes of HMAC-SHA256(secret,
// key), as hex.
func (n *keyNames) tag(key string) [2 * tagBytes]byte {
	t := n.macs.Get().(*tagMAC)
	t.mac.Reset()
	t.key = append(t.key[:0], key...)
	t.mac.Write(t.key)
	t.mac.Sum(t.sum[:0])
	var tag [2 * tagBytes]byte
	hex.Encode(tag[:], t.sum[:tagBytes])
	n.macs.Put(t)
	return tag
}

// holdersKey names the sorted set of a concurrency key's holders, beside
// its counter hash: <prefix>{<tag>}h{<key>}:<zone>, in the counter's
// slot by the same tag, and a name no counter hash can have ("}{"
// follows every counter's tag). The scripts are handed it in KEYS after
// the counters, since a script must declare every key it touches.
func holdersKey(counter string) string {
	tag := strings.IndexByte(counter, '}')
	return counter[:tag+1] + "h" + counter[tag+1:]
}

// keyNames returns how this store names keys in Redis. Until this
// instance has read the fleet's secret (Redis has been out of reach since
// it started) it reads it first, within the store's timeout, unless c's
// circuit breaker says Redis is down.
func (r *Store) keyNames(ctx context.Context, c *client) (*keyNames, error) {
	w := r.watcher()
	if n := w.names.Load(); n != nil {
		return n, nil
	}
	if err := c.breaker.allow(r.now()); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Duration(r.Timeout))
	defer cancel()
	n, err := w.readSecret(ctx)
	c.breaker.done(err, failureCounts(ctx, err), r.now())
	return n, err
}

// querySecret queues in p the creation of the fleet's secret, if Redis
// has none, with this instance's offer, and its reading.
func (w *dialWatcher) querySecret(ctx context.Context, p goredis.Pipeliner) *goredis.StringCmd {
	p.SetNX(ctx, w.secretKey, w.offer, 0)
	return p.Get(ctx, w.secretKey)
}

// readSecret reads the fleet's secret, creating it if Redis has none, and
// names the store's keys with it from then on.
func (w *dialWatcher) readSecret(ctx context.Context) (*keyNames, error) {
	var secret *goredis.StringCmd
	if _, err := w.client.rdb.Pipelined(ctx, func(p goredis.Pipeliner) error {
		secret = w.querySecret(ctx, p)
		return nil
	}); err != nil {
		return nil, err
	}
	return w.learnSecret(secret.Val()), nil
}

// learnSecret names the store's keys with secret, as Redis answered it,
// from now on. A secret that changed was lost from Redis and written
// anew: the keys move to other names, and are counted afresh.
func (w *dialWatcher) learnSecret(secret string) *keyNames {
	if n := w.names.Load(); n != nil && n.secret == secret {
		return n
	}
	n := newKeyNames(w.prefix, secret)
	if old := w.names.Swap(n); old != nil && old.secret != secret {
		w.logger.Warn("the Redis store's hash tag secret changed: it was lost from Redis (a FLUSHALL, or a failover that lost its write); keys are counted afresh",
			zap.String("key", w.secretKey))
	}
	return n
}
