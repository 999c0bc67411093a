package ratelimit

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/d61b427a/caddy-rate-limit/admin"
	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/internal/logevery"
	"github.com/d61b427a/caddy-rate-limit/internal/money"
	"github.com/d61b427a/caddy-rate-limit/internal/topkeys"
	"github.com/d61b427a/caddy-rate-limit/jwtclaims"
	"github.com/d61b427a/caddy-rate-limit/shed"
	"github.com/d61b427a/caddy-rate-limit/storage"
	_ "github.com/d61b427a/caddy-rate-limit/storage/memory"
	_ "github.com/d61b427a/caddy-rate-limit/storage/redis"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler limits how many requests (or cost units) each key may take per
// window in each zone, and answers requests over a limit with 429 Too Many
// Requests before they reach the handlers after it.
//
// A request counts against every zone whose matchers it passes. It is
// rejected if any zone rejects it, and then it consumes nothing in the other
// zones. Zones with the same name share their counters, across handlers,
// sites and, with a shared store, Caddy instances.
type Handler struct {
	// The zones to enforce. Every zone whose matchers a request passes is
	// enforced.
	Zones []*Zone `json:"zones,omitempty"`

	// Where counters are kept. Default: the in-memory store of this Caddy
	// process ("backend": "memory").
	StoreRaw json.RawMessage `json:"store,omitempty" caddy:"namespace=http.handlers.rate_limit.stores inline_key=backend"`

	// Which response headers describe the limit: "x-ratelimit" (default:
	// X-RateLimit-Limit, -Remaining, -Reset and -Used), "ietf" (RateLimit
	// and RateLimit-Policy from the IETF httpapi draft), "both" or "off".
	Headers string `json:"headers,omitempty"`

	// What to do when the store cannot answer: "allow" (default) lets the
	// request through, "deny" answers 503 Service Unavailable, "local"
	// decides in this instance's memory, with every zone's limit divided
	// by the instances sharing the store that it last saw (Redis), until
	// the store answers again. With the memory store, which always
	// answers, all three are the same.
	OnStoreError string `json:"on_store_error,omitempty"`

	// Whether keys are shown as they are where others than the request's
	// own handlers see them: log lines (rejections and delays at debug
	// level, dry-run rejections and bans at info, admin changes), the
	// rate_limit_exceeded event, and the zones' top keys on the admin API,
	// its status page and the caddy rate-limit command. "off" (default)
	// shows each key as "#" and 16 hex digits of a keyed hash
	// (HMAC-SHA256 under a key drawn at random when Caddy starts): a key
	// shows the same hash until Caddy restarts, so it can be followed,
	// but cannot be read, nor found by hashing guesses. "on" shows keys
	// as they are. Keys are often credentials: API keys, session cookies,
	// tokens. The placeholder {http.rate_limit.key} holds the key as it
	// is either way.
	LogKeys string `json:"log_keys,omitempty"`

	// Verifies a JSON Web Token in each request and makes its claims
	// available as {jwt.<claim>} placeholders ({jwt.sub}, {jwt.org.id}),
	// for keys, limits and later handlers alike. A token that is missing
	// or does not verify yields no claims: every {jwt.*} placeholder is
	// empty and a key template using one falls back to the next. The
	// token is read only if a {jwt.*} placeholder is used, at most once
	// per request. Default: none.
	JWT *jwtclaims.Config `json:"jwt,omitempty"`

	// A worker utilization load shedder: when the requests in flight
	// through the handlers after this one stay near capacity, it drops the
	// least important requests first. Checked before any zone, so a shed
	// request consumes nothing. Default: none.
	Shed *shed.Shed `json:"shed,omitempty"`

	// "off" turns off the admin API's routes that change state, for the
	// whole Caddy process while this config runs: a key's reset, per-key
	// limit overrides and zone dials answer 403 Forbidden; the routes that
	// read keep working. Default: "on". The admin API is one per process,
	// so one handler (or the global rate_limit option) with "off" is
	// enough; "on" cannot overrule it.
	AdminChanges string `json:"admin_changes,omitempty"`

	// The most memory, in bytes, that the request bodies zones read may
	// take at once in this Caddy process, read or being read: a request
	// whose body would take more is answered 503 Service Unavailable,
	// with Retry-After: 1, before any zone takes anything. A zone reads
	// a body to reserve by it (reserve max_tokens), to ask a stream for
	// its usage (usage_in_stream on), or for a key or limit that uses
	// {http.request.body}; it reads it as its bytes arrive, whatever its
	// Content-Length announced. At least 2 MiB. Default: the global
	// rate_limit option's body_memory, or 64 MiB.
	BodyMemory int64 `json:"body_memory,omitempty"`

	// How long a client has to send a body a zone reads: past it, the
	// request is answered 408 Request Timeout, and its share of
	// body_memory is free again. The server's read_body timeout, if
	// shorter, applies instead. At least 1s. Default: the global
	// rate_limit option's body_timeout, or 10s.
	BodyTimeout caddy.Duration `json:"body_timeout,omitempty"`

	// The handler options of mholt/caddy-ratelimit, under its names, so
	// that its configs carry over (see docs/migrating.md). Its log_key,
	// which is log_keys on, and its distributed and storage, which are
	// refused, have no field here: UnmarshalJSON reads them.

	// Adds to Retry-After a uniformly random extra of 0 to this fraction
	// of the wait (0.2: up to 20% more), so that rejected clients do not
	// all come back at the same instant. From 0 to 1; default 0. The
	// counters, the deny cache and max_delay keep the true instant.
	Jitter float64 `json:"jitter,omitempty"`

	// How often the memory store sweeps out keys whose counts no longer
	// matter. The store is shared, so the shortest interval any running
	// config asks for applies. Default: 10s. Memory store only.
	SweepInterval caddy.Duration `json:"sweep_interval,omitempty"`

	// This handler records no rate-limit metrics: its zones and its store
	// add no series to the caddy_http_rate_limit_* metrics.
	DisableMetrics bool `json:"disable_metrics,omitempty"`

	// random draws the jitter, uniformly from [0, 1).
	random func() float64
	// now is the clock that headers and dials are read against: the
	// store's clock, which a test may set (see memory.New).
	now func() time.Time

	store  storage.Store
	logger *zap.Logger
	// showKeys is log_keys on: keys are shown as they are, not as
	// hashes.
	showKeys bool
	// Which headers report sets, from Headers.
	xRateLimitHeaders, ietfHeaders bool
	// delays tells whether any zone has a max_delay, so that a request
	// needs its start time.
	delays bool
	// The store's name (memory, redis), its store label in metrics, and
	// its series (see storeSeries).
	storeName       string
	storeErrorCount prometheus.Counter
	storeLatency    prometheus.Observer
	// storeErrorLog rate-limits the log line for store errors.
	storeErrorLog *logevery.Limiter
	// shedder is Shed, as the handler asks it about requests; nil without
	// a shed block.
	shedder loadShedder
	// fallback decides while the store cannot (on_store_error local); nil
	// otherwise.
	fallback storage.Store
	// bodyLimits are body_memory and body_timeout as they apply.
	bodyLimits bodyLimits
	// events is Caddy's events app, which rate_limit_exceeded goes
	// through, and ctx the context events are emitted in (their origin).
	events *caddyevents.App
	ctx    caddy.Context
}

// Zone is one limit: which requests it applies to, how they are keyed and
// how much each key may take per window.
type Zone struct {
	// The zone's name. Zones with the same name share counters. 1 to 128
	// printable ASCII characters, but not . or .., which URL paths drop:
	// the admin API names a zone in its paths.
	Name string `json:"name"`

	// Which requests the zone applies to; all requests if empty. The sets
	// are OR'ed, the matchers within a set AND'ed.
	MatcherSetsRaw caddyhttp.RawMatcherSets `json:"match,omitempty" caddy:"namespace=http.matchers"`

	// Key templates (Caddy placeholders and literal text). The first one in
	// which every placeholder is known and non-empty is the key. If none
	// is, or none is given, the key is the client IP ({http.vars.client_ip}).
	KeyAlternatives Alternatives `json:"key,omitempty"`

	// Limit alternatives: integers or templates. The first that resolves
	// to a positive integer up to 2^31-1 is the limit, in cost units per
	// window. A request for which none does is not limited by this zone.
	// In a zone priced in money (cost_from usage price) they are dollar
	// amounts instead, "$50" or "$0.25" (at most 12 decimals, up to
	// $9223372.036854775807), and a template's value is read as dollars
	// with or without its $ ("50" is $50): the zone counts picodollars.
	LimitAlternatives Alternatives `json:"limit"`

	// The window: a length of at least 1ms ("1m", "24h"), cut on the
	// Unix epoch, or a calendar period, "day", "week", "month" or "year",
	// which starts at local midnight in Timezone (a week on Monday, a
	// month on the 1st, a year on January 1st) and lasts as long as the
	// calendar makes it. Calendar periods are for fixed_window and
	// sliding_tail only.
	Window Window `json:"window"`

	// The IANA time zone a calendar window's periods start at midnight
	// in, such as "America/New_York". Only with a calendar window.
	// Default: "UTC".
	Timezone string `json:"timezone,omitempty"`

	// "sliding_tail" (default), "fixed_window", "sliding_window", "gcra"
	// or "concurrency". A concurrency zone limits the requests in flight,
	// not a rate: it has no window.
	Algorithm algorithms.Algorithm `json:"algorithm,omitempty"`

	// sliding_window only: how many sub-windows the window is cut into,
	// from 2 to 60, each at least 1ms. More buckets admit closer to the
	// limit under steady demand (limit × n/(n+1) a window at least) and
	// cost a counter each. Default: 10.
	Buckets int `json:"buckets,omitempty"`

	// gcra only: how many cost units a key may take at once, its bucket.
	// Default: the limit.
	Burst int64 `json:"burst,omitempty"`

	// concurrency only: how long a shared store (Redis) holds the units
	// of a request whose instance died before releasing them. Set it
	// above the longest a request may take. Default: 1m.
	Hold caddy.Duration `json:"hold,omitempty"`

	// The old name of hold, still accepted; a zone sets one or the other.
	Lease caddy.Duration `json:"lease,omitempty"`

	// Cost of a request by HTTP method; "*" sets the cost of other methods.
	// Default: 1 for every method. A cost of 0 counts nothing.
	Cost map[string]int64 `json:"cost,omitempty"`

	// If set, a request that would be allowed within this long is held
	// until then instead of being rejected. With several zones rejecting,
	// it waits for the last of them, and only if that is within every
	// one's max_delay.
	MaxDelay caddy.Duration `json:"max_delay,omitempty"`

	// How many requests may wait at once in this zone because of
	// max_delay; the rest are rejected at once. Default: 1000. The count
	// is per handler: a zone of the same name in another rate_limit
	// handler counts its own waiting requests.
	MaxWaiting int `json:"max_waiting,omitempty"`

	// Count and report, but never reject.
	DryRun bool `json:"dry_run,omitempty"`

	// The status rejections answer with: a client or server error, 400 to
	// 599. Default: 429.
	Status int `json:"status,omitempty"`

	// If set, a key placeholder whose value is an IPv4 address is masked to
	// this many leading bits, so a whole network shares one counter.
	IPv4Prefix int `json:"ipv4_prefix,omitempty"`

	// Like ipv4_prefix, for IPv6 addresses (e.g. 64).
	IPv6Prefix int `json:"ipv6_prefix,omitempty"`

	// Only responses with these statuses use the limit: codes ("401") and
	// classes ("4xx"), from 100 to 599. A request is admitted only if its
	// key has room for its cost, which is taken at once, as always; when
	// the response is done, the cost is released unless its status is
	// listed. So concurrent requests can never use more than the limit.
	// A status carried by a handler error (basic_auth fails with 401)
	// counts as that status; a client gone before any answer, as 499.
	// Default: every response uses the limit. Not for concurrency zones.
	CountStatus Statuses `json:"count_status,omitempty"`

	// The first time the zone rejects a key, the key is banned for this
	// long: every request of the key that the zone matches is rejected,
	// with Retry-After (and the reset headers) the ban's end, whatever
	// its counts. With count_status, only the key's settled count, the
	// costs kept after their responses, may begin a ban: a request
	// refused while the settled count alone had room for it was refused
	// for costs of requests still in flight, which ban nothing; it is
	// answered with Retry-After: 1, or held by max_delay until those
	// costs are released. With a shared store the ban holds on every
	// instance. At least 1s; default: no ban. Not for concurrency zones.
	Ban caddy.Duration `json:"ban,omitempty"`

	// Where the cost of a request is read once its response is done, for
	// a zone that limits what responses cost rather than how many
	// requests come (an LLM API's tokens): the usage the response's body
	// reports, or a header. A request is admitted if its key has room for
	// its reservation (Reserve), which is taken at once; when the
	// response is done, the key keeps the cost read in its place: less
	// is released, more is taken past the limit (a debt, which refuses
	// the key until its window has room again). A response whose cost
	// cannot be read (a stream cut off, an error without usage, a
	// compressed body) keeps the reservation. Not for concurrency zones;
	// needs Reserve; not with Cost.
	CostFrom *CostFrom `json:"cost_from,omitempty"`

	// What a request of a cost_from zone takes at admission, before its
	// response shows what it cost. Only with CostFrom, which needs it.
	Reserve *Reserve `json:"reserve,omitempty"`

	// "on" asks a streamed Chat Completions request that did not ask for
	// the usage of its stream (stream_options.include_usage) for it, so
	// that its cost can be read, and hides that usage from the client,
	// which sees the stream it asked for. Default: "off". Only with
	// cost_from usage.
	UsageInStream string `json:"usage_in_stream,omitempty"`

	matchers caddyhttp.MatcherSets
	// results counts the zone's requests by result (the series of
	// caddy_http_rate_limit_requests_total), looked up once here so
	// that counting costs one atomic add.
	results [resultCount]prometheus.Counter
	// usage is the zone's series of caddy_http_rate_limit_period_usage_ratio,
	// and bans of caddy_http_rate_limit_bans_total.
	usage prometheus.Observer
	bans  prometheus.Counter
	// top is the zone's heaviest keys, shared by the zones of its name;
	// showKeys (log_keys on) shows them, and the keys of admin changes,
	// as they are rather than as hashes.
	top      *topkeys.Keys
	showKeys bool
	// events remembers which keys had their event in this window.
	events exceededKeys
	// banLog and dryRunLog hold the zone's ban and dry-run lines to one a
	// second.
	banLog, dryRunLog logevery.Limiter
	// counted is CountStatus as a set; countsStatus tells it was given.
	counted      statusSet
	countsStatus bool
	keys         []template
	limits       []template
	costs        [methodCount]int64
	waiting      atomic.Int64
	// period is the Window of the zone's rates: the window's length, or
	// for a concurrency zone the hold; 0 with a calendar, which cuts the
	// zone's windows instead.
	period   time.Duration
	calendar *algorithms.Calendar
	// policySeconds is the window in whole seconds, rounded up, for the
	// RateLimit-Policy header (0 with a calendar, whose periods differ),
	// and quotaUnit its qu parameter (with its ;), for a zone priced in
	// money, whose quota is in picodollars.
	policySeconds int64
	quotaUnit     string
	// exceeded is the error a rejection in this zone returns to
	// handle_errors, made once.
	exceeded error
	// admin is the store's admin side (dials, overrides), nil if the store
	// has none; storeName names the store for the admin API.
	admin     storage.Admin
	storeName string
	// sfName is the name as an RFC 8941 string, for the RateLimit and
	// RateLimit-Policy headers.
	sfName string
	// meter is what a cost_from zone reads a response's cost with.
	meter meter
	// bodyTemplates tells that a key or limit template reads the
	// request's body.
	bodyTemplates bool
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.rate_limit",
		New: func() caddy.Module { return new(Handler) },
	}
}

// DefaultMaxWaiting bounds the requests a zone holds for max_delay.
const DefaultMaxWaiting = 1000

// maxLimit is the largest limit a template may resolve to; anything above it
// is taken for a mistake or an attack and ignored. A zone priced in money
// counts picodollars, to 2^63-1 ($9223372.036854775807, money.MaxDollars).
const maxLimit = math.MaxInt32

// Provision loads the store and the zones' matchers and compiles templates.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	h.ctx = ctx
	// Events go through Caddy's events app, which the http app loads into
	// every config it runs in; emitExceeded asks it whether anything (a
	// subscribed handler, the events log at debug level) takes an event.
	switch events, err := ctx.AppIfConfigured("events"); {
	case err == nil:
		h.events = events.(*caddyevents.App)
	case !errors.Is(err, caddy.ErrNotConfigured):
		return fmt.Errorf("loading the events app: %w", err)
	}
	h.now = time.Now
	h.storeErrorLog = new(logevery.Limiter)
	h.showKeys = h.LogKeys == "on"
	if h.AdminChanges == "off" {
		admin.TurnChangesOff(h, h.description())
	}
	if h.JWT != nil {
		if err := h.JWT.Provision(h.logger); err != nil {
			return fmt.Errorf("jwt: %w", err)
		}
	}
	if h.StoreRaw == nil {
		h.StoreRaw = json.RawMessage(`{"backend":"memory"}`)
	}
	mod, err := ctx.LoadModule(h, "StoreRaw")
	if err != nil {
		return fmt.Errorf("loading rate_limit store: %w", err)
	}
	store, ok := mod.(storage.Store)
	if !ok {
		return fmt.Errorf("module %T is not a rate_limit store", mod)
	}
	h.store = store
	h.storeName = strings.TrimPrefix(string(mod.(caddy.Module).CaddyModule().ID), storage.Namespace+".")
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("registering metrics: %w", err)
	}
	if err := h.provisionOptions(store); err != nil {
		return err
	}
	if err := h.provisionBodyLimits(ctx); err != nil {
		return err
	}
	h.storeErrorCount, h.storeLatency = storeSeries(h.storeName, h.DisableMetrics)
	if local, ok := store.(storage.LocalFallback); ok && h.OnStoreError == "local" {
		h.fallback = local.Local()
	}
	if quiet, ok := store.(storage.MetricsDisabler); ok && h.DisableMetrics {
		quiet.DisableMetrics()
	}

	h.xRateLimitHeaders = h.Headers == "" || h.Headers == headersXRateLimit || h.Headers == headersBoth
	h.ietfHeaders = h.Headers == headersIETF || h.Headers == headersBoth
	for _, z := range h.Zones {
		if z == nil {
			// Caddy validates after provisioning, so this cannot wait.
			return errNullZone
		}
		if err := z.provision(ctx, h.logger, h.DisableMetrics); err != nil {
			return fmt.Errorf("zone %q: %w", z.Name, err)
		}
		h.delays = h.delays || z.MaxDelay > 0
		z.admin, _ = store.(storage.Admin)
		z.storeName = h.storeName
		z.top, z.showKeys = topkeys.For(z.Name), h.showKeys
		admin.RegisterZone(z)
	}
	if h.Shed != nil {
		if err := h.Shed.Provision(ctx, h.logger); err != nil {
			return fmt.Errorf("shed %q: %w", h.Shed.DisplayName(), err)
		}
		h.shedder = h.Shed
	}
	return nil
}

// provision loads the zone's matchers and sets up what it derives from
// its config; metricsOff is its handler's disable_metrics.
func (z *Zone) provision(ctx caddy.Context, logger *zap.Logger, metricsOff bool) error {
	if z.MatcherSetsRaw != nil {
		mods, err := ctx.LoadModule(z, "MatcherSetsRaw")
		if err != nil {
			return fmt.Errorf("loading matchers: %w", err)
		}
		if err := z.matchers.FromInterface(mods); err != nil {
			return err
		}
	}
	if z.Algorithm == "" {
		z.Algorithm = algorithms.SlidingTail
	}
	// The name is checked before anything is labelled with it.
	if err := checkZoneName(z.Name); err != nil {
		return err
	}
	var err error
	if z.sfName, err = sfString(z.Name); err != nil {
		return fmt.Errorf("name: %w", err)
	}
	z.results, z.usage, z.bans = zoneSeries(z.Name, metricsOff, z.Ban > 0)
	z.exceeded = fmt.Errorf("rate limit exceeded in zone %q", z.Name)
	if z.MaxWaiting == 0 {
		z.MaxWaiting = DefaultMaxWaiting
	}
	if z.Status == 0 {
		z.Status = http.StatusTooManyRequests
	}
	z.period = z.Window.Length
	if z.Algorithm == algorithms.Concurrency {
		z.period = z.hold()
	}
	if z.Window.Calendar != "" {
		// Checked here as well as in Validate, which Caddy runs only
		// after provisioning.
		zone := cmp.Or(z.Timezone, "UTC")
		loc, err := checkTimezone(zone)
		if err != nil {
			return fmt.Errorf("timezone: %w", err)
		}
		z.calendar = algorithms.CalendarOf(z.Window.Calendar, loc)
	}
	keys := z.KeyAlternatives
	if len(keys) == 0 {
		keys = Alternatives{clientIPTemplate}
	}
	if z.counted, err = newStatusSet(z.CountStatus); err != nil {
		return fmt.Errorf("count_status: %w", err)
	}
	z.countsStatus = len(z.CountStatus) > 0
	z.keys = compileKeyTemplates(keys)
	z.limits = compileTemplates(z.LimitAlternatives)
	z.policySeconds = int64((z.Window.Length + time.Second - 1) / time.Second)
	literal := false
	for _, l := range z.limits {
		literal = literal || !l.dynamic
	}
	if !literal {
		logger.Warn("zone has no integer limit to fall back on: requests for which no limit alternative resolves are not limited",
			zap.String("zone", z.Name), zap.Strings("limit", z.LimitAlternatives))
	}
	for i := range z.costs {
		z.costs[i] = 1
	}
	if c, ok := z.Cost["*"]; ok {
		for i := range z.costs {
			z.costs[i] = c
		}
	}
	for m, c := range z.Cost {
		if m != "*" {
			z.costs[methodIndex(m)] = c
		}
	}
	z.meter = newMeter(z, metricsOff)
	z.bodyTemplates = z.templatesReadBody()
	if z.meter.prices != nil {
		z.quotaUnit = `;qu="` + money.Unit + `"`
	}
	return nil
}

// rate is the zone's rate for a request whose limit is limit.
func (z *Zone) rate(limit int64) algorithms.Rate {
	return algorithms.Rate{Units: limit, Window: z.period, Calendar: z.calendar, Burst: z.Burst, Buckets: z.Buckets}
}

// description names the handler by its zones (or its shedder), for
// messages about the whole process, such as what turned admin changes
// off.
func (h *Handler) description() string {
	var names []string
	for _, z := range h.Zones {
		if z != nil {
			names = append(names, strconv.Quote(z.Name))
		}
	}
	switch {
	case len(names) == 1:
		return "the rate_limit handler of zone " + names[0]
	case len(names) > 1:
		return "the rate_limit handler of zones " + strings.Join(names, ", ")
	case h.Shed != nil:
		return "the rate_limit handler of shed " + strconv.Quote(h.Shed.DisplayName())
	}
	return "a rate_limit handler"
}

// Cleanup takes the handler's zones out of the admin API's view, gives
// back its say on the admin API's changes, and lets go of its shedder.
func (h *Handler) Cleanup() error {
	admin.ReleaseChanges(h)
	for _, z := range h.Zones {
		if z != nil && z.storeName != "" {
			admin.UnregisterZone(z)
		}
	}
	if h.Shed != nil {
		return h.Shed.Cleanup()
	}
	return nil
}

// DefaultHold is how long a shared store holds concurrency units whose
// holder never released them, when hold is not set.
const DefaultHold = time.Minute

// hold is a concurrency zone's hold, whichever name it was set by
// (validate refuses both), or DefaultHold.
func (z *Zone) hold() time.Duration {
	switch {
	case z.Hold != 0:
		return time.Duration(z.Hold)
	case z.Lease != 0:
		return time.Duration(z.Lease)
	}
	return DefaultHold
}

// Alternatives is a list of templates tried in order. In JSON it may be
// written as one string or number, or as an array of them.
type Alternatives []string

// UnmarshalJSON accepts "a", 5, ["a", 5] and the like.
func (a *Alternatives) UnmarshalJSON(b []byte) error {
	var raw any
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	items, ok := raw.([]any)
	if !ok {
		items = []any{raw}
	}
	out := make(Alternatives, 0, len(items))
	for _, it := range items {
		switch v := it.(type) {
		case string:
			out = append(out, v)
		case float64:
			out = append(out, strconv.FormatFloat(v, 'f', -1, 64))
		default:
			return fmt.Errorf("want a string or a number, got %s", b)
		}
	}
	*a = out
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)

// Window is a zone's window: a length, such as 1m or 24h, whose windows
// are cut on the Unix epoch, or a calendar period (day, week, month or
// year), which starts at local midnight in the zone's timezone: on a
// Monday for a week (ISO 8601), on the 1st for a month, on January 1st
// for a year. In JSON a length is a duration as Caddy reads one
// (nanoseconds, or a string such as "1m"), a calendar period its name.
type Window struct {
	Length time.Duration
	// Calendar is the calendar period, if the window is one (Length is
	// then 0).
	Calendar algorithms.CalendarPeriod
}

// String is the window as written: its length, or its period's name.
func (w Window) String() string {
	if w.Calendar != "" {
		return string(w.Calendar)
	}
	return w.Length.String()
}

// MarshalJSON writes a length as nanoseconds, as Caddy writes a
// caddy.Duration, and a calendar period as its name.
func (w Window) MarshalJSON() ([]byte, error) {
	if w.Calendar != "" {
		return json.Marshal(string(w.Calendar))
	}
	return json.Marshal(int64(w.Length))
}

// UnmarshalJSON reads a calendar period's name, or a duration.
func (w *Window) UnmarshalJSON(b []byte) error {
	var name string
	if json.Unmarshal(b, &name) == nil {
		if p := algorithms.CalendarPeriod(name); p.Valid() {
			*w = Window{Calendar: p}
			return nil
		}
	}
	var d caddy.Duration
	if err := d.UnmarshalJSON(b); err != nil {
		return fmt.Errorf("window: want a duration such as 1m or a calendar period (day, week, month or year), got %s", b)
	}
	*w = Window{Length: time.Duration(d)}
	return nil
}

// Statuses lists response statuses: codes (401) and classes (4xx). In
// JSON it may hold strings and numbers alike.
type Statuses []string

// UnmarshalJSON accepts ["401", 403, "5xx"], or one of them alone.
func (s *Statuses) UnmarshalJSON(b []byte) error {
	if err := (*Alternatives)(s).UnmarshalJSON(b); err != nil {
		return fmt.Errorf("count_status: %w", err)
	}
	return nil
}

// statusSet holds the statuses from 100 to 599 as bits, so that asking
// about a response costs a shift and a mask.
type statusSet [10]uint64

// parseStatusSpec returns the statuses one count_status argument names.
func parseStatusSpec(v string) ([]int, error) {
	if len(v) == 3 && v[1:] == "xx" && v[0] >= '1' && v[0] <= '5' {
		first := int(v[0]-'0') * 100
		codes := make([]int, 100)
		for i := range codes {
			codes[i] = first + i
		}
		return codes, nil
	}
	code, err := strconv.Atoi(v)
	if err != nil || code < 100 || code > 599 {
		return nil, fmt.Errorf("want an HTTP status from 100 to 599 or a class from 1xx to 5xx, got %q", v)
	}
	return []int{code}, nil
}

// newStatusSet returns the set of the statuses specs name; they have been
// checked.
func newStatusSet(specs []string) (statusSet, error) {
	var s statusSet
	for _, v := range specs {
		codes, err := parseStatusSpec(v)
		if err != nil {
			return s, err
		}
		for _, c := range codes {
			s[c/64] |= 1 << (c % 64)
		}
	}
	return s, nil
}

// has reports whether code is in the set.
func (s *statusSet) has(code int) bool {
	return code >= 0 && code < 64*len(s) && s[code/64]&(1<<(code%64)) != 0
}
