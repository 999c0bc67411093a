package ratelimit_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
)

// This file tests count_status and ban as people use them: Caddy's
// basic_auth behind a zone that counts only failed logins, in built Caddy
// processes, alone on the memory store and as a fleet on Redis.

// loginZone is the zone under test: five failed logins per 15 minutes per
// client, then an hour's ban.
const loginZone = `zone login {
				limit 5
				window 15m
				count_status 401
				ban 1h
			}`

// startLogins starts n Caddy processes that guard /app with basic_auth
// (user alice, password "right") behind rate_limit with the store lines
// given (none: memory) and zone.
func startLogins(t *testing.T, n int, store, zone string) []instance {
	t.Helper()
	hash, err := bcrypt.GenerateFromPassword([]byte("right"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	var fleet []instance
	for range n {
		fleet = append(fleet, startInstance(t, fmt.Sprintf(`	handle /app* {
		rate_limit {
			%s
			%s
		}
		basic_auth {
			alice %s
		}
		respond "welcome"
	}
`, store, zone, hash), "/app"))
	}
	return fleet
}

// attempt logs in to url as alice with password and returns the status
// and Retry-After.
func attempt(t *testing.T, url, password string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.SetBasicAuth("alice", password)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Retry-After")
}

// wantBanned checks that an attempt is refused with a Retry-After of
// about an hour.
func wantBanned(t *testing.T, what string, code int, retryAfter string) {
	t.Helper()
	secs, _ := strconv.Atoi(retryAfter)
	if code != http.StatusTooManyRequests || secs < 3500 || secs > 3600 {
		t.Fatalf("%s: %d, Retry-After %q; want 429 and about 3600", what, code, retryAfter)
	}
}

// testLogins is the scenario on fleet, whose instances share the zone's
// counts: right passwords use nothing; five wrong ones, spread over the
// instances, are answered 401; then every instance refuses the key, right
// password or wrong, for an hour; the admin API shows the ban, the
// metric counts it once, and a reset lets the right password in again;
// and 50 concurrent wrong attempts get at most five to basic_auth.
func testLogins(t *testing.T, fleet []instance) {
	const key = "127.0.0.1" // every attempt comes from loopback
	for i := range 100 {
		if code, _ := attempt(t, fleet[i%len(fleet)].url, "right"); code != http.StatusOK {
			t.Fatalf("right password %d: %d, want 200", i, code)
		}
	}
	if info := keyState(t, fleet[0].admin, "login", key); info.Used != 0 {
		t.Fatalf("100 right passwords use %d of the limit, want 0", info.Used)
	}
	for i := range 5 {
		if code, _ := attempt(t, fleet[i%len(fleet)].url, "wrong"); code != http.StatusUnauthorized {
			t.Fatalf("wrong password %d: %d, want 401", i+1, code)
		}
	}
	code, retryAfter := attempt(t, fleet[5%len(fleet)].url, "wrong")
	wantBanned(t, "the sixth wrong password", code, retryAfter)
	for _, in := range fleet {
		code, retryAfter := attempt(t, in.url, "right")
		wantBanned(t, "the right password after the ban, at "+in.url, code, retryAfter)
	}
	info := keyState(t, fleet[len(fleet)-1].admin, "login", key)
	if d := time.Until(info.BanEnds); d < 59*time.Minute || d > time.Hour {
		t.Fatalf("the admin API shows the ban ending in %s, want about an hour", d)
	}
	bans := 0
	for _, in := range fleet {
		bans += metricCountAt(t, in, `caddy_http_rate_limit_bans_total{zone="login"}`)
	}
	if bans != 1 {
		t.Fatalf("bans_total sums to %d over the instances, want 1", bans)
	}
	if code, body := adminJSON(t, fleet[0].admin, http.MethodDelete, "/rate_limit/zones/login/keys/"+key, ""); code != http.StatusNoContent {
		t.Fatalf("reset: %d %s", code, body)
	}
	for _, in := range fleet {
		// Another instance forgets its cached rejection within a second.
		waitFor(t, "the right password to pass again at "+in.url, func() bool {
			code, _ := attempt(t, in.url, "right")
			return code == http.StatusOK
		})
	}

	// 50 wrong attempts at once: each takes its cost on admission, so at
	// most five reach basic_auth, whose 401s they are.
	codes := map[int]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			code, _ := attempt(t, fleet[i%len(fleet)].url, "wrong")
			mu.Lock()
			codes[code]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if codes[http.StatusUnauthorized] > 5 || codes[http.StatusUnauthorized]+codes[http.StatusTooManyRequests] != 50 {
		t.Fatalf("50 concurrent wrong attempts: %v; want at most five 401s, the rest 429", codes)
	}
	t.Logf("50 concurrent wrong attempts: %v", codes)
}

// quickZone forgets failures after a second; its ban lasts an hour.
const quickZone = `zone quick {
				limit 2
				window 1s
				count_status 401
				ban 1h
			}`

// testBanOutlastsTheWindow: once the window's counts are gone, the banned
// key is still refused everywhere, by the ban alone.
func testBanOutlastsTheWindow(t *testing.T, fleet []instance) {
	const key = "127.0.0.1"
	for i := range 3 {
		attempt(t, fleet[i%len(fleet)].url, "wrong")
	}
	waitUsed(t, fleet[0].admin, "quick", key, 0) // the window, and the one after it, are over
	for _, in := range fleet {
		code, retryAfter := attempt(t, in.url, "right")
		wantBanned(t, "the right password after the counts are gone, at "+in.url, code, retryAfter)
	}
}

func TestLoginsMemory(t *testing.T) {
	testLogins(t, startLogins(t, 1, "", loginZone))
	testBanOutlastsTheWindow(t, startLogins(t, 1, "", quickZone))
}

// TestLoginsRedisFleet: three instances on one Redis share the counts and
// the ban.
func TestLoginsRedisFleet(t *testing.T) {
	s := redistest.Standalone(t)
	store := "store redis {\n\t\t\t\taddress " + s.URL() + "\n\t\t\t\ttimeout 5s\n\t\t\t}\n\t\t\ton_store_error deny"
	testLogins(t, startLogins(t, 3, store, loginZone))
	testBanOutlastsTheWindow(t, startLogins(t, 3, store, quickZone))
}

// TestRedisFleetCountStatusLeases: three instances with lease on and a
// zone that counts only 5xx. Successful requests of a hot key are given
// back into the leases without calls and leave nothing counted; failing
// ones get through at most the limit, and Redis ends counting exactly the
// failures that got through.
func TestRedisFleetCountStatusLeases(t *testing.T) {
	s := redistest.Standalone(t)
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Fail") != "" {
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))
	t.Cleanup(app.Close)
	const limit = 50
	fleet := startFleet(t, 3, fleetSpec{
		store:    "address " + s.URL() + "\nlease on",
		zone:     perClient(limit) + "\n\t\t\tcount_status 5xx",
		upstream: strings.TrimPrefix(app.URL, "http://"),
	})
	waitForFleet(t, fleet)
	send := func(n int, fail bool) map[int]int {
		codes := map[int]int{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for w := range 6 {
			wg.Go(func() {
				for i := w; i < n; i += 6 {
					req, _ := http.NewRequest(http.MethodGet, fleet[i%len(fleet)].url, nil)
					req.Header.Set("X-Client", "hot")
					if fail {
						req.Header.Set("X-Fail", "1")
					}
					code := -1
					if resp, err := http.DefaultClient.Do(req); err == nil {
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						code = resp.StatusCode
					}
					mu.Lock()
					codes[code]++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		return codes
	}
	if _, err := s.Do("CONFIG", "RESETSTAT"); err != nil {
		t.Fatal(err)
	}
	const ok = 1500
	if codes := send(ok, false); codes[http.StatusOK] != ok {
		t.Fatalf("%d successful requests: %v, want all 200", ok, codes)
	}
	calls, err := s.ScriptCalls()
	if err != nil {
		t.Fatal(err)
	}
	given := 0
	for _, in := range fleet {
		given += metricCountAt(t, in, `caddy_http_rate_limit_lease_units_total{outcome="given_back",zone="fleet"}`)
	}
	t.Logf("%d successful requests: %d script calls, %d units given back into leases", ok, calls, given)
	if calls*5 > ok || given == 0 {
		t.Fatalf("%d script calls and %d units given back into leases for %d successes: the give-backs do not use the leases", calls, given, ok)
	}
	waitUsed(t, fleet[0].admin, "fleet", "hot", 0)

	codes := send(200, true)
	failed := int64(codes[http.StatusInternalServerError])
	t.Logf("200 failing requests: %v", codes)
	if failed > limit || codes[http.StatusInternalServerError]+codes[http.StatusTooManyRequests] != 200 {
		t.Fatalf("200 failing requests: %v; want at most %d 500s, the rest 429", codes, limit)
	}
	// Once the leases are back, Redis counts the failures that got
	// through, and nothing else.
	waitUsed(t, fleet[0].admin, "fleet", "hot", failed)
}
