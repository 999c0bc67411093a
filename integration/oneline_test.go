package integration

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"
)

// Tests of the one-line form, rate_limit [<matcher>] <key> <rate>
// [<zone_size> [<reject_status>]], through a real Caddy: the lines that
// setup guides for self-hosted apps, API gateways and hardening checklists
// tell people to write, each one line as they print it.

// burstThenRefused sends limit requests, which must all pass, then up to
// limit more, of which at least one must be refused with want: a sliding
// window that a burst straddles may let one or two of them through.
func burstThenRefused(t *testing.T, url string, limit, want int, headers ...string) *http.Response {
	t.Helper()
	for i := range limit {
		if resp, _ := do(t, http.MethodGet, url, headers...); resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d of %d: %d, want 200", i+1, limit, resp.StatusCode)
		}
	}
	for range limit {
		resp, _ := do(t, http.MethodGet, url, headers...)
		if resp.StatusCode == want {
			if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || ra < 1 {
				t.Fatalf("refused without a Retry-After: %v", resp.Header)
			}
			return resp
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d, want 200 or %d", resp.StatusCode, want)
		}
	}
	t.Fatalf("%d more requests after the limit of %d, none refused", limit, limit)
	return nil
}

// zoneNames lists the zones the admin API shows.
func zoneNames(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, z := range zones(t, adminURL) {
		out = append(out, z.Name)
	}
	return out
}

// TestGuidesOneLiners runs one-liners as published guides print them.
func TestGuidesOneLiners(t *testing.T) {
	cases := []struct {
		name, site string
		check      func(t *testing.T)
	}{
		{"a self-hosted app behind Caddy: 10 requests a second per client", `
` + siteAddr + ` {
	rate_limit {remote.ip} 10r/s
	respond "ok"
}`, func(t *testing.T) {
			burstThenRefused(t, siteURL+"/", 10, http.StatusTooManyRequests)
		}},
		{"a hardening checklist: 100 requests a minute per client", `
` + siteAddr + ` {
	rate_limit {remote.ip} 100r/m
	respond "ok"
}`, func(t *testing.T) {
			roomInWindow(time.Minute, 10*time.Second)
			burstThenRefused(t, siteURL+"/", 100, http.StatusTooManyRequests)
		}},
		{"a login form: 5 attempts a minute, the rest of the site free", `
` + siteAddr + ` {
	@auth path /login /api/auth/*
	rate_limit @auth {remote.ip} 5r/m
	respond "ok"
}`, func(t *testing.T) {
			roomInWindow(time.Minute, 10*time.Second)
			burstThenRefused(t, siteURL+"/login", 5, http.StatusTooManyRequests)
			for range 20 {
				if resp, _ := do(t, http.MethodGet, siteURL+"/"); resp.StatusCode != http.StatusOK {
					t.Fatalf("the rest of the site: %d", resp.StatusCode)
				}
			}
			if names, want := fmt.Sprint(zoneNames(t)), "[auth@"+siteAddr+"]"; names != want {
				t.Fatalf("zones %v, want %s, named after @auth and the site", names, want)
			}
		}},
		{"an API gateway: 60 requests an hour per API key", `
` + siteAddr + ` {
	rate_limit {header.X-Api-Key} 60r/h
	respond "ok"
}`, func(t *testing.T) {
			burstThenRefused(t, siteURL+"/", 60, http.StatusTooManyRequests, "X-Api-Key: k1")
			if resp, _ := do(t, http.MethodGet, siteURL+"/", "X-Api-Key: k2"); resp.StatusCode != http.StatusOK {
				t.Fatalf("another API key: %d, want 200", resp.StatusCode)
			}
		}},
		{"a zone size and a reject status: 503 for 30 requests an hour", `
` + siteAddr + ` {
	rate_limit {remote.ip} 30r/h 10000 503
	respond "ok"
}`, func(t *testing.T) {
			resp := burstThenRefused(t, siteURL+"/", 30, http.StatusServiceUnavailable)
			if resp.Header.Get("X-RateLimit-Limit") != "30" {
				t.Fatalf("headers %v", resp.Header)
			}
		}},
		{"a whole /24 network shares 20 requests an hour", `
` + siteAddr + ` {
	rate_limit {remote.ip_prefix.24} 20r/h
	respond "{http.rate_limit.key}"
}`, func(t *testing.T) {
			_, body := do(t, http.MethodGet, siteURL+"/")
			if body != "127.0.0.0/24" {
				t.Fatalf("key %q, want the client's /24", body)
			}
			burstThenRefused(t, siteURL+"/", 19, http.StatusTooManyRequests)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			startCaddy(t, c.site)
			c.check(t)
		})
	}
}

// TestCaddyExtReadmeExample is the example of RussellLuo/caddy-ext's
// README: 2 requests a minute per id on /foo; another id is not limited.
func TestCaddyExtReadmeExample(t *testing.T) {
	startCaddy(t, `
`+siteAddr+` {
	route /foo {
		rate_limit {query.id} 2r/m

		respond 200
	}
}
`)
	roomInWindow(time.Minute, 10*time.Second)
	for i, want := range []int{200, 200, 429} {
		if resp, _ := do(t, http.MethodGet, siteURL+"/foo?id=1"); resp.StatusCode != want {
			t.Fatalf("id=1, request %d: %d, want %d", i+1, resp.StatusCode, want)
		}
	}
	if resp, _ := do(t, http.MethodGet, siteURL+"/foo?id=2"); resp.StatusCode != http.StatusOK {
		t.Fatalf("id=2: %d, want 200", resp.StatusCode)
	}
}

// TestRemoteIPIsTheClientIP: {remote.ip} is the client's address as
// trusted_proxies decide it. Without trusted proxies, a client that sends
// its own X-Forwarded-For, a new address each time, still has one counter;
// behind a trusted proxy, the addresses it forwards are the clients.
func TestRemoteIPIsTheClientIP(t *testing.T) {
	var site = `
` + siteAddr + ` {
	rate_limit {remote.ip} 2r/h
	respond "{http.rate_limit.key}"
}
`
	t.Run("no trusted proxies: a forged X-Forwarded-For buys nothing", func(t *testing.T) {
		startCaddy(t, site)
		for i, want := range []int{200, 200, 429, 429} {
			resp, body := do(t, http.MethodGet, siteURL+"/", fmt.Sprintf("X-Forwarded-For: 198.51.100.%d", i+1))
			if resp.StatusCode != want {
				t.Fatalf("request %d with a fresh X-Forwarded-For: %d, want %d", i+1, resp.StatusCode, want)
			}
			if want == 200 && body != "127.0.0.1" && body != "::1" {
				t.Fatalf("key %q, want the connection's address", body)
			}
		}
	})
	t.Run("a trusted proxy: each forwarded client its own counter", func(t *testing.T) {
		startCaddy(t, withGlobals("servers {\n\t\ttrusted_proxies static 127.0.0.0/8 ::1\n\t}")+site)
		for _, client := range []string{"198.51.100.1", "198.51.100.2"} {
			for i, want := range []int{200, 200, 429} {
				resp, body := do(t, http.MethodGet, siteURL+"/", "X-Forwarded-For: "+client)
				if resp.StatusCode != want || want == 200 && body != client {
					t.Fatalf("client %s, request %d: %d key %q, want %d with its own key", client, i+1, resp.StatusCode, body, want)
				}
			}
		}
	})
}

// TestOneLinersThroughCaddy: several one-line rate_limits in one site, each
// its own handler and zone, as Caddy orders them: a login request counts
// against both the login zone and the site-wide one.
func TestOneLinersThroughCaddy(t *testing.T) {
	startCaddy(t, `
`+siteAddr+` {
	@login path /login
	rate_limit @login {remote.ip} 2r/h
	rate_limit {remote.ip} 5r/h
	respond "ok"
}
`)
	for i, want := range []int{200, 200, 429} {
		if resp, _ := do(t, http.MethodGet, siteURL+"/login"); resp.StatusCode != want {
			t.Fatalf("login %d: %d, want %d", i+1, resp.StatusCode, want)
		}
	}
	// The two logins that passed count site-wide too; the refused one
	// counts nowhere.
	for i, want := range []int{200, 200, 200, 429} {
		if resp, _ := do(t, http.MethodGet, siteURL+"/"); resp.StatusCode != want {
			t.Fatalf("site request %d: %d, want %d", i+1, resp.StatusCode, want)
		}
	}
	if names, want := fmt.Sprint(zoneNames(t)), "[default@"+siteAddr+" login@"+siteAddr+"]"; names != want {
		t.Fatalf("zones %v, want %s", names, want)
	}
}

// oneLineSite is a site at addr that answers "ok" and holds line.
func oneLineSite(addr, line string) string {
	return addr + " {\n\t" + line + "\n\trespond \"ok\"\n}\n"
}

// TestOneLinersInTwoSitesCountApart: the one-liners of two sites each
// count on their own, whether their lines differ or are identical: a
// client that has used up site A still has all of site B. Neither is
// refused for resembling the other.
func TestOneLinersInTwoSitesCountApart(t *testing.T) {
	for _, c := range []struct {
		name   string
		lineB  string
		limitB int
	}{
		{"other rates", "rate_limit {header.X-Client} 3r/h", 3},
		{"identical lines", "rate_limit {header.X-Client} 2r/h", 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			startCaddy(t, oneLineSite(siteAddr, "rate_limit {header.X-Client} 2r/h")+oneLineSite(site2Addr, c.lineB))
			wantStatuses(t, []int{get(t, siteURL+"/", "c"), get(t, siteURL+"/", "c"), get(t, siteURL+"/", "c")}, 200, 200, 429)
			for i := range c.limitB {
				if got := get(t, site2URL+"/", "c"); got != http.StatusOK {
					t.Fatalf("site B, request %d after site A refused: %d, want 200", i+1, got)
				}
			}
			if got := get(t, site2URL+"/", "c"); got != http.StatusTooManyRequests {
				t.Fatalf("site B, request %d: %d, want 429", c.limitB+1, got)
			}
			want := []string{"default@" + siteAddr, "default@" + site2Addr}
			slices.Sort(want)
			if names := zoneNames(t); !slices.Equal(names, want) {
				t.Fatalf("zones %s, want %s", names, want)
			}
		})
	}
}

// TestOneLinerKeepsItsCountsAcrossReloads: an unchanged line in an
// unchanged site keeps its zone, and so its counts, when the same
// Caddyfile is loaded again and when another site, written before it,
// changes or loses its one-liner.
func TestOneLinerKeepsItsCountsAcrossReloads(t *testing.T) {
	siteA := oneLineSite(siteAddr, "rate_limit {header.X-Client} 2r/h")
	startCaddy(t, oneLineSite(site2Addr, "rate_limit {header.X-Client} 5r/h")+siteA)
	zoneA := "default@" + siteAddr
	wantStatuses(t, []int{get(t, siteURL+"/", "c"), get(t, siteURL+"/", "c"), get(t, siteURL+"/", "c")}, 200, 200, 429)
	for _, c := range []struct{ name, lineB string }{
		{"the same Caddyfile", "rate_limit {header.X-Client} 5r/h"},
		{"the other site changed", "rate_limit {header.X-Client} 7r/m"},
		{"the other site's one-liner gone", "header X-Site b"},
	} {
		if code, body := reload(t, oneLineSite(site2Addr, c.lineB)+siteA); code != http.StatusOK {
			t.Fatalf("%s: reload refused: %d %s", c.name, code, body)
		}
		if got := get(t, siteURL+"/", "c"); got != http.StatusTooManyRequests {
			t.Fatalf("%s: site A after the reload: %d, want 429", c.name, got)
		}
		if used := keyState(t, adminURL, zoneA, "c").Used; used != 2 {
			t.Fatalf("%s: zone %s key c used %d after the reload, want 2", c.name, zoneA, used)
		}
	}
}

// TestCaddyFmtKeepsOneLiners: the built Caddy's fmt leaves one-liners as
// they are.
func TestCaddyFmtKeepsOneLiners(t *testing.T) {
	src := "example.com {\n\t@auth path /login*\n\trate_limit @auth {remote.ip} 5r/m\n\trate_limit {remote.ip} 10r/s 10000 503\n\treverse_proxy 127.0.0.1:8080\n}\n"
	path := filepath.Join(t.TempDir(), "Caddyfile")
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := caddyCommand(t.Context(), t, "fmt", path).Output()
	if err != nil {
		t.Fatalf("caddy fmt: %v", err)
	}
	if string(out) != src {
		t.Fatalf("caddy fmt made\n%s\nof\n%s", out, src)
	}
}
