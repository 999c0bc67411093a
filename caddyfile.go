package ratelimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/internal/bodyread"
	"github.com/d61b427a/caddy-rate-limit/internal/names"
	"github.com/d61b427a/caddy-rate-limit/jwtclaims"
	"github.com/d61b427a/caddy-rate-limit/shed"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// The directive orders itself before basic_auth, so that a Caddyfile needs
// no order line: requests over a limit are refused before a password is
// checked.
func init() {
	httpcaddyfile.RegisterDirective("rate_limit", parseCaddyfile)
	httpcaddyfile.RegisterDirectiveOrder("rate_limit", httpcaddyfile.Before, "basic_auth")
}

// parseCaddyfile sets up a rate_limit handler as RegisterHandlerDirective
// would (the matcher token, if any, becomes the route's matcher), and
// names a one-liner's zone after its named matcher and its site, so that
// each one-liner of the Caddyfile counts on its own (see oneLineNames).
// That name is why the directive is registered with RegisterDirective:
// RegisterHandlerDirective hands its setup function the tokens with the
// matcher token already deleted (ExtractMatcherSet), and the matcher set
// it makes of it does not keep the name.
func parseCaddyfile(h httpcaddyfile.Helper) ([]httpcaddyfile.ConfigValue, error) {
	if !h.Next() {
		return nil, h.ArgErr()
	}
	// The named matcher, read before ExtractMatcherSet deletes its token.
	base := DefaultZoneName
	if h.NextArg() {
		if name, ok := strings.CutPrefix(h.Val(), "@"); ok {
			base = name
		}
	}
	h.Reset()
	h.Next()
	matcherSet, err := h.ExtractMatcherSet()
	if err != nil {
		return nil, err
	}
	rl := new(Handler)
	oneLine, err := rl.unmarshal(h.Dispenser, base)
	if err != nil {
		return nil, err
	}
	named := oneLineNamesOf(h.State)
	if !oneLine {
		for _, z := range rl.Zones {
			if err := named.blockZone(z.Name); err != nil {
				return nil, h.Errf("rate_limit: %v", err)
			}
		}
		return h.NewRoute(matcherSet, rl), nil
	}
	z := rl.Zones[0]
	if z.Name, err = named.name(base, siteAddress(h)); err != nil {
		return nil, h.Errf("rate_limit: %v", err)
	}
	if err := checkZoneName(z.Name); err != nil {
		return nil, h.Errf("rate_limit: zone %q, from the matcher and the site's first address: %v", z.Name, err)
	}
	return h.NewRoute(matcherSet, rl), nil
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens, in the
// one-line form (see unmarshalOneLine; its zone is named DefaultZoneName here,
// where neither a named matcher nor a site is known)
//
//	rate_limit [<matcher>] <key> <rate> [<zone_size> [<reject_status>]]
//
// or the block form, which holds at least one zone or a shed block:
//
//	rate_limit [<matcher>] {
//		store memory|redis { ... }              # default: memory
//		jwt { ... }
//		headers x-ratelimit|ietf|both|off       # default: x-ratelimit
//		on_store_error allow|deny|local         # default: allow
//		log_keys on|off                         # default: off
//		admin_changes on|off                    # default: on
//		body_memory <size>                      # default: the global option's, or 64MiB
//		body_timeout <duration>                 # default: the global option's, or 10s
//		shed [<name>] { ... }
//		jitter <fraction>                       # 0 to 1
//		sweep_interval <duration>               # memory store only
//		log_key                                 # log_keys on; not with log_keys
//		disable_metrics
//		zone <name> {                           # one block per name
//			match { <matchers> }                # repeatable
//			key <template> [<template>...]
//			limit <template|n|$amount> [...]     # required; or: events; $amount (dollars): cost_from usage price
//			window <duration>|day|week|month|year # required; not with concurrency
//			timezone <IANA name>                 # calendar periods only; default: UTC
//			algorithm sliding_tail|fixed_window|sliding_window|gcra|concurrency
//			buckets <n>                          # sliding_window only
//			burst <n>                            # gcra only
//			hold <duration>                      # concurrency only (old name: lease)
//			cost <METHOD|*> <n>                  # repeatable, once per method
//			max_delay <duration>
//			max_waiting <n>
//			dry_run
//			ipv4_prefix <bits>
//			ipv6_prefix <bits>
//			status <code>                        # 400 to 599
//			count_status <code|class> [<code|class>...] # not with concurrency
//			ban <duration>                       # not with concurrency
//			cost_from usage input|output|total|price # price takes a block (below); or: cost_from header <name>; not with concurrency or cost
//				<model|pattern*> input <$> output <$> [cache_read <$>] [cache_write <$>] [cache_write_1h <$>]
//				                                 # price's lines: dollars per million tokens; the first match prices
//			reserve <n>                          # or: reserve max_tokens <default>; required by cost_from
//			usage_in_stream on|off               # cost_from usage only; default: off
//		}
//	}
//
// The blocks of store, jwt and shed are read by their own
// UnmarshalCaddyfile (memory.Store, redis.Store, jwtclaims.Config,
// shed.Shed), whose comments show them. Every line but zone, match and
// cost is given at most once. mholt/caddy-ratelimit's distributed and
// storage are refused with what to write instead. Every value is checked
// as its line is read, with the check Validate uses, so `caddy adapt`
// already refuses a bad one with its file and line.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	_, err := h.unmarshal(d, DefaultZoneName)
	return err
}

// unmarshal reads either form, naming a one-line zone zone, and reports
// whether it was the one-line form.
func (h *Handler) unmarshal(d *caddyfile.Dispenser, zone string) (oneLine bool, err error) {
	d.Next() // directive name
	if args := d.RemainingArgs(); len(args) > 0 {
		return true, h.unmarshalOneLine(d, args, zone)
	}
	return false, h.unmarshalBlock(d)
}

// unmarshalBlock reads the block form.
func (h *Handler) unmarshalBlock(d *caddyfile.Dispenser) error {
	seen := make(map[string]bool)
	given := make(map[string]bool)
	for d.NextBlock(0) {
		if d.Val() != "zone" {
			if given[d.Val()] {
				return d.Errf("rate_limit: %s: repeated (want one %s per rate_limit; zone is the one that repeats)", d.Val(), d.Val())
			}
			given[d.Val()] = true
		}
		switch d.Val() {
		case "zone":
			z, err := unmarshalZone(d)
			if err != nil {
				return err
			}
			if seen[z.Name] {
				return d.Errf("zone %q: %v", z.Name, errDuplicateZone)
			}
			seen[z.Name] = true
			h.Zones = append(h.Zones, z)

		case "shed":
			h.Shed = new(shed.Shed)
			if err := h.Shed.UnmarshalCaddyfile(d); err != nil {
				return err
			}

		case "store":
			if !d.NextArg() {
				return d.ArgErr()
			}
			name := d.Val()
			id := storage.Namespace + "." + name
			if _, err := caddy.GetModule(id); err != nil {
				return d.Errf("store: want memory or redis, got unknown store %q", name)
			}
			unm, err := caddyfile.UnmarshalModule(d, id)
			if err != nil {
				return err
			}
			h.StoreRaw = caddyconfig.JSONModuleObject(unm, "backend", name, nil)

		case "jwt":
			h.JWT = new(jwtclaims.Config)
			if err := h.JWT.UnmarshalCaddyfile(d); err != nil {
				return err
			}

		case "headers":
			if !d.AllArgs(&h.Headers) {
				return d.ArgErr()
			}
			if err := checkHeaders(h.Headers); err != nil {
				return d.Errf("headers: %v", err)
			}

		case "log_keys":
			if !d.AllArgs(&h.LogKeys) {
				return d.ArgErr()
			}
			if err := checkOnOff(h.LogKeys); err != nil {
				return d.Errf("log_keys: %v", err)
			}

		case "admin_changes":
			if !d.AllArgs(&h.AdminChanges) {
				return d.ArgErr()
			}
			if err := checkOnOff(h.AdminChanges); err != nil {
				return d.Errf("admin_changes: %v", err)
			}

		case "on_store_error":
			if !d.AllArgs(&h.OnStoreError) {
				return d.ArgErr()
			}
			if err := checkOnStoreError(h.OnStoreError); err != nil {
				return d.Errf("on_store_error: %v", err)
			}

		case "body_memory":
			var size string
			if !d.AllArgs(&size) {
				return d.ArgErr()
			}
			n, err := bodyread.ParseSize(size)
			if err == nil {
				err = bodyread.CheckMemory(n)
			}
			if err != nil {
				return d.Errf("body_memory: %v", err)
			}
			h.BodyMemory = n

		case "body_timeout":
			t, err := parseDuration(d)
			if err == nil {
				err = bodyread.CheckTimeout(t)
			}
			if err != nil {
				return d.Errf("body_timeout: %v", err)
			}
			h.BodyTimeout = caddy.Duration(t)

		case "jitter", "sweep_interval", "log_key", "disable_metrics", "distributed", "storage":
			if err := h.unmarshalOption(d); err != nil {
				return err
			}

		default:
			return d.Errf("rate_limit: unknown subdirective %q (want zone, shed, store, jwt, headers, on_store_error, log_keys, admin_changes, body_memory, body_timeout, jitter, sweep_interval, log_key or disable_metrics)", d.Val())
		}
	}
	if len(given) == 0 && len(h.Zones) == 0 && h.Shed == nil {
		return d.Err("rate_limit: want the one-line form rate_limit [<matcher>] <key> <rate> (such as rate_limit {remote.ip} 10r/s), " +
			"or a block with at least one zone or a shed block")
	}
	if len(h.Zones) == 0 && h.Shed == nil {
		return d.Err(errNoZone.Error())
	}
	// What no line could check: options that conflict.
	if given["log_key"] && given["log_keys"] {
		return d.Err(errLogKeyAndLogKeys.Error())
	}
	if err := h.validateOptions(); err != nil {
		return d.Err(err.Error())
	}
	return nil
}

func unmarshalZone(d *caddyfile.Dispenser) (*Zone, error) {
	z := new(Zone)
	if !d.NextArg() {
		return nil, d.Err("zone: a name is required")
	}
	z.Name = d.Val()
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	given := make(map[string]bool)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		dir := d.Val()
		// fail names the zone and the directive as written.
		fail := func(err error) error { return d.Errf("zone %q: %s: %v", z.Name, dir, err) }
		// A second line would silently replace the first; key and limit
		// take their alternatives on one line. match and cost repeat.
		once := dir
		switch dir {
		case "events":
			once = "limit"
		case "lease":
			once = "hold"
		}
		if dir != "match" && dir != "cost" {
			if given[once] {
				return nil, fail(fmt.Errorf("repeated (want one %s line per zone)", once))
			}
			given[once] = true
		}
		switch dir {
		case "match":
			matcherSet, err := caddyhttp.ParseCaddyfileNestedMatcherSet(d)
			if err != nil {
				return nil, fail(err)
			}
			z.MatcherSetsRaw = append(z.MatcherSetsRaw, matcherSet)

		case "key":
			z.KeyAlternatives = d.RemainingArgs()
			if len(z.KeyAlternatives) == 0 {
				return nil, d.ArgErr()
			}
			for _, k := range z.KeyAlternatives {
				if err := checkKey(k); err != nil {
					return nil, fail(err)
				}
			}

		case "limit", "events":
			z.LimitAlternatives = d.RemainingArgs()
			if len(z.LimitAlternatives) == 0 {
				return nil, d.ArgErr()
			}
			for _, l := range z.LimitAlternatives {
				if err := checkLimit(l); err != nil {
					return nil, fail(err)
				}
			}

		case "window":
			var s string
			if !d.AllArgs(&s) {
				return nil, d.ArgErr()
			}
			w, err := parseWindow(s)
			if err != nil {
				return nil, fail(err)
			}
			z.Window = w

		case "timezone":
			if !d.AllArgs(&z.Timezone) {
				return nil, d.ArgErr()
			}
			if _, err := checkTimezone(z.Timezone); err != nil {
				return nil, fail(err)
			}

		case "hold", "lease":
			// lease is hold's old name: it stays the zone's lease, so
			// that what is refused names what was written.
			dur, err := parseDuration(d)
			if err == nil {
				err = checkHold(dur)
			}
			if err != nil {
				return nil, fail(err)
			}
			if dir == "hold" {
				z.Hold = caddy.Duration(dur)
			} else {
				z.Lease = caddy.Duration(dur)
			}

		case "burst":
			var s string
			if !d.AllArgs(&s) {
				return nil, d.ArgErr()
			}
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				return nil, fail(fmt.Errorf("want an integer from 1 to %d, got %q", maxLimit, s))
			}
			if err := checkBurst(n); err != nil {
				return nil, fail(err)
			}
			z.Burst = n

		case "buckets":
			var v string
			if !d.AllArgs(&v) {
				return nil, d.ArgErr()
			}
			n, err := strconv.Atoi(v)
			if err != nil {
				return nil, fail(fmt.Errorf("want an integer from %d to %d, got %q", algorithms.MinBuckets, algorithms.MaxBuckets, v))
			}
			if err := checkBuckets(n); err != nil {
				return nil, fail(err)
			}
			z.Buckets = n

		case "max_delay":
			dur, err := parseDuration(d)
			if err == nil {
				err = checkMaxDelay(dur)
			}
			if err != nil {
				return nil, fail(err)
			}
			z.MaxDelay = caddy.Duration(dur)

		case "algorithm":
			var s string
			if !d.AllArgs(&s) {
				return nil, d.ArgErr()
			}
			z.Algorithm = algorithms.Algorithm(s)
			if err := checkAlgorithm(z.Algorithm); err != nil {
				return nil, fail(err)
			}

		case "cost":
			args := d.RemainingArgs()
			if len(args) != 2 {
				return nil, d.ArgErr()
			}
			method, val := args[0], args[1]
			n, err := strconv.ParseInt(val, 10, 64)
			if err != nil {
				return nil, fail(fmt.Errorf("want a %s cost from 0 to %d, got %q", method, maxLimit, val))
			}
			if err := checkCost(method, n); err != nil {
				return nil, fail(err)
			}
			if _, ok := z.Cost[method]; ok {
				return nil, fail(fmt.Errorf("%s: repeated (want one cost line per method)", method))
			}
			if z.Cost == nil {
				z.Cost = make(map[string]int64)
			}
			z.Cost[method] = n

		case "dry_run":
			if d.NextArg() {
				return nil, d.ArgErr()
			}
			z.DryRun = true

		case "status":
			code, err := parseStatus(d)
			if err != nil {
				return nil, fail(err)
			}
			z.Status = code

		case "count_status":
			z.CountStatus = d.RemainingArgs()
			if len(z.CountStatus) == 0 {
				return nil, fail(errors.New("want one or more statuses, such as 401 or 4xx, got none"))
			}
			for _, v := range z.CountStatus {
				if err := checkCountStatus(v); err != nil {
					return nil, fail(err)
				}
			}

		case "ban":
			dur, err := parseDuration(d)
			if err == nil {
				err = checkBan(dur)
			}
			if err != nil {
				return nil, fail(err)
			}
			z.Ban = caddy.Duration(dur)

		case "cost_from":
			args := d.RemainingArgs()
			if len(args) != 2 {
				return nil, fail(fmt.Errorf("want usage input|output|total or header <name>, got %q", strings.Join(args, " ")))
			}
			switch args[0] {
			case "usage":
				if err := checkUsage(args[1]); err != nil {
					return nil, fail(fmt.Errorf("usage: %w", err))
				}
				z.CostFrom = &CostFrom{Usage: args[1]}
				if args[1] == usagePrice {
					lines, err := unmarshalPriceLines(d)
					if err != nil {
						return nil, fail(fmt.Errorf("price: %w", err))
					}
					z.CostFrom.Price = lines
				}
			case "header":
				if err := checkCostHeader(args[1]); err != nil {
					return nil, fail(fmt.Errorf("header: %w", err))
				}
				z.CostFrom = &CostFrom{Header: args[1]}
			default:
				return nil, fail(fmt.Errorf("want usage input|output|total or header <name>, got %q", args[0]))
			}

		case "reserve":
			args := d.RemainingArgs()
			var n int64
			var err error
			switch {
			case len(args) == 1:
				n, err = strconv.ParseInt(args[0], 10, 64)
				if err == nil {
					err = checkReserveUnits(n)
				}
				z.Reserve = &Reserve{Units: n}
			case len(args) == 2 && args[0] == "max_tokens":
				n, err = strconv.ParseInt(args[1], 10, 64)
				if err == nil {
					err = checkReserveUnits(n)
				}
				z.Reserve = &Reserve{MaxTokens: n}
			default:
				return nil, fail(fmt.Errorf("want <n> or max_tokens <default>, got %q", strings.Join(args, " ")))
			}
			if err != nil {
				return nil, fail(fmt.Errorf("want an integer from 1 to %d, got %q", maxLimit, args[len(args)-1]))
			}

		case "usage_in_stream":
			if !d.AllArgs(&z.UsageInStream) {
				return nil, d.ArgErr()
			}
			if err := checkOnOff(z.UsageInStream); err != nil {
				return nil, fail(err)
			}

		case "max_waiting", "ipv4_prefix", "ipv6_prefix":
			var s string
			if !d.AllArgs(&s) {
				return nil, d.ArgErr()
			}
			n, err := strconv.Atoi(s)
			if err != nil {
				return nil, fail(fmt.Errorf("want an integer, got %q", s))
			}
			switch dir {
			case "max_waiting":
				err = checkMaxWaiting(n)
				z.MaxWaiting = n
			case "ipv4_prefix":
				err = checkPrefix(n, 32)
				z.IPv4Prefix = n
			case "ipv6_prefix":
				err = checkPrefix(n, 128)
				z.IPv6Prefix = n
			}
			if err != nil {
				return nil, fail(err)
			}

		default:
			return nil, d.Errf("zone %q: unknown subdirective %q (want match, key, limit, window, timezone, algorithm, buckets, burst, hold, cost, max_delay, max_waiting, dry_run, ipv4_prefix, ipv6_prefix, status, count_status, ban, cost_from, reserve or usage_in_stream)", z.Name, dir)
		}
	}
	// What no line could check: the fields that are missing.
	if err := z.validate(); err != nil {
		return nil, d.Errf("zone %q: %v", z.Name, err)
	}
	return z, nil
}

// unmarshalPriceLines reads the block of cost_from usage price, a line per
// model or pattern of models:
//
//	<model> input <$> output <$> [cache_read <$>] [cache_write <$>] [cache_write_1h <$>]
//
// in dollars per million tokens, and checks the table as Validate does.
func unmarshalPriceLines(d *caddyfile.Dispenser) ([]PriceLine, error) {
	var lines []PriceLine
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		l := PriceLine{Model: d.Val()}
		args := d.RemainingArgs()
		if len(args)%2 != 0 {
			return nil, fmt.Errorf("%s: want a price of each kind, such as input 2.50 output 10.00, got %q", l.Model, strings.Join(args, " "))
		}
		for i := 0; i < len(args); i += 2 {
			kind, v := args[i], args[i+1]
			if !slices.Contains(priceKinds, kind) {
				return nil, fmt.Errorf("%s: want input, output, cache_read, cache_write or cache_write_1h, got %q", l.Model, kind)
			}
			if *l.field(kind) != "" {
				return nil, fmt.Errorf("%s: %s: repeated (want one price of each kind a line)", l.Model, kind)
			}
			*l.field(kind) = Dollars(v)
		}
		lines = append(lines, l)
	}
	if _, err := compilePrices(lines); err != nil {
		return nil, err
	}
	return lines, nil
}

// parseDuration reads the one argument of a duration directive.
func parseDuration(d *caddyfile.Dispenser) (time.Duration, error) {
	var s string
	if !d.AllArgs(&s) {
		return 0, d.ArgErr()
	}
	dur, err := caddy.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("want a duration such as 500ms or 1m, got %q", s)
	}
	return dur, nil
}

// parseStatus reads the one argument of a status directive.
func parseStatus(d *caddyfile.Dispenser) (int, error) {
	var s string
	if !d.AllArgs(&s) {
		return 0, d.ArgErr()
	}
	code, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("want an HTTP status from 400 to 599, got %q", s)
	}
	return code, checkStatus(code)
}

// Interface guard
var _ caddyfile.Unmarshaler = (*Handler)(nil)

// This file reads the one-line form that many published Caddyfiles use,
// the syntax of RussellLuo/caddy-ext's rate_limit:
//
//	rate_limit [<matcher>] <key> <rate> [<zone_size> [<reject_status>]]
//
// It is one zone with the default algorithm: key <key>, `limit n` and a
// window of 1s, 1m, 1h or 24h from <rate> (<n>r/s, r/m, r/h or r/d),
// <reject_status> as its status and <zone_size> as the memory store's
// max_keys. As in that plugin, where every directive is its own limiter,
// each one-liner counts on its own: its zone's name (see oneLineNames) is
// its own in the config, so no two share a counter.

// DefaultZoneName is the name a one-line rate_limit without a named matcher
// starts from.
const DefaultZoneName = "default"

// oneLineState keys, in the Caddyfile adapter's state, the *oneLineNames
// of the Caddyfile being adapted.
const oneLineState = "rate_limit.one_line_zones"

// oneLineNames gives each one-line rate_limit of a Caddyfile a zone name of
// its own: its named matcher's (@auth: auth) or DefaultZoneName, then "@"
// and the first address of its site (default@example.com, auth@:8080), so
// that one-liners in different sites never share a counter. A second
// one-liner of the same site that would take the same name gets "~2", a
// third "~3", in the order they are written in the site. A name thus
// depends on its line and its site only: an unchanged line in an
// unchanged site keeps its name, and its counters, across reloads, whatever
// other sites come and go. The site's address is in every one-liner's
// name, not only in those that would clash: the adapter reads a site's
// directives before it has seen the next site, so a clash with a later
// site cannot be known, and a suffix that came and went with other sites
// would reset counters on a reload.
//
// Block-form zones share a counter space by name, deliberately; a block
// zone named as a one-liner's zone would silently share its counter, so
// that is refused.
type oneLineNames struct {
	oneLine map[string]bool // names given to one-liners
	block   map[string]bool // names of block-form zones
}

// oneLineNamesOf returns the naming state kept in the adapter's state,
// creating it for the first rate_limit of the Caddyfile.
func oneLineNamesOf(state map[string]any) *oneLineNames {
	n, _ := state[oneLineState].(*oneLineNames)
	if n == nil {
		n = &oneLineNames{oneLine: make(map[string]bool), block: make(map[string]bool)}
		state[oneLineState] = n
	}
	return n
}

// name returns the zone name of a one-liner of site named after base, and
// records it. site is the site's first address, or "" where the adapter
// does not show it (then the name is base, ~2 and so on across the
// Caddyfile).
func (n *oneLineNames) name(base, site string) (string, error) {
	first := base
	if site != "" {
		first += "@" + siteLabel(site)
	}
	name := first
	// Without a site, the matcher @. or @.. would name a zone that URL
	// paths drop (see checkZoneName): it is numbered from the first.
	for i := 2; n.oneLine[name] || dotSegment(name); i++ {
		name = first + "~" + strconv.Itoa(i)
	}
	if n.block[name] {
		return "", fmt.Errorf("zone %q: the name of a one-line rate_limit and of a block-form zone; they would share one counter (want another name for the block-form zone)", name)
	}
	n.oneLine[name] = true
	return name, nil
}

// blockZone records the name of a block-form zone, refusing the name of a
// one-liner's zone.
func (n *oneLineNames) blockZone(name string) error {
	if n.oneLine[name] {
		return fmt.Errorf("zone %q: the name of a one-line rate_limit's zone; they would share one counter (want another name)", name)
	}
	n.block[name] = true
	return nil
}

// siteLabel is a site address as a zone name may show it: a byte that is
// not printable ASCII (an internationalized domain name) is written as
// %XX.
func siteLabel(site string) string {
	var b strings.Builder
	for i := 0; i < len(site); i++ {
		if c := site[i]; c < 0x20 || c > 0x7e {
			fmt.Fprintf(&b, "%%%02X", c)
		} else {
			b.WriteByte(c)
		}
	}
	return b.String()
}

// siteAddress returns the first address of the site block h is reading
// (&(name) for a named route), or "" if it cannot be read. httpcaddyfile.Helper keeps the block in an
// unexported field and has no method that returns its addresses, so they
// are read through reflection; a Caddy that renamed the field would give
// "", and names made unique across the Caddyfile instead of per site.
func siteAddress(h httpcaddyfile.Helper) string {
	block := reflect.ValueOf(h).FieldByName("parentBlock")
	if block.Kind() != reflect.Struct {
		return ""
	}
	keys := block.FieldByName("Keys")
	if keys.Kind() != reflect.Slice || keys.Len() == 0 || keys.Index(0).Kind() != reflect.Struct {
		return ""
	}
	text := keys.Index(0).FieldByName("Text")
	if text.Kind() != reflect.String || text.String() == "" {
		return ""
	}
	if h.IsNamedRoute() {
		// As written, so that a named route never takes a site's name.
		return "&(" + text.String() + ")"
	}
	return text.String()
}

// rateForm is a one-line rate: n requests per second, minute, hour or day.
// It takes a sign, so that a negative count is refused as not positive
// rather than as not a rate.
var rateForm = regexp.MustCompile(`^(-?[0-9]+)r/([smhd])$`)

var rateWindows = map[string]time.Duration{"s": time.Second, "m": time.Minute, "h": time.Hour, "d": 24 * time.Hour}

// parseRate reads <n>r/s, r/m, r/h or r/d.
func parseRate(s string) (int64, time.Duration, error) {
	m := rateForm.FindStringSubmatch(s)
	if m == nil {
		return 0, 0, fmt.Errorf("want <n>r/s, <n>r/m, <n>r/h or <n>r/d, such as 10r/s, got %q", s)
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil || n < 1 || n > maxLimit {
		return 0, 0, fmt.Errorf("want a positive number of requests, from 1 to %d, in <n>r/s, <n>r/m, <n>r/h or <n>r/d, got %q", maxLimit, s)
	}
	return n, rateWindows[m[2]], nil
}

// The key shorthands of RussellLuo/caddy-ext that Caddy does not have,
// as the Caddy placeholders they mean here. {remote.ip} is the client's
// address as Caddy's trusted_proxies decide it ({client_ip}): the other
// plugin took the first X-Forwarded-For entry of any client, which every
// client can forge to get a fresh counter. (Caddy's Caddyfile adapter has
// already turned {query.x}, {header.X}, {cookie.x} and {path.x} into its
// own placeholders before the directive is read, and {body.x}, which
// caddy-ext read through its requestbodyvar extension, is this module's
// own: a field of the JSON body, by a dotted path of object keys.)
var keyShorthands = map[string]string{
	"remote.ip":   "{http.vars.client_ip}",
	"remote.host": "{http.request.remote.host}",
	"remote.port": "{http.request.remote.port}",
}

// keyPrefixShorthands are the shorthands of an address masked to a
// network: {remote.ip_prefix.<bits>} and {remote.host_prefix.<bits>}.
var keyPrefixShorthands = map[string]string{
	"remote.ip_prefix.":   "{http.vars.client_ip}",
	"remote.host_prefix.": "{http.request.remote.host}",
}

var placeholderPattern = regexp.MustCompile(`\{[^{}]*\}`)

// oneLineKey turns a one-line key into a key template and the IPv4 prefix
// it asks for (0 for none), refusing a shorthand that has no equivalent:
// an unknown {remote.*}, or a {body.*} path that names array elements or
// patterns (GJSON's syntax, which requestbodyvar read).
func oneLineKey(key string) (string, int, error) {
	var bits int
	var err error
	out := placeholderPattern.ReplaceAllStringFunc(key, func(p string) string {
		name := p[1 : len(p)-1]
		if full, ok := keyShorthands[name]; ok {
			return full
		}
		for prefix, full := range keyPrefixShorthands {
			rest, ok := strings.CutPrefix(name, prefix)
			if !ok {
				continue
			}
			n, convErr := strconv.Atoi(rest)
			if convErr != nil || n < 1 || n > 32 {
				err = fmt.Errorf("%s: want a prefix length from 1 to 32 bits, got %q", p, rest)
			} else if bits != 0 && bits != n {
				err = fmt.Errorf("%s: one prefix length per key, got %d and %d", p, bits, n)
			}
			bits = n
			return full
		}
		if strings.HasPrefix(name, "remote.") {
			err = fmt.Errorf("%s: unknown (want {remote.ip}, {remote.host}, {remote.port}, {remote.ip_prefix.<bits>} or {remote.host_prefix.<bits>})", p)
		}
		return p
	})
	if err != nil {
		return "", 0, err
	}
	if err := checkKey(out); err != nil {
		return "", 0, err
	}
	return out, bits, nil
}

// unmarshalOneLine reads a one-line rate_limit's arguments (key, rate,
// zone_size, reject_status) into h, naming its zone zone.
func (h *Handler) unmarshalOneLine(d *caddyfile.Dispenser, args []string, zone string) error {
	if len(args) < 2 || len(args) > 4 {
		noun := "arguments"
		if len(args) == 1 {
			noun = "argument"
		}
		return d.Errf("rate_limit: want rate_limit [<matcher>] <key> <rate> [<zone_size> [<reject_status>]] "+
			"(such as rate_limit {remote.ip} 10r/s), or a block; got %d %s %q", len(args), noun, args)
	}
	if d.NextBlock(0) {
		return d.Errf("rate_limit %s %s: the one-line form takes no block (want either the one line, or the block form with zones)", args[0], args[1])
	}
	key, bits, err := oneLineKey(args[0])
	if err != nil {
		return d.Errf("rate_limit: key %v", err)
	}
	limit, window, err := parseRate(args[1])
	if err != nil {
		return d.Errf("rate_limit: rate: %v", err)
	}
	// The characters the zone's name takes from the matcher; the name
	// as a whole, with the site's address, is checked once it has it.
	if err := names.Check(zone); err != nil {
		return d.Errf("rate_limit: matcher @%s as the zone's name: %v", zone, err)
	}
	z := &Zone{
		Name:              zone,
		KeyAlternatives:   Alternatives{key},
		LimitAlternatives: Alternatives{strconv.FormatInt(limit, 10)},
		Window:            Window{Length: window},
		IPv4Prefix:        bits,
	}
	if len(args) > 2 {
		n, err := strconv.Atoi(args[2])
		if err != nil || n < 1 {
			return d.Errf("rate_limit: zone_size: want a positive number of keys the memory store keeps (its max_keys), got %q", args[2])
		}
		store, err := json.Marshal(map[string]any{"backend": "memory", "max_keys": n})
		if err != nil {
			return err
		}
		h.StoreRaw = store
	}
	if len(args) > 3 {
		code, err := strconv.Atoi(args[3])
		if err == nil {
			err = checkStatus(code)
		} else {
			err = fmt.Errorf("want an HTTP status from 400 to 599, got %q", args[3])
		}
		if err != nil {
			return d.Errf("rate_limit: reject_status: %v", err)
		}
		z.Status = code
	}
	h.Zones = []*Zone{z}
	return nil
}

// parseWindow reads a window as written in a Caddyfile.
func parseWindow(s string) (Window, error) {
	if p := algorithms.CalendarPeriod(s); p.Valid() {
		return Window{Calendar: p}, nil
	}
	d, err := caddy.ParseDuration(s)
	if err != nil {
		return Window{}, fmt.Errorf("want a duration such as 500ms or 1m, or a calendar period (day, week, month or year), got %q", s)
	}
	if err := checkWindow(d); err != nil {
		return Window{}, err
	}
	return Window{Length: d}, nil
}
