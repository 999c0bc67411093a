package storage

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"go.uber.org/zap"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
)

func init() {
	caddy.RegisterModule(Redis{})
}

// Defaults of the Redis store.
const (
	DefaultRedisTimeout   = 50 * time.Millisecond
	DefaultRedisKeyPrefix = "rl:"
)

// redisClientName is what the store's connections call themselves (CLIENT
// SETNAME), so an operator can tell them apart in CLIENT LIST.
const redisClientName = "caddy-rate-limit"

// maxExact bounds the numbers handed to the script, whose Lua numbers are
// exact integers only below 2^53.
const maxExact = 1 << 50

// Redis keeps counters in Redis, so that every Caddy instance using the
// same Redis shares one exact counter per zone and key. It talks to one
// Redis server, a Redis Cluster or a Sentinel-managed master.
//
// Each decision is one Lua script run on the Redis server (EVALSHA), which
// reads the server's clock, so instances whose clocks disagree still cut
// windows at the same instants. A request over the limit writes nothing.
// Counters expire on their own.
//
// A key known to be over its limit is answered from a local cache until the
// instant it could next be allowed, so a client hammering after its 429
// costs no Redis round trip. When Redis does not answer within timeout the
// handler applies on_store_error; after repeated failures a circuit breaker
// skips Redis for a second, so an outage adds no latency.
type Redis struct {
	// Redis URLs: redis://[user:password@]host[:port][/db], or rediss://
	// for TLS (add ?skip_verify=true to skip certificate checks). A bare
	// host:port means redis://host:port. Placeholders such as
	// {env.REDIS_URL} are resolved when the config is loaded. With
	// cluster, these are seed nodes; with sentinel, the sentinels. Default:
	// none; at least one is required.
	Addresses []string `json:"addresses,omitempty"`

	// The addresses are nodes of a Redis Cluster.
	Cluster bool `json:"cluster,omitempty"`

	// The name of the master that the sentinels at the addresses watch.
	// The URLs' user, password and database apply to the master.
	Sentinel string `json:"sentinel,omitempty"`

	// How long one decision may wait for Redis before on_store_error
	// applies. Default: 50ms.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// Prefix of every key the store writes. Must not contain braces.
	// Default: "rl:".
	KeyPrefix string `json:"key_prefix,omitempty"`

	// Connections per Redis node; 0 means go-redis's default (10 per CPU).
	PoolSize int `json:"pool_size,omitempty"`

	client  *redisClient
	poolKey string
	opts    *redis.UniversalOptions
	lease   *clientLease
	// now is the local clock; tests replace it to skew it.
	now    func() time.Time
	logger *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (Redis) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  Namespace + ".redis",
		New: func() caddy.Module { return new(Redis) },
	}
}

// redisClients holds one client per distinct connection config while any
// loaded config uses it, so a config reload keeps its connections.
var redisClients = caddy.NewUsagePool()

// Provision resolves placeholders in the addresses, checks them and
// attaches the shared client for them.
func (r *Redis) Provision(ctx caddy.Context) error {
	r.logger = ctx.Logger()
	if r.Timeout == 0 {
		r.Timeout = caddy.Duration(DefaultRedisTimeout)
	}
	if r.KeyPrefix == "" {
		r.KeyPrefix = DefaultRedisKeyPrefix
	}
	if r.now == nil {
		r.now = time.Now
	}
	if err := r.Validate(); err != nil {
		return err
	}
	repl := caddy.NewReplacer()
	addrs := make([]string, len(r.Addresses))
	names := make([]string, len(r.Addresses))
	for i, a := range r.Addresses {
		v, err := repl.ReplaceOrErr(a, true, true)
		if err != nil {
			return fmt.Errorf("address %q: %w", redactAddress(a), err)
		}
		addrs[i] = v
		names[i] = strconv.Quote(redactAddress(a))
		if v != a {
			names[i] += " = " + strconv.Quote(redactAddress(v))
		}
	}
	opts, err := r.clientOptions(addrs, names)
	if err != nil {
		return err
	}
	// Everything clientOptions reads is in the key, the timeout included:
	// the connection timeouts derive from it.
	key, err := json.Marshal(struct {
		Addrs    []string
		Cluster  bool
		Sentinel string
		PoolSize int
		Timeout  caddy.Duration
	}{addrs, r.Cluster, r.Sentinel, r.PoolSize, r.Timeout})
	if err != nil {
		return err
	}
	val, _, err := redisClients.LoadOrNew(string(key), func() (caddy.Destructor, error) {
		return newRedisClient(opts), nil
	})
	if err != nil {
		return err
	}
	r.client = val.(*redisClient)
	r.poolKey = string(key)
	r.opts = opts
	r.lease = new(clientLease)
	return nil
}

// Validate refuses options that cannot work. Addresses are checked in
// Provision, once their placeholders are resolved.
func (r *Redis) Validate() error {
	if len(r.Addresses) == 0 {
		return errors.New("address: at least one address is required")
	}
	if r.Cluster && r.Sentinel != "" {
		return errors.New("cluster and sentinel exclude each other")
	}
	if len(r.Addresses) > 1 && !r.Cluster && r.Sentinel == "" {
		return fmt.Errorf("address: %d addresses given; several addresses need cluster or sentinel", len(r.Addresses))
	}
	if r.Timeout < 0 {
		return fmt.Errorf("timeout: must be positive, got %s", time.Duration(r.Timeout))
	}
	if strings.ContainsAny(r.KeyPrefix, "{}") {
		return fmt.Errorf("key_prefix: must not contain braces, got %q", r.KeyPrefix)
	}
	if r.PoolSize < 0 {
		return fmt.Errorf("pool_size: must not be negative, got %d", r.PoolSize)
	}
	for _, a := range r.Addresses {
		if !strings.Contains(a, "{") {
			if _, err := parseAddress(a, strconv.Quote(redactAddress(a))); err != nil {
				return err
			}
		}
	}
	return nil
}

// clientLease is a config's hold on its shared client.
type clientLease struct {
	// inUse counts the config's decisions in flight, plus retired once
	// the config has been cleaned up.
	inUse    atomic.Int64
	detached sync.Once
}

// retired is added to clientLease.inUse by Cleanup: far above any number
// of decisions in flight, so one comparison tells whether it was added.
const retired = 1 << 40

// Cleanup lets go of the shared client once the last decision of this
// config has finished; the last config using the client closes its
// connections. Caddy cleans up an old config while its requests may still
// be running, and a reload that changes the connection settings must not
// close the connections under them.
func (r *Redis) Cleanup() error {
	if r.lease == nil {
		return nil
	}
	if r.lease.inUse.Add(retired) == retired {
		r.detach()
	}
	return nil
}

// acquire returns the client for one decision and the function that ends
// the decision. Until this config is cleaned up, and while its decisions
// run, that is the config's own client. A request of this config that
// starts deciding after that borrows a client from the pool for its one
// decision (the one a newer config with the same settings uses, or its
// own connection), so no request is ever sent to closed connections.
func (r *Redis) acquire() (*redisClient, func(), error) {
	if r.lease.inUse.Add(1) < retired {
		return r.client, r.release, nil
	}
	r.release()
	val, _, err := redisClients.LoadOrNew(r.poolKey, func() (caddy.Destructor, error) {
		return newRedisClient(r.opts), nil
	})
	if err != nil {
		return nil, nil, err
	}
	return val.(*redisClient), r.deletePoolUse, nil
}

// release ends a decision that acquire started on the config's own client.
func (r *Redis) release() {
	if r.lease.inUse.Add(-1) == retired {
		r.detach()
	}
}

// detach gives the config's use of the shared client back to the pool.
func (r *Redis) detach() {
	r.lease.detached.Do(r.deletePoolUse)
}

func (r *Redis) deletePoolUse() {
	if _, err := redisClients.Delete(r.poolKey); err != nil {
		r.logger.Error("closing Redis connections", zap.Error(err))
	}
}

// parseAddress parses one Redis URL. Errors name the address as name,
// which must have any password masked.
func parseAddress(addr, name string) (*redis.Options, error) {
	raw := addr
	if !strings.Contains(raw, "://") {
		raw = "redis://" + raw
	}
	fail := func(err error) (*redis.Options, error) {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error repeats the whole URL, password and all
		}
		return nil, fmt.Errorf("address %s: %w", name, err)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fail(err)
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return fail(fmt.Errorf("scheme %q is not supported (want redis or rediss)", u.Scheme))
	}
	if u.Hostname() == "" {
		return fail(errors.New("no host"))
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fail(fmt.Errorf("invalid port %q", p))
		}
	}
	for name := range u.Query() {
		if name != "skip_verify" {
			return fail(fmt.Errorf("URL option %q is not supported; use the store's own options", name))
		}
	}
	opts, err := redis.ParseURL(raw)
	if err != nil {
		return fail(err)
	}
	return opts, nil
}

// redactAddress masks the password in a Redis URL for error messages.
func redactAddress(addr string) string {
	scheme, rest, ok := strings.Cut(addr, "://")
	if !ok {
		return addr
	}
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return addr
	}
	user, _, hasPass := strings.Cut(rest[:at], ":")
	if !hasPass {
		return addr
	}
	return scheme + "://" + user + ":xxxxx" + rest[at:]
}

// clientOptions turns the resolved addresses into go-redis options.
func (r *Redis) clientOptions(addrs, names []string) (*redis.UniversalOptions, error) {
	var first *redis.Options
	hosts := make([]string, len(addrs))
	for i, a := range addrs {
		o, err := parseAddress(a, names[i])
		if err != nil {
			return nil, err
		}
		if first == nil {
			first = o
		} else if o.Username != first.Username || o.Password != first.Password || o.DB != first.DB ||
			(o.TLSConfig == nil) != (first.TLSConfig == nil) {
			return nil, fmt.Errorf("address %s: user, password, database and TLS must be the same for every address", names[i])
		}
		hosts[i] = o.Addr
	}
	if r.Cluster && first.DB != 0 {
		return nil, fmt.Errorf("address %s: a Redis Cluster has only database 0", names[0])
	}
	timeout := time.Duration(r.Timeout)
	return &redis.UniversalOptions{
		Addrs:         hosts,
		IsClusterMode: r.Cluster,
		MasterName:    r.Sentinel,
		Username:      first.Username,
		Password:      first.Password,
		DB:            first.DB,
		TLSConfig:     first.TLSConfig,
		PoolSize:      r.PoolSize,
		ClientName:    redisClientName,
		// A decision's script must never run twice: a retry after a
		// timeout could charge a request that was already charged.
		MaxRetries: -1,
		// Deadlines come from each decision's context (timeout); the
		// socket timeouts only bound what runs without one.
		ContextTimeoutEnabled: true,
		ReadTimeout:           max(timeout, time.Second),
		WriteTimeout:          max(timeout, time.Second),
		DialTimeout:           max(timeout, time.Second),
		DialerRetries:         1,
		// Waiting for a free connection gives up a little before the
		// decision's deadline, so that it is told apart from Redis not
		// answering (see take).
		PoolTimeout:     timeout - min(timeout/5, 10*time.Millisecond),
		DisableIdentity: true,
		// Maintenance notifications are a Redis Enterprise feature; asking
		// for them costs a round trip per connection elsewhere.
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}, nil
}

// UnmarshalCaddyfile sets up the store from Caddyfile tokens:
//
//	store redis {
//		address <url> [<url>...]   # repeatable
//		cluster
//		sentinel <master name>
//		timeout <duration>
//		key_prefix <prefix>
//		pool_size <n>
//	}
func (r *Redis) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // store name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "address", "addresses":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			for _, a := range args {
				if !strings.Contains(a, "{") {
					if _, err := parseAddress(a, strconv.Quote(redactAddress(a))); err != nil {
						return d.Errf("store redis: %v", err)
					}
				}
			}
			r.Addresses = append(r.Addresses, args...)
		case "cluster":
			if d.NextArg() {
				return d.ArgErr()
			}
			r.Cluster = true
		case "sentinel":
			if !d.NextArg() {
				return d.Errf("store redis: sentinel: the master name is required")
			}
			r.Sentinel = d.Val()
			if d.NextArg() {
				return d.ArgErr()
			}
		case "timeout":
			if !d.NextArg() {
				return d.ArgErr()
			}
			dur, err := caddy.ParseDuration(d.Val())
			if err != nil || dur <= 0 {
				return d.Errf("store redis: timeout: must be a positive duration, got %q", d.Val())
			}
			r.Timeout = caddy.Duration(dur)
			if d.NextArg() {
				return d.ArgErr()
			}
		case "key_prefix":
			if !d.NextArg() {
				return d.ArgErr()
			}
			r.KeyPrefix = d.Val()
			if r.KeyPrefix == "" || strings.ContainsAny(r.KeyPrefix, "{}") {
				return d.Errf("store redis: key_prefix: must be non-empty and without braces, got %q", r.KeyPrefix)
			}
			if d.NextArg() {
				return d.ArgErr()
			}
		case "pool_size":
			if !d.NextArg() {
				return d.ArgErr()
			}
			n, err := strconv.Atoi(d.Val())
			if err != nil || n < 0 {
				return d.Errf("store redis: pool_size: must be a non-negative integer, got %q", d.Val())
			}
			r.PoolSize = n
			if d.NextArg() {
				return d.ArgErr()
			}
		default:
			return d.Errf("store redis: unknown subdirective %q", d.Val())
		}
	}
	if err := r.Validate(); err != nil {
		return d.Errf("store redis: %v", err)
	}
	return nil
}

// Interface guards
var (
	_ Store                 = (*Redis)(nil)
	_ caddy.Provisioner     = (*Redis)(nil)
	_ caddy.Validator       = (*Redis)(nil)
	_ caddy.CleanerUpper    = (*Redis)(nil)
	_ caddyfile.Unmarshaler = (*Redis)(nil)
)

// counterKey names the Redis hash holding the counters of key in zone:
// <prefix>{<key>}:<zone>. The braces make the key its own cluster hash
// tag, so the zones of one key share a slot and one script call decides
// them all, even on a cluster. The hash holds the current and the previous
// window together, so every key a script touches is declared to it, as a
// Redis Cluster requires. A key that is empty, long, contains a brace or
// starts with '#' is replaced by '#' and a hash of it, so a hostile key can
// neither break out of the tag, nor bloat Redis, nor collide with another.
func (r *Redis) counterKey(zone, key string) string {
	tag := key
	if len(key) == 0 || len(key) > maxPlainKey || key[0] == '#' || strings.ContainsAny(key, "{}") {
		sum := sha256.Sum256([]byte(key))
		tag = "#" + hex.EncodeToString(sum[:16])
	}
	return r.KeyPrefix + "{" + tag + "}:" + zone
}

// maxPlainKey is the longest key kept as it is in Redis key names.
const maxPlainKey = 64

// Take implements Store.
func (r *Redis) Take(ctx context.Context, reqs []Request, decisions []algorithms.Decision) error {
	return r.take(ctx, reqs, decisions, 0)
}

// take is Take with the script's clock set to clock (ms since the epoch)
// instead of the server's, for tests, unless clock is 0. With a set clock
// the deny cache is not used and decisions are in that clock.
func (r *Redis) take(ctx context.Context, reqs []Request, decisions []algorithms.Decision, clock int64) error {
	if len(reqs) == 0 {
		return nil
	}
	keys := make([]string, 0, len(reqs))
	for _, q := range reqs {
		if q.Limit.Events > maxExact || q.Cost < 0 || q.Cost > maxExact || q.Limit.Window.Milliseconds() > maxExact {
			return fmt.Errorf("zone %q: limit, cost or window too large for the Redis store", q.Zone)
		}
		if err := q.Limit.Validate(); err != nil {
			return fmt.Errorf("zone %q: %w", q.Zone, err)
		}
		keys = append(keys, r.counterKey(q.Zone, q.Key))
	}
	c, done, err := r.acquire()
	if err != nil {
		return fmt.Errorf("%w: redis: %w", ErrUnavailable, err)
	}
	defer done()
	if clock == 0 && c.denies.lookup(keys, reqs, decisions, r.now()) {
		return nil
	}
	if err := c.breaker.allow(r.now()); err != nil {
		return fmt.Errorf("%w: redis: %w", ErrUnavailable, err)
	}
	tctx, cancel := context.WithTimeout(ctx, time.Duration(r.Timeout))
	defer cancel()
	err = r.decide(tctx, c, keys, reqs, decisions, clock)
	if err != nil {
		c.breaker.done(err, failureCounts(ctx, err), r.now())
		return fmt.Errorf("%w: redis: %w", ErrUnavailable, err)
	}
	c.breaker.done(nil, true, r.now())
	if clock == 0 {
		c.denies.store(keys, reqs, decisions, r.now())
	}
	return nil
}

// failureCounts reports whether err, from a decision asked for under ctx,
// counts against Redis in the circuit breaker. A client that went away says
// nothing about Redis, and neither does a wait for a free connection: a
// burst of traffic must not trip the breaker and so lift every limit.
func failureCounts(ctx context.Context, err error) bool {
	return ctx.Err() == nil && !errors.Is(err, redis.ErrPoolTimeout)
}

// decide runs the script over reqs. On one server or a sentinel's master
// that is one call for all zones. On a cluster, zones whose keys lie in
// different slots are decided one group of keys at a time; see
// decideGroups.
func (r *Redis) decide(ctx context.Context, c *redisClient, keys []string, reqs []Request, decisions []algorithms.Decision, clock int64) error {
	if !r.Cluster || sameTag(keys) {
		_, err := r.run(ctx, c, keys, reqs, decisions, clock, true)
		return err
	}
	return r.decideGroups(ctx, c, keys, reqs, decisions, clock)
}

// sameTag reports whether all keys share one hash tag, and so one slot.
func sameTag(keys []string) bool {
	for _, k := range keys[1:] {
		if hashTag(k) != hashTag(keys[0]) {
			return false
		}
	}
	return true
}

func hashTag(key string) string {
	open := strings.IndexByte(key, '{')
	end := strings.IndexByte(key[open:], '}')
	return key[open : open+end+1]
}

// decideGroups keeps the all-or-nothing rule on a cluster, where one script
// cannot reach keys in different slots. Keys are grouped by hash tag and
// each group is decided by one atomic script call, in order. Each group
// charges its zones only if they all allow the request; once a group
// rejects, the remaining groups are only asked for their decisions, and
// every group already charged is refunded by a second script that is
// atomic in its slot. Until that refund lands, a concurrent request for
// the same key may see the charge and be rejected; no request is ever
// allowed beyond a limit.
//
// Once a group has rejected the request, Redis errors no longer make it a
// store error, which on_store_error allow would let through: a group that
// cannot be asked is reported as not rejecting, and a refund that fails is
// logged and leaves its charge in place (counting too much, never too
// little).
func (r *Redis) decideGroups(ctx context.Context, c *redisClient, keys []string, reqs []Request, decisions []algorithms.Decision, clock int64) error {
	type group struct {
		tag   string
		index []int
	}
	var groups []group
	for i, k := range keys {
		tag := hashTag(k)
		found := false
		for g := range groups {
			if groups[g].tag == tag {
				groups[g].index = append(groups[g].index, i)
				found = true
				break
			}
		}
		if !found {
			groups = append(groups, group{tag: tag, index: []int{i}})
		}
	}

	type charged struct {
		keys []string
		args []any
	}
	var refunds []charged
	rejected := false
	var firstErr error
	for gi, g := range groups {
		gKeys := make([]string, len(g.index))
		gReqs := make([]Request, len(g.index))
		gDec := make([]algorithms.Decision, len(g.index))
		for j, i := range g.index {
			gKeys[j], gReqs[j] = keys[i], reqs[i]
		}
		now, err := r.run(ctx, c, gKeys, gReqs, gDec, clock, !rejected)
		if err != nil && rejected {
			for _, rest := range groups[gi:] {
				for _, i := range rest.index {
					decisions[i] = algorithms.Decision{Allowed: true}
				}
			}
			break
		}
		if err != nil {
			firstErr = err
			break
		}
		allowed := true
		for j, i := range g.index {
			decisions[i] = gDec[j]
			allowed = allowed && gDec[j].Allowed
		}
		if !allowed {
			rejected = true
			continue
		}
		if !rejected {
			args := make([]any, 0, 2*len(gReqs))
			for _, q := range gReqs {
				w := q.Limit.Window.Milliseconds()
				args = append(args, algorithms.WindowIndex(now, w), q.Cost)
			}
			refunds = append(refunds, charged{gKeys, args})
		}
	}
	if !rejected && firstErr == nil {
		return nil
	}
	// Undo the charges with a fresh budget: the decision's own timeout may
	// be what ended it.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Duration(r.Timeout))
	defer cancel()
	for _, ch := range refunds {
		if err := refundScript.Run(rctx, c.rdb, ch.keys, ch.args...).Err(); err != nil {
			r.logger.Error("refunding a request rejected in another cluster slot failed; its charge stays",
				zap.Int("zones", len(ch.keys)), zap.Error(err))
		}
	}
	return firstErr
}

// run executes the take script once for keys, all in one slot, and fills
// decisions. It returns the script's clock (server time unless clock is
// set), in ms.
func (r *Redis) run(ctx context.Context, c *redisClient, keys []string, reqs []Request, decisions []algorithms.Decision, clock int64, charge bool) (int64, error) {
	args := make([]any, 2, 2+4*len(reqs))
	args[0] = ""
	if clock != 0 {
		args[0] = clock
	}
	args[1] = "0"
	if charge {
		args[1] = "1"
	}
	for _, q := range reqs {
		alg := "s"
		if q.Algorithm == algorithms.FixedWindow {
			alg = "f"
		}
		args = append(args, alg, q.Limit.Events, q.Limit.Window.Milliseconds(), q.Cost)
	}
	vals, err := takeScript.Run(ctx, c.rdb, keys, args...).Int64Slice()
	if err != nil {
		return 0, err
	}
	if len(vals) != 2+4*len(reqs) {
		return 0, fmt.Errorf("take script returned %d values for %d zones", len(vals), len(reqs))
	}
	serverNow := vals[0]
	// Decisions are computed in the clock the script used, then moved to
	// the local clock, so Retry-After and the deny cache are right even
	// when this machine's clock disagrees with Redis's.
	var shift time.Duration
	if clock == 0 {
		shift = r.now().Sub(time.UnixMilli(serverNow))
	}
	for i, q := range reqs {
		v := vals[2+4*i:]
		counts := algorithms.Counts{Window: v[0], Current: v[1], Previous: v[2]}
		d, _ := algorithms.Decide(q.Algorithm, counts, time.UnixMilli(serverNow), q.Limit, q.Cost)
		// The script's verdict is what was written; it equals Decide's by
		// construction (and by test), but the store must report what it did.
		d.Allowed = v[3] == 1
		d.Reset = d.Reset.Add(shift)
		if !d.RetryAt.IsZero() {
			d.RetryAt = d.RetryAt.Add(shift)
		}
		decisions[i] = d
	}
	return serverNow, nil
}

var (
	//go:embed scripts/take.lua
	takeSource string
	//go:embed scripts/refund.lua
	refundSource string

	takeScript   = redis.NewScript(takeSource)
	refundScript = redis.NewScript(refundSource)
)
