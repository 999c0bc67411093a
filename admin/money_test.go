package admin

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/d61b427a/caddy-rate-limit/internal/money"
)

// runMoneyZone registers a zone priced in money, named name, for the
// test's length.
func runMoneyZone(t *testing.T, name string) *testZone {
	t.Helper()
	z := runZone(t, name, true)
	z.info.Limit, z.info.Units, z.info.Unit = []string{"$50"}, true, money.Unit
	return z
}

// TestMoneyInDollars: a zone priced in money shows its amounts in
// dollars beside its counts in picodollars: a key's counts and
// override, its top keys, its dial; and takes overrides and dials in
// dollars, as a string with or without $ or as a number of dollars.
func TestMoneyInDollars(t *testing.T) {
	z := runMoneyZone(t, "money_admin")
	z.store.used["money_admin/alice"] = 12_345_678_000_000
	z.top = []TopKey{{Key: "alice", Units: 1_500_000_000_000, Rejected: 2}}

	code, body := call(t, zap.NewNop(), http.MethodGet, "/rate_limit/zones/money_admin/keys/alice", "")
	var k KeyInfo
	if err := json.Unmarshal([]byte(body), &k); code != http.StatusOK || err != nil {
		t.Fatalf("GET key: %d %s (%v)", code, body, err)
	}
	if k.Used != 12_345_678_000_000 || k.Unit != money.Unit || k.Dollars["used"] != "$12.345678" || k.Dollars["current"] != "$0.00" {
		t.Errorf("key %s: want used in picodollars and in dollars, $12.345678", body)
	}

	code, body = call(t, zap.NewNop(), http.MethodGet, "/rate_limit/zones/money_admin/top", "")
	var top TopInfo
	if err := json.Unmarshal([]byte(body), &top); code != http.StatusOK || err != nil || top.Unit != money.Unit ||
		len(top.Keys) != 1 || top.Keys[0].Units != 1_500_000_000_000 || top.Keys[0].Dollars != "$1.50" || top.Dollars["error"] != "$0.00" {
		t.Errorf("top: %d %s (%v), want alice's $1.50", code, body, err)
	}

	for _, c := range []struct {
		body string
		want int64
	}{
		{`{"limit": "$75"}`, 75 * money.PerDollar},
		{`{"limit": "0.25"}`, money.PerDollar / 4},
		{`{"limit": 12.5}`, 12_500_000_000_000},
		{`{"limit": 3}`, 3 * money.PerDollar},
	} {
		code, body := call(t, zap.NewNop(), http.MethodPut, "/rate_limit/zones/money_admin/keys/alice/limit", c.body)
		var o OverrideInfo
		if err := json.Unmarshal([]byte(body), &o); code != http.StatusOK || err != nil || o.Limit != c.want || o.Dollars["limit"] != money.Format(c.want) {
			t.Errorf("PUT limit %s: %d %s (%v), want an override of %d picodollars", c.body, code, body, err, c.want)
		}
	}
	code, body = call(t, zap.NewNop(), http.MethodGet, "/rate_limit/zones/money_admin/keys/alice", "")
	if err := json.Unmarshal([]byte(body), &k); err != nil || k.Override == nil || k.Dollars["override"] != "$3.00" {
		t.Errorf("key with an override: %d %s, want it in dollars, $3.00", code, body)
	}

	code, body = call(t, zap.NewNop(), http.MethodPut, "/rate_limit/zones/money_admin/dial", `{"limit": "$100", "ttl": "1h"}`)
	var d DialInfo
	if err := json.Unmarshal([]byte(body), &d); code != http.StatusOK || err != nil || d.Limit != 100*money.PerDollar || d.Dollars["limit"] != "$100.00" {
		t.Errorf("PUT dial: %d %s (%v), want a dial of $100", code, body, err)
	}
	code, body = call(t, zap.NewNop(), http.MethodGet, "/rate_limit/zones", "")
	var zones []ZoneInfo
	if err := json.Unmarshal([]byte(body), &zones); err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(zones, func(z ZoneInfo) bool { return z.Name == "money_admin" })
	if i < 0 || zones[i].Dial == nil || zones[i].Dial.Limit != 100*money.PerDollar || zones[i].Dollars["dial_limit"] != "$100.00" || zones[i].Unit != money.Unit {
		t.Errorf("zones: %d %s, want money_admin's dial of $100", code, body)
	}

	before := len(z.store.changes)
	for _, bad := range []string{`{"limit": "lots"}`, `{"limit": "$0"}`, `{"limit": "-5"}`, `{"limit": "$1.0000000000001"}`, `{"limit": true}`, `{"limit": "$99999999"}`} {
		if code, msg := call(t, zap.NewNop(), http.MethodPut, "/rate_limit/zones/money_admin/keys/alice/limit", bad); code != http.StatusBadRequest || !strings.Contains(msg, "limit") || !strings.Contains(msg, "dollars") {
			t.Errorf("PUT limit %s: %d %s, want 400 asking for dollars", bad, code, msg)
		}
		if code, msg := call(t, zap.NewNop(), http.MethodPut, "/rate_limit/zones/money_admin/dial", bad); code != http.StatusBadRequest || !strings.Contains(msg, "dollars") {
			t.Errorf("PUT dial %s: %d %s, want 400 asking for dollars", bad, code, msg)
		}
	}
	if len(z.store.changes) != before {
		t.Errorf("refused changes reached the store: %q", z.store.changes[before:])
	}

	// A zone that counts units takes a number of units, never dollars.
	units := runZone(t, "units_admin", true)
	if code, msg := call(t, zap.NewNop(), http.MethodPut, "/rate_limit/zones/units_admin/keys/k/limit", `{"limit": "$75"}`); code != http.StatusBadRequest || !strings.Contains(msg, `"$75"`) {
		t.Errorf("dollars for a zone of units: %d %s, want 400 naming them", code, msg)
	}
	units.store.used["units_admin/k"] = 1
	if code, body := call(t, zap.NewNop(), http.MethodPut, "/rate_limit/zones/units_admin/keys/k/limit", `{"limit": 75, "ttl": "1m"}`); code != http.StatusOK || strings.Contains(body, "dollars") {
		t.Errorf("units: %d %s, want the override without dollars", code, body)
	}
	if o := units.store.overrides["units_admin/k"]; o.Limit != 75 || o.Expires.Before(time.Now()) {
		t.Errorf("override %+v, want 75 units", o)
	}
}
