package integration

import (
	"context"
	"github.com/d61b427a/caddy-rate-limit/internal/wait"
	"github.com/d61b427a/caddy-rate-limit/shed"

	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// slowApp is an application behind Caddy that holds requests to /hold
// until released, answers the others at once, and remembers the X-Id of
// every request it sees.
type slowApp struct {
	url     string
	held    atomic.Int64
	release chan struct{}
	once    sync.Once
	seen    sync.Map
}

func newSlowApp(t *testing.T) *slowApp {
	t.Helper()
	a := &slowApp{release: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.seen.Store(r.Header.Get("X-Id"), true)
		if r.URL.Path == "/hold" {
			a.held.Add(1)
			defer a.held.Add(-1)
			select {
			case <-a.release:
			case <-r.Context().Done():
			}
		}
		_, _ = io.WriteString(w, "app")
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(a.releaseAll) // before srv.Close, which waits for held requests
	a.url = strings.TrimPrefix(srv.URL, "http://")
	return a
}

func (a *slowApp) releaseAll() { a.once.Do(func() { close(a.release) }) }

// hold sends n requests to /hold, each on its own connection, and waits
// until the app holds them all. The returned channel gets each one's
// result once the app lets it go. A request that ends before the app
// holds it fails the test at once, saying how it ended, rather than
// leaving the wait to run out.
func (a *slowApp) hold(t *testing.T, n int, headers ...string) <-chan result {
	t.Helper()
	before := a.held.Load()
	done := sendAll(context.Background(), []string{siteURL + "/hold"}, n, headers...)
	wait.For(t, "the app to hold the requests", func() bool {
		select {
		case r := <-done:
			t.Fatalf("a request to /hold ended before the app held %d: %+v (the app holds %d)", n, r, a.held.Load()-before)
		default:
		}
		return a.held.Load() == before+int64(n)
	})
	return done
}

// shedState reads the named shedder from the admin API; ok is false if
// no such shedder runs.
func shedState(t *testing.T, name string) (info shed.Info, ok bool) {
	t.Helper()
	for _, s := range readAdmin[[]shed.Info](t, adminURL, "/rate_limit/shed") {
		if s.Name == name {
			return s, true
		}
	}
	return shed.Info{}, false
}

// chance is a class's drop chance as the admin API shows it.
func chance(s shed.Info, class string) float64 {
	for _, c := range s.Classes {
		if c.Class == class {
			return c.DropChance
		}
	}
	return -1
}

// TestShedThroughCaddy runs the shedder's vector in real time through a
// real Caddy (capacity 4, after 2 s, full 4 s, classes critical normal
// low, the class from a `map` of the path): four requests held by a slow
// app keep utilization at 1. At first nothing is shed, then low goes
// before normal, critical never (when, to the second, is the fake-clock
// tests' of package shed); the app never sees a shed request, which
// consumes nothing in the zone; once the load stops shedding eases off
// over seconds, normal first; one log line when shedding starts and one
// when it stops. handle_errors shapes a shed request's answer.
func TestShedThroughCaddy(t *testing.T) {
	const after, full = 2 * time.Second, 4 * time.Second
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	a := newSlowApp(t)
	startCaddy(t, withGlobals(fmt.Sprintf(`log {
		output file %s
		format json
		level INFO
	}`, logFile))+fmt.Sprintf(`
`+siteAddr+` {
	map {path} {priority} {
		/hold          critical
		~^/critical(/|$) critical
		~^/normal(/|$)   normal
	}
	rate_limit {
		shed vector {
			priority {priority}
			classes critical normal low
			capacity 4
			good 0.7
			bad 0.8
			after %s
			full %s
		}
		zone shed_zone {
			key {header.X-Client}
			limit 1000000
			window 1h
		}
	}
	reverse_proxy %s
	handle_errors 503 {
		respond "{http.error.message}, retry in {http.response.header.Retry-After}s" 503
	}
}
`, after, full, a.url))
	metric := func(class string) int {
		return metricCount(t, adminURL, fmt.Sprintf(`caddy_http_rate_limit_shed_total{class=%q,shedder="vector"}`, class))
	}
	shedBefore := map[string]int{"critical": metric("critical"), "normal": metric("normal"), "low": metric("low")}

	// Each probe sends one request of each class; low's path is not in
	// the map, so its priority is empty: the last class.
	classes := []string{"critical", "normal", "low"}
	paths := map[string]string{"critical": "/critical", "normal": "/normal", "low": "/low"}
	var (
		ids       int
		served    int                // probes answered by the app
		shedIDs   []string           // probes answered 503
		shedBy    = map[string]int{} // by class
		firstShed = map[string]time.Time{}
	)
	// probe sends a round and checks it against the drop chances the
	// admin API shows before and after: if the amount did not move in
	// between, a class with chance 0 is served and one with chance 1 shed.
	probe := func() (before shed.Info, consistent bool) {
		t.Helper()
		before, _ = shedState(t, "vector")
		got := map[string]int{}
		for _, class := range classes {
			ids++
			id := fmt.Sprintf("probe-%d", ids)
			resp, body := do(t, http.MethodGet, siteURL+paths[class], "X-Client: probes", "X-Id: "+id)
			got[class] = resp.StatusCode
			switch resp.StatusCode {
			case http.StatusOK:
				served++
				if body != "app" {
					t.Fatalf("%s: body %q", class, body)
				}
			case http.StatusServiceUnavailable:
				if resp.Header.Get("Retry-After") != "1" {
					t.Fatalf("%s shed without Retry-After: 1: %v", class, resp.Header)
				}
				// handle_errors shapes it.
				if want := fmt.Sprintf(`load shed by shedder "vector": class %q, retry in 1s`, class); body != want {
					t.Fatalf("%s shed: body %q, want %q", class, body, want)
				}
				shedIDs = append(shedIDs, id)
				shedBy[class]++
				if firstShed[class].IsZero() {
					firstShed[class] = time.Now()
				}
			default:
				t.Fatalf("%s: status %d", class, resp.StatusCode)
			}
		}
		if got["critical"] != http.StatusOK {
			t.Fatalf("critical shed at amount %v", before.Amount)
		}
		after, _ := shedState(t, "vector")
		if after.Amount != before.Amount {
			return before, false
		}
		for _, class := range classes {
			switch c := chance(before, class); {
			case c == 0 && got[class] != http.StatusOK, c == 1 && got[class] != http.StatusServiceUnavailable:
				t.Fatalf("amount %v: %s (drop chance %v) answered %d", before.Amount, class, c, got[class])
			}
		}
		return before, true
	}

	// Load: four held requests, all the capacity.
	if s, ok := shedState(t, "vector"); !ok || s.Amount != -0.5 {
		t.Fatalf("before the load: %+v, %v; want the amount at -after/full", s, ok)
	}
	held := a.hold(t, 4, "X-Client: hold", "X-Id: hold")
	sawUnshed, sawLowOnly := false, false
	wait.For(t, "normal to be shed", func() bool {
		s, consistent := probe()
		if s.Amount <= 0 && consistent {
			sawUnshed = true
		}
		if consistent && chance(s, "low") > 0 && chance(s, "normal") == 0 {
			sawLowOnly = true
		}
		if chance(s, "normal") == 1 {
			if s.Utilization < 1 || s.InFlight < 4 {
				t.Fatalf("shedding everything but critical at utilization %v with %d in flight", s.Utilization, s.InFlight)
			}
			return true
		}
		return false
	})
	if !sawUnshed || !sawLowOnly || firstShed["low"].IsZero() || !firstShed["low"].Before(firstShed["normal"]) {
		t.Fatalf("saw nothing shed: %v, low shed alone: %v, first low shed %v, first normal shed %v; want low first",
			sawUnshed, sawLowOnly, firstShed["low"], firstShed["normal"])
	}

	// The load stops: shedding eases off over seconds, normal first.
	a.releaseAll()
	released := time.Now()
	for range 4 {
		if r := receive(t, "a held request to end", held); r.status != http.StatusOK {
			t.Fatalf("held critical request: %+v", r)
		}
	}
	if s, _ := probe(); chance(s, "low") != 1 {
		t.Fatalf("low no longer shed right after the load stopped: %+v", s)
	}
	var normalBack time.Time
	wait.For(t, "shedding to stop", func() bool {
		s, consistent := probe()
		if normalBack.IsZero() && consistent && chance(s, "normal") == 0 {
			normalBack = time.Now()
			if chance(s, "low") == 0 {
				t.Fatalf("normal and low came back at once: %+v", s)
			}
		}
		return s.Amount <= 0
	})
	// The app saw no shed request, and they consumed nothing in the zone.
	for _, id := range shedIDs {
		if _, ok := a.seen.Load(id); ok {
			t.Fatalf("the app saw shed request %s", id)
		}
	}
	if key := keyState(t, adminURL, "shed_zone", "probes"); key.Used != int64(served) {
		t.Fatalf("zone key of the probes: %+v; want used %d (the served probes only; %d were shed)", key, served, len(shedIDs))
	}

	// Visibility: the metrics count what was shed, by class; the amount
	// is a gauge; one log line when shedding started, one when it stopped.
	for _, class := range classes {
		if d := metric(class) - shedBefore[class]; d != shedBy[class] {
			t.Fatalf("shed_total{class=%q} grew by %d, want %d", class, d, shedBy[class])
		}
	}
	if shedBy["critical"] != 0 || shedBy["normal"] == 0 || shedBy["low"] <= shedBy["normal"] {
		t.Fatalf("shed by class: %v", shedBy)
	}
	if g := metricValue(t, adminURL, `caddy_http_rate_limit_shed_amount{shedder="vector"}`); g == "" || strings.HasPrefix(g, "0.") || g[0] != '-' && g != "0" {
		t.Fatalf("shed_amount gauge %q, want at most 0", g)
	}
	waitForLog(t, logFile, 1, `"msg":"load shedding stopped"`, `"shedder":"vector"`, `"level":"info"`)
	if n, m := len(logLines(logFile, `"msg":"load shedding started"`)), len(logLines(logFile, `"shedder":"vector"`)); n != 1 || m != 2 {
		t.Fatalf("%d lines saying shedding started, %d naming the shedder; want 1 and 2", n, m)
	}
	t.Logf("shed %v of %d probes; normal back %v and low back %v after the load stopped",
		shedBy, ids, normalBack.Sub(released).Round(time.Millisecond), time.Since(released).Round(time.Millisecond))
}

// TestShedSurvivesReload: a reload to a config with a shedder of the same
// name keeps its amount and in-flight count; after a reload to a config
// without it, the admin API no longer shows it. (shed's TestSharedByName
// shows that one sampler runs per name, and stops with the last config
// that uses it.)
func TestShedSurvivesReload(t *testing.T) {
	a := newSlowApp(t)
	site := func(body string) string {
		return fmt.Sprintf(`
`+siteAddr+` {
	rate_limit {
		shed kept {
			classes critical low
			capacity 4
			after 2s
			full 4s
		}
	}
	handle /hold {
		reverse_proxy %s
	}
	respond %q
}
`, a.url, body)
	}
	startCaddy(t, site("v1"))
	held := a.hold(t, 4)
	var before shed.Info
	wait.For(t, "the amount to move", func() bool {
		before, _ = shedState(t, "kept")
		return before.Amount > -0.5
	})
	if code, body := reload(t, site("v2")); code != http.StatusOK {
		t.Fatalf("reload: %d %s", code, body)
	}
	if _, body := do(t, http.MethodGet, siteURL+"/"); body != "v2" {
		t.Fatalf("new config not serving: %q", body)
	}
	s, ok := shedState(t, "kept")
	if !ok || s.Amount < before.Amount || s.InFlight != 4 {
		t.Fatalf("after the reload: %+v; want the amount at least %v and the old config's 4 requests in flight", s, before.Amount)
	}
	a.releaseAll()
	for range 4 {
		receive(t, "a held request to end", held)
	}
	wait.For(t, "the requests to count down", func() bool { s, _ := shedState(t, "kept"); return s.InFlight == 0 })

	if code, body := reload(t, siteAddr+" {\n\trespond \"plain\"\n}\n"); code != http.StatusOK {
		t.Fatalf("reload: %d %s", code, body)
	}
	if _, ok := shedState(t, "kept"); ok {
		t.Fatal("the admin API still shows a shedder no config uses")
	}
}

// TestShedOnlyHandler: a rate_limit block may hold a shed block and no
// zone; the admin API refuses other methods on /rate_limit/shed.
func TestShedOnlyHandler(t *testing.T) {
	startCaddy(t, `
`+siteAddr+` {
	rate_limit {
		shed {
			classes critical low
			capacity 64
		}
	}
	respond "ok"
}
`)
	resp, body := do(t, http.MethodGet, siteURL+"/")
	status(t, resp, http.StatusOK)
	if body != "ok" || resp.Header.Get("X-RateLimit-Limit") != "" {
		t.Fatalf("body %q, headers %v", body, resp.Header)
	}
	s, ok := shedState(t, shed.DefaultName)
	if !ok || s.Capacity != 64 || s.Amount != -shed.DefaultAfter.Seconds()/shed.DefaultFull.Seconds() || len(s.Classes) != 2 {
		t.Fatalf("default shedder: %+v, %v", s, ok)
	}
	if code, _ := adminJSON(t, adminURL, http.MethodPost, "/rate_limit/shed", "{}"); code != http.StatusMethodNotAllowed {
		t.Fatalf("POST /rate_limit/shed: %d", code)
	}
}

// TestShedSharedAcrossHandlers: two rate_limit handlers of one config
// with shedders of the same name are one shedder: the requests in flight
// through either count together.
func TestShedSharedAcrossHandlers(t *testing.T) {
	a := newSlowApp(t)
	shedBlock := `
		shed shared {
			classes critical low
			capacity 4
			after 2s
			full 4s
		}`
	startCaddy(t, fmt.Sprintf(`
`+siteAddr+` {
	@a header X-Side a
	@b header X-Side b
	rate_limit @a {%s
	}
	rate_limit @b {%s
	}
	reverse_proxy %s
}
`, shedBlock, shedBlock, a.url))
	heldA := a.hold(t, 2, "X-Side: a")
	heldB := a.hold(t, 3, "X-Side: b")
	if s, ok := shedState(t, "shared"); !ok || s.InFlight != 5 {
		t.Fatalf("shedder: %+v (found: %v), want the 5 requests of both handlers in flight", s, ok)
	}
	a.releaseAll()
	for range 2 {
		receive(t, "a held request of site A to end", heldA)
	}
	for range 3 {
		receive(t, "a held request of site B to end", heldB)
	}
	wait.For(t, "the requests to count down", func() bool { s, _ := shedState(t, "shared"); return s.InFlight == 0 })
}
