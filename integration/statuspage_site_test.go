package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"golang.org/x/crypto/bcrypt"

	"github.com/d61b427a/caddy-rate-limit/internal/wait"
	"github.com/d61b427a/caddy-rate-limit/shed"
)

// Keys as clients send them: an IPv6 address written out in full and a
// 64-byte API key, the longest a store keeps as it is.
const (
	longIPv6   = "2001:0db8:85a3:0000:0000:8a2e:0370:7334"
	longAPIKey = "sk_live_51MzQ8bK2pXa7TvLq9RwYc3HdE6fGjN4uVsA0iZoPkBmCxDyWtU1eFgH"
)

// statusSite is a Caddy process whose site serves the status page the
// two ways the docs show, with the admin endpoint refusing a browser's
// navigation, as Caddy sets it up (its origins only its own address, for
// the tests' requests):
//
//	/limits/*  handle_path, behind basic_auth (user ops, password secret)
//	/ops*      handle, unstripped, for the loopback address only
//
// and everything else through rate_limit (log_keys on) with two zones,
// api and login, and a load shedder, backend. /hold is answered by gate.
type statusSite struct {
	site  string // http://<loopback>:<port>
	admin string // http://<loopback>:<port>
	gate  *gate
}

// startStatusSite starts the process and sends it traffic: in zone api,
// the IPv6 address over its limit of 20 an hour (60 requests), the API
// key over it (30), and a few lighter keys; in zone login (3 an hour),
// one address over it, after which the zone is dialled to dry_run.
func startStatusSite(t *testing.T) statusSite {
	t.Helper()
	if len(longAPIKey) != 64 {
		t.Fatalf("the API key is %d bytes, want 64", len(longAPIKey))
	}
	hash, err := bcrypt.GenerateFromPassword([]byte("secret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	site, admin := freePort(), onLoopback(freePort())
	s := statusSite{site: "http://" + onLoopback(site), admin: "http://" + admin, gate: newGate(t)}
	startProcess(t, caddyGlobals(adminOption(admin), site, freePort(), "")+fmt.Sprintf(`%s {
	handle_path /limits/* {
		basic_auth {
			ops %s
		}
		rate_limit_status
	}
	@ops {
		path /ops /ops/*
		remote_ip 127.0.0.1
	}
	handle @ops {
		rate_limit_status
	}
	handle {
		rate_limit {
			log_keys on
			shed backend {
				priority {header.X-Priority}
				classes critical normal low
				capacity 4
				after 1s
				full 4s
			}
			zone api {
				key {header.X-Client}
				limit 20
				window 1h
			}
			zone login {
				match {
					path /login
				}
				key {header.X-Client}
				limit 3
				window 1h
			}
		}
		handle /hold {
			reverse_proxy %s
		}
		respond "ok"
	}
}
`, s.site, hash, s.gate.url), s.site+"/")

	api := []string{s.site + "/"}
	for _, c := range []struct {
		key     string
		n, okay int
	}{{longIPv6, 60, 20}, {longAPIKey, 30, 20}, {"customer-42", 12, 12}, {"198.51.100.23", 5, 5}, {"2001:db8::1f", 3, 3}} {
		if codes := burst(api, c.n, "X-Client: "+c.key); codes[http.StatusOK] != c.okay {
			t.Fatalf("%s's %d requests: %v, want %d allowed", c.key, c.n, codes, c.okay)
		}
	}
	if codes := burst([]string{s.site + "/login"}, 15, "X-Client: 203.0.113.7"); codes[http.StatusOK] != 3 {
		t.Fatalf("203.0.113.7's 15 logins: %v, want 3 allowed", codes)
	}
	if code, body := adminJSON(t, s.admin, http.MethodPut, "/rate_limit/zones/login/dial", `{"mode": "dry_run", "ttl": "1h"}`); code != http.StatusOK {
		t.Fatalf("PUT dial: %d %s", code, body)
	}
	return s
}

// saturate holds the shedder's capacity of critical requests in the app
// until the shedder sheds the other classes.
func (s statusSite) saturate(t *testing.T) {
	t.Helper()
	sendAll(context.Background(), []string{s.site + "/hold"}, 4, "X-Priority: critical", "X-Client: batch")
	s.gate.waitArrivals(t, 4)
	wait.For(t, "the shedder to shed", func() bool {
		all := readAdmin[[]shed.Info](t, s.admin, "/rate_limit/shed")
		return len(all) == 1 && all[0].Amount > 0
	})
}

// request sends a request to the site, as user ops if auth, and returns its
// status, Location and body.
func (s statusSite) request(t *testing.T, method, path, body string, auth bool) (int, string, string) {
	t.Helper()
	var headers []string
	if auth {
		headers = append(headers, basicAuth("ops", "secret"))
	}
	resp, answer := request(t, client, method, s.site+path, body, headers...)
	return resp.StatusCode, resp.Header.Get("Location"), answer
}

// TestStatusPageSiteRoutes: through a real Caddy, rate_limit_status
// answers the admin endpoint's read-only JSON under both mounts, behind
// basic_auth where the site puts it; /ops is redirected to /ops/, whose
// relative addresses the page's fetches need; and every request that
// would reset a key, set an override or a dial is refused on both mounts
// and changes nothing: the admin endpoint shows the key's counts as they
// were, no override and no dial, and the key is still refused.
func TestStatusPageSiteRoutes(t *testing.T) {
	s := startStatusSite(t)
	if code, _, _ := s.request(t, http.MethodGet, "/limits/zones", "", false); code != http.StatusUnauthorized {
		t.Fatalf("GET /limits/zones without credentials: %d, want 401", code)
	}
	for _, route := range []string{"/zones", "/zones/api/top?n=3", "/shed"} {
		_, admin := adminJSON(t, s.admin, http.MethodGet, "/rate_limit"+route, "")
		for _, mount := range []string{"/limits", "/ops"} {
			code, _, body := s.request(t, http.MethodGet, mount+route, "", true)
			if code != http.StatusOK || body != admin {
				t.Errorf("GET %s: %d %s\nwant the admin endpoint's answer: %s", mount+route, code, body, admin)
			}
		}
	}
	var top struct {
		Keys []struct {
			Key                string
			Requests, Rejected int
		}
	}
	_, _, body := s.request(t, http.MethodGet, "/limits/zones/api/top", "", true)
	if err := json.Unmarshal([]byte(body), &top); err != nil || len(top.Keys) == 0 || top.Keys[0].Key != longIPv6 || top.Keys[0].Rejected != 40 {
		t.Fatalf("top of api: %s (%v), want %s first with 40 rejected", body, err, longIPv6)
	}
	for _, c := range []struct{ path, location string }{{"/ops", "/ops/"}, {"/ops/", ""}, {"/limits/", ""}} {
		code, location, body := s.request(t, http.MethodGet, c.path, "", true)
		switch {
		case c.location != "" && (code != http.StatusPermanentRedirect || location != c.location):
			t.Errorf("GET %s: %d to %q, want 308 to %s", c.path, code, location, c.location)
		case c.location == "" && (code != http.StatusOK || !strings.HasPrefix(body, "<!doctype html>")):
			t.Errorf("GET %s: %d %.40q, want the page", c.path, code, body)
		}
	}

	keyPath := "/zones/api/keys/" + url.PathEscape(longIPv6)
	before := keyState(t, s.admin, "api", longIPv6)
	if before.Used != 20 || before.Override != nil {
		t.Fatalf("%s before: %+v, want 20 used and no override", longIPv6, before)
	}
	for _, mount := range []string{"/limits", "/ops"} {
		for _, c := range []struct{ method, path, body string }{
			{http.MethodDelete, keyPath, ""},
			{http.MethodPut, keyPath + "/limit", `{"limit": 1000}`},
			{http.MethodPost, keyPath + "/limit", `{"limit": 1000}`},
			{http.MethodPut, "/zones/api/dial", `{"mode": "off"}`},
			{http.MethodDelete, "/zones/login/dial", ""},
			{http.MethodPost, "/zones", `{}`},
			{http.MethodPut, "/shed", `{}`},
			{http.MethodPost, "/", ""},
		} {
			code, _, body := s.request(t, c.method, mount+c.path, c.body, true)
			if code != http.StatusMethodNotAllowed && code != http.StatusNotFound {
				t.Errorf("%s %s: %d %s, want 405 or 404", c.method, mount+c.path, code, body)
			}
		}
	}
	if after := keyState(t, s.admin, "api", longIPv6); after.Used != before.Used || after.Override != nil {
		t.Errorf("%s after the refused writes: %+v, want %d used and no override", longIPv6, after, before.Used)
	}
	_, zones := adminJSON(t, s.admin, http.MethodGet, "/rate_limit/zones", "")
	if strings.Count(zones, `"dial"`) != 1 || !strings.Contains(zones, `"dial":{"mode":"dry_run"`) {
		t.Errorf("zones after the refused writes: %s, want login's dry_run dial and no other", zones)
	}
	if codes := burst([]string{s.site + "/"}, 1, "X-Client: "+longIPv6); codes[http.StatusTooManyRequests] != 1 {
		t.Errorf("%s after the refused writes: %v, want still refused", longIPv6, codes)
	}
}
