package ratelimit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/d61b427a/caddy-rate-limit/internal/race"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// TestHiddenKey: a hidden key is "#" and 16 hex digits, the same for the
// same key, different for different keys, and not the bare SHA-256 of the
// key, which anyone could compute for every IPv4 address and look up.
func TestHiddenKey(t *testing.T) {
	form := regexp.MustCompile(`^#[0-9a-f]{16}$`)
	keys := []string{"192.0.2.7", "192.0.2.8", "sk_live_0123456789", ""}
	seen := map[string]string{}
	for _, k := range keys {
		h := hiddenKey(k)
		if !form.MatchString(h) {
			t.Errorf("hiddenKey(%q) = %q, want # and 16 hex digits", k, h)
		}
		if again := hiddenKey(k); again != h {
			t.Errorf("hiddenKey(%q) = %q, then %q", k, h, again)
		}
		sum := sha256.Sum256([]byte(k))
		if h == "#"+hex.EncodeToString(sum[:8]) {
			t.Errorf("hiddenKey(%q) is the key's bare SHA-256", k)
		}
		if other, ok := seen[h]; ok {
			t.Errorf("keys %q and %q both hash to %s", other, k, h)
		}
		seen[h] = k
	}
}

// TestLogKeyShowsKeys: mholt's log_key shows keys as log_keys on does;
// without either, keys are hashes.
func TestLogKeyShowsKeys(t *testing.T) {
	for _, c := range []struct {
		config string
		want   string
	}{
		{`{"log_key":true,"zones":[{"name":"unit_log_key","limit":1,"window":"1h"}]}`, "k"},
		{`{"log_keys":"on","zones":[{"name":"unit_log_keys_on","limit":1,"window":"1h"}]}`, "k"},
		{`{"zones":[{"name":"unit_log_keys_default","limit":1,"window":"1h"}]}`, hiddenKey("k")},
	} {
		h := provisionHandler(t, c.config)
		core, logged := observer.New(zap.InfoLevel)
		zap.New(core).Info("line", h.keyField("k"))
		if got := logged.All()[0].ContextMap(); got["key"] != c.want || got["from"] != clientIPTemplate {
			t.Errorf("%s: key logged as %v, want %q from %s", c.config, got, c.want, clientIPTemplate)
		}
	}
}

// resolvedKey is the stored key the first zone of h gives a request from
// clientIP with headers.
func resolvedKey(h *Handler, clientIP string, headers ...string) string {
	r, repl := testRequest(context.Background(), http.MethodGet, clientIP, headers...)
	vars, _ := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
	return h.Zones[0].resolveKey(requestValues{repl: repl, vars: vars})
}

// TestKeySpaces: each alternative of a zone's key keeps its values behind
// a tag of its own, 8 hex digits of its template and '|', before the
// value bounded as every key is (a long one hashed, its tag kept); the
// client's address, the fallback or an alternative, is kept as it is,
// unless it holds a '|'; and a stored key tells its value and
// alternative back.
func TestKeySpaces(t *testing.T) {
	const header = "{http.request.header.X-Api-Key}"
	long := strings.Repeat("k", storage.MaxKeyLen+1)
	for _, c := range []struct {
		name, zone string
		clientIP   string
		headers    []string
		from       string
		value      string // as stored, after the tag if any
		bare       bool
	}{
		{"an API key that is an address", `{"key":["` + header + `"]}`, "127.0.0.9", []string{"X-Api-Key: 127.0.0.9"}, header, "127.0.0.9", false},
		{"the fallback", `{"key":["` + header + `"]}`, "127.0.0.9", nil, clientIPTemplate, "127.0.0.9", true},
		{"no key: the client's address", `{}`, "2001:db8::1", nil, clientIPTemplate, "2001:db8::1", true},
		{"{client_ip} as an alternative", `{"key":["{http.vars.client_ip}"]}`, "127.0.0.9", []string{"X-Api-Key: x"}, clientIPTemplate, "127.0.0.9", true},
		{"an address masked to its network", `{"ipv4_prefix":24}`, "203.0.113.77", nil, clientIPTemplate, "203.0.113.0/24", true},
		{"an address that holds a '|'", `{}`, "a|b", nil, clientIPTemplate, "a|b", false},
		{"a prefix and a placeholder", `{"key":["key:` + header + `"]}`, "127.0.0.9", []string{"X-Api-Key: 127.0.0.9"}, "key:" + header, "key:127.0.0.9", false},
		{"a long value, replaced", `{"key":["key:` + header + `"]}`, "127.0.0.9", []string{"X-Api-Key: " + long}, "key:" + header, storage.BoundKey("key:" + long), false},
		{"a long value", `{"key":["` + header + `"]}`, "127.0.0.9", []string{"X-Api-Key: " + long}, header, storage.BoundKey(long), false},
		{"a value with a brace", `{"key":["` + header + `"]}`, "127.0.0.9", []string{"X-Api-Key: a}b"}, header, storage.BoundKey("a}b"), false},
		{"literal text", `{"key":["global"]}`, "127.0.0.9", nil, "global", "global", false},
	} {
		var zone map[string]any
		if err := json.Unmarshal([]byte(c.zone), &zone); err != nil {
			t.Fatal(err)
		}
		zone["name"], zone["limit"], zone["window"] = "unit_spaces", []int{1}, "1m"
		config, _ := json.Marshal(map[string]any{"zones": []any{zone}})
		h := provisionHandler(t, string(config))
		stored := resolvedKey(h, c.clientIP, c.headers...)
		want := spaceTag(c.from) + c.value
		if c.bare {
			want = c.value
		}
		if stored != want {
			t.Errorf("%s: stored as %q, want %q", c.name, stored, want)
		}
		if value, from := keyFrom(stored); value != c.value || from != c.from {
			t.Errorf("%s: %q tells %q from %s, want %q from %s", c.name, stored, value, from, c.value, c.from)
		}
	}

	tags := map[string]string{}
	for _, tmpl := range []string{header, "{http.request.header.X-Api-Kez}", clientIPTemplate, "key:" + header, "global"} {
		tag := spaceTag(tmpl)
		if len(tag) != tagLen+1 || tag[tagLen] != tagSep || strings.Trim(tag[:tagLen], "0123456789abcdef") != "" {
			t.Errorf("the tag of %s is %q, want %d hex digits and %q", tmpl, tag, tagLen, tagSep)
		}
		if other, ok := tags[tag]; ok {
			t.Errorf("%s and %s share the tag %s", other, tmpl, tag)
		}
		tags[tag] = tmpl
	}
	if value, from := keyFrom("0badc0de|v"); value != "v" || from != "" {
		t.Errorf("a stored key of no template compiled here tells %q from %q, want v from none", value, from)
	}
}

// TestSameTemplatesShareASpace: zones of one name in two handlers that
// list the same alternatives, in another order, keep a key of one
// alternative as the same stored key.
func TestSameTemplatesShareASpace(t *testing.T) {
	a := provisionHandler(t, `{"zones":[{"name":"unit_shared","key":["{http.request.cookie.s}","{http.request.header.X-Api-Key}"],"limit":[1],"window":"1m"}]}`)
	b := provisionHandler(t, `{"zones":[{"name":"unit_shared","key":["{http.request.header.X-Api-Key}","{http.request.cookie.s}"],"limit":[1],"window":"1m"}]}`)
	if ka, kb := resolvedKey(a, "203.0.113.9", "X-Api-Key: k"), resolvedKey(b, "203.0.113.9", "X-Api-Key: k"); ka != kb {
		t.Fatalf("the same API key is %q in one handler and %q in the other", ka, kb)
	}
}

// TestKeyAlternativesCountApart: a request whose X-Api-Key is another
// client's address uses up its own counter, not that client's, and a
// ban of it bans nobody else.
func TestKeyAlternativesCountApart(t *testing.T) {
	h := provisionHandler(t, `{"zones":[{"name":"unit_apart","key":["{http.request.header.X-Api-Key}"],"limit":[1],"window":"1h","ban":"1h"}]}`)
	withClock(t, h, time.Unix(1_800_000_000, 0))
	for i, want := range []int{http.StatusOK, http.StatusTooManyRequests, http.StatusTooManyRequests} {
		if got := serve(t, h, context.Background(), http.MethodGet, "198.51.100.1", "X-Api-Key: 203.0.113.9"); got.status != want {
			t.Fatalf("API key request %d: %d, want %d", i+1, got.status, want)
		}
	}
	if got := serve(t, h, context.Background(), http.MethodGet, "203.0.113.9"); got.status != http.StatusOK {
		t.Fatalf("the client whose address the API key was: %d, want 200", got.status)
	}
}

// TestKeyResolutionAllocations: the tag costs the client's address and
// literal keys no allocation, a template replaced as a whole none more
// than its replacement, and a single placeholder the one string of the
// stored key.
func TestKeyResolutionAllocations(t *testing.T) {
	if race.Enabled {
		t.Skip("allocation counts are not asserted under the race detector")
	}
	for _, c := range []struct {
		key  string
		more float64 // than the replacement of the template's text
	}{
		{clientIPTemplate, 0},
		{"global", 0},
		{"key:{http.request.header.X-Api-Key}", 0},
		{"{http.request.header.X-Api-Key}", 1},
	} {
		h := provisionHandler(t, `{"zones":[{"name":"unit_allocs","key":["`+c.key+`"],"limit":[1],"window":"1m"}]}`)
		z := h.Zones[0]
		r, repl := testRequest(context.Background(), http.MethodGet, "203.0.113.9", "X-Api-Key: k")
		v := requestValues{repl: repl}
		v.vars, _ = r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
		replaced := testing.AllocsPerRun(100, func() { _, _ = z.resolve(v, &z.keys[0]) })
		if n := testing.AllocsPerRun(100, func() { _ = z.resolveKey(v) }); n != replaced+c.more {
			t.Errorf("key %s: %v allocations, want %v (the template's own %v and %v)", c.key, n, replaced+c.more, replaced, c.more)
		}
	}
}

// TestLoggedKeysEscaped: a key shown as it is (log_keys on) with an
// escape sequence and a line break is written escaped in Caddy's log
// formats, json and console alike: it can neither drive the terminal
// that shows the log nor forge a line.
func TestLoggedKeysEscaped(t *testing.T) {
	h := provisionHandler(t, `{"log_keys":"on","zones":[{"name":"unit_logged_escaped","key":["{http.request.header.X-Api-Key}"],"limit":[1],"window":"1m"}]}`)
	stored := spaceTag("{http.request.header.X-Api-Key}") + "\x1b[2J\r\nforged"
	for name, enc := range map[string]zapcore.Encoder{
		"json":    zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()),
		"console": zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()),
	} {
		var out strings.Builder
		zap.New(zapcore.NewCore(enc, zapcore.AddSync(&out), zap.InfoLevel)).Info("rate limit exceeded", h.keyField(stored))
		if line := out.String(); strings.ContainsAny(strings.TrimSuffix(line, "\n"), "\x1b\r\n") || !strings.Contains(line, `\u001b[2J\r\nforged`) {
			t.Errorf("%s: logged %q, want the key escaped", name, line)
		}
	}
}
