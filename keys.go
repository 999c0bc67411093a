package ratelimit

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/netip"
	"net/textproto"
	"strconv"
	"strings"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/d61b427a/caddy-rate-limit/internal/money"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// Keys are whatever clients send, and often credentials: an API key, a
// session cookie, a token. So wherever the module shows a key to someone
// other than the request's own handlers (log lines, events, top keys on
// the admin API, the status page and the command), it shows a keyed hash
// of it, unless the handler's log_keys is on. The placeholder
// {http.rate_limit.key} holds the key as it is: it is for the operator's
// own handlers, which can read the request anyway.

// keyHashKey keys the hash that stands for a hidden key. It is drawn when
// Caddy starts, so a key's hash is the same in every log line, event and
// answer until the process ends (across config reloads), while nobody
// without it can find a key by hashing guesses, which an unkeyed hash of
// a short key (an IPv4 address has 2^32) would allow. Another process,
// or a restart, shows other hashes.
var keyHashKey = func() []byte {
	k := make([]byte, 32)
	_, _ = rand.Read(k) // never fails: crypto/rand crashes the program instead
	return k
}()

// hiddenKey is how a hidden key is shown: "#" and 16 hex digits of its
// HMAC-SHA256 under keyHashKey, enough to tell keys apart and to follow
// one from line to line, not to read it.
func hiddenKey(key string) string {
	mac := hmac.New(sha256.New, keyHashKey)
	_, _ = io.WriteString(mac, key)
	return "#" + hex.EncodeToString(mac.Sum(nil)[:8])
}

// shownKey is a stored key as it is shown: its value if show (log_keys
// on), else the hash of the stored key, which tells apart the same
// value in two key spaces.
func shownKey(stored string, show bool) string {
	if show {
		return keyValue(stored)
	}
	return hiddenKey(stored)
}

// keyField is a stored key as log fields: key, shown as log_keys says,
// and from, the alternative of the zone's key it came from.
func (h *Handler) keyField(stored string) zap.Field {
	return zap.Inline(loggedKey{stored: stored, show: h.showKeys})
}

// loggedKey is a stored key as keyField logs it.
type loggedKey struct {
	stored string
	show   bool
}

func (k loggedKey) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	_, from := keyFrom(k.stored)
	enc.AddString("key", shownKey(k.stored, k.show))
	enc.AddString("from", from)
	return nil
}

// hash is the hash that stands for a stored key in the zone's logs,
// events and top keys, or "" if the zone shows keys as they are.
func (z *Zone) hash(stored string) string {
	if z.showKeys {
		return ""
	}
	return hiddenKey(stored)
}

// Key spaces. A zone's key has alternatives (key {jwt.sub}
// {header.X-Api-Key}), and falls back to the client's address when none
// resolves. Each counts in a key space of its own, so that no value of
// one lands on another's counter, ban or override: a client that sends
// another client's address as its X-Api-Key uses up, or gets banned, its
// own counter, never the address's. A key as the stores keep it is its
// alternative's tag, 8 hex digits of the SHA-256 of the template's text,
// then '|' and the value bounded by storage.BoundKey (so a long value is
// hashed and the tag stays). The tag depends on the text alone: zones of
// one name in different handlers that list the same templates count a
// key in the same space whatever their order, and a stored key tells
// which alternative it came from.
//
// The client's address ({http.vars.client_ip}: the fallback, and
// {client_ip} or a one-liner's {remote.ip} as an alternative, which are
// the same key) is kept as it is, without a tag: an address never holds
// a '|', so it is a space apart from every tagged one, and the commonest
// key costs no byte and no allocation more. A value of it that does hold
// one (a vars directive that sets client_ip to a header) is tagged like
// any other.

// clientIPTemplate is the client's address as a key template, the key
// of a zone without one and the fallback of every zone.
const clientIPTemplate = "{http.vars.client_ip}"

const (
	// tagLen is the length of a key space's tag, in hex digits, and
	// tagSep what follows it in a stored key.
	tagLen = 8
	tagSep = '|'
)

// spaceTag returns the tag of the key space of template, with tagSep.
func spaceTag(template string) string {
	sum := sha256.Sum256([]byte(template))
	return hex.EncodeToString(sum[:tagLen/2]) + string(tagSep)
}

// keyTemplates maps each tag (with tagSep) to its template, for every key
// template compiled in this process, so that a stored key can say which
// alternative it came from in any zone that shares its name. It grows
// with the templates of the configs loaded, never with requests.
var keyTemplates sync.Map

// compileKeyTemplates compiles a zone's key alternatives, each with its
// key space.
func compileKeyTemplates(alts Alternatives) []template {
	out := make([]template, len(alts))
	for i, a := range alts {
		out[i] = compileKeyTemplate(a)
	}
	return out
}

// compileKeyTemplate compiles a key alternative, with its key space.
func compileKeyTemplate(a string) template {
	t := compileTemplate(a)
	t.tag = spaceTag(a)
	t.bare = a == clientIPTemplate
	keyTemplates.LoadOrStore(t.tag, a)
	if t.dynamic && t.placeholder == "" {
		// Replaced with the tag in front: the replacement's one string
		// is the stored key.
		t.tagged = t.tag + a
	}
	if !t.dynamic {
		t.stored = t.storedKey(a)
	}
	return t
}

// storedKey is the key the stores keep for value, resolved from t.
func (t *template) storedKey(value string) string {
	return t.tagKey(storage.BoundKey(value))
}

// tagKey is the key the stores keep for key, a value bounded by
// storage.BoundKey, from t.
func (t *template) tagKey(key string) string {
	if t.bare && strings.IndexByte(key, tagSep) < 0 {
		return key
	}
	return t.tag + key
}

// splitKey returns the value of a stored key and the tag of its space
// (with tagSep), or "" for the client's address kept as it is.
func splitKey(stored string) (tag, value string) {
	if len(stored) > tagLen && stored[tagLen] == tagSep {
		return stored[:tagLen+1], stored[tagLen+1:]
	}
	return "", stored
}

// keyValue is the value of a stored key, as {http.rate_limit.key} holds it.
func keyValue(stored string) string {
	_, value := splitKey(stored)
	return value
}

// keyFrom returns the value of a stored key and the template of the
// alternative it came from.
func keyFrom(stored string) (value, from string) {
	tag, value := splitKey(stored)
	if tag == "" {
		return value, clientIPTemplate
	}
	if t, ok := keyTemplates.Load(tag); ok {
		return value, t.(string)
	}
	return value, ""
}

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
