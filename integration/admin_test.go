package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/d61b427a/caddy-rate-limit/internal/docs"
	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
)

// TestAdminAPIMemory drives every admin route against the memory store
// through a running Caddy, as an operator would with curl.
func TestAdminAPIMemory(t *testing.T) {
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	startCaddy(t, withGlobals(jsonLog(logFile, "INFO"))+clientSite("admin_mem", 2, ""))
	testAdminAPI(t, adminURL, "admin_mem", "memory", func(client string, n int) []int { return statuses(t, n, client) })

	t.Run("dials and overrides outlive reloads", func(t *testing.T) {
		base := "/rate_limit/zones/admin_mem"
		if code, body := adminJSON(t, adminURL, http.MethodPut, base+"/keys/kept/limit", `{"limit": 4}`); code != 200 {
			t.Fatal(code, body)
		}
		if code, body := adminJSON(t, adminURL, http.MethodPut, base+"/dial", `{"mode": "dry_run"}`); code != 200 {
			t.Fatal(code, body)
		}
		mustReload(t, withGlobals(jsonLog(logFile, "INFO"))+clientSite("admin_mem", 3, ""))
		wantStatuses(t, statuses(t, 6, "kept"), 200, 200, 200, 200, 200, 200) // dry run
		if code, body := adminJSON(t, adminURL, http.MethodDelete, base+"/dial", ""); code != http.StatusNoContent {
			t.Fatal(code, body)
		}
		wantStatuses(t, statuses(t, 1, "kept"), 429) // the override's 4 are used
	})

	t.Run("admin changes are logged", func(t *testing.T) {
		for _, msg := range []string{"rate limit admin: key reset", "rate limit admin: key limit override set", "rate limit admin: zone dial set", "rate limit admin: zone dial removed"} {
			waitForLog(t, logFile, 1, msg, `"zone":"admin_mem"`, `"remote_addr":"127.0.0.1:`, `"level":"info"`)
		}
		// The key the operator typed is logged as its hash, as keys are
		// by default.
		waitForLog(t, logFile, 1, "rate limit admin: key reset", `"key":"`+keyHash(t, adminURL, "admin_mem", "a/b c")+`"`)
		if lines := logLines(logFile, "rate limit admin", "a/b c"); len(lines) != 0 {
			t.Fatalf("the key is in the admin change's log line: %s", lines)
		}
	})
}

// testAdminAPI runs the admin API checks on zone (limit 2 per hour per
// X-Client) through the admin endpoint at base; send sends n requests for
// a client to a site using the zone.
func testAdminAPI(t *testing.T, base, zone, store string, send func(client string, n int) []int) {
	t.Helper()
	keyPath := func(key string) string {
		return "/rate_limit/zones/" + zone + "/keys/" + url.PathEscape(key)
	}

	t.Run("list zones", func(t *testing.T) {
		z, ok := zoneState(t, base, zone)
		if !ok || z.Store != store || z.Window != "1h0m0s" || fmt.Sprint(z.Limit) != "[2]" || z.Algorithm != "sliding_tail" {
			t.Fatalf("zone %s: %+v (listed: %v), want store %s, limit 2 per 1h, sliding_tail", zone, z, ok, store)
		}
	})

	t.Run("inspect and reset a key", func(t *testing.T) {
		client := "a/b c" // a key that needs escaping in a path
		wantStatuses(t, send(client, 3), 200, 200, 429)
		if k := keyState(t, base, zone, client); k.Key != client || k.Used != 2 || k.Current != 2 || k.Reset.IsZero() {
			t.Fatalf("GET key: %+v, want %q with 2 used", k, client)
		}
		if code, body := adminJSON(t, base, http.MethodDelete, keyPath(client), ""); code != http.StatusNoContent {
			t.Fatalf("DELETE key: %d %s", code, body)
		}
		wantStatuses(t, send(client, 3), 200, 200, 429)
		if code, body := adminJSON(t, base, http.MethodGet, keyPath("never-seen"), ""); code != 200 || !strings.Contains(body, `"used":0`) {
			t.Fatalf("unseen key: %d %s", code, body)
		}
	})

	t.Run("per-key limit override", func(t *testing.T) {
		wantStatuses(t, send("vip", 3), 200, 200, 429)
		code, body := adminJSON(t, base, http.MethodPut, keyPath("vip")+"/limit", `{"limit": 5, "ttl": "24h"}`)
		if code != 200 || !strings.Contains(body, `"limit":5`) {
			t.Fatalf("PUT limit: %d %s", code, body)
		}
		wantStatuses(t, send("vip", 4), 200, 200, 200, 429)
		if code, body := adminJSON(t, base, http.MethodGet, keyPath("vip"), ""); code != 200 || !strings.Contains(body, `"override":{"limit":5`) {
			t.Fatalf("GET shows no override: %d %s", code, body)
		}
		if code, body := adminJSON(t, base, http.MethodDelete, keyPath("vip")+"/limit", ""); code != http.StatusNoContent {
			t.Fatalf("DELETE limit: %d %s", code, body)
		}
		wantStatuses(t, send("vip", 1), 429)
	})

	t.Run("zone dial", func(t *testing.T) {
		wantStatuses(t, send("dial", 3), 200, 200, 429)
		for _, c := range []struct {
			body string
			want []int
		}{
			{`{"mode": "off"}`, []int{200, 200}},
			{`{"mode": "dry_run"}`, []int{200, 200}},
			// dry-run requests over the limit took nothing: 2 counted of 6
			{`{"mode": "enforce", "limit": 6, "ttl": "1h"}`, []int{200, 200, 200, 200, 429}},
		} {
			if code, body := adminJSON(t, base, http.MethodPut, "/rate_limit/zones/"+zone+"/dial", c.body); code != 200 {
				t.Fatalf("PUT dial %s: %d %s", c.body, code, body)
			}
			wantStatuses(t, send("dial", len(c.want)), c.want...)
		}
		if _, body := adminJSON(t, base, http.MethodGet, "/rate_limit/zones", ""); !strings.Contains(body, `"dial":{"mode":"enforce","limit":6`) {
			t.Fatalf("zone list shows no dial: %s", body)
		}
		if code, body := adminJSON(t, base, http.MethodDelete, "/rate_limit/zones/"+zone+"/dial", ""); code != http.StatusNoContent {
			t.Fatalf("DELETE dial: %d %s", code, body)
		}
		wantStatuses(t, send("dial", 1), 429)
	})

	t.Run("errors", func(t *testing.T) {
		for _, c := range []struct {
			method, path, body string
			status             int
		}{
			{http.MethodGet, "/rate_limit/zones/nosuch/keys/k", "", http.StatusNotFound},
			{http.MethodPut, "/rate_limit/zones/nosuch/dial", `{"mode":"off"}`, http.StatusNotFound},
			{http.MethodPut, "/rate_limit/zones/" + zone + "/dial", `{"mode":"loud"}`, http.StatusBadRequest},
			{http.MethodPut, "/rate_limit/zones/" + zone + "/dial", `{}`, http.StatusBadRequest},
			{http.MethodPut, "/rate_limit/zones/" + zone + "/dial", `not json`, http.StatusBadRequest},
			{http.MethodPut, keyPath("k") + "/limit", `{"limit": 0}`, http.StatusBadRequest},
			{http.MethodPut, keyPath("k") + "/limit", `{"limit": 5, "tll": "1h"}`, http.StatusBadRequest},
			{http.MethodPost, keyPath("k"), "", http.StatusMethodNotAllowed},
		} {
			code, body := adminJSON(t, base, c.method, c.path, c.body)
			var e struct{ Error string }
			if code != c.status || json.Unmarshal([]byte(body), &e) != nil || e.Error == "" {
				t.Errorf("%s %s %s: %d %s, want %d with a JSON error", c.method, c.path, c.body, code, body, c.status)
			}
		}
	})

	t.Run("garbage", func(t *testing.T) { testAdminGarbage(t, base, zone) })
}

// testAdminGarbage sends garbage to every admin route of zone through the
// admin endpoint at base: methods a route does not take, unknown zones,
// bad escapes, keys empty or of 10 KB, ?n= and ?from= of garbage, and
// bodies that are not JSON, not objects, of unknown fields, of numbers
// too large, of negative or unreadable TTLs, or followed by more. Each is
// answered with the status the route gives it (400, 404, 405; a key of
// 10 KB is a key, and a path with an empty segment is cleaned by Caddy's
// admin endpoint), with a JSON error, never a 5xx, and none changes
// anything: the zone has no dial after them, the key no override.
func testAdminGarbage(t *testing.T, base, zone string) {
	zonePath := "/rate_limit/zones/" + zone
	key := zonePath + "/keys/k"
	long := strings.Repeat("k", 10<<10)
	type garbage struct {
		method, path, body string
		status             int
	}
	var cases []garbage
	// Each route, with the methods it takes; every other is refused.
	routes := []struct {
		path  string
		takes []string
	}{
		{"/rate_limit/", []string{http.MethodGet, http.MethodHead}},
		{"/rate_limit/zones", []string{http.MethodGet, http.MethodHead}},
		{"/rate_limit/shed", []string{http.MethodGet, http.MethodHead}},
		{zonePath + "/top", []string{http.MethodGet, http.MethodHead}},
		{key, []string{http.MethodGet, http.MethodDelete}},
		{key + "/limit", []string{http.MethodPut, http.MethodDelete}},
		{zonePath + "/dial", []string{http.MethodPut, http.MethodDelete}},
	}
	for _, r := range routes {
		for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions, http.MethodTrace, "BREW"} {
			if !slices.Contains(r.takes, m) {
				cases = append(cases, garbage{m, r.path, `{"limit": 5, "mode": "off"}`, http.StatusMethodNotAllowed})
			}
		}
	}
	for _, c := range []struct{ method, path string }{
		{http.MethodGet, "/top"}, {http.MethodGet, "/keys/k"}, {http.MethodDelete, "/keys/k"},
		{http.MethodPut, "/keys/k/limit"}, {http.MethodDelete, "/keys/k/limit"},
		{http.MethodPut, "/dial"}, {http.MethodDelete, "/dial"},
	} {
		for _, name := range []string{"nosuch", url.PathEscape(zone + "\r\nX-Injected: 1"), strings.Repeat("z", 10<<10), "..%2F" + zone} {
			cases = append(cases, garbage{c.method, "/rate_limit/zones/" + name + c.path, `{"limit": 5}`, http.StatusNotFound})
		}
	}
	for _, q := range []string{"garbage", "0", "-1", "129", "1e3", "99999999999999999999", "garbage&n=1"} {
		cases = append(cases, garbage{http.MethodGet, zonePath + "/top?n=" + q, "", http.StatusBadRequest})
	}
	for _, c := range []struct{ method, path, body string }{
		{http.MethodGet, key, ""}, {http.MethodDelete, key, ""},
		{http.MethodPut, key + "/limit", `{"limit": 5}`}, {http.MethodDelete, key + "/limit", ""},
	} {
		cases = append(cases, garbage{c.method, c.path + "?from=%7Bheader.X-Other%7D", c.body, http.StatusBadRequest})
	}
	bodies := []string{
		"", "{", "not json", "[]", `"off"`, "null", "{}", strings.Repeat("[", 100_000),
		`{"limit": 5, "extra": 1}`, `{"limit": "5"}`, `{"limit": 5.5}`, `{"limit": 1e30}`, `{"limit": 99999999999999999999}`,
		`{"limit": 2147483648}`, `{"limit": -1}`, `{"limit": 0}`,
		`{"limit": 5, "ttl": "-1h"}`, `{"limit": 5, "ttl": -1}`, `{"limit": 5, "ttl": "forever"}`, `{"limit": 5, "ttl": "9999999999h"}`, `{"limit": 5, "ttl": 1e400}`,
		`{"limit": 5} garbage`, `{"limit": 5}{"limit": 1000000}`, `{"limit": 5}` + strings.Repeat(" ", 70<<10) + "x",
		`{"limit": 5, "pad": "` + strings.Repeat("x", 70<<10) + `"}`,
	}
	for _, b := range bodies {
		cases = append(cases, garbage{http.MethodPut, key + "/limit", b, http.StatusBadRequest})
	}
	for _, b := range append(bodies, `{"mode": "loud"}`, `{"mode": 5}`, `{"mode": "off"} garbage`, `{"mode": "off"}{"mode": "enforce"}`) {
		cases = append(cases, garbage{http.MethodPut, zonePath + "/dial", b, http.StatusBadRequest})
	}
	// A key of 10 KB is a key, as a client may send one: the store keeps
	// it bounded, as a hash.
	cases = append(cases,
		garbage{http.MethodPut, zonePath + "/keys/" + long + "/limit", `{"limit": 5}`, http.StatusOK},
		garbage{http.MethodDelete, zonePath + "/keys/" + long + "/limit", "", http.StatusNoContent},
		garbage{http.MethodDelete, zonePath + "/keys/" + long, "", http.StatusNoContent},
	)
	if k := keyState(t, base, zone, long); !regexp.MustCompile(`^#[0-9a-f]{32}$`).MatchString(k.Key) || k.Used != 0 {
		t.Errorf("a key of 10 KB: %+v, want it unseen, shown bounded as # and 32 hex digits", k)
	}

	for _, c := range cases {
		code, body := adminJSON(t, base, c.method, c.path, c.body)
		var e struct{ Error string }
		switch {
		case code != c.status:
			t.Errorf("%s %.120s %.60q: %d %.200s, want %d", c.method, c.path, c.body, code, body, c.status)
		case code >= 400 && c.method != http.MethodHead && (json.Unmarshal([]byte(body), &e) != nil || e.Error == ""):
			t.Errorf("%s %.120s %.60q: %d %.200s, want a JSON error", c.method, c.path, c.body, code, body)
		}
	}
	// Bad escapes, which no client library sends.
	for _, path := range []string{zonePath + "/keys/%zz/limit", "/rate_limit/zones/%zz/dial", zonePath + "/keys/%/limit"} {
		if resp := rawRequest(t, base, "PUT "+path+" HTTP/1.1", `{"limit": 5}`); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("PUT %s: %d, want 400", path, resp.StatusCode)
		}
	}
	// An empty key: Caddy's admin endpoint sends a path with an empty
	// segment on to the path without it, which names no key here.
	if resp := rawRequest(t, base, "PUT "+zonePath+"/keys//limit HTTP/1.1", `{"limit": 5}`); resp.StatusCode != http.StatusTemporaryRedirect || resp.Header.Get("Location") != zonePath+"/keys/limit" {
		t.Errorf("PUT with an empty key: %d to %q, want 307 to %s/keys/limit", resp.StatusCode, resp.Header.Get("Location"), zonePath)
	}
	if code, body := adminJSON(t, base, http.MethodPut, zonePath+"/keys/limit", `{"limit": 5}`); code != http.StatusMethodNotAllowed {
		t.Errorf("PUT %s/keys/limit: %d %s, want 405", zonePath, code, body)
	}
	if z, ok := zoneState(t, base, zone); !ok || z.Dial != nil {
		t.Errorf("zone %s after garbage: %+v, want it with no dial", zone, z)
	}
	if k := keyState(t, base, zone, "k"); k.Override != nil || k.Used != 0 {
		t.Errorf("key k after garbage: %+v, want no override and no use", k)
	}
}

// rawRequest sends a request with requestLine as given (one no client
// library would send) and body to the admin endpoint at base, and
// returns the answer.
func rawRequest(t *testing.T, base, requestLine, body string) *http.Response {
	t.Helper()
	host := strings.TrimPrefix(base, "http://")
	conn, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "%s\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", requestLine, host, len(body), body)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("%s: %v", requestLine, err)
	}
	resp.Body.Close()
	return resp
}

// docCurls returns the lines of the given Markdown files that are curl
// commands, in order.
func docCurls(t *testing.T, files ...string) []string {
	t.Helper()
	var out []string
	for _, f := range files {
		for line := range strings.Lines(docs.Read(t, f)) {
			if strings.HasPrefix(line, "curl ") {
				out = append(out, strings.TrimSpace(line))
			}
		}
	}
	return out
}

// shellWords splits a command line on spaces, keeping single-quoted text
// together, as the documents' curls are written.
func shellWords(line string) []string {
	var words []string
	var cur strings.Builder
	quoted, inWord := false, false
	for _, r := range line {
		switch {
		case r == '\'':
			quoted, inWord = !quoted, true
		case r == ' ' && !quoted:
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

// TestDocumentedCurls runs every curl of the README and of
// docs/operating.md against a running Caddy (its admin endpoint on this
// test's port), in order, and expects each to succeed.
func TestDocumentedCurls(t *testing.T) {
	// The zones the documents' curls name, and a key in each.
	startCaddy(t, `
`+siteAddr+` {
	rate_limit {
		zone api {
			key {header.X-Client}
			limit 100
			window 1h
		}
		zone per_api_key {
			key key:{header.X-Client}
			limit 100
			window 1h
		}
		# A zone priced in money, whose overrides and dials are in
		# dollars: a GET names no model, and * prices it.
		zone spend {
			key {header.X-Client}
			limit $1
			window 1h
			cost_from usage price {
				* input 1 output 1
			}
			reserve max_tokens 100
		}
	}
	respond "ok"
}
`)
	get(t, siteURL+"/", "customer-42")
	curls := docCurls(t, "../README.md", "../docs/operating.md")
	if len(curls) < 8 {
		t.Fatalf("%d curls in the README and docs/operating.md", len(curls))
	}
	for _, line := range curls {
		words := shellWords(line)
		method, target, body := http.MethodGet, "", ""
		for i := 1; i < len(words); i++ {
			switch words[i] {
			case "-X":
				i++
				method = words[i]
			case "-d":
				i++
				body = words[i]
				if method == http.MethodGet {
					method = http.MethodPost
				}
			default:
				target = words[i]
			}
		}
		path, ok := strings.CutPrefix(target, "localhost:2019")
		if !ok {
			t.Fatalf("%s: not aimed at the admin endpoint", line)
		}
		if code, resp := adminJSON(t, adminURL, method, path, body); code/100 != 2 {
			t.Errorf("%s: %d %s", line, code, resp)
		}
	}
}

// TestAdminAPIRedis drives every admin route against the Redis store
// through a running Caddy.
func TestAdminAPIRedis(t *testing.T) {
	s := redistest.Standalone(t)
	startCaddy(t, clientSite("admin_redis", 2, redisStore("address "+s.URL())))
	testAdminAPI(t, adminURL, "admin_redis", "redis", func(client string, n int) []int { return statuses(t, n, client) })
	// The override lives beside the key's counters, in the same slot.
	if o, err := s.Do("HGET", counterKey(t, s, "admin_redis", clientKey("vip")), "o"); err != nil || o != "" {
		t.Fatalf("override field after DELETE: %q %v", o, err)
	}
}

// TestAdminChangesOff: with admin_changes off, in a rate_limit handler or
// as the global rate_limit option, the admin API's changes (reset,
// override, dial) answer 403 with a JSON error that says what turned them
// off and how to turn them on, and change nothing, while its reads keep
// working; a config without it (a reload) turns them on again, and a
// refused config that has it leaves them on.
func TestAdminChangesOff(t *testing.T) {
	integration(t)
	const zone = "admin_changes"
	key := "/rate_limit/zones/" + zone + "/keys/k"
	changes := []struct{ method, path, body string }{
		{http.MethodDelete, key, ""},
		{http.MethodPut, key + "/limit", `{"limit": 10}`},
		{http.MethodDelete, key + "/limit", ""},
		{http.MethodPut, "/rate_limit/zones/" + zone + "/dial", `{"mode": "off"}`},
		{http.MethodDelete, "/rate_limit/zones/" + zone + "/dial", ""},
	}
	refused := func(t *testing.T, where string) {
		t.Helper()
		for _, c := range changes {
			code, body := adminJSON(t, adminURL, c.method, c.path, c.body)
			var e struct{ Error string }
			if code != http.StatusForbidden || json.Unmarshal([]byte(body), &e) != nil ||
				!strings.Contains(e.Error, "admin_changes off") || !strings.Contains(e.Error, where) || !strings.Contains(e.Error, "remove it and reload") {
				t.Fatalf("%s %s with changes off: %d %s, want 403 naming admin_changes off in %s and how to turn changes on", c.method, c.path, code, body, where)
			}
		}
		// Nothing changed: the key's count stands, and it is still
		// refused. The reads answer.
		if k := keyState(t, adminURL, zone, "k"); k.Used != 2 || k.Override != nil {
			t.Fatalf("key after the refused changes: %+v, want 2 used and no override", k)
		}
		wantStatuses(t, statuses(t, 1, "k"), 429)
		for _, path := range []string{"/rate_limit/zones", "/rate_limit/zones/" + zone + "/top", "/rate_limit/"} {
			if code, body := adminJSON(t, adminURL, http.MethodGet, path, ""); code != http.StatusOK {
				t.Fatalf("GET %s with changes off: %d %s", path, code, body)
			}
		}
	}
	allowed := func(t *testing.T) {
		t.Helper()
		if code, body := adminJSON(t, adminURL, http.MethodDelete, key, ""); code != http.StatusNoContent {
			t.Fatalf("DELETE key with changes on: %d %s", code, body)
		}
		if k := keyState(t, adminURL, zone, "k"); k.Used != 0 {
			t.Fatalf("key after its reset: %+v, want 0 used", k)
		}
	}

	t.Run("handler", func(t *testing.T) {
		startCaddy(t, clientSite(zone, 2, "admin_changes off"))
		wantStatuses(t, statuses(t, 3, "k"), 200, 200, 429)
		refused(t, `the rate_limit handler of zone "admin_changes"`)
	})
	t.Run("on again after a reload without it", func(t *testing.T) {
		mustReload(t, clientSite(zone, 2, ""))
		allowed(t)
	})
	t.Run("global option", func(t *testing.T) {
		mustReload(t, withGlobals("rate_limit {\n\t\tadmin_changes off\n\t}")+clientSite(zone, 2, ""))
		wantStatuses(t, statuses(t, 3, "k"), 200, 200, 429)
		refused(t, "the global rate_limit option")
		mustReload(t, clientSite(zone, 2, ""))
		allowed(t)
	})
	t.Run("a refused config leaves them on", func(t *testing.T) {
		// Provisioned, then refused by its Validate: the limit 0.
		bad := `{"apps": {"http": {"servers": {"s": {"listen": ["` + siteListen + `"],
			"routes": [{"handle": [{"handler": "rate_limit", "admin_changes": "off", "zones": [{"name": "` + zone + `", "limit": 0, "window": "1h"}]}]}]}}}}}`
		if code, body := reload(t, bad); code == http.StatusOK {
			t.Fatalf("a zone with limit 0 was loaded: %s", body)
		}
		wantStatuses(t, statuses(t, 3, "k"), 200, 200, 429)
		allowed(t)
	})
}
