package admin

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	_ "github.com/caddyserver/caddy/v2/modules/caddyhttp/caddyauth" // basic_auth, in front of the page
	_ "github.com/caddyserver/caddy/v2/modules/caddyhttp/rewrite"   // handle_path, which mounts it
)

// TestStatusPage: GET /rate_limit/ answers the status page as HTML, under
// a policy that lets only its own inline script and style run and lets it
// fetch only from its own origin; the page names no other host, so it
// loads nothing from elsewhere and works offline, and it fetches its JSON
// by relative addresses, so that it works under any prefix. /rate_limit
// is redirected to /rate_limit/, which those addresses are relative to.
// It is read-only: only GET and HEAD are answered.
func TestStatusPage(t *testing.T) {
	a := &adminAPI{}
	w := httptest.NewRecorder()
	if err := a.serve(w, httptest.NewRequest(http.MethodGet, "/rate_limit/", nil)); err != nil {
		t.Fatalf("GET /rate_limit/: %v", err)
	}
	if w.Code != http.StatusOK || w.Header().Get("Content-Type") != "text/html; charset=utf-8" {
		t.Fatalf("GET /rate_limit/: %d %q, want 200 text/html; charset=utf-8", w.Code, w.Header().Get("Content-Type"))
	}
	csp := w.Header().Get("Content-Security-Policy")
	for _, d := range []string{"default-src 'none'", "script-src 'unsafe-inline'", "style-src 'unsafe-inline'", "connect-src 'self'", "frame-ancestors 'none'"} {
		if !strings.Contains(csp, d) {
			t.Errorf("Content-Security-Policy %q lacks %q", csp, d)
		}
	}
	page := w.Body.String()
	if !strings.HasPrefix(page, "<!doctype html>") || !strings.Contains(page, `<meta name="viewport"`) {
		t.Fatalf("want the HTML page with a viewport, got %.200q", page)
	}
	if u := regexp.MustCompile(`(?i)(https?:|["'(])//[^\s"'<>)]*`).FindString(page); u != "" {
		t.Errorf("the page refers to another host: %s", u)
	}
	fetched := regexp.MustCompile(`getJSON\("([^"]*)"`).FindAllStringSubmatch(page, -1)
	if len(fetched) < 3 {
		t.Fatalf("the page fetches %q, want zones, shed and a zone's top", fetched)
	}
	for _, f := range fetched {
		if strings.HasPrefix(f[1], "/") {
			t.Errorf("the page fetches %q, an absolute path: it would miss the route a site mounts under a prefix", f[1])
		}
	}

	w = httptest.NewRecorder()
	if err := a.serve(w, httptest.NewRequest(http.MethodGet, "/rate_limit?x=1", nil)); err != nil || w.Code != http.StatusPermanentRedirect || w.Header().Get("Location") != "/rate_limit/?x=1" {
		t.Fatalf("GET /rate_limit?x=1: %d Location %q (%v), want 308 to /rate_limit/?x=1", w.Code, w.Header().Get("Location"), err)
	}
	err := a.serve(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/rate_limit/", nil))
	if err == nil || !strings.Contains(err.Error(), "POST not allowed") {
		t.Fatalf("POST /rate_limit/: %v, want method not allowed", err)
	}
}

// siteStatus sends one request to a rate_limit_status handler as a site
// would hand it over: path is what the handler sees, asked the address
// the client asked for, before handle_path stripped its prefix. It
// returns the response, with the status an error carries, if any.
func siteStatus(t *testing.T, method, path, asked, body string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	u, err := url.ParseRequestURI(asked)
	if err != nil {
		t.Fatal(err)
	}
	orig := r.Clone(r.Context())
	orig.URL = u
	r = r.WithContext(context.WithValue(r.Context(), caddyhttp.OriginalRequestCtxKey, *orig))
	w := httptest.NewRecorder()
	err = StatusPage{}.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
		t.Fatalf("%s %s: the handler called the next one", method, path)
		return nil
	}))
	var he caddyhttp.HandlerError
	switch {
	case errors.As(err, &he):
		w.Code = he.StatusCode
	case err != nil:
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return w
}

// TestStatusPageOnASite: rate_limit_status answers the admin endpoint's
// read-only JSON, byte for byte, by the last segments of the path, with
// its prefix stripped or not; keys as the zone shows them; the page
// anywhere else, redirected to an address ending in a slash, which stays
// on the host; and it refuses every request that would change something,
// which changes nothing.
func TestStatusPageOnASite(t *testing.T) {
	const ip = "2001:db8::7"
	shown := runZone(t, "status_site", true)
	hidden := runZone(t, "status_hidden", false)
	shown.top = []TopKey{{Key: ip, Requests: 3, Rejected: 1}}
	hidden.top = shown.top

	for _, prefix := range []string{"", "/limits"} {
		for _, route := range []string{"/zones", "/shed", "/zones/status_site/top"} {
			site := siteStatus(t, http.MethodGet, prefix+route, "/limits"+route, "")
			admin := httptest.NewRecorder()
			if err := (&adminAPI{}).serve(admin, httptest.NewRequest(http.MethodGet, "/rate_limit"+route, nil)); err != nil {
				t.Fatal(err)
			}
			if site.Code != http.StatusOK || site.Header().Get("Content-Type") != "application/json" || site.Body.String() != admin.Body.String() {
				t.Errorf("GET %s: %d %s\nwant the admin endpoint's answer: %s", prefix+route, site.Code, site.Body, admin.Body)
			}
		}
	}
	var top TopInfo
	site := siteStatus(t, http.MethodGet, "/zones/status_site/top", "/limits/zones/status_site/top", "")
	if err := json.Unmarshal(site.Body.Bytes(), &top); err != nil || len(top.Keys) != 1 || top.Keys[0] != shown.top[0] {
		t.Fatalf("top: %s (%v), want %s with 3 requests, 1 rejected", site.Body, err, ip)
	}
	site = siteStatus(t, http.MethodGet, "/zones/status_hidden/top", "/limits/zones/status_hidden/top", "")
	if err := json.Unmarshal(site.Body.Bytes(), &top); err != nil || len(top.Keys) != 1 || top.Keys[0].Key != hidden.ShownKey(ip) || strings.Contains(site.Body.String(), ip) {
		t.Fatalf("top of a zone that hides keys: %s (%v), want the key as %s only", site.Body, err, hidden.ShownKey(ip))
	}
	if site := siteStatus(t, http.MethodGet, "/zones/nosuch/top", "/limits/zones/nosuch/top", ""); site.Code != http.StatusNotFound {
		t.Fatalf("top of no zone: %d, want 404", site.Code)
	}

	for _, c := range []struct{ path, asked, location string }{
		{"/", "/limits/", ""},
		{"/limits/", "/limits/", ""},
		{"/shed/", "/shed/", ""},
		{"/status/zones/", "/status/zones/", ""},
		{"/", "/limits", "/limits/"},
		{"/limits", "/limits", "/limits/"},
		{"/", "/limits?dark=1", "/limits/?dark=1"},
		{"/", "//evil.example", "/evil.example/"},
	} {
		site := siteStatus(t, http.MethodGet, c.path, c.asked, "")
		switch {
		case c.location == "" && (site.Code != http.StatusOK || !strings.HasPrefix(site.Body.String(), "<!doctype html>") || site.Header().Get("Content-Security-Policy") != statusPageCSP):
			t.Errorf("GET %s asked as %s: %d %.60q, want the page", c.path, c.asked, site.Code, site.Body)
		case c.location != "" && (site.Code != http.StatusPermanentRedirect || site.Header().Get("Location") != c.location):
			t.Errorf("GET %s asked as %s: %d to %q, want 308 to %s", c.path, c.asked, site.Code, site.Header().Get("Location"), c.location)
		}
	}

	key := "/limits/zones/status_site/keys/" + url.PathEscape(ip)
	for _, c := range []struct{ method, path, body string }{
		{http.MethodDelete, key, ""},
		{http.MethodPut, key + "/limit", `{"limit": 100}`},
		{http.MethodPost, key + "/limit", `{"limit": 100}`},
		{http.MethodPut, "/limits/zones/status_site/dial", `{"mode": "off"}`},
		{http.MethodDelete, "/limits/zones/status_site/dial", ""},
		{http.MethodPost, "/limits/zones", `{"name": "x"}`},
		{http.MethodDelete, "/limits/zones/status_site/top", ""},
		{http.MethodPut, "/limits/shed", "{}"},
		{http.MethodPost, "/limits/", ""},
	} {
		site := siteStatus(t, c.method, c.path, c.path, c.body)
		if site.Code != http.StatusMethodNotAllowed && site.Code != http.StatusNotFound {
			t.Errorf("%s %s: %d %s, want 405 or 404", c.method, c.path, site.Code, site.Body)
		}
	}
	if len(shown.store.changes) > 0 {
		t.Errorf("refused writes changed the store: %q", shown.store.changes)
	}
}

// TestStatusPageCaddyfile: rate_limit_status with an argument or a block
// is refused with its name and the stray value. (That it takes a matcher
// and runs after basic_auth in a route is the root package's golden
// testdata/caddyfile_adapt/status_page.caddyfiletest.)
func TestStatusPageCaddyfile(t *testing.T) {
	for _, c := range []struct{ site, value string }{
		{"rate_limit_status now", `"now"`},
		{"rate_limit_status /limits/* extra", `"extra"`},
		{"rate_limit_status {\n\t\tzones api\n\t}", `"zones"`},
	} {
		_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(":9080 {\n"+c.site+"\n}\n"), nil)
		if err == nil || !strings.Contains(err.Error(), "rate_limit_status") || !strings.Contains(err.Error(), c.value) {
			t.Errorf("%s: %v, want a refusal naming rate_limit_status and %s", c.site, err, c.value)
		}
	}
}
