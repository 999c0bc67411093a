package ratelimit

import (
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/jwtclaims"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	var rl Handler
	err := rl.UnmarshalCaddyfile(h.Dispenser)
	return &rl, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens:
//
//	rate_limit [<matcher>] {
//		store <name> { ... }
//		jwt { ... }
//		headers x-ratelimit|ietf|both|off
//		on_store_error allow|deny
//		zone <name> {
//			match { <matchers> }
//			key <template> [<template>...]
//			limit <template|n> [<template|n>...]   # or: events
//			window <duration>
//			algorithm sliding_tail|fixed_window
//			cost <METHOD|*> <n>
//			max_delay <duration>
//			max_waiting <n>
//			dry_run
//			ipv4_prefix <bits>
//			ipv6_prefix <bits>
//		}
//	}
//
// Every value is checked here too, so `caddy adapt` already refuses a bad
// one with its file and line.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := make(map[string]bool)
	for d.NextBlock(0) {
		switch d.Val() {
		case "zone":
			z, err := unmarshalZone(d)
			if err != nil {
				return err
			}
			if seen[z.Name] {
				return d.Errf("zone %q: duplicate zone name in one rate_limit handler", z.Name)
			}
			seen[z.Name] = true
			h.Zones = append(h.Zones, z)

		case "store":
			if !d.NextArg() {
				return d.ArgErr()
			}
			name := d.Val()
			unm, err := caddyfile.UnmarshalModule(d, storage.Namespace+"."+name)
			if err != nil {
				return d.Errf("store: %v", err)
			}
			h.StoreRaw = caddyconfig.JSONModuleObject(unm, "backend", name, nil)

		case "jwt":
			if h.JWT != nil {
				return d.Err("jwt: only one jwt block per rate_limit")
			}
			h.JWT = new(jwtclaims.Config)
			if err := h.JWT.UnmarshalCaddyfile(d); err != nil {
				return err
			}

		case "headers":
			if !d.AllArgs(&h.Headers) {
				return d.ArgErr()
			}
			switch h.Headers {
			case headersXRateLimit, headersIETF, headersBoth, headersOff:
			default:
				return d.Errf("headers: unknown value %q (want x-ratelimit, ietf, both or off)", h.Headers)
			}

		case "on_store_error":
			if !d.AllArgs(&h.OnStoreError) {
				return d.ArgErr()
			}
			if h.OnStoreError != "allow" && h.OnStoreError != "deny" {
				return d.Errf("on_store_error: unknown value %q (want allow or deny)", h.OnStoreError)
			}

		default:
			return d.Errf("rate_limit: unknown subdirective %q", d.Val())
		}
	}
	if len(h.Zones) == 0 {
		return d.Err("rate_limit: at least one zone is required")
	}
	return nil
}

func unmarshalZone(d *caddyfile.Dispenser) (*Zone, error) {
	z := new(Zone)
	if !d.NextArg() {
		return nil, d.Errf("zone: a name is required")
	}
	z.Name = d.Val()
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		dir := d.Val()
		switch dir {
		case "match":
			matcherSet, err := caddyhttp.ParseCaddyfileNestedMatcherSet(d)
			if err != nil {
				return nil, d.Errf("zone %q: match: %v", z.Name, err)
			}
			z.MatcherSetsRaw = append(z.MatcherSetsRaw, matcherSet)

		case "key":
			z.Key = d.RemainingArgs()
			if len(z.Key) == 0 {
				return nil, d.ArgErr()
			}

		case "limit", "events":
			z.Limit = d.RemainingArgs()
			if len(z.Limit) == 0 {
				return nil, d.ArgErr()
			}
			for _, l := range z.Limit {
				if err := validateLimit(l); err != nil {
					return nil, d.Errf("zone %q: %s: %v", z.Name, dir, err)
				}
			}

		case "window", "max_delay":
			var s string
			if !d.AllArgs(&s) {
				return nil, d.ArgErr()
			}
			dur, err := caddy.ParseDuration(s)
			if err != nil {
				return nil, d.Errf("zone %q: %s: bad duration %q: %v", z.Name, dir, s, err)
			}
			if dir == "window" {
				if dur < time.Millisecond {
					return nil, d.Errf("zone %q: window: must be at least 1ms, got %q", z.Name, s)
				}
				z.Window = caddy.Duration(dur)
			} else {
				if dur < 0 {
					return nil, d.Errf("zone %q: max_delay: must not be negative, got %q", z.Name, s)
				}
				z.MaxDelay = caddy.Duration(dur)
			}

		case "algorithm":
			var s string
			if !d.AllArgs(&s) {
				return nil, d.ArgErr()
			}
			z.Algorithm = algorithms.Algorithm(s)
			if !z.Algorithm.Valid() {
				return nil, d.Errf("zone %q: algorithm: unknown algorithm %q (want sliding_tail or fixed_window)", z.Name, s)
			}

		case "cost":
			args := d.RemainingArgs()
			if len(args) != 2 {
				return nil, d.ArgErr()
			}
			method, val := args[0], args[1]
			if method != "*" && methodIndex(method) == methodOther {
				return nil, d.Errf("zone %q: cost: unknown HTTP method %q", z.Name, method)
			}
			n, err := strconv.ParseInt(val, 10, 64)
			if err != nil || n < 0 || n > maxLimit {
				return nil, d.Errf("zone %q: cost: %s cost must be an integer between 0 and %d, got %q", z.Name, method, maxLimit, val)
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

		case "max_waiting", "ipv4_prefix", "ipv6_prefix":
			var s string
			if !d.AllArgs(&s) {
				return nil, d.ArgErr()
			}
			n, err := strconv.Atoi(s)
			if err != nil {
				return nil, d.Errf("zone %q: %s: not an integer: %q", z.Name, dir, s)
			}
			switch dir {
			case "max_waiting":
				z.MaxWaiting = n
			case "ipv4_prefix":
				z.IPv4Prefix = n
			case "ipv6_prefix":
				z.IPv6Prefix = n
			}

		default:
			return nil, d.Errf("zone %q: unknown subdirective %q", z.Name, dir)
		}
	}
	if err := z.validate(); err != nil {
		return nil, d.Errf("zone %q: %v", z.Name, err)
	}
	return z, nil
}

// Interface guard
var _ caddyfile.Unmarshaler = (*Handler)(nil)
