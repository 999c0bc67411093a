package integration

import (
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/admin"
	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
)

// This file tests that the alternatives of a zone's key, the client
// address it falls back to and a one-liner's key each count in a key
// space of their own: a client that sends another client's address as its
// API key uses up, or gets banned, only its own counter.

// victimAddr is the loopback address the victim's requests come from:
// not 127.0.0.1, where the suite's other requests come from.
const victimAddr = "127.0.0.9"

// clientFrom returns a client whose connections come from addr, a local
// address, as a client on another machine would be told apart by Caddy.
// It skips t where addr is not local (only 127.0.0.1 answers on macOS).
func clientFrom(t *testing.T, addr string) *http.Client {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		t.Skipf("%s is not a local address here: %v", addr, err)
	}
	l.Close()
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(addr)}, Timeout: 30 * time.Second}
	return &http.Client{
		Transport: &http.Transport{DisableKeepAlives: true, DialContext: dialer.DialContext},
		Timeout:   30 * time.Second,
	}
}

// statusFrom sends GET url through hc with headers and returns the status
// and Retry-After.
func statusFrom(t *testing.T, hc *http.Client, url string, headers ...string) (int, string) {
	t.Helper()
	resp, _ := request(t, hc, http.MethodGet, url, "", headers...)
	return resp.StatusCode, resp.Header.Get("Retry-After")
}

// TestAPIKeyNeverUsesAnAddressBudget: a client that sends the victim's
// address as its X-Api-Key, until refused, uses up its own counter only:
// the victim, whose requests carry no key and fall back to its address,
// still has its whole limit, in a one-liner and in a block-form zone.
func TestAPIKeyNeverUsesAnAddressBudget(t *testing.T) {
	victim := clientFrom(t, victimAddr)
	for _, c := range []struct{ name, site string }{
		{"one-liner", oneLineSite(siteAddr, "rate_limit {header.X-Api-Key} 3r/m")},
		{"block form", siteAddr + ` {
	rate_limit {
		zone api {
			key {header.X-Api-Key}
			limit 3
			window 1m
		}
	}
	respond "ok"
}
`},
	} {
		t.Run(c.name, func(t *testing.T) {
			startCaddy(t, c.site)
			roomInWindow(time.Minute, 10*time.Second)
			var attacker []int
			for range 4 {
				code, _ := statusFrom(t, client, siteURL+"/", "X-Api-Key: "+victimAddr)
				attacker = append(attacker, code)
			}
			wantStatuses(t, attacker, 200, 200, 200, 429)
			var own []int
			for range 4 {
				code, _ := statusFrom(t, victim, siteURL+"/")
				own = append(own, code)
			}
			// Its own limit holds it too: the fallback counts.
			wantStatuses(t, own, 200, 200, 200, 429)
		})
	}
}

// TestAPIKeyNeverBansAnAddress: on Redis, in a zone that counts only
// successful responses and bans for an hour, a client that sends the
// victim's address as its X-Api-Key gets its key banned, and the victim,
// whose requests fall back to its address, is not.
func TestAPIKeyNeverBansAnAddress(t *testing.T) {
	victim := clientFrom(t, victimAddr)
	s := redistest.Standalone(t)
	startCaddy(t, siteAddr+` {
	rate_limit {
		`+redisStore("address "+s.URL())+`
		zone api {
			key {header.X-Api-Key}
			limit 2
			window 1m
			count_status 2xx
			ban 1h
		}
	}
	respond "ok"
}
`)
	roomInWindow(time.Minute, 10*time.Second)
	var attacker []int
	for range 3 {
		code, _ := statusFrom(t, client, siteURL+"/", "X-Api-Key: "+victimAddr)
		attacker = append(attacker, code)
	}
	wantStatuses(t, attacker, 200, 200, 429)
	code, retryAfter := statusFrom(t, client, siteURL+"/", "X-Api-Key: "+victimAddr)
	if secs, _ := strconv.Atoi(retryAfter); code != http.StatusTooManyRequests || secs < 3500 {
		t.Fatalf("the API key after its third request: %d, Retry-After %q; want banned for about an hour", code, retryAfter)
	}
	for i := range 2 {
		if code, retryAfter := statusFrom(t, victim, siteURL+"/"); code != http.StatusOK {
			t.Fatalf("the victim's request %d, from %s without a key: %d, Retry-After %q; want 200", i+1, victimAddr, code, retryAfter)
		}
	}
	if code, retryAfter := statusFrom(t, victim, siteURL+"/"); code != http.StatusTooManyRequests || retryAfter == "" {
		t.Fatalf("the victim's third request: %d, Retry-After %q; want 429 by its own limit", code, retryAfter)
	}
}

// The alternatives of the zone apiKeySite holds.
const (
	apiKeyAlt   = "{http.request.header.X-Api-Key}"
	clientIPAlt = "{http.vars.client_ip}"
)

// apiKeySite is a site whose zone limits each X-Api-Key, or the client's
// address without one, to one request an hour, in the store the store
// line configures ("" for memory).
func apiKeySite(zone, store string) string {
	return siteAddr + ` {
	rate_limit {
		` + store + `
		zone ` + zone + ` {
			key {header.X-Api-Key}
			limit 1
			window 1h
		}
	}
	respond "ok"
}
`
}

// TestKeysOfEachAlternative: an API key that is the victim's address and
// the victim's address are two keys everywhere an operator sees and
// changes them, on memory and on Redis: an override given to one does
// not apply to the other; the admin API and the command refuse to guess
// which is meant, naming both and how to name one, and show and reset
// the one named; top keys say which alternative each came from.
func TestKeysOfEachAlternative(t *testing.T) {
	victim := clientFrom(t, victimAddr)
	cli := inProcessCLI(t)
	from := func(alt string) string { return "?from=" + url.QueryEscape(alt) }
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			// A zone of each store's own: top keys outlive a config.
			zone := "api_" + store
			keyPath := "/rate_limit/zones/" + zone + "/keys/" + victimAddr
			line := ""
			if store == "redis" {
				line = redisStore("address " + redistest.Standalone(t).URL())
			}
			startCaddy(t, apiKeySite(zone, line))
			// Given before the key is seen, so named by its alternative,
			// in the Caddyfile's shorthand.
			if code, body := adminJSON(t, adminURL, http.MethodPut, keyPath+"/limit"+from("{header.X-Api-Key}"), `{"limit": 3}`); code != http.StatusOK {
				t.Fatalf("PUT an override of the API key: %d %s", code, body)
			}
			var attacker, own []int
			for range 4 {
				code, _ := statusFrom(t, client, siteURL+"/", "X-Api-Key: "+victimAddr)
				attacker = append(attacker, code)
				code, _ = statusFrom(t, victim, siteURL+"/")
				own = append(own, code)
			}
			wantStatuses(t, attacker, 200, 200, 200, 429)
			wantStatuses(t, own, 200, 429, 429, 429)

			code, body := adminJSON(t, adminURL, http.MethodGet, keyPath, "")
			if code != http.StatusConflict || !strings.Contains(body, apiKeyAlt) || !strings.Contains(body, clientIPAlt) || !strings.Contains(body, "?from=") {
				t.Fatalf("GET the key without from: %d %s, want 409 naming both alternatives and from", code, body)
			}
			apiKey := readAdmin[admin.KeyInfo](t, adminURL, keyPath+from(apiKeyAlt))
			address := readAdmin[admin.KeyInfo](t, adminURL, keyPath+from("{client_ip}"))
			if apiKey.From != apiKeyAlt || apiKey.Used != 3 || apiKey.Override == nil || apiKey.Override.Limit != 3 ||
				address.From != clientIPAlt || address.Used != 1 || address.Override != nil || apiKey.Hash == address.Hash {
				t.Fatalf("the API key %+v and the address %+v: want 3 used under its override and 1 used without one, two hashes", apiKey, address)
			}

			top := topKeys(t, zone, "")
			byFrom := map[string]string{}
			for _, k := range top.Keys {
				byFrom[k.From] = k.Key
			}
			if len(top.Keys) != 2 || byFrom[apiKeyAlt] != apiKey.Hash || byFrom[clientIPAlt] != address.Hash {
				t.Fatalf("top keys %+v, want the API key as %s from %s and the address as %s from %s", top.Keys, apiKey.Hash, apiKeyAlt, address.Hash, clientIPAlt)
			}
			rows := topRows(cli("top", zone))
			if len(rows) != 2 || !slices.ContainsFunc(rows, func(r []string) bool { return slices.Equal(r, []string{apiKey.Hash, "4", "1", apiKeyAlt}) }) {
				t.Fatalf("top rows %q, want the API key's hash with 4 requests, 1 rejected, from %s", rows, apiKeyAlt)
			}
			_, stderr, err := rateLimitCLI(t, "key", zone, victimAddr, "--address", adminAddr)
			if msg := loggedError(stderr); err == nil || !strings.Contains(msg, "--from") || !strings.Contains(msg, clientIPAlt) {
				t.Fatalf("key without --from: %v, logged %q; want a failure naming the alternatives and --from", err, msg)
			}
			if out := cli("key", zone, victimAddr, "--from", "{client_ip}"); tableRow(out, "from") == nil || tableRow(out, "from")[1] != clientIPAlt {
				t.Fatalf("key --from {client_ip} printed\n%s\nwant from %s", out, clientIPAlt)
			}

			cli("reset", zone, victimAddr, "--from", "{client_ip}")
			if code, _ := statusFrom(t, victim, siteURL+"/"); code != http.StatusOK {
				t.Fatalf("the victim after its reset: %d, want 200", code)
			}
			if code, _ := statusFrom(t, client, siteURL+"/", "X-Api-Key: "+victimAddr); code != http.StatusTooManyRequests {
				t.Fatalf("the API key after the victim's reset: %d, want still 429", code)
			}
		})
	}
}
