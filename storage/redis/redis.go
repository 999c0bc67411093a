// Package redis is the rate_limit store that keeps counters in Redis
// (module http.handlers.rate_limit.stores.redis), so that every Caddy
// instance using the same Redis shares them. The Lua scripts that decide
// on the server are in scripts/. Besides the counters, it keeps what only
// a shared store needs: the fleet's size, leases, a deny cache, a circuit
// breaker, and a local fallback (a memory store of its own, from
// storage/memory) for while Redis cannot answer.
package redis

import (
	"context"
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
	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"go.uber.org/zap"

	"github.com/d61b427a/caddy-rate-limit/storage"
)

func init() {
	caddy.RegisterModule(Store{})
}

// Defaults of the Redis store.
const (
	DefaultTimeout   = 50 * time.Millisecond
	DefaultKeyPrefix = "rl:"
)

// clientName is what the store's connections call themselves (CLIENT
// SETNAME), so an operator can tell them apart in CLIENT LIST.
const clientName = "caddy-rate-limit"

// maxExact bounds the numbers handed to the script, whose Lua numbers are
// exact integers only below 2^53.
const maxExact = 1 << 50

// Store keeps counters in Redis, so that every Caddy instance using the
// same Redis shares one exact counter per zone and key. It talks to one
// Redis server, a Redis Cluster or a Sentinel-managed master.
//
// Each decision is made by a Lua script on the Redis server (EVALSHA),
// which reads the server's clock, so instances whose clocks disagree still
// cut windows at the same instants. Decisions that arrive while a call is
// in flight share the next call. A request over the limit writes nothing.
// Counters expire on their own.
//
// A key known to be over its limit is answered from a local cache until the
// instant it could next be allowed, so a client hammering after its 429
// costs no Redis round trip. When Redis does not answer within timeout the
// handler applies on_store_error; after repeated failures a circuit breaker
// skips Redis for a second, so an outage adds no latency.
type Store struct {
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

	// Leases: a call for a key in demand on this instance leases several
	// units of its limit, which the instance's later requests for the key
	// take without a call. Every unit is counted in Redis before it is
	// taken, and a lease never holds more than a 2N-th of what the key
	// has left (N instances), so the fleet admits no more than exact
	// decisions would. Not for concurrency zones, which always take in
	// Redis.
	// Default: off.
	Lease bool `json:"lease,omitempty"`

	client  *client
	poolKey string
	opts    *goredis.UniversalOptions
	hold    *clientHold
	// now is the local clock; tests replace it to skew it.
	now func() time.Time
	// scriptClock, if set, is the clock the take script uses instead of
	// the Redis server's (TIME); tests drive the shared vectors with it.
	// With it set, the deny cache is not used and decisions are in that
	// clock.
	scriptClock func() time.Time

	logger *zap.Logger
	// metricsOff is set by a handler with disable_metrics: its leases
	// count in no series.
	metricsOff bool
	// series are the zones' lease_units_total series, by zone.
	series *sync.Map
}

// CaddyModule returns the Caddy module information.
func (Store) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  storage.Namespace + ".redis",
		New: func() caddy.Module { return new(Store) },
	}
}

// clients holds one client per distinct connection config while any
// loaded config uses it, so a config reload keeps its connections.
var clients = caddy.NewUsagePool()

// Provision resolves placeholders in the addresses, checks them and
// attaches the shared client for them.
func (r *Store) Provision(ctx caddy.Context) error {
	r.logger = ctx.Logger()
	routeGoRedisLog()
	if r.Timeout == 0 {
		r.Timeout = caddy.Duration(DefaultTimeout)
	}
	if r.KeyPrefix == "" {
		r.KeyPrefix = DefaultKeyPrefix
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
	val, _, err := clients.LoadOrNew(string(key), func() (caddy.Destructor, error) {
		return r.newClient(opts), nil
	})
	if err != nil {
		return err
	}
	r.client = val.(*client)
	r.poolKey = string(key)
	r.opts = opts
	r.hold = new(clientHold)
	r.series = new(sync.Map)
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("registering metrics: %w", err)
	}
	// A server too old for the scripts refuses the config. One out of
	// reach does not: Redis may be back before the first request, and a
	// connection made then checks the version (see versionCheck).
	var old *errOldServer
	reached := r.client.checkServers(serverCheckTimeout)
	if errors.As(reached, &old) {
		return fmt.Errorf("store redis: %w", reached)
	} else if reached != nil {
		r.logger.Warn("Redis out of reach at load; its version will be checked when the store reaches it",
			zap.Error(reached), zap.String("needs", minRedisText+" or later"))
	}
	// Announce this instance from now on, and read the fleet's size.
	w := r.watcher()
	// The first request needs the fleet's secret to name its keys: read
	// it now, as the watcher would, if Redis is there to ask.
	if reached == nil && w.names.Load() == nil {
		read, cancel := context.WithTimeout(context.Background(), serverCheckTimeout)
		_, _ = w.readSecret(read) // if it fails, the first request or refresh reads it
		cancel()
	}
	if r.Lease {
		r.client.startLeases()
	}
	return nil
}

// newClient makes the connection for r's config, opts made from it.
func (r *Store) newClient(opts *goredis.UniversalOptions) *client {
	c := newClient(opts, r.logger)
	c.timeout = time.Duration(r.Timeout)
	return c
}

// DisableMetrics implements storage.MetricsDisabler: the store counts its
// leases in no series, for a handler with disable_metrics.
func (r *Store) DisableMetrics() {
	r.metricsOff = true
}

// leaseSeries returns the zone's lease_units_total series, or nil with
// disable_metrics.
func (r *Store) leaseSeries(zone string) *leaseSeries {
	if r.metricsOff || r.series == nil || metrics.leaseUnits == nil {
		return nil
	}
	if s, ok := r.series.Load(zone); ok {
		return s.(*leaseSeries)
	}
	s, _ := r.series.LoadOrStore(zone, newLeaseSeries(zone))
	return s.(*leaseSeries)
}

// Validate refuses options that cannot work, with the checks the
// Caddyfile parser makes line by line. Addresses with placeholders are
// checked in Provision, once the placeholders are resolved.
func (r *Store) Validate() error {
	if len(r.Addresses) == 0 {
		return errors.New("store redis: address: missing (want at least one redis:// or rediss:// URL)")
	}
	for _, a := range r.Addresses {
		if err := checkAddress(a); err != nil {
			return fmt.Errorf("store redis: %w", err)
		}
	}
	if err := checkTimeout(time.Duration(r.Timeout)); err != nil {
		return fmt.Errorf("store redis: timeout: %w", err)
	}
	if err := checkKeyPrefix(r.KeyPrefix); err != nil {
		return fmt.Errorf("store redis: key_prefix: %w", err)
	}
	if err := checkPoolSize(r.PoolSize); err != nil {
		return fmt.Errorf("store redis: pool_size: %w", err)
	}
	return r.checkTopology()
}

// checkTopology checks the options that only make sense together.
func (r *Store) checkTopology() error {
	if r.Cluster && r.Sentinel != "" {
		return errors.New("store redis: cluster and sentinel exclude each other (want one of them)")
	}
	if len(r.Addresses) > 1 && !r.Cluster && r.Sentinel == "" {
		return fmt.Errorf("store redis: address: %d addresses given (want one, or cluster or sentinel)", len(r.Addresses))
	}
	return nil
}

// checkAddress parses a Redis URL, unless placeholders in it wait for
// Provision. Its errors name the address with any password masked.
func checkAddress(a string) error {
	if strings.Contains(a, "{") {
		return nil
	}
	_, err := parseAddress(a, strconv.Quote(redactAddress(a)))
	return err
}

func checkTimeout(d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("want a positive duration, got %s", d)
	}
	return nil
}

func checkKeyPrefix(p string) error {
	if strings.ContainsAny(p, "{}") {
		return fmt.Errorf("want a prefix without braces, got %q", p)
	}
	return nil
}

func checkPoolSize(n int) error {
	if n < 0 {
		return fmt.Errorf("want 0 (the go-redis default) or more connections, got %d", n)
	}
	return nil
}

// clientHold is a config's hold on its shared client.
type clientHold struct {
	// inUse counts the config's decisions in flight, plus retired once
	// the config has been cleaned up.
	inUse    atomic.Int64
	detached sync.Once
	// dials is the client's dial watcher for this config's key prefix,
	// found once.
	dials atomic.Pointer[dialWatcher]
}

// retired is added to clientHold.inUse by Cleanup: far above any number
// of decisions in flight, so one comparison tells whether it was added.
const retired = 1 << 40

// Cleanup lets go of the shared client once the last decision of this
// config has finished; the last config using the client closes its
// connections. Caddy cleans up an old config while its requests may still
// be running, and a reload that changes the connection settings must not
// close the connections under them.
func (r *Store) Cleanup() error {
	if r.hold == nil {
		return nil
	}
	if r.hold.inUse.Add(retired) == retired {
		r.detach()
	}
	return nil
}

// acquire returns the client for one decision, which end(own) ends. Until
// this config is cleaned up, and while its decisions run, that is the
// config's own client (own is true). A request of this config that starts
// deciding after that borrows a client from the pool for its one decision
// (the one a newer config with the same settings uses, or its own
// connection), so no request is ever sent to closed connections.
//
// It returns a flag rather than the function that ends the decision: a
// method value would be allocated on every decision.
func (r *Store) acquire() (c *client, own bool, err error) {
	if r.hold.inUse.Add(1) < retired {
		return r.client, true, nil
	}
	r.endOwn()
	val, _, err := clients.LoadOrNew(r.poolKey, func() (caddy.Destructor, error) {
		return r.newClient(r.opts), nil
	})
	if err != nil {
		return nil, false, err
	}
	return val.(*client), false, nil
}

// end ends a decision that acquire started, on the config's own client or
// on one borrowed from the pool.
func (r *Store) end(own bool) {
	if own {
		r.endOwn()
	} else {
		r.deletePoolUse()
	}
}

// endOwn ends a decision on the config's own client.
func (r *Store) endOwn() {
	if r.hold.inUse.Add(-1) == retired {
		r.detach()
	}
}

// detach gives the config's use of the shared client back to the pool.
func (r *Store) detach() {
	r.hold.detached.Do(r.deletePoolUse)
}

func (r *Store) deletePoolUse() {
	if _, err := clients.Delete(r.poolKey); err != nil {
		r.logger.Error("closing Redis connections", zap.Error(err))
	}
}

// parseAddress parses one Redis URL. Errors name the address as name,
// which must have any password masked.
func parseAddress(addr, name string) (*goredis.Options, error) {
	raw := addr
	if !strings.Contains(raw, "://") {
		raw = "redis://" + raw
	}
	fail := func(err error) (*goredis.Options, error) {
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
	opts, err := goredis.ParseURL(raw)
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
func (r *Store) clientOptions(addrs, names []string) (*goredis.UniversalOptions, error) {
	var first *goredis.Options
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
	return &goredis.UniversalOptions{
		Addrs:         hosts,
		IsClusterMode: r.Cluster,
		MasterName:    r.Sentinel,
		Username:      first.Username,
		Password:      first.Password,
		DB:            first.DB,
		TLSConfig:     first.TLSConfig,
		PoolSize:      r.PoolSize,
		ClientName:    clientName,
		// A decision's script must never run twice: a retry after a
		// timeout could take a request that was already taken.
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
		// RESP2: the store needs no push notifications, and with RESP3
		// go-redis peeks each connection for them before every command
		// (1.5% of Caddy's CPU on the Redis allowed path).
		Protocol: 2,
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
//		lease on|off
//	}
func (r *Store) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // store name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := make(map[string]bool)
	for d.NextBlock(0) {
		dir := d.Val()
		if dir != "address" && dir != "addresses" {
			if seen[dir] {
				return d.Errf("store redis: %s: repeated (want it once; address is the one that repeats)", dir)
			}
			seen[dir] = true
		}
		fail := func(err error) error { return d.Errf("store redis: %s: %v", dir, err) }
		switch dir {
		case "address", "addresses":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			for _, a := range args {
				if err := checkAddress(a); err != nil {
					return d.Errf("store redis: %v", err)
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
				return fail(errors.New("missing (want the master name)"))
			}
			r.Sentinel = d.Val()
			if d.NextArg() {
				return d.ArgErr()
			}
		case "timeout":
			var v string
			if !d.AllArgs(&v) {
				return d.ArgErr()
			}
			dur, err := caddy.ParseDuration(v)
			if err != nil || dur <= 0 {
				return fail(fmt.Errorf("want a positive duration, got %q", v))
			}
			r.Timeout = caddy.Duration(dur)
		case "key_prefix":
			if !d.AllArgs(&r.KeyPrefix) {
				return d.ArgErr()
			}
			if err := checkKeyPrefix(r.KeyPrefix); err != nil {
				return fail(err)
			}
		case "pool_size":
			var v string
			if !d.AllArgs(&v) {
				return d.ArgErr()
			}
			n, err := strconv.Atoi(v)
			if err != nil {
				return fail(fmt.Errorf("want an integer, got %q", v))
			}
			if err := checkPoolSize(n); err != nil {
				return fail(err)
			}
			r.PoolSize = n
		case "lease":
			var v string
			if !d.AllArgs(&v) {
				return fail(errors.New("want on or off, after lease"))
			}
			switch v {
			case "on", "off":
				r.Lease = v == "on"
			default:
				return fail(fmt.Errorf("want on or off, got %q", v))
			}
		default:
			return d.Errf("store redis: unknown subdirective %q (want address, cluster, sentinel, timeout, key_prefix, pool_size or lease)", dir)
		}
	}
	if len(r.Addresses) == 0 {
		return d.Err("store redis: address: missing (want at least one redis:// or rediss:// URL)")
	}
	if err := r.checkTopology(); err != nil {
		return d.Err(err.Error())
	}
	return nil
}

// Interface guards
var (
	_ storage.Store           = (*Store)(nil)
	_ storage.Refuser         = (*Store)(nil)
	_ storage.LocalFallback   = (*Store)(nil)
	_ storage.Fleet           = (*Store)(nil)
	_ storage.MetricsDisabler = (*Store)(nil)
	_ caddy.Provisioner       = (*Store)(nil)
	_ caddy.Validator         = (*Store)(nil)
	_ caddy.CleanerUpper      = (*Store)(nil)
	_ caddyfile.Unmarshaler   = (*Store)(nil)
)
