package ratelimit

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func TestMaskIP(t *testing.T) {
	for _, c := range []struct {
		v4, v6   int
		in, want string
	}{
		{24, 0, "203.0.113.77", "203.0.113.0/24"},
		{24, 0, "2001:db8::1", "2001:db8::1"},
		{0, 64, "2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"},
		{0, 64, "203.0.113.77", "203.0.113.77"},
		{16, 48, "::ffff:203.0.113.77", "203.0.0.0/16"},
		{24, 64, "fe80::1%eth0", "fe80::/64"},
		{24, 64, "not-an-ip", "not-an-ip"},
		{32, 128, "203.0.113.77", "203.0.113.77/32"},
	} {
		z := &Zone{IPv4Prefix: c.v4, IPv6Prefix: c.v6}
		if got := z.maskIP(c.in); got != c.want {
			t.Errorf("maskIP(%q) with /%d, /%d = %q, want %q", c.in, c.v4, c.v6, got, c.want)
		}
	}
}

func TestResolveLimit(t *testing.T) {
	for _, c := range []struct {
		alts  Alternatives
		quota any
		want  int64
		ok    bool
	}{
		{Alternatives{"10"}, nil, 10, true},
		{Alternatives{"{q}", "10"}, "25", 25, true},
		{Alternatives{"{q}", "10"}, " 25 ", 25, true},
		{Alternatives{"{q}", "10"}, "", 10, true},
		{Alternatives{"{q}", "10"}, "0", 10, true},
		{Alternatives{"{q}", "10"}, "-3", 10, true},
		{Alternatives{"{q}", "10"}, "2147483648", 10, true},
		{Alternatives{"{q}", "10"}, "1e3", 10, true},
		{Alternatives{"{q}"}, nil, 0, false},
		{Alternatives{"{q}"}, "2147483647", 2147483647, true},
	} {
		repl := caddy.NewReplacer()
		if c.quota != nil {
			repl.Set("q", c.quota)
		}
		z := &Zone{limits: compileTemplates(c.alts)}
		got, ok := z.resolveLimit(requestValues{repl: repl})
		if got != c.want || ok != c.ok {
			t.Errorf("limit %q with {q} = %v: %d %v, want %d %v", c.alts, c.quota, got, ok, c.want, c.ok)
		}
	}
}

// TestHeaderKeyAsReplacer holds the direct read of a request header field
// for a key to what Caddy's replacer answers for the same placeholder:
// every value joined, a field name in any case, and an absent or empty
// field falling through to the next alternative.
func TestHeaderKeyAsReplacer(t *testing.T) {
	for _, c := range []struct {
		name   string
		alts   Alternatives
		header http.Header
	}{
		{"one value", Alternatives{"{http.request.header.X-Api-Key}"}, http.Header{"X-Api-Key": {"k1"}}},
		{"two values", Alternatives{"{http.request.header.X-Api-Key}"}, http.Header{"X-Api-Key": {"k1", "k2"}}},
		{"lower-case name", Alternatives{"{http.request.header.x-api-key}"}, http.Header{"X-Api-Key": {"k1"}}},
		{"absent", Alternatives{"{http.request.header.X-Api-Key}", "fixed"}, http.Header{}},
		{"empty", Alternatives{"{http.request.header.X-Api-Key}", "fixed"}, http.Header{"X-Api-Key": {""}}},
		{"in text", Alternatives{"key:{http.request.header.X-Api-Key}"}, http.Header{"X-Api-Key": {"k1"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			req.Header = c.header
			repl := caddyhttp.NewTestReplacer(req)
			z := &Zone{keys: compileKeyTemplates(c.alts)}
			got := z.resolveKey(requestValues{repl: repl, header: req.Header})
			want := z.resolveKey(requestValues{repl: repl})
			if got != want {
				t.Errorf("key %q with header %v: %q, the replacer answers %q", c.alts, c.header, got, want)
			}
		})
	}
}
