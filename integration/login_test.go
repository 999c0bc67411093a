package integration

import (
	"context"
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

	"github.com/d61b427a/caddy-rate-limit/internal/docs"
	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
	"github.com/d61b427a/caddy-rate-limit/internal/wait"
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
// (user alice, password "right") behind rate_limit with the handler lines
// given (the store; none: memory) and zone, in front of app (host:port),
// or of Caddy's own "welcome" if app is "".
func startLogins(t *testing.T, n int, lines, zone, app string) []instance {
	t.Helper()
	hash, err := bcrypt.GenerateFromPassword([]byte("right"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	serve := `respond "welcome"`
	if app != "" {
		serve = "reverse_proxy " + app
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
		%s
	}
`, lines, zone, hash, serve), "/app"))
	}
	return fleet
}

// attempt logs in to url as alice with password and returns the status
// and Retry-After.
func attempt(t *testing.T, url, password string) (int, string) {
	t.Helper()
	resp := login(t, url, password)
	return resp.StatusCode, resp.Header.Get("Retry-After")
}

// login logs in to url as alice with password and returns the response.
func login(t *testing.T, url, password string) *http.Response {
	t.Helper()
	resp, _ := do(t, http.MethodGet, url, basicAuth("alice", password))
	return resp
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
		bans += metricCount(t, in.admin, `caddy_http_rate_limit_bans_total{zone="login"}`)
	}
	if bans != 1 {
		t.Fatalf("bans_total sums to %d over the instances, want 1", bans)
	}
	if code, body := adminJSON(t, fleet[0].admin, http.MethodDelete, "/rate_limit/zones/login/keys/"+key, ""); code != http.StatusNoContent {
		t.Fatalf("reset: %d %s", code, body)
	}
	for _, in := range fleet {
		// Another instance forgets its cached rejection within a second.
		wait.For(t, "the right password to pass again at "+in.url, func() bool {
			code, _ := attempt(t, in.url, "right")
			return code == http.StatusOK
		})
	}

	// 50 wrong attempts at once: each takes its cost on admission, so at
	// most five reach basic_auth, whose 401s they are.
	codes := burst(urls(fleet), 50, basicAuth("alice", "wrong"))
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
	// Wrong passwords until one is refused with the ban: three in a row
	// do it, but on a busy machine they may not fall within one 1s
	// window.
	i := 0
	wait.For(t, "a wrong password to be banned", func() bool {
		code, retryAfter := attempt(t, fleet[i%len(fleet)].url, "wrong")
		i++
		secs, _ := strconv.Atoi(retryAfter)
		return code == http.StatusTooManyRequests && secs > 60
	})
	waitUsed(t, fleet[0].admin, "quick", key, 0) // the window, and the one after it, are over
	for _, in := range fleet {
		code, retryAfter := attempt(t, in.url, "right")
		wantBanned(t, "the right password after the counts are gone, at "+in.url, code, retryAfter)
	}
}

func TestLoginsMemory(t *testing.T) {
	testLogins(t, startLogins(t, 1, "", loginZone, ""))
	testBanOutlastsTheWindow(t, startLogins(t, 1, "", quickZone, ""))
}

// redisLines are the handler lines of instances that share the Redis
// server s, with extra lines in the store block.
func redisLines(s *redistest.Server, extra string) string {
	return redisStore("address "+s.URL()+"\n"+extra) + "\non_store_error deny"
}

// TestLoginsRedisFleet: three instances on one Redis share the counts and
// the ban.
func TestLoginsRedisFleet(t *testing.T) {
	s := redistest.Standalone(t)
	testLogins(t, startLogins(t, 3, redisLines(s, ""), loginZone, ""))
	testBanOutlastsTheWindow(t, startLogins(t, 3, redisLines(s, ""), quickZone, ""))
}

// loginsAtOnce sends n logins with password at once, spread over fleet,
// and returns a channel that gets each one's result.
func loginsAtOnce(fleet []instance, password string, n int) <-chan result {
	return sendAll(context.Background(), urls(fleet), n, basicAuth("alice", password))
}

// testInFlightIsNoBan: a browser loads eight assets at once with the right
// password from a key with a limit of five failures. The five admitted
// fill the limit while the app holds them; the other three are refused
// with Retry-After: 1, for costs in flight, and ban nothing: once the
// five are done, their costs are released and the right password passes.
func testInFlightIsNoBan(t *testing.T, fleet []instance, app *gate) {
	const key = "127.0.0.1"
	answers := loginsAtOnce(fleet, "right", 8)
	app.waitArrivals(t, 5)
	for range 3 {
		if r := receive(t, "an answer", answers); r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") != "1" {
			t.Fatalf("a request past the five in flight: %+v; want 429 and Retry-After 1", r)
		}
	}
	app.releaseAll()
	for range 5 {
		if r := receive(t, "an answer", answers); r.status != http.StatusOK {
			t.Fatalf("a request in flight: %+v, want 200", r)
		}
	}
	if info := keyState(t, fleet[0].admin, "login", key); !info.BanEnds.IsZero() {
		t.Fatalf("the admin API shows a ban until %s after a page load with the right password", info.BanEnds)
	}
	waitUsed(t, fleet[0].admin, "login", key, 0)
	for _, in := range fleet {
		if code, retryAfter := attempt(t, in.url, "right"); code != http.StatusOK {
			t.Fatalf("the right password after the page load, at %s: %d, Retry-After %q; want 200", in.url, code, retryAfter)
		}
	}
}

func TestLoginsInFlightMemory(t *testing.T) {
	app := newGate(t)
	testInFlightIsNoBan(t, startLogins(t, 1, "", loginZone, app.url), app)
}

func TestLoginsInFlightRedisFleet(t *testing.T) {
	s := redistest.Standalone(t)
	app := newGate(t)
	testInFlightIsNoBan(t, startLogins(t, 3, redisLines(s, ""), loginZone, app.url), app)
}

// readmeLoginZone is the zone of the README's basic_auth example, which
// docs/brute-force.md shows too.
func readmeLoginZone(t *testing.T) string {
	t.Helper()
	zone := func(file, section string) string {
		var block string
		if blocks := docs.FencedBlocks(docs.Section(t, file, section), "caddyfile"); len(blocks) > 0 {
			block = blocks[0]
		}
		start := strings.Index(block, "zone login {")
		end := strings.Index(block[max(start, 0):], "\n\t\t}")
		if start < 0 || end < 0 {
			t.Fatalf("%s: no zone login in the first Caddyfile block of %q", file, section)
		}
		return block[start : start+end+4]
	}
	readme := zone("../README.md", "Stop password guessing")
	if doc := zone("../docs/brute-force.md", "basic_auth"); doc != readme {
		t.Fatalf("docs/brute-force.md's basic_auth zone\n%s\nis not the README's\n%s", doc, readme)
	}
	return readme
}

// testChallenges plays the README's basic_auth zone against requests
// that carry no password, so no guess: a browser's first request, which
// basic_auth answers 401 with a challenge, an uptime probe, or colleagues
// behind one address opening the page. Five of them count nothing, and
// then the right password is let in (app lets it through), with no ban.
func testChallenges(t *testing.T, fleet []instance, app *gate) {
	const key = "127.0.0.1"
	for i := range 5 {
		resp, _ := do(t, http.MethodGet, fleet[i%len(fleet)].url)
		if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
			t.Fatalf("request %d without credentials: %d, WWW-Authenticate %q; want 401 and a challenge", i+1, resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
		}
	}
	app.open(1)
	if code, retryAfter := attempt(t, fleet[len(fleet)-1].url, "right"); code != http.StatusOK {
		t.Fatalf("the right password after 5 requests without credentials: %d, Retry-After %q; want 200: nobody guessed", code, retryAfter)
	}
	if info := keyState(t, fleet[0].admin, "login", key); info.Used != 0 || !info.BanEnds.IsZero() {
		t.Fatalf("after requests without credentials and the right password, the admin API shows %d used and a ban until %s; want none", info.Used, info.BanEnds)
	}
}

// testPageLoad plays the README's basic_auth zone: a page load of 20
// requests at once with the right password all pass, the first five
// holding the limit while the app holds them and the others waiting for
// them, and so does the next request, with no ban; six wrong passwords
// in a row still ban, and then the right password is refused for the
// hour. Meanwhile X-RateLimit-Reset and the RateLimit header's reset tell
// the ban's end, as Retry-After does.
func testPageLoad(t *testing.T, fleet []instance, app *gate) {
	const key = "127.0.0.1"
	arrived := app.arrived.Load()
	answers := loginsAtOnce(fleet, "right", 20)
	app.waitArrivals(t, arrived+5)
	app.releaseAll()
	for range 20 {
		if r := receive(t, "an answer", answers); r.status != http.StatusOK {
			t.Fatalf("a page load of 20 with the right password: %+v; want every one 200", r)
		}
	}
	if code, retryAfter := attempt(t, fleet[len(fleet)-1].url, "right"); code != http.StatusOK {
		t.Fatalf("the right password after the page load: %d, Retry-After %q; want 200", code, retryAfter)
	}
	if info := keyState(t, fleet[0].admin, "login", key); !info.BanEnds.IsZero() {
		t.Fatalf("the admin API shows a ban until %s after a page load with the right password", info.BanEnds)
	}
	banned := 0
	for i := 1; i <= 7 && banned == 0; i++ {
		resp := login(t, fleet[i%len(fleet)].url, "wrong")
		switch {
		case resp.StatusCode == http.StatusTooManyRequests && i >= 6:
			wantBanned(t, fmt.Sprintf("wrong password %d", i), resp.StatusCode, resp.Header.Get("Retry-After"))
			wantBanHeaders(t, fmt.Sprintf("wrong password %d", i), resp)
			banned = i
		case resp.StatusCode != http.StatusUnauthorized:
			t.Fatalf("wrong password %d: %d, Retry-After %q; want 401", i, resp.StatusCode, resp.Header.Get("Retry-After"))
		}
	}
	if banned == 0 {
		t.Fatal("seven wrong passwords in a row began no ban")
	}
	for _, in := range fleet {
		resp := login(t, in.url, "right")
		wantBanned(t, "the right password after the ban, at "+in.url, resp.StatusCode, resp.Header.Get("Retry-After"))
		wantBanHeaders(t, "the right password after the ban, at "+in.url, resp)
	}
}

// wantBanHeaders checks that a refusal by a ban of about an hour says its
// end in X-RateLimit-Reset (Unix seconds) and in the RateLimit header's t
// (seconds from now), as Retry-After does.
func wantBanHeaders(t *testing.T, what string, resp *http.Response) {
	t.Helper()
	retryAfter, _ := strconv.ParseInt(resp.Header.Get("Retry-After"), 10, 64)
	reset, _ := strconv.ParseInt(resp.Header.Get("X-RateLimit-Reset"), 10, 64)
	if now := time.Now().Unix(); reset < now+retryAfter-5 || reset > now+retryAfter+5 {
		t.Errorf("%s: X-RateLimit-Reset %d is %ds from now, want the ban's end, as Retry-After %d says", what, reset, reset-now, retryAfter)
	}
	_, tail, _ := strings.Cut(resp.Header.Get("RateLimit"), ";t=")
	if secs, _ := strconv.ParseInt(tail, 10, 64); secs < retryAfter-5 || secs > retryAfter {
		t.Errorf("%s: RateLimit %q, want t the ban's end, as Retry-After %d says", what, resp.Header.Get("RateLimit"), retryAfter)
	}
}

// TestLoginsPageLoadMemory: the README's zone, requests without
// credentials first, then a page load and a guesser.
func TestLoginsPageLoadMemory(t *testing.T) {
	app := newGate(t)
	fleet := startLogins(t, 1, "headers both", readmeLoginZone(t), app.url)
	testChallenges(t, fleet, app)
	testPageLoad(t, fleet, app)
}

// TestLoginsPageLoadRedisFleet: the same on three instances sharing Redis
// with leases on (which a zone that bans does not take).
func TestLoginsPageLoadRedisFleet(t *testing.T) {
	s := redistest.Standalone(t)
	app := newGate(t)
	fleet := startLogins(t, 3, redisLines(s, "lease on")+"\n\t\t\theaders both", readmeLoginZone(t), app.url)
	testChallenges(t, fleet, app)
	testPageLoad(t, fleet, app)
}

// TestRedisFleetCountStatusLeases: three instances with lease on and a
// zone that counts only 5xx. Successful requests of a hot key are
// released into the leases without calls and leave nothing counted; failing
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
	released := 0
	for _, in := range fleet {
		released += metricCount(t, in.admin, `caddy_http_rate_limit_lease_units_total{outcome="released_to_lease",zone="fleet"}`)
	}
	t.Logf("%d successful requests: %d script calls, %d units released into leases", ok, calls, released)
	if calls*5 > ok || released == 0 {
		t.Fatalf("%d script calls and %d units released into leases for %d successes: the releases do not use the leases", calls, released, ok)
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
