package ratelimit

import (
	"errors"
	"net/http"
	"net/netip"
	"net/textproto"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/d61b427a/caddy-rate-limit/internal/money"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// template is a key or limit alternative: literal text, or text with Caddy
// placeholders resolved per request.
type template struct {
	text    string
	dynamic bool
	// placeholder is set when the whole template is one placeholder, such
	// as {http.vars.client_ip}: its value is then read with one lookup,
	// without building a string the way a replacement does.
	placeholder string
	// variable is set when that placeholder is {http.vars.<variable>}.
	variable string
	// header is set, in canonical form, when that placeholder is
	// {http.request.header.<Field>}.
	header string
	// number is the value of a literal limit.
	number int64

	// A key template's key space (see keys.go): its tag, with tagSep;
	// bare, for the client's address, kept without a tag; tagged, for a
	// template replaced as a whole, its text behind the tag; stored, for
	// literal text, its stored key.
	tag    string
	bare   bool
	tagged string
	stored string
}

func compileTemplates(alts Alternatives) []template {
	out := make([]template, len(alts))
	for i, a := range alts {
		out[i] = compileTemplate(a)
	}
	return out
}

func compileTemplate(a string) template {
	t := template{text: a, dynamic: strings.Contains(a, "{")}
	if t.dynamic {
		compileBodyPaths(a)
	} else {
		t.number, _ = strconv.ParseInt(a, 10, 64)
		if strings.HasPrefix(a, "$") {
			t.number, _ = money.Parse(a)
		}
	}
	if len(a) > 2 && a[0] == '{' && a[len(a)-1] == '}' && strings.Count(a, "{") == 1 && strings.Count(a, "}") == 1 && !strings.Contains(a, `\`) {
		t.placeholder = a[1 : len(a)-1]
		if v, ok := strings.CutPrefix(t.placeholder, "http.vars."); ok {
			t.variable = v
		}
		if f, ok := strings.CutPrefix(t.placeholder, requestHeaderPrefix); ok && f != "" {
			t.header = textproto.CanonicalMIMEHeaderKey(f)
		}
	}
	return t
}

// requestHeaderPrefix begins the placeholders of request header fields
// ({header.X-Api-Key} in a Caddyfile).
const requestHeaderPrefix = "http.request.header."

// requestValues is where a request's placeholders are read: Caddy's
// replacer, and the request's variables and header fields, read directly
// for {http.vars.*} and {http.request.header.*}: what the replacer would
// answer, after asking every provider before it and, for a header, each
// of the dozens of its own placeholders that it tries first.
type requestValues struct {
	repl   *caddy.Replacer
	vars   map[string]any
	header http.Header
}

func (v requestValues) get(t *template) (any, bool) {
	switch {
	case t.variable != "" && v.vars != nil:
		return v.vars[t.variable], true
	case t.header != "" && v.header != nil:
		// As Caddy answers it: every value of the field, joined, and
		// known (empty) when the request has none.
		return strings.Join(v.header[t.header], ","), true
	}
	return v.repl.Get(t.placeholder)
}

// clientIP is the key when no key template resolves.
var clientIP = compileKeyTemplate(clientIPTemplate)

// errUnresolved stops a replacement as soon as one placeholder is unknown or
// empty; it is a sentinel so that falling through alternatives allocates no
// error.
var errUnresolved = errors.New("placeholder unknown or empty")

// resolveKey returns the stored key (see keys.go) of the first
// alternative whose placeholders all resolve to non-empty values, masking
// IP addresses to the zone's prefixes. If none does, the key is the
// client IP, so that a missing or forged credential falls back to
// per-address limiting rather than escaping the zone. The value is
// bounded by storage.BoundKey, the rule every store relies on, and
// follows the tag of its alternative's key space.
func (z *Zone) resolveKey(v requestValues) string {
	for i := range z.keys {
		if k, ok := z.resolveStored(v, &z.keys[i]); ok {
			return k
		}
	}
	if k, ok := z.resolveStored(v, &clientIP); ok {
		return k
	}
	return clientIP.storedKey("")
}

// resolveStored returns the stored key of key template t, and whether
// every placeholder in it is known and non-empty.
func (z *Zone) resolveStored(v requestValues, t *template) (string, bool) {
	switch {
	case !t.dynamic:
		return t.stored, true
	case t.tagged != "":
		// One string for the tag and the value; a value the bound
		// hashes makes another.
		out, ok := z.replace(v, t.tagged)
		if !ok {
			return "", false
		}
		value := out[len(t.tag):]
		if bounded := storage.BoundKey(value); bounded != value {
			out = t.tag + bounded
		}
		return out, true
	}
	value, ok := z.resolve(v, t)
	if !ok {
		return "", false
	}
	return t.storedKey(value), true
}

// resolveLimit returns the first alternative that resolves to a limit: an
// integer in 1..maxLimit, or dollars in a zone priced in money (see
// limitValue).
func (z *Zone) resolveLimit(v requestValues) (int64, bool) {
	for i := range z.limits {
		t := &z.limits[i]
		if !t.dynamic {
			return t.number, true
		}
		s, ok := z.resolve(v, t)
		if !ok {
			continue
		}
		if n, ok := z.limitValue(s); ok {
			return n, true
		}
	}
	return 0, false
}

// resolve returns the template's value, and whether every placeholder in
// it is known and non-empty.
func (z *Zone) resolve(v requestValues, t *template) (string, bool) {
	if !t.dynamic {
		return t.text, true
	}
	if t.placeholder != "" {
		val, ok := v.get(t)
		if !ok || val == nil {
			return "", false
		}
		s := caddy.ToString(val)
		if s == "" {
			return "", false
		}
		if z.IPv4Prefix > 0 || z.IPv6Prefix > 0 {
			s = z.maskIP(s)
		}
		return s, true
	}
	return z.replace(v, t.text)
}

// replace returns text with its placeholders replaced, and whether every
// one is known and non-empty.
func (z *Zone) replace(v requestValues, text string) (string, bool) {
	out, err := v.repl.ReplaceFunc(text, func(_ string, val any) (any, error) {
		if val == nil {
			return nil, errUnresolved
		}
		s := caddy.ToString(val)
		if s == "" {
			return nil, errUnresolved
		}
		if z.IPv4Prefix > 0 || z.IPv6Prefix > 0 {
			s = z.maskIP(s)
		}
		return s, nil
	})
	return out, err == nil
}

// maskIP masks s to the zone's prefix if it is an IP address.
func (z *Zone) maskIP(s string) string {
	addr, err := netip.ParseAddr(s)
	if err != nil {
		return s
	}
	addr = addr.Unmap()
	bits := z.IPv6Prefix
	if addr.Is4() {
		bits = z.IPv4Prefix
	}
	if bits == 0 {
		return s
	}
	p, err := addr.WithZone("").Prefix(bits)
	if err != nil {
		return s
	}
	return p.String()
}
