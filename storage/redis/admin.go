package redis

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// The Redis store's admin side. A per-key override lives in the key's
// counter hash (fields o and ox), so the take script reads it with the
// counters, in the same call. A zone's dial is a key of its own,
// <prefix>dial:{<zone>}, expiring with the dial. Every change also bumps
// <prefix>admin:epoch. Each instance rereads the dials of the zones it
// serves, and the epoch, once a second; when the epoch has moved it forgets
// its cached rejections, so a key reset or given an override is decided
// afresh everywhere within a second.

// dialRefresh is how often an instance rereads dials and the epoch.
const dialRefresh = time.Second

func (r *Store) dialKey(zone string) string { return r.KeyPrefix + "dial:{" + zone + "}" }
func (r *Store) epochKey() string           { return r.KeyPrefix + "admin:epoch" }

// adminCtx bounds an admin call: the store's timeout, but at least a
// second, since an operator waits for it, not a request.
func (r *Store) adminCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, max(time.Duration(r.Timeout), time.Second))
}

// KeyState implements storage.Admin.
func (r *Store) KeyState(ctx context.Context, zone, key string, rate algorithms.Rate) (storage.KeyState, error) {
	ctx, cancel := r.adminCtx(ctx)
	defer cancel()
	names, err := r.keyNames(ctx, r.client)
	if err != nil {
		return storage.KeyState{}, fmt.Errorf("redis: %w", err)
	}
	vals, err := keyStateScript.Run(ctx, r.client.rdb, []string{names.counter(zone, key)}).Int64Slice()
	if err != nil {
		return storage.KeyState{}, fmt.Errorf("redis: %w", err)
	}
	// The server's instants, moved to the local clock.
	local := func(ms int64) time.Time { return time.Now().Add(time.Duration(ms-vals[0]) * time.Millisecond) }
	st := storage.KeyState{Counts: algorithms.Counts{W: vals[1], C: vals[2], P: vals[3]}}
	if vals[4] != 0 {
		st.Override = &storage.Override{Limit: vals[4]}
		if vals[5] != 0 {
			st.Override.Expires = local(vals[5])
		}
	}
	if vals[6] != 0 {
		st.BanEnds = local(vals[6])
	}
	// Counted at the server's now, in whose clock the costs in flight
	// were taken.
	if inFlight := (algorithms.WindowCounts{Window: vals[7], Current: vals[8], Previous: vals[9]}); inFlight.Current > 0 || inFlight.Previous > 0 {
		st.InFlight = algorithms.InFlightUnits(inFlight, time.UnixMilli(vals[0]), rate)
	}
	if ring := vals[10:]; len(ring) > 0 {
		st.Ring = algorithms.Ring{Index: vals[1], Buckets: len(ring) - 1}
		copy(st.Ring.Counts[:], ring)
	}
	return st, nil
}

// ResetKey implements storage.Admin: it forgets the key's counts and lifts its
// ban, on every instance sharing the store.
func (r *Store) ResetKey(ctx context.Context, zone, key string) error {
	return r.adminOp(ctx, "reset", zone, key, 0, 0)
}

// SetOverride implements storage.Admin.
func (r *Store) SetOverride(ctx context.Context, zone, key string, o storage.Override) error {
	var ttl int64
	if !o.Expires.IsZero() {
		ttl = max(time.Until(o.Expires).Milliseconds(), 1)
	}
	return r.adminOp(ctx, "override", zone, key, o.Limit, ttl)
}

// DeleteOverride implements storage.Admin.
func (r *Store) DeleteOverride(ctx context.Context, zone, key string) error {
	return r.adminOp(ctx, "unoverride", zone, key, 0, 0)
}

// adminOp runs one change of the admin state of key in zone
// (scripts/admin.lua) and bumps the epoch, so that every instance forgets
// its cached rejections.
func (r *Store) adminOp(ctx context.Context, op, zone, key string, limit, ttl int64) error {
	ctx, cancel := r.adminCtx(ctx)
	defer cancel()
	names, err := r.keyNames(ctx, r.client)
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	if err := adminScript.Run(ctx, r.client.rdb, []string{names.counter(zone, key)}, op, limit, ttl).Err(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	return r.bumpEpoch(ctx)
}

func (r *Store) bumpEpoch(ctx context.Context) error {
	if err := r.client.rdb.Incr(ctx, r.epochKey()).Err(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	// This instance need not wait for its next refresh.
	r.client.adminChanged()
	return nil
}

// adminChanged forgets what an admin change may have made wrong: the
// cached rejections, and the leases (see lease.go).
func (c *client) adminChanged() {
	c.denies.clear()
	c.leases.drop()
}

// SetZoneDial implements storage.Admin.
func (r *Store) SetZoneDial(ctx context.Context, zone string, d storage.ZoneDial) error {
	ctx, cancel := r.adminCtx(ctx)
	defer cancel()
	var ttl time.Duration
	if !d.Expires.IsZero() {
		ttl = max(time.Until(d.Expires), time.Millisecond)
	}
	b, err := json.Marshal(struct {
		Mode  string `json:"mode,omitempty"`
		Limit int64  `json:"limit,omitempty"`
	}{d.Mode, d.Limit})
	if err != nil {
		return err
	}
	if err := r.client.rdb.Set(ctx, r.dialKey(zone), b, ttl).Err(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	r.watcher().set(zone, d)
	return r.bumpEpoch(ctx)
}

// DeleteZoneDial implements storage.Admin.
func (r *Store) DeleteZoneDial(ctx context.Context, zone string) error {
	ctx, cancel := r.adminCtx(ctx)
	defer cancel()
	if err := r.client.rdb.Del(ctx, r.dialKey(zone)).Err(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	r.watcher().set(zone, storage.ZoneDial{})
	return r.bumpEpoch(ctx)
}

// ZoneDial implements storage.Admin: it answers from what this instance last read, and
// asks for zone to be read from then on.
func (r *Store) ZoneDial(zone string) (storage.ZoneDial, bool) {
	return r.watcher().dial(zone)
}

// watcher returns the dial watcher of this store's client and key prefix.
func (r *Store) watcher() *dialWatcher {
	if w := r.hold.dials.Load(); w != nil {
		return w
	}
	w := r.client.watcher(r.KeyPrefix, r)
	r.hold.dials.Store(w)
	return w
}

// dialWatcher keeps the dials of the zones asked about, for one client and
// key prefix, rereading them and the epoch once a second, in the same
// round trip that announces this instance, counts the fleet and reads the
// secret the store's key names are derived from (keys.go).
type dialWatcher struct {
	client       *client
	dialKey      func(zone string) string
	epochKey     string
	instancesKey string
	logger       *zap.Logger

	prefix    string
	secretKey string
	// offer is the secret this instance writes if Redis has none.
	offer string
	// names names the store's keys, once the secret has been read.
	names atomic.Pointer[keyNames]

	dials storage.DialTable

	// wake asks for a refresh before the next tick.
	wake chan struct{}

	mu    sync.Mutex
	zones map[string]bool
	epoch string
	// sets counts the dials this instance wrote, so that a refresh that
	// read Redis before one of them does not undo it.
	sets int
}

// watcher returns the client's dial watcher for prefix, starting it on
// first use; it stops when the client is closed.
func (c *client) watcher(prefix string, r *Store) *dialWatcher {
	c.watchersMu.Lock()
	defer c.watchersMu.Unlock()
	if w, ok := c.watchers[prefix]; ok {
		return w
	}
	w := &dialWatcher{client: c, dialKey: r.dialKey, epochKey: r.epochKey(), instancesKey: r.instancesKey(), logger: r.logger,
		prefix: prefix, secretKey: r.tagSecretKey(), offer: newTagSecret(),
		zones: make(map[string]bool), wake: make(chan struct{}, 1)}
	if c.watchers == nil {
		c.watchers = make(map[string]*dialWatcher)
	}
	c.watchers[prefix] = w
	w.wake <- struct{}{} // the first reading at once
	c.watching.Add(1)
	go func() {
		defer c.watching.Done()
		w.run()
	}()
	return w
}

func (w *dialWatcher) dial(zone string) (storage.ZoneDial, bool) {
	if d, ok := w.dials.Get(zone); ok {
		return d, d.Mode != "" || d.Limit > 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.zones[zone] {
		w.zones[zone] = true
		w.dials.Set(zone, storage.ZoneDial{})
		// Read it now rather than at the next tick, without making this
		// request wait for Redis.
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
	return storage.ZoneDial{}, false
}

// set records a dial this instance just wrote, ahead of the next refresh.
func (w *dialWatcher) set(zone string, d storage.ZoneDial) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.zones[zone] = true
	w.sets++
	w.dials.Set(zone, d)
}

func (w *dialWatcher) run() {
	t := time.NewTicker(dialRefresh)
	defer t.Stop()
	for {
		select {
		case <-w.client.closed:
			return
		case <-t.C:
		case <-w.wake:
		}
		w.refresh()
	}
}

// refresh rereads the dials, the epoch and the secret the store's key
// names derive from, announces this instance and counts the live ones,
// with one round trip.
func (w *dialWatcher) refresh() {
	ctx, cancel := context.WithTimeout(context.Background(), dialRefresh)
	defer cancel()
	w.mu.Lock()
	zones := make([]string, 0, len(w.zones))
	for z := range w.zones {
		zones = append(zones, z)
	}
	sets := w.sets
	w.mu.Unlock()
	var epoch, secret *goredis.StringCmd
	var live *goredis.Cmd
	gets := make([]*goredis.StringCmd, len(zones))
	cmds, err := w.client.rdb.Pipelined(ctx, func(p goredis.Pipeliner) error {
		epoch = p.Get(ctx, w.epochKey)
		live = announce(ctx, p, w.instancesKey)
		secret = w.querySecret(ctx, p)
		for i, z := range zones {
			gets[i] = p.Get(ctx, w.dialKey(z))
		}
		return nil
	})
	if goredis.HasErrorPrefix(live.Err(), "NOSCRIPT") {
		live, err = announceAgain(ctx, w.client.rdb, w.instancesKey, cmds)
	}
	if err != nil && !errors.Is(err, goredis.Nil) {
		// Keep the dials and the fleet last read; the store's errors are
		// logged where requests meet them.
		return
	}
	if secret.Err() == nil {
		w.learnSecret(secret.Val())
	}
	// Redis answers: what the local fallback admitted meanwhile is
	// taken there now (the catch-up), whether or not a request comes to find it.
	if owed := w.client.answered(); owed != nil {
		go w.client.catchUp(owed)
	}
	if n, err := live.Int64(); err == nil {
		w.client.fleet.n.Store(n)
		if metrics.instances != nil {
			metrics.instances.WithLabelValues("redis").Set(float64(n))
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if e := epoch.Val(); e != w.epoch {
		w.epoch = e
		w.client.adminChanged()
	}
	if w.sets != sets {
		return // a dial written meanwhile; the next refresh reads it
	}
	next := make(map[string]storage.ZoneDial, len(zones))
	for i, z := range zones {
		var d storage.ZoneDial
		if b, err := gets[i].Bytes(); err == nil {
			if err := json.Unmarshal(b, &d); err != nil {
				w.logger.Warn("unreadable rate limit dial in Redis", zap.String("zone", z), zap.Error(err))
			}
		}
		next[z] = d
	}
	w.dials.Replace(next)
}

var (
	//go:embed scripts/admin.lua
	adminSource string
	//go:embed scripts/key_state.lua
	keyStateSource string

	adminScript    = goredis.NewScript(adminSource)
	keyStateScript = goredis.NewScript(keyStateSource)
)

var _ storage.Admin = (*Store)(nil)
