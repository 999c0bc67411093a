package ratelimit

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// This file reads the one-line form that many published Caddyfiles use,
// the syntax of RussellLuo/caddy-ext's rate_limit:
//
//	rate_limit [<matcher>] <key> <rate> [<zone_size> [<reject_status>]]
//
// It is one zone with the default algorithm: key <key>, `limit n` and a
// window of 1s, 1m, 1h or 24h from <rate> (<n>r/s, r/m, r/h or r/d),
// <reject_status> as its status and <zone_size> as the memory store's
// max_keys. The zone is named after the directive's named matcher (@auth:
// auth), or DefaultZoneName without one.

// DefaultZoneName names the zone of a one-line rate_limit without a named
// matcher.
const DefaultZoneName = "default"

// oneLineState keys, in the Caddyfile adapter's state, the one-line zones
// already read, by name, so that two that would share a name but differ
// are refused.
const oneLineState = "rate_limit.one_line_zones"

// rateForm is a one-line rate: n requests per second, minute, hour or day.
var rateForm = regexp.MustCompile(`^([0-9]+)r/([smhd])$`)

var rateWindows = map[string]time.Duration{"s": time.Second, "m": time.Minute, "h": time.Hour, "d": 24 * time.Hour}

// parseRate reads <n>r/s, r/m, r/h or r/d.
func parseRate(s string) (int64, time.Duration, error) {
	m := rateForm.FindStringSubmatch(s)
	if m == nil {
		return 0, 0, fmt.Errorf("want <n>r/s, <n>r/m, <n>r/h or <n>r/d, such as 10r/s, got %q", s)
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil || n < 1 || n > maxLimit {
		return 0, 0, fmt.Errorf("want a number of requests from 1 to %d in <n>r/s, <n>r/m, <n>r/h or <n>r/d, got %q", maxLimit, s)
	}
	return n, rateWindows[m[2]], nil
}

// The key shorthands of RussellLuo/caddy-ext that Caddy does not have,
// as the Caddy placeholders they mean here. {remote.ip} is the client's
// address as Caddy's trusted_proxies decide it ({client_ip}): the other
// plugin took the first X-Forwarded-For entry of any client, which every
// client can forge to get a fresh counter. (Caddy's Caddyfile adapter has
// already turned {query.x}, {header.X}, {cookie.x} and {path.x} into its
// own placeholders before the directive is read.)
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
// it asks for (0 for none), refusing a shorthand that has no equivalent.
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
		switch {
		case strings.HasPrefix(name, "body."):
			err = fmt.Errorf("%s: not supported: the request body is the application's to read, after rate_limit has decided; "+
				"want a header ({header.X-Api-Key}), a query parameter ({query.id}), a cookie ({cookie.session}), "+
				"or a verified JWT claim ({jwt.sub}, with the block form's jwt block)", p)
		case strings.HasPrefix(name, "remote."):
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
		return d.Errf("rate_limit: want rate_limit [<matcher>] <key> <rate> [<zone_size> [<reject_status>]] "+
			"(such as rate_limit {remote.ip} 10r/s), or a block; got %d arguments %q", len(args), args)
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
	if err := checkZoneName(zone); err != nil {
		return d.Errf("rate_limit: matcher @%s as the zone's name: %v", zone, err)
	}
	z := &Zone{
		Name:              zone,
		KeyAlternatives:   Alternatives{key},
		LimitAlternatives: Alternatives{strconv.FormatInt(limit, 10)},
		Window:            caddy.Duration(window),
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

// oneLineClash refuses a one-line zone that another one-line rate_limit of
// the same Caddyfile already names with another key or rate: both would
// share one counter space while meaning different limits. seen holds the
// one-line zones read so far (the adapter's state); identical ones share
// their counter, as any zone used twice does.
func oneLineClash(seen map[string]*Zone, z *Zone) error {
	prev, ok := seen[z.Name]
	if !ok {
		seen[z.Name] = z
		return nil
	}
	if prev.KeyAlternatives[0] == z.KeyAlternatives[0] && prev.LimitAlternatives[0] == z.LimitAlternatives[0] &&
		prev.Window == z.Window && prev.IPv4Prefix == z.IPv4Prefix {
		return nil
	}
	name := "@" + z.Name
	if z.Name == DefaultZoneName {
		name = "no named matcher"
	}
	return fmt.Errorf("zone %q: two one-line rate_limits with %s differ in key or rate, and would share one counter (want a named matcher for each, such as rate_limit @login {remote.ip} 5r/m, or the block form with a zone of its own name)", z.Name, name)
}
