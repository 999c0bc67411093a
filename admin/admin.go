// Package admin is the rate limiter's admin side: the admin endpoint's
// /rate_limit/ routes, the status page (also served from a site, by the
// rate_limit_status handler), the caddy rate-limit command that calls the
// routes, and the rate_limit app, the global option that turns their
// changes off. The rate_limit handler registers its zones here while its
// config runs; this package knows them only as Zone.
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
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
	"github.com/d61b427a/caddy-rate-limit/internal/money"
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

// Zone is a running zone as the routes see it: what they show of it and
// ask of it. The rate_limit handler's zones are Zones. Each alternative
// of a zone's key (ZoneInfo.Key) counts in a key space of its own, so
// the store keeps a key as its value in the space of the alternative it
// came from: a stored key.
type Zone interface {
	// Info is the zone's config as GET /rate_limit/zones shows it,
	// without the dial in force and the instances, which the routes ask
	// its store for.
	Info() ZoneInfo
	// Admin is the admin side of the zone's store, nil if the store has
	// none.
	Admin() storage.Admin
	// AlternativesOf returns the alternatives of the zone's key (of
	// Info's Key) that could have given key, a value bounded by
	// storage.BoundKey: those whose literal text it has, for one.
	AlternativesOf(key string) []string
	// StoredKey is the stored key of key, a value bounded by
	// storage.BoundKey, from the alternative from (one of Info's Key).
	StoredKey(key, from string) string
	// KeyInfo reads a stored key's state from the store and tells what
	// it counts now under the zone's algorithm, and the alternative it
	// came from.
	KeyInfo(ctx context.Context, stored string) (KeyInfo, error)
	// Top returns the zone's n heaviest keys on this instance, as
	// stored, with the alternative each came from, and the most any
	// count may be overstated.
	Top(n int) ([]TopKey, int64)
	// ShownKey is a stored key as the zone shows it outside the
	// request's own handlers: its value under log_keys on, else its
	// hash, since keys are often credentials.
	ShownKey(stored string) string
}

// running knows the zones of the loaded configs by name. During a reload
// two configs run at once; the zone registered last is the one in force.
var running = struct {
	sync.Mutex
	zones map[string][]Zone
}{zones: make(map[string][]Zone)}

// RegisterZone puts z in the routes' view, under its name, until
// UnregisterZone. A handler registers its zones as it is provisioned.
func RegisterZone(z Zone) {
	name := z.Info().Name
	running.Lock()
	defer running.Unlock()
	running.zones[name] = append(running.zones[name], z)
}

// UnregisterZone takes z, registered by RegisterZone, out of the routes'
// view. A handler unregisters its zones as it is cleaned up.
func UnregisterZone(z Zone) {
	name := z.Info().Name
	running.Lock()
	defer running.Unlock()
	zs := slices.DeleteFunc(running.zones[name], func(o Zone) bool { return o == z })
	if len(zs) == 0 {
		delete(running.zones, name)
	} else {
		running.zones[name] = zs
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

// TurnChangesOff turns the admin API's changes off until ReleaseChanges
// is called with by, which is at where. A handler with admin_changes off
// calls it as it is provisioned.
func TurnChangesOff(by any, where string) {
	changesOff.Lock()
	defer changesOff.Unlock()
	changesOff.by[by] = where
}

// ReleaseChanges takes back by's TurnChangesOff, if it made one.
func ReleaseChanges(by any) {
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

// keySpaces returns the alternatives of the keys of the running zones
// named name, each once: zones of one name share their counters, and a
// key of any of their alternatives may be asked for. With key set, only
// those that could have given key, a bounded value.
func keySpaces(name, key string) []string {
	running.Lock()
	zs := slices.Clone(running.zones[name])
	running.Unlock()
	var out []string
	for _, z := range zs {
		alts := z.Info().Key
		if key != "" {
			alts = z.AlternativesOf(key)
		}
		for _, alt := range alts {
			if !slices.Contains(out, alt) {
				out = append(out, alt)
			}
		}
	}
	return out
}

// runningZone returns the zone in force with that name.
func runningZone(name string) Zone {
	running.Lock()
	defer running.Unlock()
	zs := running.zones[name]
	if len(zs) == 0 {
		return nil
	}
	return zs[len(zs)-1]
}

// ZoneInfo is a zone as GET /rate_limit/zones shows it.
type ZoneInfo struct {
	Name      string               `json:"name"`
	Algorithm algorithms.Algorithm `json:"algorithm"`
	// Window is the zone's window as written: a length ("1h0m0s") or a
	// calendar period ("month").
	Window string `json:"window,omitempty"`
	// Timezone is, for a calendar period, the time zone its periods
	// start at midnight in; PeriodEnds when the current one ends, and
	// with it the counts of a fixed window.
	Timezone   string    `json:"timezone,omitempty"`
	PeriodEnds time.Time `json:"period_ends,omitzero"`
	Burst      int64     `json:"burst,omitempty"`
	Buckets    int       `json:"buckets,omitempty"`
	Hold       string    `json:"hold,omitempty"`
	// Key is the alternatives of the zone's key, then the client's
	// address it falls back to ({http.vars.client_ip}) unless it is
	// one: each counts in a key space of its own, which the key routes'
	// from names. With zones of the same name in several handlers, all
	// of theirs.
	Key    []string `json:"key"`
	Limit  []string `json:"limit"`
	Store  string   `json:"store"`
	DryRun bool     `json:"dry_run,omitempty"`
	// Units tells that the zone limits what responses cost (cost_from):
	// its limit, its keys' counts and its top keys are in cost units
	// (an LLM API's tokens), not requests. Unit is picodollars for a
	// zone priced in money (cost_from usage price), whose limit is
	// written in dollars.
	Units bool              `json:"units,omitempty"`
	Unit  string            `json:"unit,omitempty"`
	Dial  *storage.ZoneDial `json:"dial,omitempty"`
	// Dollars is, in a zone priced in money, its dial's limit in dollars
	// (dial_limit).
	Dollars Dollars `json:"dollars,omitempty"`
	// Instances is N, the live instances sharing the zone's store, for a
	// store shared by a fleet (Redis).
	Instances int `json:"instances,omitempty"`
}

// KeyInfo is a key as GET /rate_limit/zones/<zone>/keys/<key> shows it.
type KeyInfo struct {
	Zone string `json:"zone"`
	Key  string `json:"key"`
	// From is the alternative of the zone's key the key is counted
	// under (ZoneInfo.Key): the same value from another alternative is
	// another key. It is empty for a key asked for without from that
	// holds nothing under any alternative.
	From string `json:"from,omitempty"`
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
	// Debt is, for a key of a zone that limits what responses cost
	// (cost_from), the units its count stands past its limit: responses
	// that cost more than their reservations take the difference past
	// the limit, and the key is refused until time has paid it off. It
	// is unset when the key's limit depends on the request (a limit
	// placeholder with neither override nor dial limit).
	Debt *int64 `json:"debt,omitempty"`
	// Reserved is, for a key of a zone that limits what responses cost
	// (cost_from), the units reserved by its requests still in flight,
	// on every instance that shares the store: admitted, and their
	// responses not done, so not trued up yet. They are part of Used
	// until then. The store forgets a reservation once the window after
	// the one it was taken in has ended: a request admitted before the
	// zone's previous window began is no longer counted, nor, by then,
	// one whose instance died before its response ended.
	Reserved *int64 `json:"reserved,omitempty"`
	// Unit is picodollars in a zone priced in money, and Dollars its
	// amounts above (used, current, previous, previous_weighted, and
	// override, debt and reserved where set) in dollars.
	Unit    string  `json:"unit,omitempty"`
	Dollars Dollars `json:"dollars,omitempty"`
}

// serve routes one admin request:
//
//	GET    /rate_limit/                               the status page (/rate_limit redirects there)
//	GET    /rate_limit/zones
//	GET    /rate_limit/zones/<zone>/keys/<key>[?from=<alternative>]
//	DELETE /rate_limit/zones/<zone>/keys/<key>[?from=<alternative>]
//	PUT    /rate_limit/zones/<zone>/keys/<key>/limit[?from=<alternative>]   {"limit": n, "ttl": "24h"}
//	DELETE /rate_limit/zones/<zone>/keys/<key>/limit[?from=<alternative>]
//	GET    /rate_limit/zones/<zone>/top?n=20
//	PUT    /rate_limit/zones/<zone>/dial               {"mode": m, "limit": n, "ttl": "1h"}
//	DELETE /rate_limit/zones/<zone>/dial
//	GET    /rate_limit/shed
//
// Zone names and keys are path segments, URL-path-escaped; keys.go says
// how a key is named. The routes that only read answer HEAD as well.
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

// target is the zone a request acts on, with its config and the admin
// side of its store, read once for the request.
type target struct {
	Zone
	info  ZoneInfo
	store storage.Admin
}

// infoOf is the config of z, the running zone named name, with the
// alternatives of every running zone of that name.
func infoOf(name string, z Zone) ZoneInfo {
	info := z.Info()
	info.Key = keySpaces(name, "")
	return info
}

// adminZone returns the running zone named name, if its store has an
// admin API to ask.
func adminZone(name string) (target, error) {
	z := runningZone(name)
	if z == nil {
		return target{}, apiError(http.StatusNotFound, fmt.Errorf("zone %q: no such zone in the running config", name))
	}
	t := target{Zone: z, info: infoOf(name, z), store: z.Admin()}
	if t.store == nil {
		return target{}, apiError(http.StatusNotImplemented, fmt.Errorf("zone %q: store %s has no admin API", t.info.Name, t.info.Store))
	}
	return t, nil
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
	out := []ZoneInfo{}
	now := time.Now()
	for _, name := range names {
		z := runningZone(name)
		if z == nil {
			continue
		}
		info := infoOf(name, z)
		store := z.Admin()
		if store != nil {
			if d, ok := store.ZoneDial(info.Name); ok && d.Active(now) {
				info.Dial = &d
			}
		}
		if f, ok := store.(storage.Fleet); ok {
			info.Instances = f.Instances()
		}
		if info.Dial != nil {
			if d := (target{info: info}).limitDollars(info.Dial.Limit); d != nil {
				info.Dollars = Dollars{"dial_limit": d["limit"]}
			}
		}
		out = append(out, info)
	}
	return writeJSON(w, out)
}

// TopInfo is GET /rate_limit/zones/<zone>/top's answer: this instance's
// heaviest keys in the zone over about the last minute, and the most any
// count may be overstated. Units tells that the zone limits what
// responses cost (cost_from): its keys are counted in Units, and Error
// is in units too.
// In a zone priced in money, Unit is picodollars, and Dollars the error
// in dollars.
type TopInfo struct {
	Zone    string   `json:"zone"`
	Units   bool     `json:"units,omitempty"`
	Unit    string   `json:"unit,omitempty"`
	Keys    []TopKey `json:"keys"`
	Error   int64    `json:"error"`
	Dollars Dollars  `json:"dollars,omitempty"`
}

// TopKey is a key as GET /rate_limit/zones/<zone>/top shows it: its
// requests, or, in a cost_from zone, the units they took (the
// cost each response showed, the reservation where none showed one,
// nothing for a request whose cost was released); and its rejected
// requests.
type TopKey struct {
	Key string `json:"key"`
	// From is the alternative of the zone's key it came from.
	From     string `json:"from,omitempty"`
	Requests int64  `json:"requests,omitempty"`
	Units    int64  `json:"units,omitempty"`
	Rejected int64  `json:"rejected"`
	// Dollars is, in a zone priced in money, Units in dollars.
	Dollars string `json:"dollars,omitempty"`
}

// DefaultTopKeys is how many keys GET .../top shows without ?n, and
// MaxTopKeys the most it shows: as many as a zone tracks.
const (
	DefaultTopKeys = 20
	MaxTopKeys     = 128
)

// serveTop answers GET /rate_limit/zones/<zone>/top: the zone's
// heaviest keys, as hashes where log_keys off hides keys.
func serveTop(w http.ResponseWriter, r *http.Request, z target) error {
	if err := readOnly(w, r); err != nil {
		return err
	}
	n := DefaultTopKeys
	if v := r.URL.Query().Get("n"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 || n > MaxTopKeys {
			return apiError(http.StatusBadRequest, fmt.Errorf("n: want a number of keys from 1 to %d, got %q", MaxTopKeys, v))
		}
	}
	keys, bound := z.Top(n)
	for i := range keys {
		keys[i].Key = z.ShownKey(keys[i].Key)
	}
	top := TopInfo{Zone: z.info.Name, Units: z.info.Units, Keys: keys, Error: bound}
	if z.priced() {
		top.Unit, top.Dollars = money.Unit, Dollars{"error": money.Format(bound)}
		for i := range keys {
			keys[i].Dollars = money.Format(keys[i].Units)
		}
	}
	return writeJSON(w, top)
}

// maxLimit is the largest limit an override or a dial may set: the
// largest a zone's limit may be.
const maxLimit = math.MaxInt32

func (a *adminAPI) key(w http.ResponseWriter, r *http.Request, z target, raw string) error {
	if r.Method != http.MethodGet && r.Method != http.MethodDelete {
		return methodNotAllowed(r)
	}
	if r.Method == http.MethodDelete {
		if err := checkChangesAllowed(); err != nil {
			return err
		}
	}
	keys, err := z.namedKeys(r.Context(), raw, r.URL.Query().Get("from"))
	if err != nil {
		return err
	}
	k, ok, err := z.pick(keys, raw, holdsState)
	if err != nil {
		return err
	}
	if r.Method == http.MethodGet {
		if !ok {
			// Unseen under every alternative: no use, in none of them.
			info := keys[0].info
			info.From, info.Hash = "", ""
			return writeJSON(w, info)
		}
		return writeJSON(w, k.info)
	}
	if !ok {
		return apiError(http.StatusNotFound, fmt.Errorf("zone %q: key %q holds no counts, ban or override under any alternative of the zone's key (%s): nothing to reset",
			z.info.Name, raw, strings.Join(z.info.Key, ", ")))
	}
	if err := z.store.ResetKey(r.Context(), z.info.Name, k.stored); err != nil {
		return apiError(http.StatusBadGateway, err)
	}
	a.changed(r, "key reset", z, k.fields(z)...)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (a *adminAPI) override(w http.ResponseWriter, r *http.Request, z target, raw string) error {
	if r.Method != http.MethodPut && r.Method != http.MethodDelete {
		return methodNotAllowed(r)
	}
	if err := checkChangesAllowed(); err != nil {
		return err
	}
	from := r.URL.Query().Get("from")
	switch r.Method {
	case http.MethodPut:
		var body struct {
			Limit json.RawMessage `json:"limit"`
			TTL   caddy.Duration  `json:"ttl"`
		}
		if err := decodeBody(r, &body); err != nil {
			return err
		}
		if body.Limit == nil {
			body.Limit = json.RawMessage("0")
		}
		limit, err := z.limitOf(body.Limit)
		if err != nil {
			return err
		}
		if body.TTL < 0 {
			return apiError(http.StatusBadRequest, fmt.Errorf("ttl: want a positive duration, got %s", time.Duration(body.TTL)))
		}
		keys, err := z.namedKeys(r.Context(), raw, from)
		if err != nil {
			return err
		}
		k, ok, err := z.pick(keys, raw, holdsState)
		if err != nil {
			return err
		}
		if !ok {
			return apiError(http.StatusConflict, fmt.Errorf("zone %q: key %q holds nothing yet under any alternative of the zone's key (%s); name the one to give it a limit in with ?from=<alternative> (caddy rate-limit: --from <alternative>)",
				z.info.Name, raw, strings.Join(z.info.Key, ", ")))
		}
		o := storage.Override{Limit: limit}
		if body.TTL > 0 {
			o.Expires = time.Now().Add(time.Duration(body.TTL))
		}
		if err := z.store.SetOverride(r.Context(), z.info.Name, k.stored, o); errors.Is(err, storage.ErrTooManyOverrides) {
			return apiError(http.StatusInsufficientStorage, err)
		} else if err != nil {
			return apiError(http.StatusBadGateway, err)
		}
		a.changed(r, "key limit override set", z, append(k.fields(z), zap.Int64("limit", o.Limit), zap.Time("expires", o.Expires))...)
		return writeJSON(w, OverrideInfo{Override: o, Dollars: z.limitDollars(o.Limit)})
	default: // DELETE
		keys, err := z.namedKeys(r.Context(), raw, from)
		if err != nil {
			return err
		}
		k, ok, err := z.pick(keys, raw, func(k KeyInfo) bool { return k.Override != nil })
		if err != nil {
			return err
		}
		if !ok {
			return apiError(http.StatusNotFound, fmt.Errorf("zone %q: key %q has no override under any alternative of the zone's key (%s): nothing to remove",
				z.info.Name, raw, strings.Join(z.info.Key, ", ")))
		}
		if err := z.store.DeleteOverride(r.Context(), z.info.Name, k.stored); err != nil {
			return apiError(http.StatusBadGateway, err)
		}
		a.changed(r, "key limit override removed", z, k.fields(z)...)
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
}

func (a *adminAPI) dial(w http.ResponseWriter, r *http.Request, z target) error {
	if r.Method != http.MethodPut && r.Method != http.MethodDelete {
		return methodNotAllowed(r)
	}
	if err := checkChangesAllowed(); err != nil {
		return err
	}
	switch r.Method {
	case http.MethodPut:
		var body struct {
			Mode  string          `json:"mode"`
			Limit json.RawMessage `json:"limit"`
			TTL   caddy.Duration  `json:"ttl"`
		}
		if err := decodeBody(r, &body); err != nil {
			return err
		}
		switch body.Mode {
		case "", storage.ModeEnforce, storage.ModeDryRun, storage.ModeOff:
		default:
			return apiError(http.StatusBadRequest, fmt.Errorf("mode: want enforce, dry_run or off, got %q", body.Mode))
		}
		if string(body.Limit) == "0" {
			// No limit, as when none is given.
			body.Limit = nil
		}
		limit, err := z.limitOf(body.Limit)
		if err != nil {
			return err
		}
		if body.TTL < 0 {
			return apiError(http.StatusBadRequest, fmt.Errorf("ttl: want a positive duration, got %s", time.Duration(body.TTL)))
		}
		if body.Mode == "" && limit == 0 {
			return apiError(http.StatusBadRequest, errors.New("want a mode, a limit or both"))
		}
		d := storage.ZoneDial{Mode: body.Mode, Limit: limit}
		if body.TTL > 0 {
			d.Expires = time.Now().Add(time.Duration(body.TTL))
		}
		if err := z.store.SetZoneDial(r.Context(), z.info.Name, d); err != nil {
			return apiError(http.StatusBadGateway, err)
		}
		a.changed(r, "zone dial set", z, zap.String("mode", d.Mode), zap.Int64("limit", d.Limit), zap.Time("expires", d.Expires))
		return writeJSON(w, DialInfo{ZoneDial: d, Dollars: z.limitDollars(d.Limit)})
	default: // DELETE
		if err := z.store.DeleteZoneDial(r.Context(), z.info.Name); err != nil {
			return apiError(http.StatusBadGateway, err)
		}
		a.changed(r, "zone dial removed", z)
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
}

// changed logs an admin change at info level, with who asked for it.
func (a *adminAPI) changed(r *http.Request, what string, z target, fields ...zap.Field) {
	fields = append([]zap.Field{zap.String("zone", z.info.Name), zap.String("store", z.info.Store), zap.String("remote_addr", r.RemoteAddr)}, fields...)
	a.logger.Info("rate limit admin: "+what, fields...)
}

// decodeBody reads a JSON body into v, refusing unknown fields and
// anything after the object: of `{"mode": "off"} {"mode": "enforce"}`,
// or an object cut short and followed by garbage, the first object alone
// is not what was sent, and acting on it would set a change nobody sent
// whole.
func decodeBody(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return apiError(http.StatusBadRequest, fmt.Errorf("body: want a JSON object: %w", err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return apiError(http.StatusBadRequest, errors.New("body: want one JSON object, got more after it"))
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
