//go:build monitoring

package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
	"github.com/d61b427a/caddy-rate-limit/internal/wait"
)

// This file is the live tier of the shipped dashboard and alerts
// (monitoring/): a real Prometheus (Debian's prometheus package) scrapes
// the in-process Caddy every second while traffic goes through a zone of
// every kind, and every query of the dashboard must return a value above
// zero through Prometheus's HTTP API; then the test's own Redis is
// stopped (SIGSTOP) and the store alert's expression must hold. Run by
// go test -tags monitoring -run TestMonitoring ./integration/ (.ci/run).

// rateInterval stands for the dashboard's $__rate_interval: a few of the
// test's 1s scrapes.
const rateInterval = "10s"

// monitoringBudget is how long the test waits for Prometheus to see what
// the traffic does: a few scrapes and rate windows, on a busy machine.
const monitoringBudget = 90 * time.Second

// outageOnly are the dashboard's queries that are above zero only while
// the store fails: they are checked with Redis stopped.
var outageOnly = map[string]bool{
	"Store errors/A":         true,
	"Breaker and fallback/A": true,
	"Breaker and fallback/B": true,
}

type dashboardTarget struct {
	panel, ref, expr string
}

// dashboardQueries reads the dashboard's targets, with its variables
// replaced as Grafana would for every zone.
func dashboardQueries(t *testing.T) []dashboardTarget {
	t.Helper()
	b, err := os.ReadFile("../monitoring/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr, RefID string }
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	var out []dashboardTarget
	for _, p := range d.Panels {
		for _, q := range p.Targets {
			expr := strings.NewReplacer("$__rate_interval", rateInterval, "$zone", ".*").Replace(q.Expr)
			out = append(out, dashboardTarget{p.Title, q.RefID, expr})
		}
	}
	if len(out) == 0 {
		t.Fatal("the dashboard has no queries")
	}
	return out
}

// alertExprs reads the alerts' expressions by name.
func alertExprs(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("../monitoring/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct{ Alert, Expr string }
		}
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			out[r.Alert] = r.Expr
		}
	}
	return out
}

// promServer is a Prometheus server of the test's own.
type promServer struct{ url string }

// startPrometheus starts Prometheus on a free port of the suite's
// loopback address, with a storage directory of its own, scraping the
// in-process Caddy's admin endpoint every second and evaluating
// monitoring/alerts.yml every second; it is killed when the test ends.
func startPrometheus(t *testing.T) *promServer {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("prometheus is not on PATH (apt-get install prometheus)")
		}
		t.Skip("prometheus is not on PATH (apt-get install prometheus)")
	}
	rules, err := filepath.Abs("../monitoring/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	config := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: caddy
    static_configs:
      - targets: [%q]
`, rules, adminAddr)), 0o600); err != nil {
		t.Fatal(err)
	}
	listen := onLoopback(freePort())
	logFile, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+config, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+listen)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logFile.Close()
		if t.Failed() {
			log, _ := os.ReadFile(logFile.Name())
			t.Logf("prometheus log:\n%s", log)
		}
	})
	p := &promServer{url: "http://" + listen}
	wait.For(t, "prometheus to be ready", func() bool {
		resp, err := http.Get(p.url + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return p
}

// promSeries is one series of an instant query's answer.
type promSeries struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

func (s promSeries) value() float64 {
	text, _ := s.Value[1].(string)
	v, err := strconv.ParseFloat(text, 64)
	if err != nil {
		return math.NaN()
	}
	return v
}

func (s promSeries) String() string {
	var labels []string
	for k, v := range s.Metric {
		if k != "instance" && k != "job" {
			labels = append(labels, fmt.Sprintf("%s=%q", k, v))
		}
	}
	slices.Sort(labels)
	return fmt.Sprintf("{%s} %v", strings.Join(labels, ","), s.Value[1])
}

// query evaluates expr now through /api/v1/query.
func (p *promServer) query(t *testing.T, expr string) []promSeries {
	t.Helper()
	resp, err := http.PostForm(p.url+"/api/v1/query", url.Values{"query": {expr}})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var answer struct {
		Status string
		Error  string
		Data   struct {
			ResultType string
			Result     []promSeries
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil {
		t.Fatal(err)
	}
	if answer.Status != "success" {
		t.Fatalf("query %s: %s", expr, answer.Error)
	}
	return answer.Data.Result
}

// positive returns the series of ss whose value is above zero.
func positive(ss []promSeries) []promSeries {
	var out []promSeries
	for _, s := range ss {
		if v := s.value(); v > 0 && !math.IsInf(v, 0) {
			out = append(out, s)
		}
	}
	return out
}

// pollQueries evaluates the queries until each returns a series above
// zero, and fails the test naming those that never did within
// monitoringBudget. It logs what each returned.
func pollQueries(t *testing.T, p *promServer, what string, queries map[string]string) {
	t.Helper()
	pending := map[string]string{}
	for name, q := range queries {
		pending[name] = q
	}
	deadline := time.Now().Add(monitoringBudget)
	for len(pending) > 0 {
		for name, q := range pending {
			if got := positive(p.query(t, q)); len(got) > 0 {
				t.Logf("%s: %s → %v", what, name, got)
				delete(pending, name)
			}
		}
		if len(pending) == 0 {
			break
		}
		if time.Now().After(deadline) {
			for name, q := range pending {
				t.Errorf("%s: %s returned no series above zero in %v: %s → %v", what, name, monitoringBudget, q, p.query(t, q))
			}
			t.FailNow()
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// monitoringSite has a zone of every kind, each on its own path: memory
// (mem), a ban, max_delay, dry_run, Redis with lease on and on_store_error
// local (over their limits: rejected from its deny cache), Redis keys
// under their limit (leased: a key over its limit is decided exactly at a
// window's start and from the deny cache after, so it seldom leases),
// cost_from counted in tokens and in money in front of a fake upstream,
// and a shedder in front of a slow app.
func monitoringSite(redisURL, upstream, slow string) string {
	store := redisStore(fmt.Sprintf("address %s\ntimeout 100ms\nlease on", redisURL))
	return fmt.Sprintf(`
%s {
	route /mem {
		rate_limit {
			zone mon_mem {
				key {header.X-Client}
				limit 5
				window 1s
				algorithm fixed_window
			}
		}
		respond "ok"
	}
	route /ban {
		rate_limit {
			zone mon_ban {
				key {header.X-Client}
				limit 1
				window 1s
				ban 2s
			}
		}
		respond "ok"
	}
	route /delay {
		rate_limit {
			zone mon_delay {
				key {header.X-Client}
				limit 10
				window 1s
				algorithm fixed_window
				max_delay 2s
			}
		}
		respond "ok"
	}
	route /dry {
		rate_limit {
			zone mon_dry {
				key {header.X-Client}
				limit 1
				window 1s
				dry_run
			}
		}
		respond "ok"
	}
	route /redis {
		rate_limit {
			%s
			on_store_error local
			zone mon_redis {
				key {header.X-Client}
				limit 50
				window 1s
			}
		}
		respond "ok"
	}
	route /lease {
		rate_limit {
			%s
			zone mon_lease {
				key {header.X-Client}
				limit 1000000
				window 1s
			}
		}
		respond "ok"
	}
	route /tokens {
		rate_limit {
			zone mon_tokens {
				key {header.X-Client}
				limit 1000000
				window 1s
				cost_from usage output
				reserve 10
			}
		}
		reverse_proxy %s
	}
	route /money {
		rate_limit {
			zone mon_money {
				key {header.X-Client}
				limit $1000
				window 1s
				cost_from usage price {
					* input 2.50 output 10.00
				}
				reserve max_tokens 500
			}
		}
		reverse_proxy %s
	}
	@shed path /hold /shed
	route @shed {
		rate_limit {
			shed mon_shed {
				classes critical low
				capacity 1
				after 1s
				full 2s
			}
			zone mon_shed_zone {
				key {header.X-Client}
				limit 1000000
				window 1h
			}
		}
		reverse_proxy %s
	}
}
`, siteAddr, store, store, upstream, upstream, slow)
}

// monitoringTraffic sends requests through every zone until ctx ends,
// so that every counter keeps growing between scrapes: memory keys over
// their limit (rejected, and windows rolled), a new key banned each
// round, requests held by max_delay, dry-run would-be rejections, Redis
// keys with leases, token and money responses costing less and more than
// their reservation (released, and debt), and requests to a shedding
// route.
func monitoringTraffic(ctx context.Context, t *testing.T) *sync.WaitGroup {
	var wg sync.WaitGroup
	loop := func(fn func(i int)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				fn(i)
			}
		}()
	}
	send := func(method, path, body string, headers ...string) {
		req, err := http.NewRequestWithContext(ctx, method, siteURL+path, strings.NewReader(body))
		if err != nil {
			t.Error(err)
			return
		}
		setHeaders(req, headers)
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
	}
	chat := `{"model":"gpt-4o","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`
	loop(func(i int) {
		send(http.MethodGet, "/mem", "", fmt.Sprintf("X-Client: mem-%d", i%3))
		send(http.MethodGet, "/dry", "", "X-Client: dry")
		send(http.MethodGet, "/ban", "", fmt.Sprintf("X-Client: ban-%d", i/2))
		send(http.MethodGet, "/shed", "", "X-Client: shed")
		send(http.MethodGet, "/lease", "", "X-Client: lease")
		// 1 token out of a reservation of 10, then 30: released, then debt.
		send(http.MethodPost, "/tokens", chat, "X-Client: tokens", "Content-Type: application/json", fmt.Sprintf("X-Tokens: %d", []int{1, 30}[i%2]))
		// 1 token out costs less than the reservation of 5 and the body;
		// 500 more.
		send(http.MethodPost, "/money", chat, "X-Client: money", "Content-Type: application/json", fmt.Sprintf("X-Tokens: %d", []int{1, 500}[i%2]))
		time.Sleep(5 * time.Millisecond)
	})
	loop(func(i int) { send(http.MethodGet, "/delay", "", "X-Client: delay") })
	loop(func(i int) {
		send(http.MethodGet, "/redis", "", fmt.Sprintf("X-Client: redis-%d", i%4))
	})
	return &wg
}

// TestMonitoring: under traffic through every kind of zone, every query
// of the shipped dashboard returns a series above zero through a real
// Prometheus scraping Caddy, and the rules of the shipped alerts load and
// evaluate without error; with the test's Redis stopped (SIGSTOP), the
// store's errors, its open breaker and its fallback's decisions show,
// and the expression of RateLimitStoreFailing holds.
func TestMonitoring(t *testing.T) {
	integration(t)
	targets := dashboardQueries(t)
	alerts := alertExprs(t)
	s := redistest.Standalone(t)
	upstream := newTokenCounter(t, func(int64) int64 { return 1 })
	slow := newSlowApp(t)
	startCaddy(t, monitoringSite(s.URL(), upstream.url, slow.url))
	p := startPrometheus(t)

	// Two requests held by the slow app keep the shedder's utilization at
	// 2 (capacity 1): it sheds once after has passed.
	slow.hold(t, 2, "X-Client: shed")
	ctx, cancel := context.WithCancel(context.Background())
	traffic := monitoringTraffic(ctx, t)
	defer traffic.Wait()
	defer cancel()

	live := map[string]string{}
	outage := map[string]string{}
	for _, q := range targets {
		name := q.panel + "/" + q.ref
		if outageOnly[name] {
			outage[name] = q.expr
		} else {
			live[name] = q.expr
		}
	}
	pollQueries(t, p, "under traffic", live)

	// The rules loaded, and each evaluated against the scraped series
	// without error.
	var rules struct {
		Data struct {
			Groups []struct {
				Rules []struct{ Name, Health, LastError string }
			}
		}
	}
	resp, err := http.Get(p.url + "/api/v1/rules")
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(resp.Body).Decode(&rules)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	loaded := 0
	for _, g := range rules.Data.Groups {
		for _, r := range g.Rules {
			loaded++
			if r.Health != "ok" || r.LastError != "" {
				t.Errorf("rule %s: health %q, %s", r.Name, r.Health, r.LastError)
			}
		}
	}
	if loaded != len(alerts) {
		t.Errorf("prometheus loaded %d rules, want the %d of alerts.yml", loaded, len(alerts))
	}
	// What each alert's expression returns under this traffic, for the
	// record: only the store's is asserted, below.
	for _, name := range slices.Sorted(maps.Keys(alerts)) {
		t.Logf("under traffic: alert %s → %v", name, p.query(t, alerts[name]))
	}

	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Resume() })
	outage["alert RateLimitStoreFailing"] = alerts["RateLimitStoreFailing"]
	// The rule itself, pending for its for: 2m, as Prometheus evaluates it.
	outage["ALERTS RateLimitStoreFailing"] = `ALERTS{alertname="RateLimitStoreFailing",store="redis"}`
	pollQueries(t, p, "with Redis stopped", outage)
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	// Once Redis answers again the breaker closes.
	pollQueries(t, p, "with Redis back", map[string]string{
		"breaker closed": `max by (store) (caddy_http_rate_limit_store_breaker_open) == bool 0`,
	})
}
