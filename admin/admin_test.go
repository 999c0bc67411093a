package admin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// testZone is a running zone as the routes see it, with the heaviest keys
// the test gives it, over a store that records the changes asked of it.
type testZone struct {
	info  ZoneInfo
	store *testStore // nil: a store with no admin side
	top   []TopKey
	show  bool // log_keys on
}

func (z *testZone) Info() ZoneInfo { return z.info }

// StoredKey keeps a key of the zone's last alternative, its fallback, as
// it is, and one of another alternative behind its text and "|", as the
// handler keeps the client's address bare and tags the others.
func (z *testZone) StoredKey(key, from string) string {
	if from == z.info.Key[len(z.info.Key)-1] {
		return key
	}
	return from + "|" + key
}

// AlternativesOf: any alternative could give a key but the fallback,
// the client's address, which gives IP addresses only.
func (z *testZone) AlternativesOf(key string) []string {
	var out []string
	for _, alt := range z.info.Key {
		if _, err := netip.ParseAddr(key); err == nil || alt != z.info.Key[len(z.info.Key)-1] {
			out = append(out, alt)
		}
	}
	return out
}

// keyOf returns the key a stored key holds and its alternative.
func (z *testZone) keyOf(stored string) (key, from string) {
	for _, alt := range z.info.Key {
		if key, ok := strings.CutPrefix(stored, alt+"|"); ok {
			return key, alt
		}
	}
	return stored, z.info.Key[len(z.info.Key)-1]
}

func (z *testZone) Admin() storage.Admin {
	if z.store == nil {
		return nil
	}
	return z.store
}

func (z *testZone) KeyInfo(ctx context.Context, stored string) (KeyInfo, error) {
	st, err := z.store.KeyState(ctx, z.info.Name, stored, algorithms.Rate{Window: time.Minute})
	key, from := z.keyOf(stored)
	return KeyInfo{Zone: z.info.Name, Key: key, From: from, Used: st.Counts.Windows().Current, Override: st.Override}, err
}

func (z *testZone) Top(n int) ([]TopKey, int64) {
	return slices.Clone(z.top[:min(n, len(z.top))]), 0
}

// ShownKey hides a key as the handler does, by a hash of it, unless the
// zone shows keys.
func (z *testZone) ShownKey(key string) string {
	if z.show {
		return key
	}
	h := sha256.Sum256([]byte(key))
	return "#" + hex.EncodeToString(h[:8])
}

// testStore is a store's admin side that keeps the counts the test
// gives it, overrides and dials in maps, and records each change asked
// of it.
type testStore struct {
	mu        sync.Mutex
	used      map[string]int64 // by zone/key
	overrides map[string]storage.Override
	dials     map[string]storage.ZoneDial
	changes   []string
}

func newTestStore() *testStore {
	return &testStore{used: map[string]int64{}, overrides: map[string]storage.Override{}, dials: map[string]storage.ZoneDial{}}
}

func (s *testStore) change(format string, args ...any) {
	s.changes = append(s.changes, fmt.Sprintf(format, args...))
}

func (s *testStore) KeyState(_ context.Context, zone, key string, _ algorithms.Rate) (storage.KeyState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := storage.KeyState{Counts: algorithms.WindowCounts{Current: s.used[zone+"/"+key]}.Counts()}
	if o, ok := s.overrides[zone+"/"+key]; ok {
		st.Override = &o
	}
	return st, nil
}

func (s *testStore) ResetKey(_ context.Context, zone, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.change("reset %s %s", zone, key)
	delete(s.used, zone+"/"+key)
	return nil
}

func (s *testStore) SetOverride(_ context.Context, zone, key string, o storage.Override) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.change("override %s %s %d", zone, key, o.Limit)
	s.overrides[zone+"/"+key] = o
	return nil
}

func (s *testStore) DeleteOverride(_ context.Context, zone, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.change("delete override %s %s", zone, key)
	delete(s.overrides, zone+"/"+key)
	return nil
}

func (s *testStore) SetZoneDial(_ context.Context, zone string, d storage.ZoneDial) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.change("dial %s %s %d", zone, d.Mode, d.Limit)
	s.dials[zone] = d
	return nil
}

func (s *testStore) DeleteZoneDial(_ context.Context, zone string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.change("delete dial %s", zone)
	delete(s.dials, zone)
	return nil
}

func (s *testStore) ZoneDial(zone string) (storage.ZoneDial, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.dials[zone]
	return d, ok
}

// runZone registers a zone named name, with a store of its own, for the
// test's length; show is its log_keys.
func runZone(t *testing.T, name string, show bool) *testZone {
	t.Helper()
	z := &testZone{info: ZoneInfo{Name: name, Algorithm: algorithms.SlidingTail, Window: "1h0m0s", Key: []string{"{http.vars.client_ip}"}, Limit: []string{"2"}, Store: "test"},
		store: newTestStore(), show: show}
	RegisterZone(z)
	t.Cleanup(func() { UnregisterZone(z) })
	return z
}

// call sends one request to the admin routes, as a handler logging to
// logs, and returns the answer's status and body, or an error's status
// and message.
func call(t *testing.T, logs *zap.Logger, method, path, body string) (int, string) {
	t.Helper()
	w := httptest.NewRecorder()
	err := (&adminAPI{logger: logs}).serve(w, httptest.NewRequest(method, path, strings.NewReader(body)))
	var ae caddy.APIError
	switch {
	case errors.As(err, &ae):
		return ae.HTTPStatus, ae.Message
	case err != nil:
		t.Fatalf("%s %s: %v, want an API error", method, path, err)
	}
	return w.Code, w.Body.String()
}

// TestRunningZones: the zone list shows each running zone once, by name,
// with the dial in force from its store; during a reload, when two
// configs have a zone of one name, the one registered last is the one in
// force, and the other again once it is unregistered.
func TestRunningZones(t *testing.T) {
	old := runZone(t, "running_b", false)
	runZone(t, "running_a", false)
	reloaded := runZone(t, "running_b", false)
	reloaded.info.Limit = []string{"5"}
	reloaded.store.dials["running_b"] = storage.ZoneDial{Mode: storage.ModeDryRun}
	old.store.dials["running_b"] = storage.ZoneDial{Mode: storage.ModeOff, Expires: time.Now().Add(-time.Second)}

	zones := func() []ZoneInfo {
		t.Helper()
		code, body := call(t, zap.NewNop(), http.MethodGet, "/rate_limit/zones", "")
		var out []ZoneInfo
		if err := json.Unmarshal([]byte(body), &out); code != http.StatusOK || err != nil {
			t.Fatalf("GET /rate_limit/zones: %d %s (%v)", code, body, err)
		}
		var mine []ZoneInfo
		for _, z := range out {
			if strings.HasPrefix(z.Name, "running_") {
				mine = append(mine, z)
			}
		}
		return mine
	}
	got := zones()
	if len(got) != 2 || got[0].Name != "running_a" || got[1].Name != "running_b" || got[1].Limit[0] != "5" || got[1].Dial == nil || got[1].Dial.Mode != storage.ModeDryRun {
		t.Fatalf("zones %+v, want running_a, then running_b as reloaded: limit 5, dial dry_run", got)
	}
	UnregisterZone(reloaded)
	got = zones()
	if len(got) != 2 || got[1].Limit[0] != "2" || got[1].Dial != nil {
		t.Fatalf("zones %+v, want running_b as before the reload, its expired dial not shown", got)
	}
	UnregisterZone(old)
	if got = zones(); len(got) != 1 || got[0].Name != "running_a" {
		t.Fatalf("zones %+v, want running_a only", got)
	}
	if code, _ := call(t, zap.NewNop(), http.MethodGet, "/rate_limit/zones/running_b/top", ""); code != http.StatusNotFound {
		t.Fatalf("top of an unregistered zone: %d, want 404", code)
	}
}

// TestAdminChanges: a change reaches the zone's store as asked and is
// logged with the key as the zone shows it; a bad one is refused before
// it does; while admin_changes off runs anywhere every change is refused,
// naming where, and reads still answer; a zone whose store has no admin
// side says so.
func TestAdminChanges(t *testing.T) {
	z := runZone(t, "changes", false)
	core, logged := observer.New(zap.InfoLevel)
	logs := zap.New(core)
	const key = "secret token"

	before := time.Now()
	code, body := call(t, logs, http.MethodPut, "/rate_limit/zones/changes/keys/secret%20token/limit", `{"limit": 5, "ttl": "1h"}`)
	var o storage.Override
	if err := json.Unmarshal([]byte(body), &o); code != http.StatusOK || err != nil || o.Limit != 5 || o.Expires.Before(before.Add(time.Hour)) || o.Expires.After(time.Now().Add(time.Hour)) {
		t.Fatalf("PUT limit: %d %s (%v), want the override of 5 for 1h", code, body, err)
	}
	for _, c := range []struct{ method, path, body string }{
		{http.MethodDelete, "/rate_limit/zones/changes/keys/secret%20token", ""},
		{http.MethodDelete, "/rate_limit/zones/changes/keys/secret%20token/limit", ""},
		{http.MethodPut, "/rate_limit/zones/changes/dial", `{"mode": "dry_run", "limit": 7}`},
		{http.MethodDelete, "/rate_limit/zones/changes/dial", ""},
	} {
		if code, body := call(t, logs, c.method, c.path, c.body); code/100 != 2 {
			t.Fatalf("%s %s: %d %s", c.method, c.path, code, body)
		}
	}
	want := []string{"override changes secret token 5", "reset changes secret token", "delete override changes secret token", "dial changes dry_run 7", "delete dial changes"}
	if !slices.Equal(z.store.changes, want) {
		t.Fatalf("the store was asked %q, want %q", z.store.changes, want)
	}
	if logged.Len() != len(want) {
		t.Fatalf("%d changes logged, want %d", logged.Len(), len(want))
	}
	for _, e := range logged.All() {
		if k, ok := e.ContextMap()["key"]; ok && k != z.ShownKey(key) {
			t.Errorf("%q logged the key as %q, want %q", e.Message, k, z.ShownKey(key))
		}
		if e.ContextMap()["zone"] != "changes" || e.ContextMap()["store"] != "test" {
			t.Errorf("%q logged %v, want zone changes, store test", e.Message, e.ContextMap())
		}
	}

	for _, c := range []struct{ path, body, names string }{
		{"/rate_limit/zones/changes/keys/k/limit", `{"limit": 0}`, "limit"},
		{"/rate_limit/zones/changes/keys/k/limit", `{"limit": 5, "ttl": "-1h"}`, "ttl"},
		{"/rate_limit/zones/changes/keys/k/limit", `{"limit": 5, "extra": 1}`, "extra"},
		{"/rate_limit/zones/changes/dial", `{"mode": "loud"}`, "loud"},
		{"/rate_limit/zones/changes/dial", `{}`, "want a mode, a limit or both"},
	} {
		if code, msg := call(t, logs, http.MethodPut, c.path, c.body); code != http.StatusBadRequest || !strings.Contains(msg, c.names) {
			t.Errorf("PUT %s %s: %d %s, want 400 naming %s", c.path, c.body, code, msg, c.names)
		}
	}
	if len(z.store.changes) != len(want) {
		t.Fatalf("refused changes reached the store: %q", z.store.changes[len(want):])
	}

	TurnChangesOff(t, "the test's config")
	t.Cleanup(func() { ReleaseChanges(t) })
	if code, msg := call(t, logs, http.MethodDelete, "/rate_limit/zones/changes/keys/k", ""); code != http.StatusForbidden || !strings.Contains(msg, "the test's config") {
		t.Fatalf("a reset under admin_changes off: %d %s, want 403 naming what turned changes off", code, msg)
	}
	if code, body := call(t, logs, http.MethodGet, "/rate_limit/zones/changes/keys/k", ""); code != http.StatusOK {
		t.Fatalf("a read under admin_changes off: %d %s, want 200", code, body)
	}
	ReleaseChanges(t)
	if code, msg := call(t, logs, http.MethodDelete, "/rate_limit/zones/changes/keys/k", ""); code != http.StatusNoContent {
		t.Fatalf("a reset once changes are back on: %d %s, want 204", code, msg)
	}

	z.store = nil
	if code, msg := call(t, logs, http.MethodGet, "/rate_limit/zones/changes/keys/k", ""); code != http.StatusNotImplemented || !strings.Contains(msg, "store test has no admin API") {
		t.Fatalf("a store without an admin side: %d %s, want 501 saying so", code, msg)
	}
}

// TestAdminGarbage: every route answers garbage with 400, 404 or 405 and
// an error, and no change reaches the store: methods a route does not
// take, unknown zones and routes, ?n= and ?from= of garbage, and bodies
// that are not one JSON object of the route's fields with values in
// range, among them an object followed by more (the first object alone
// would set an override or a dial nobody sent whole).
func TestAdminGarbage(t *testing.T) {
	z := runZone(t, "garbage", false)
	const key = "/rate_limit/zones/garbage/keys/k"
	type garbage struct {
		method, path, body string
		status             int
	}
	var cases []garbage
	for _, r := range []struct {
		path  string
		takes []string
	}{
		{"/rate_limit/", []string{http.MethodGet, http.MethodHead}},
		{"/rate_limit/zones", []string{http.MethodGet, http.MethodHead}},
		{"/rate_limit/shed", []string{http.MethodGet, http.MethodHead}},
		{"/rate_limit/zones/garbage/top", []string{http.MethodGet, http.MethodHead}},
		{key, []string{http.MethodGet, http.MethodDelete}},
		{key + "/limit", []string{http.MethodPut, http.MethodDelete}},
		{"/rate_limit/zones/garbage/dial", []string{http.MethodPut, http.MethodDelete}},
	} {
		for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions, http.MethodTrace, "BREW"} {
			if !slices.Contains(r.takes, m) {
				cases = append(cases, garbage{m, r.path, `{"limit": 5, "mode": "off"}`, http.StatusMethodNotAllowed})
			}
		}
	}
	for _, path := range []string{"/rate_limit/zones/nosuch/keys/k/limit", "/rate_limit/zones/nosuch/dial", "/rate_limit/nosuch", "/rate_limit/zones/garbage/keys/k/limit/more"} {
		cases = append(cases, garbage{http.MethodPut, path, `{"limit": 5}`, http.StatusNotFound})
	}
	for _, n := range []string{"garbage", "0", "-1", "129", "1e3", "99999999999999999999"} {
		cases = append(cases, garbage{http.MethodGet, "/rate_limit/zones/garbage/top?n=" + n, "", http.StatusBadRequest})
	}
	cases = append(cases, garbage{http.MethodPut, key + "/limit?from=%7Bheader.X%7D", `{"limit": 5}`, http.StatusBadRequest})
	bodies := []string{
		"", "{", "not json", "[]", `"off"`, "null", "{}", strings.Repeat("[", 100_000),
		`{"limit": 5, "extra": 1}`, `{"limit": "5"}`, `{"limit": 5.5}`, `{"limit": 1e30}`, `{"limit": 2147483648}`, `{"limit": -1}`,
		`{"limit": 5, "ttl": "-1h"}`, `{"limit": 5, "ttl": "forever"}`, `{"limit": 5, "ttl": 1e400}`,
		`{"limit": 5} garbage`, `{"limit": 5}{"limit": 1000000}`, `{"limit": 5}}`, `{"limit": 5}` + strings.Repeat(" ", 70<<10) + "x",
	}
	for _, b := range bodies {
		cases = append(cases, garbage{http.MethodPut, key + "/limit", b, http.StatusBadRequest})
	}
	for _, b := range append(bodies, `{"mode": "loud"}`, `{"mode": "off"} garbage`, `{"mode": "off"}{"mode": "enforce"}`) {
		cases = append(cases, garbage{http.MethodPut, "/rate_limit/zones/garbage/dial", b, http.StatusBadRequest})
	}

	for _, c := range cases {
		if code, msg := call(t, zap.NewNop(), c.method, c.path, c.body); code != c.status || msg == "" {
			t.Errorf("%s %s %.40q: %d %.200s, want %d with an error", c.method, c.path, c.body, code, msg, c.status)
		}
	}
	if len(z.store.changes) > 0 {
		t.Errorf("garbage changed the store: %q", z.store.changes)
	}
}
