package ratelimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/d61b427a/caddy-rate-limit/admin"
	"github.com/d61b427a/caddy-rate-limit/storage"
	"github.com/d61b427a/caddy-rate-limit/storage/memory"
)

// statusJSON asks a rate_limit_status handler for one of its JSON routes
// and decodes the answer into v, as a status page would read it.
func statusJSON(t *testing.T, path string, v any) int {
	t.Helper()
	w := httptest.NewRecorder()
	err := admin.StatusPage{}.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil), caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
		t.Fatalf("GET %s: the handler called the next one", path)
		return nil
	}))
	var he caddyhttp.HandlerError
	if errors.As(err, &he) {
		return he.StatusCode
	} else if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	if err := json.Unmarshal(w.Body.Bytes(), v); v != nil && err != nil {
		t.Fatalf("GET %s: %s: %v", path, w.Body, err)
	}
	return w.Code
}

// TestZoneInAdminView: while its handler runs, a zone is in the admin
// routes' view: its config in the zone list, a key's counts, its heaviest
// keys, shown as they are under log_keys on and as their hashes by
// default; once the handler is cleaned up, it is gone.
func TestZoneInAdminView(t *testing.T) {
	shown := provisionHandler(t, `{"log_keys":"on","zones":[{"name":"view_shown","limit":[2],"window":"1h"}]}`)
	hidden := provisionHandler(t, `{"zones":[{"name":"view_hidden","limit":[2],"window":"1h"}]}`)
	const ip = "2001:db8::7"
	ok := func(http.ResponseWriter, *http.Request) error { return nil }
	for range 3 {
		_, _ = serveWith(shown, context.Background(), ip, ok)
		_, _ = serveWith(hidden, context.Background(), ip, ok)
	}

	var zones []admin.ZoneInfo
	statusJSON(t, "/zones", &zones)
	i := slices.IndexFunc(zones, func(z admin.ZoneInfo) bool { return z.Name == "view_shown" })
	if i < 0 || zones[i].Algorithm != "sliding_tail" || zones[i].Window != "1h0m0s" || !slices.Equal(zones[i].Limit, []string{"2"}) || zones[i].Store != "memory" {
		t.Fatalf("zones %+v, want view_shown: sliding_tail, 1h0m0s, limit 2, memory", zones)
	}

	for _, c := range []struct {
		h    *Handler
		zone string
		key  string // as shown
		hash string
	}{
		{shown, "view_shown", ip, ""},
		{hidden, "view_hidden", hiddenKey(ip), hiddenKey(ip)},
	} {
		var top admin.TopInfo
		statusJSON(t, "/zones/"+c.zone+"/top", &top)
		if len(top.Keys) != 1 || top.Keys[0] != (admin.TopKey{Key: c.key, From: clientIPTemplate, Requests: 3, Rejected: 1}) {
			t.Errorf("top of %s: %+v, want %s with 3 requests, 1 rejected", c.zone, top.Keys, c.key)
		}
		info, err := c.h.Zones[0].KeyInfo(context.Background(), ip)
		if err != nil || info.Zone != c.zone || info.Key != ip || info.Hash != c.hash || info.Used != 2 || info.Current != 2 {
			t.Errorf("key of %s: %+v (%v), want %s used 2 of its current window, hash %q", c.zone, info, err, ip, c.hash)
		}
	}

	if err := hidden.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if code := statusJSON(t, "/zones/view_hidden/top", nil); code != http.StatusNotFound {
		t.Fatalf("top of a cleaned-up zone: %d, want 404", code)
	}
}

// TestCalendarZoneInAdminView: a zone whose window is a calendar period
// shows it as written, with its time zone and when the current period
// ends; a key's reset is that end, as its headers say.
func TestCalendarZoneInAdminView(t *testing.T) {
	h := provisionHandler(t, `{"zones":[{"name":"view_month","limit":[5],"window":"month","timezone":"America/New_York","algorithm":"fixed_window"}]}`)
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	// The end of the month in New York that holds now, read around the
	// look, which may straddle midnight on the 1st.
	ends := func() (before, after time.Time) {
		month := func() time.Time {
			now := time.Now().In(ny)
			return time.Date(now.Year(), now.Month()+1, 1, 0, 0, 0, 0, ny)
		}
		return month(), month()
	}
	ok := func(http.ResponseWriter, *http.Request) error { return nil }
	const ip = "192.0.2.44"
	if _, err := serveWith(h, context.Background(), ip, ok); err != nil {
		t.Fatal(err)
	}
	var zones []admin.ZoneInfo
	first, _ := ends()
	statusJSON(t, "/zones", &zones)
	_, last := ends()
	i := slices.IndexFunc(zones, func(z admin.ZoneInfo) bool { return z.Name == "view_month" })
	if i < 0 || zones[i].Window != "month" || zones[i].Timezone != "America/New_York" ||
		!zones[i].PeriodEnds.Equal(first) && !zones[i].PeriodEnds.Equal(last) {
		t.Fatalf("zones %+v, want view_month: window month in America/New_York, ending %s", zones, last)
	}
	first, _ = ends()
	info, err := h.Zones[0].KeyInfo(context.Background(), ip)
	_, last = ends()
	if err != nil || info.Used != 1 || !info.Reset.Equal(first) && !info.Reset.Equal(last) {
		t.Fatalf("key %+v (%v), want used 1 until %s", info, err, last)
	}
}

// TestCostFromZoneInAdminView: a zone that reads what responses cost
// says so in the zone list, counts its top keys in the units each
// request took (the response's cost, else the reservation; none
// for a rejected one), and shows a key's debt once a response cost more
// than the key had room for, in a windowed zone as in a gcra one; a zone
// without cost_from shows no debt.
func TestCostFromZoneInAdminView(t *testing.T) {
	h := provisionHandler(t, `{"log_keys":"on","zones":[
		{"name":"units_view","limit":[100],"window":"1h","algorithm":"fixed_window","cost_from":{"header":"X-Cost"},"reserve":{"units":10}},
		{"name":"units_view_plain","limit":[100],"window":"1h"}]}`)
	gcra := provisionHandler(t, `{"zones":[{"name":"units_view_gcra","limit":[100],"window":"1h","algorithm":"gcra","cost_from":{"header":"X-Cost"},"reserve":{"units":10}}]}`)
	const ip = "2001:db8::9"
	costing := func(cost string) caddyhttp.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) error {
			if cost != "" {
				w.Header().Set("X-Cost", cost)
			}
			w.WriteHeader(http.StatusOK)
			return nil
		}
	}
	for _, h := range []*Handler{h, gcra} {
		for _, cost := range []string{"30", "", "150"} {
			if w, err := serveWith(h, context.Background(), ip, costing(cost)); err != nil || w.Code != http.StatusOK {
				t.Fatalf("cost %q: %d %v, want 200", cost, w.Code, err)
			}
		}
		var he caddyhttp.HandlerError
		if _, err := serveWith(h, context.Background(), ip, costing("1")); !errors.As(err, &he) || he.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("in debt: %v, want 429", err)
		}
	}

	var zones []admin.ZoneInfo
	statusJSON(t, "/zones", &zones)
	for _, z := range zones {
		if want := z.Name != "units_view_plain"; strings.HasPrefix(z.Name, "units_view") && z.Units != want {
			t.Errorf("zone %s: units %v, want %v", z.Name, z.Units, want)
		}
	}
	var top admin.TopInfo
	statusJSON(t, "/zones/units_view/top", &top)
	if !top.Units || len(top.Keys) != 1 || top.Keys[0] != (admin.TopKey{Key: ip, From: clientIPTemplate, Units: 30 + 10 + 150, Rejected: 1}) {
		t.Errorf("top: %+v, want units, %s with 190 units, 1 rejected", top, ip)
	}
	var plain admin.TopInfo
	statusJSON(t, "/zones/units_view_plain/top", &plain)
	if plain.Units || len(plain.Keys) != 1 || plain.Keys[0] != (admin.TopKey{Key: ip, From: clientIPTemplate, Requests: 4}) {
		t.Errorf("top of a zone without cost_from: %+v, want %s with 4 requests", plain, ip)
	}

	for i, want := range map[int]int64{0: 190 - 100, 1: -1, 2: 190 - 100} {
		z := h.Zones[min(i, 1)]
		if i == 2 {
			z = gcra.Zones[0]
		}
		info, err := z.KeyInfo(context.Background(), ip)
		switch {
		case err != nil:
			t.Fatal(err)
		case want < 0 && info.Debt != nil:
			t.Errorf("%s: debt %d, want none for a zone without cost_from", info.Zone, *info.Debt)
		case want >= 0 && (info.Debt == nil || *info.Debt != want):
			t.Errorf("%s: %+v, want a debt of %d", info.Zone, info, want)
		}
	}
}

// TestCostFromReservedInAdminView: a key of a cost_from zone shows the
// units its requests in flight hold reserved, while the next handler has
// them, and 0 once each is done: trued up to the cost its response
// showed, kept whole when the response showed none, or released whole
// when count_status does not count it. A zone without cost_from shows
// none.
func TestCostFromReservedInAdminView(t *testing.T) {
	h := provisionHandler(t, `{"log_keys":"on","zones":[
		{"name":"reserved_view","limit":[1000],"window":"1h","algorithm":"fixed_window","count_status":["2xx"],"cost_from":{"header":"X-Cost"},"reserve":{"units":100}},
		{"name":"reserved_view_plain","limit":[1000],"window":"1h"}]}`)
	const ip = "2001:db8::a"
	for _, c := range []struct {
		name, cost string
		status     int
		used       int64 // once done, counting the requests before
	}{
		{"trued_up", "30", http.StatusOK, 30},
		{"no_cost_read", "", http.StatusOK, 30 + 100},
		{"not_counted", "5", http.StatusInternalServerError, 30 + 100},
	} {
		t.Run(c.name, func(t *testing.T) {
			entered, leave := make(chan struct{}), make(chan struct{})
			done := make(chan error, 1)
			go func() {
				_, err := serveWith(h, context.Background(), ip, func(w http.ResponseWriter, _ *http.Request) error {
					close(entered)
					<-leave
					if c.cost != "" {
						w.Header().Set("X-Cost", c.cost)
					}
					w.WriteHeader(c.status)
					return nil
				})
				done <- err
			}()
			<-entered
			info, err := h.Zones[0].KeyInfo(context.Background(), ip)
			if err != nil || info.Reserved == nil || *info.Reserved != 100 {
				t.Errorf("in flight: %+v (%v), want 100 reserved", info, err)
			}
			close(leave)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			info, err = h.Zones[0].KeyInfo(context.Background(), ip)
			if err != nil || info.Reserved == nil || *info.Reserved != 0 || info.Used != c.used {
				t.Errorf("done: %+v (%v), want 0 reserved, %d used", info, err, c.used)
			}
			if plain, err := h.Zones[1].KeyInfo(context.Background(), ip); err != nil || plain.Reserved != nil {
				t.Errorf("a zone without cost_from: %+v (%v), want no reserved", plain, err)
			}
		})
	}
}

// TestAlternativesOf: a value could come from the alternatives whose
// literal text it has where they have it, from the client's address if
// it is an address or a network, and, hashed by the bound, from any
// placeholder.
func TestAlternativesOf(t *testing.T) {
	const header = "{http.request.header.X-Api-Key}"
	prefixed := provisionHandler(t, `{"zones":[{"name":"unit_alts_prefixed","key":["key:`+header+`","ip:{http.vars.client_ip}"],"limit":[1],"window":"1m"}]}`).Zones[0]
	plain := provisionHandler(t, `{"zones":[{"name":"unit_alts_plain","key":["`+header+`","global"],"limit":[1],"window":"1m"}]}`).Zones[0]
	long := storage.BoundKey(strings.Repeat("k", storage.MaxKeyLen+1))
	for _, c := range []struct {
		z    *Zone
		key  string
		want []string
	}{
		{prefixed, "key:customer-42", []string{"key:" + header}},
		{prefixed, "ip:203.0.113.9", []string{"ip:{http.vars.client_ip}"}},
		{prefixed, "203.0.113.9", []string{clientIPTemplate}},
		{prefixed, "customer-42", nil},
		{prefixed, long, []string{"key:" + header, "ip:{http.vars.client_ip}"}},
		{plain, "127.0.0.9", []string{header, clientIPTemplate}},
		{plain, "2001:db8::/64", []string{header, clientIPTemplate}},
		{plain, "customer-42", []string{header}},
		{plain, "global", []string{header, "global"}},
		{plain, long, []string{header}},
	} {
		if got := c.z.AlternativesOf(c.key); !slices.Equal(got, c.want) {
			t.Errorf("zone %s, key %.20q: %q, want %q", c.z.Name, c.key, got, c.want)
		}
	}
}

// adminRoute sends one request to the admin API's /rate_limit/ routes, as
// Caddy's admin endpoint would, and returns the answer's status and body,
// or an error's status and message.
func adminRoute(t *testing.T, method, path, body string) (int, string) {
	t.Helper()
	mod, err := caddy.GetModule("admin.api.rate_limit")
	if err != nil {
		t.Fatal(err)
	}
	router := mod.New().(caddy.AdminRouter)
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	if err := router.(caddy.Provisioner).Provision(ctx); err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	err = router.Routes()[0].Handler.ServeHTTP(w, httptest.NewRequest(method, path, strings.NewReader(body)))
	var ae caddy.APIError
	if errors.As(err, &ae) {
		return ae.HTTPStatus, ae.Message
	} else if err != nil {
		t.Fatalf("%s %s: %v, want an API error", method, path, err)
	}
	return w.Code, w.Body.String()
}

// TestOverridesBoundedInAdminAPI: past the memory store's bound on per-key
// limit overrides, the admin API refuses one more with 507 Insufficient
// Storage, saying the bound, rather than let the store grow without end.
func TestOverridesBoundedInAdminAPI(t *testing.T) {
	const zone = "unit_overrides_bounded"
	h := provisionHandler(t, `{"zones":[{"name":"`+zone+`","limit":[2],"window":"1h"}]}`)
	// Filled through the store itself: a hundred thousand admin calls
	// would take long. Other tests share the process's memory store and
	// may hold overrides: fill until the store says it is full.
	store := h.store.(storage.Admin)
	ctx := context.Background()
	filled := 0
	t.Cleanup(func() {
		for i := range filled {
			_ = store.DeleteOverride(ctx, zone, fmt.Sprint("fill-", i))
		}
	})
	for ; ; filled++ {
		err := store.SetOverride(ctx, zone, fmt.Sprint("fill-", filled), storage.Override{Limit: 3})
		if errors.Is(err, storage.ErrTooManyOverrides) {
			break
		}
		if err != nil || filled == memory.MaxOverrides {
			t.Fatalf("override %d: %v, want the store full at %d", filled, err, memory.MaxOverrides)
		}
	}
	code, body := adminRoute(t, http.MethodPut, "/rate_limit/zones/"+zone+"/keys/one-more/limit", `{"limit": 4}`)
	if code != http.StatusInsufficientStorage || !strings.Contains(body, fmt.Sprint("at most ", memory.MaxOverrides)) {
		t.Fatalf("an override past the bound: %d %s, want 507 saying the bound", code, body)
	}
}
