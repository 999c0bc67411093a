package ratelimit

import (
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/d61b427a/caddy-rate-limit/internal/names"
)

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
