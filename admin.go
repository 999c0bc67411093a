package ratelimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/shed"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

func init() {
	caddy.RegisterModule(adminAPI{})
}

// adminAPI is the admin endpoint /rate_limit/: it lists the running
// zones, shows and resets a key's counts, sets per-key limit overrides and
// zone-wide dials, and shows the running load shedders. Every change acts
// on the zone's store, so with a shared store one call on any instance acts
// on the whole fleet. The admin endpoint's own access rules apply (it
// listens on localhost by default). The status page and the read-only
// routes it reads are also served from a site, by rate_limit_status.
type adminAPI struct {
	logger *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (adminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.rate_limit",
		New: func() caddy.Module { return new(adminAPI) },
	}
}

// Provision sets up the logger for admin changes.
func (a *adminAPI) Provision(ctx caddy.Context) error {
	a.logger = ctx.Logger()
	return nil
}

// Routes returns the /rate_limit/ routes.
func (a *adminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/rate_limit/", Handler: caddy.AdminHandlerFunc(a.serve)}}
}

// running knows the zones of the loaded configs by name. During a reload
// two configs run at once; the zone provisioned last is the one in force.
var running = struct {
	sync.Mutex
	zones map[string][]*Zone
}{zones: make(map[string][]*Zone)}

func registerZone(z *Zone) {
	running.Lock()
	defer running.Unlock()
	running.zones[z.Name] = append(running.zones[z.Name], z)
}

func unregisterZone(z *Zone) {
	running.Lock()
	defer running.Unlock()
	zs := slices.DeleteFunc(running.zones[z.Name], func(o *Zone) bool { return o == z })
	if len(zs) == 0 {
		delete(running.zones, z.Name)
	} else {
		running.zones[z.Name] = zs
	}
}

// changesOff holds what turns the admin API's changes off while its
// config runs (admin_changes off): handlers and the rate_limit app, with
// where each is, for the refusal to name. The admin API is one per
// process, whatever the configs: while any one running says off, changes
// are off, since a config that says on cannot know what the other meant.
// During a reload both configs run for a moment, so turning them back on
// takes effect once the old config is cleaned up.
var changesOff = struct {
	sync.Mutex
	by map[any]string
}{by: make(map[any]string)}

// turnChangesOff turns the admin API's changes off until releaseChanges
// is called with by, which is at where.
func turnChangesOff(by any, where string) {
	changesOff.Lock()
	defer changesOff.Unlock()
	changesOff.by[by] = where
}

// releaseChanges takes back by's turnChangesOff, if it made one.
func releaseChanges(by any) {
	changesOff.Lock()
	defer changesOff.Unlock()
	delete(changesOff.by, by)
}

// checkChangesAllowed refuses a change, with 403 and what turned changes
// off, while any running config has admin_changes off.
func checkChangesAllowed() error {
	changesOff.Lock()
	var where []string
	for _, w := range changesOff.by {
		where = append(where, w)
	}
	changesOff.Unlock()
	if len(where) == 0 {
		return nil
	}
	slices.Sort(where)
	where = slices.Compact(where)
	return apiError(http.StatusForbidden, fmt.Errorf("rate limit changes through the admin API are turned off by admin_changes off in the running config (%s); to turn them on, remove it and reload the config",
		strings.Join(where, "; ")))
}

// runningZone returns the zone in force with that name.
func runningZone(name string) *Zone {
	running.Lock()
	defer running.Unlock()
	zs := running.zones[name]
	if len(zs) == 0 {
		return nil
	}
	return zs[len(zs)-1]
}

// zoneInfo is a zone as GET /rate_limit/zones shows it.
type zoneInfo struct {
	Name      string               `json:"name"`
	Algorithm algorithms.Algorithm `json:"algorithm"`
	Window    string               `json:"window,omitempty"`
	Burst     int64                `json:"burst,omitempty"`
	Buckets   int                  `json:"buckets,omitempty"`
	Lease     string               `json:"lease,omitempty"`
	Limit     Alternatives         `json:"limit"`
	Store     string               `json:"store"`
	DryRun    bool                 `json:"dry_run,omitempty"`
	Dial      *storage.ZoneDial    `json:"dial,omitempty"`
	// Instances is N, the live instances sharing the zone's store, for a
	// store shared by a fleet (Redis).
	Instances int `json:"instances,omitempty"`
}

// keyInfo is a key as GET /rate_limit/zones/<zone>/keys/<key> shows it.
type keyInfo struct {
	Zone string `json:"zone"`
	Key  string `json:"key"`
	// Hash is how the key is shown in logs, events and top keys, unless
	// log_keys is on: so an operator can tell whether a hash seen there
	// is this key.
	Hash string `json:"hash,omitempty"`
	// Used is what counts against the limit now: the current window's
	// count plus, for a sliding tail, the previous window's weighted share;
	// for a sliding window the counts of its n+1 sub-windows (Current the
	// current one's, Previous the others'); for gcra the units the bucket
	// lacks; for concurrency the units in flight. Current and the previous
	// window's are for windowed algorithms only.
	Used             int64             `json:"used"`
	Current          int64             `json:"current"`
	Previous         int64             `json:"previous"`
	PreviousWeighted int64             `json:"previous_weighted"`
	Reset            time.Time         `json:"reset"`
	Override         *storage.Override `json:"override,omitempty"`
	// BanEnds is when the key's ban ends, if it is banned (ban).
	BanEnds time.Time `json:"ban_ends,omitzero"`
}

// serve routes one admin request:
//
//	GET    /rate_limit/                               the status page (/rate_limit redirects there)
//	GET    /rate_limit/zones
//	GET    /rate_limit/zones/<zone>/keys/<key>
//	DELETE /rate_limit/zones/<zone>/keys/<key>
//	PUT    /rate_limit/zones/<zone>/keys/<key>/limit   {"limit": n, "ttl": "24h"}
//	DELETE /rate_limit/zones/<zone>/keys/<key>/limit
//	GET    /rate_limit/zones/<zone>/top?n=20
//	PUT    /rate_limit/zones/<zone>/dial               {"mode": m, "limit": n, "ttl": "1h"}
//	DELETE /rate_limit/zones/<zone>/dial
//	GET    /rate_limit/shed
//
// Zone names and keys are path segments, URL-path-escaped. The routes
// that only read answer HEAD as well.
func (a *adminAPI) serve(w http.ResponseWriter, r *http.Request) error {
	parts, err := pathSegments(r.URL.EscapedPath())
	if err != nil {
		return err
	}
	if len(parts) == 1 && parts[0] == "rate_limit" {
		return serveStatusPage(w, r, r.URL)
	}
	if len(parts) == 2 && parts[0] == "rate_limit" && parts[1] == "shed" {
		return serveShedders(w, r)
	}
	if len(parts) < 2 || parts[0] != "rate_limit" || parts[1] != "zones" {
		return apiError(http.StatusNotFound, errors.New("not found; see GET /rate_limit/zones"))
	}
	if len(parts) == 2 {
		return serveZones(w, r)
	}
	z, err := adminZone(parts[2])
	if err != nil {
		return err
	}
	switch {
	case len(parts) == 4 && parts[3] == "top":
		return serveTop(w, r, z)
	case len(parts) == 4 && parts[3] == "dial":
		return a.dial(w, r, z)
	case len(parts) == 5 && parts[3] == "keys":
		return a.key(w, r, z, parts[4])
	case len(parts) == 6 && parts[3] == "keys" && parts[5] == "limit":
		return a.override(w, r, z, parts[4])
	}
	return apiError(http.StatusNotFound, errors.New("not found; see GET /rate_limit/zones"))
}

// pathSegments splits an escaped URL path at its slashes, after trimming
// those at its ends, and unescapes each segment, so that a zone name or a
// key may hold a slash (%2F).
func pathSegments(escaped string) ([]string, error) {
	var parts []string
	for _, p := range strings.Split(strings.Trim(escaped, "/"), "/") {
		u, err := url.PathUnescape(p)
		if err != nil {
			return nil, apiError(http.StatusBadRequest, fmt.Errorf("path segment %q: %w", p, err))
		}
		parts = append(parts, u)
	}
	return parts, nil
}

// adminZone returns the running zone named name, if its store has an
// admin API to ask.
func adminZone(name string) (*Zone, error) {
	z := runningZone(name)
	if z == nil {
		return nil, apiError(http.StatusNotFound, fmt.Errorf("zone %q: no such zone in the running config", name))
	}
	if z.admin == nil {
		return nil, apiError(http.StatusNotImplemented, fmt.Errorf("zone %q: store %s has no admin API", z.Name, z.storeName))
	}
	return z, nil
}

// readOnly refuses a request that is not a GET or a HEAD, for the routes
// that only show something: the status page and the JSON it reads.
func readOnly(w http.ResponseWriter, r *http.Request) error {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return nil
	}
	w.Header().Set("Allow", "GET, HEAD")
	return methodNotAllowed(r)
}

// serveShedders answers GET /rate_limit/shed: the running load shedders.
func serveShedders(w http.ResponseWriter, r *http.Request) error {
	if err := readOnly(w, r); err != nil {
		return err
	}
	return writeJSON(w, shed.List())
}

// serveZones answers GET /rate_limit/zones: the running zones.
func serveZones(w http.ResponseWriter, r *http.Request) error {
	if err := readOnly(w, r); err != nil {
		return err
	}
	running.Lock()
	names := make([]string, 0, len(running.zones))
	for name := range running.zones {
		names = append(names, name)
	}
	running.Unlock()
	slices.Sort(names)
	out := []zoneInfo{}
	now := time.Now()
	for _, name := range names {
		z := runningZone(name)
		if z == nil {
			continue
		}
		info := zoneInfo{Name: z.Name, Algorithm: z.Algorithm, Burst: z.Burst, Buckets: z.Buckets,
			Limit: z.LimitAlternatives, Store: z.storeName, DryRun: z.DryRun}
		if z.Algorithm == algorithms.Concurrency {
			info.Lease = time.Duration(z.Lease).String()
		} else {
			info.Window = time.Duration(z.Window).String()
		}
		if z.admin != nil {
			if d, ok := z.admin.ZoneDial(z.Name); ok && d.Active(now) {
				info.Dial = &d
			}
		}
		if f, ok := z.admin.(storage.Fleet); ok {
			info.Instances = f.Instances()
		}
		out = append(out, info)
	}
	return writeJSON(w, out)
}

// topInfo is GET /rate_limit/zones/<zone>/top's answer: this instance's
// heaviest keys in the zone over about the last minute, and the most any
// count may be overstated.
type topInfo struct {
	Zone  string   `json:"zone"`
	Keys  []topKey `json:"keys"`
	Error int64    `json:"error"`
}

// DefaultTopKeys is how many keys GET .../top shows without ?n.
const DefaultTopKeys = 20

// serveTop answers GET /rate_limit/zones/<zone>/top: the zone's
// heaviest keys, as hashes where log_keys off hides keys.
func serveTop(w http.ResponseWriter, r *http.Request, z *Zone) error {
	if err := readOnly(w, r); err != nil {
		return err
	}
	n := DefaultTopKeys
	if v := r.URL.Query().Get("n"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 || n > topTracked {
			return apiError(http.StatusBadRequest, fmt.Errorf("n: want a number of keys from 1 to %d, got %q", topTracked, v))
		}
	}
	keys, bound := z.top.top(n)
	if !z.showKeys {
		for i := range keys {
			keys[i].Key = hiddenKey(keys[i].Key)
		}
	}
	return writeJSON(w, topInfo{Zone: z.Name, Keys: keys, Error: bound})
}

func (a *adminAPI) key(w http.ResponseWriter, r *http.Request, z *Zone, raw string) error {
	key := storage.BoundKey(raw)
	switch r.Method {
	case http.MethodGet:
		st, err := z.admin.KeyState(r.Context(), z.Name, key, z.period)
		if err != nil {
			return apiError(http.StatusBadGateway, err)
		}
		// Decide for a request of no cost against no limit reports what
		// counts now, without charging anything. A GCRA bucket is measured
		// against the limit the key was last charged with, kept with its
		// TAT: Used is then the units its bucket lacks, Reset when it is
		// full. A concurrency key's Used is the units in flight.
		rate := algorithms.Rate{Units: maxLimit, Window: z.period}
		if z.Algorithm == algorithms.GCRA {
			rate = algorithms.Rate{Units: max(st.Counts.Previous, 1), Window: z.period, Burst: z.Burst}
		}
		if z.Algorithm == algorithms.SlidingWindow {
			// Used is the sum of the ring's sub-windows; Current the
			// current sub-window's count, Previous the other n's.
			rate.Buckets = z.Buckets
			d, ring := algorithms.DecideRing(st.Ring, time.Now(), rate, 0)
			current := ring.Counts[d.Window%int64(ring.Buckets+1)]
			return writeJSON(w, keyInfo{Zone: z.Name, Key: key, Hash: z.hash(key), Used: d.Used, Current: current, Previous: d.Used - current,
				Reset: d.Reset, Override: st.Override, BanEnds: st.BanEnds})
		}
		d, rolled := algorithms.Decide(z.Algorithm, st.Counts, time.Now(), rate, 0)
		info := keyInfo{Zone: z.Name, Key: key, Hash: z.hash(key), Used: d.Used, Reset: d.Reset, Override: st.Override, BanEnds: st.BanEnds}
		if z.Algorithm.Windowed() {
			info.Current, info.Previous, info.PreviousWeighted = rolled.Current, rolled.Previous, d.Used-rolled.Current
		}
		return writeJSON(w, info)
	case http.MethodDelete:
		if err := checkChangesAllowed(); err != nil {
			return err
		}
		if err := z.admin.ResetKey(r.Context(), z.Name, key); err != nil {
			return apiError(http.StatusBadGateway, err)
		}
		a.changed(r, "key reset", z, zap.String("key", shownKey(key, z.showKeys)))
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	return methodNotAllowed(r)
}

func (a *adminAPI) override(w http.ResponseWriter, r *http.Request, z *Zone, raw string) error {
	key := storage.BoundKey(raw)
	if r.Method != http.MethodPut && r.Method != http.MethodDelete {
		return methodNotAllowed(r)
	}
	if err := checkChangesAllowed(); err != nil {
		return err
	}
	switch r.Method {
	case http.MethodPut:
		var body struct {
			Limit int64          `json:"limit"`
			TTL   caddy.Duration `json:"ttl"`
		}
		if err := decodeBody(r, &body); err != nil {
			return err
		}
		if body.Limit < 1 || body.Limit > maxLimit {
			return apiError(http.StatusBadRequest, fmt.Errorf("limit: want an integer from 1 to %d, got %d", maxLimit, body.Limit))
		}
		if body.TTL < 0 {
			return apiError(http.StatusBadRequest, fmt.Errorf("ttl: want a positive duration, got %s", time.Duration(body.TTL)))
		}
		o := storage.Override{Limit: body.Limit}
		if body.TTL > 0 {
			o.Expires = time.Now().Add(time.Duration(body.TTL))
		}
		if err := z.admin.SetOverride(r.Context(), z.Name, key, o); errors.Is(err, storage.ErrTooManyOverrides) {
			return apiError(http.StatusInsufficientStorage, err)
		} else if err != nil {
			return apiError(http.StatusBadGateway, err)
		}
		a.changed(r, "key limit override set", z, zap.String("key", shownKey(key, z.showKeys)), zap.Int64("limit", o.Limit), zap.Time("expires", o.Expires))
		return writeJSON(w, o)
	default: // DELETE
		if err := z.admin.DeleteOverride(r.Context(), z.Name, key); err != nil {
			return apiError(http.StatusBadGateway, err)
		}
		a.changed(r, "key limit override removed", z, zap.String("key", shownKey(key, z.showKeys)))
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
}

func (a *adminAPI) dial(w http.ResponseWriter, r *http.Request, z *Zone) error {
	if r.Method != http.MethodPut && r.Method != http.MethodDelete {
		return methodNotAllowed(r)
	}
	if err := checkChangesAllowed(); err != nil {
		return err
	}
	switch r.Method {
	case http.MethodPut:
		var body struct {
			Mode  string         `json:"mode"`
			Limit int64          `json:"limit"`
			TTL   caddy.Duration `json:"ttl"`
		}
		if err := decodeBody(r, &body); err != nil {
			return err
		}
		switch body.Mode {
		case "", storage.ModeEnforce, storage.ModeDryRun, storage.ModeOff:
		default:
			return apiError(http.StatusBadRequest, fmt.Errorf("mode: want enforce, dry_run or off, got %q", body.Mode))
		}
		if body.Limit < 0 || body.Limit > maxLimit {
			return apiError(http.StatusBadRequest, fmt.Errorf("limit: want an integer from 1 to %d, got %d", maxLimit, body.Limit))
		}
		if body.TTL < 0 {
			return apiError(http.StatusBadRequest, fmt.Errorf("ttl: want a positive duration, got %s", time.Duration(body.TTL)))
		}
		if body.Mode == "" && body.Limit == 0 {
			return apiError(http.StatusBadRequest, errors.New("want a mode, a limit or both"))
		}
		d := storage.ZoneDial{Mode: body.Mode, Limit: body.Limit}
		if body.TTL > 0 {
			d.Expires = time.Now().Add(time.Duration(body.TTL))
		}
		if err := z.admin.SetZoneDial(r.Context(), z.Name, d); err != nil {
			return apiError(http.StatusBadGateway, err)
		}
		a.changed(r, "zone dial set", z, zap.String("mode", d.Mode), zap.Int64("limit", d.Limit), zap.Time("expires", d.Expires))
		return writeJSON(w, d)
	default: // DELETE
		if err := z.admin.DeleteZoneDial(r.Context(), z.Name); err != nil {
			return apiError(http.StatusBadGateway, err)
		}
		a.changed(r, "zone dial removed", z)
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
}

// changed logs an admin change at info level, with who asked for it.
func (a *adminAPI) changed(r *http.Request, what string, z *Zone, fields ...zap.Field) {
	fields = append([]zap.Field{zap.String("zone", z.Name), zap.String("store", z.storeName), zap.String("remote_addr", r.RemoteAddr)}, fields...)
	a.logger.Info("rate limit admin: "+what, fields...)
}

// decodeBody reads a JSON body into v, refusing unknown fields.
func decodeBody(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return apiError(http.StatusBadRequest, fmt.Errorf("body: want a JSON object: %w", err))
	}
	return nil
}

func writeJSON(w http.ResponseWriter, v any) error {
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(v)
}

func apiError(status int, err error) error {
	return caddy.APIError{HTTPStatus: status, Err: err, Message: err.Error()}
}

func methodNotAllowed(r *http.Request) error {
	return apiError(http.StatusMethodNotAllowed, fmt.Errorf("method %s not allowed", r.Method))
}

// Interface guards
var (
	_ caddy.AdminRouter = (*adminAPI)(nil)
	_ caddy.Provisioner = (*adminAPI)(nil)
)
