package ratelimit

import (
	"testing"

	"github.com/caddyserver/caddy/v2"
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
