package ratelimit

import (
	"errors"
	"fmt"
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
// one-line form (see oneline.go; its zone is named DefaultZoneName here,
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
