// Package monitoring holds the Grafana dashboard and the Prometheus
// alerts shipped for the module; its tests check them against the
// metrics the module really exports.
package monitoring

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"gopkg.in/yaml.v3"

	_ "github.com/d61b427a/caddy-rate-limit"
	"github.com/d61b427a/caddy-rate-limit/internal/promreg"
	_ "github.com/d61b427a/caddy-rate-limit/storage/memory"
	_ "github.com/d61b427a/caddy-rate-limit/storage/redis"
)

// Dashboard is what the tests read of grafana-dashboard.json.
type Dashboard struct {
	UID           string `json:"uid"`
	Title         string `json:"title"`
	SchemaVersion int    `json:"schemaVersion"`
	Templating    struct {
		List []Variable `json:"list"`
	} `json:"templating"`
	Panels []Panel `json:"panels"`
}

type Variable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"`
	Datasource *Datasource     `json:"datasource"`
	Multi      bool            `json:"multi"`
	IncludeAll bool            `json:"includeAll"`
}

type Datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type Panel struct {
	ID          int         `json:"id"`
	Type        string      `json:"type"`
	Title       string      `json:"title"`
	Description string      `json:"description"`
	Datasource  *Datasource `json:"datasource"`
	GridPos     struct {
		H, W, X, Y int
	} `json:"gridPos"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
	Targets []Target `json:"targets"`
}

type Target struct {
	Expr         string `json:"expr"`
	RefID        string `json:"refId"`
	LegendFormat string `json:"legendFormat"`
}

// Rules is what the tests read of alerts.yml.
type Rules struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []Rule `yaml:"rules"`
	} `yaml:"groups"`
}

type Rule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func readDashboard(t testing.TB) Dashboard {
	t.Helper()
	b, err := os.ReadFile("grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d Dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	return d
}

func readRules(t testing.TB) []Rule {
	t.Helper()
	b, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var r Rules
	if err := yaml.Unmarshal(b, &r); err != nil {
		t.Fatalf("alerts.yml: %v", err)
	}
	var rules []Rule
	for _, g := range r.Groups {
		rules = append(rules, g.Rules...)
	}
	return rules
}

// panelDatasource is the datasource every panel and target names: the
// dashboard's datasource variable, so that one import serves any
// Prometheus.
var panelDatasource = Datasource{Type: "prometheus", UID: "${datasource}"}

// TestDashboardStructure: the dashboard has what Grafana 10+ imports (a
// uid, a title, a current schemaVersion), a datasource variable of
// Prometheus data sources and a zone variable read from a module metric,
// and every panel a datasource, a place on the grid, a one-line
// description and targets with a query, a refId and a legend. Money is
// shown in dollars.
func TestDashboardStructure(t *testing.T) {
	d := readDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("uid %q, title %q: Grafana needs both", d.UID, d.Title)
	}
	if d.SchemaVersion < 38 {
		t.Errorf("schemaVersion %d, want at least 38 (Grafana 10)", d.SchemaVersion)
	}
	vars := map[string]Variable{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	if v := vars["datasource"]; v.Type != "datasource" || string(v.Query) != `"prometheus"` {
		t.Errorf("datasource variable %+v, want type datasource, query prometheus", v)
	}
	zone := vars["zone"]
	var zoneQuery struct{ Query string }
	_ = json.Unmarshal(zone.Query, &zoneQuery)
	if zone.Type != "query" || !zone.Multi || !zone.IncludeAll || zone.Datasource == nil || *zone.Datasource != panelDatasource ||
		!regexp.MustCompile(`^label_values\(caddy_http_rate_limit_\w+, zone\)$`).MatchString(zoneQuery.Query) {
		t.Errorf("zone variable: type %q, multi %t, includeAll %t, datasource %+v, query %q; want a multi, include-all query of label_values(<a module metric>, zone) on ${datasource}",
			zone.Type, zone.Multi, zone.IncludeAll, zone.Datasource, zoneQuery.Query)
	}

	ids := map[int]bool{}
	for _, p := range d.Panels {
		name := fmt.Sprintf("panel %d %q", p.ID, p.Title)
		if p.ID == 0 || ids[p.ID] {
			t.Errorf("%s: id missing or taken by another panel", name)
		}
		ids[p.ID] = true
		if p.Type == "" || p.Title == "" {
			t.Errorf("%s: no type or title", name)
		}
		if p.Description == "" || strings.Contains(p.Description, "\n") {
			t.Errorf("%s: description %q, want one line", name, p.Description)
		}
		if p.Datasource == nil || *p.Datasource != panelDatasource {
			t.Errorf("%s: datasource %+v, want %+v", name, p.Datasource, panelDatasource)
		}
		if g := p.GridPos; g.W <= 0 || g.H <= 0 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
			t.Errorf("%s: gridPos %+v does not fit Grafana's 24 columns", name, g)
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: no targets", name)
		}
		refs := map[string]bool{}
		for _, q := range p.Targets {
			if q.Expr == "" || q.RefID == "" || refs[q.RefID] || q.LegendFormat == "" {
				t.Errorf("%s: target %+v wants an expr, a refId of its own and a legendFormat", name, q)
			}
			refs[q.RefID] = true
			if strings.Contains(q.Expr, `unit="picodollars"`) && (p.FieldConfig.Defaults.Unit != "currencyUSD" || !strings.Contains(q.Expr, "/ 1e12")) {
				t.Errorf("%s: %s counts picodollars; want it divided by 1e12 in a currencyUSD panel (unit %q)", name, q.Expr, p.FieldConfig.Defaults.Unit)
			}
		}
	}
}

// exported returns the metrics the module exports, each with the label
// names its series may have, from the module's collectors themselves:
// the handler (with a shed block), the memory store and the Redis store
// are provisioned (Redis at a loopback port where none listens: it is
// provisioned, never reached), which makes and registers them.
func exported(t *testing.T) map[string][]string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: t.Context()})
	defer cancel()
	for _, cfg := range []string{
		`{"zones": [{"name": "z", "limit": ["10"], "window": "1m"}],
		  "shed": {"classes": ["critical", "low"], "capacity": 8}}`,
		`{"zones": [{"name": "z", "limit": ["10"], "window": "1m"}],
		  "store": {"backend": "redis", "addresses": ["redis://` + closed + `"]}}`,
	} {
		if _, err := ctx.LoadModuleByID("http.handlers.rate_limit", json.RawMessage(cfg)); err != nil {
			t.Fatalf("provisioning %s: %v", cfg, err)
		}
	}

	descName := regexp.MustCompile(`^Desc\{fqName: "([^"]+)", .*constLabels: \{([^}]*)\}, variableLabels: \{([^}]*)\}\}$`)
	metrics := map[string][]string{}
	for _, c := range promreg.Collectors() {
		ch := make(chan *prometheus.Desc, 16)
		c.Describe(ch)
		close(ch)
		_, histogram := c.(*prometheus.HistogramVec)
		for desc := range ch {
			m := descName.FindStringSubmatch(desc.String())
			if m == nil {
				t.Fatalf("cannot read %s", desc)
			}
			var labels []string
			for _, l := range strings.Split(m[2], ",") {
				if name, _, ok := strings.Cut(l, "="); ok {
					labels = append(labels, name)
				}
			}
			for _, l := range strings.Split(m[3], ",") {
				if l != "" {
					labels = append(labels, l)
				}
			}
			if !histogram {
				metrics[m[1]] = labels
				continue
			}
			metrics[m[1]+"_bucket"] = append(slices.Clone(labels), "le")
			metrics[m[1]+"_sum"] = labels
			metrics[m[1]+"_count"] = labels
		}
	}
	return metrics
}

// promqlWords are the PromQL functions, aggregations and keywords the
// queries may use beside metric and label names.
var promqlWords = map[string]bool{
	"sum": true, "max": true, "min": true, "avg": true, "count": true, "by": true, "without": true,
	"rate": true, "increase": true, "irate": true, "histogram_quantile": true, "label_values": true,
	"and": true, "or": true, "unless": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"offset": true, "bool": true, "e12": true,
}

var (
	// quoted strips strings ("...") from a query, template variables
	// ($zone, ${datasource}, $__rate_interval) and durations ([5m]).
	quoted     = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|\$\{?\w+\}?|\[[^\]]*\]`)
	identifier = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
	// leMatcher is a literal matcher on le: Prometheus 3 writes le="1.0"
	// where Prometheus 2 wrote le="1", so such a query works on one only.
	leMatcher = regexp.MustCompile(`\ble\s*(=|!=|=~|!~)`)
)

// queries returns every query the dashboard and the alerts ship, each
// named by where it is.
func queries(t *testing.T) map[string]string {
	qs := map[string]string{}
	d := readDashboard(t)
	for _, v := range d.Templating.List {
		var q struct{ Query string }
		if json.Unmarshal(v.Query, &q) == nil && q.Query != "" {
			qs["variable "+v.Name] = q.Query
		}
	}
	for _, p := range d.Panels {
		for _, q := range p.Targets {
			qs[fmt.Sprintf("panel %q target %s", p.Title, q.RefID)] = q.Expr
		}
	}
	for _, r := range readRules(t) {
		qs["alert "+r.Alert] = r.Expr
	}
	return qs
}

// TestQueriesNameExportedMetrics: every name in every query of the
// dashboard and the alerts is PromQL's, a metric the module exports or a
// label one of the metrics it names has; and no query matches le
// literally.
func TestQueriesNameExportedMetrics(t *testing.T) {
	metrics := exported(t)
	if len(metrics) < 10 {
		t.Fatalf("the module exports %d metrics? %v", len(metrics), metrics)
	}
	used := map[string]bool{}
	for where, q := range queries(t) {
		if leMatcher.MatchString(q) {
			t.Errorf("%s matches le literally: %s", where, q)
		}
		words := identifier.FindAllString(quoted.ReplaceAllString(q, " "), -1)
		labels := map[string]bool{}
		for _, w := range words {
			for _, l := range metrics[w] {
				labels[l] = true
			}
		}
		for _, w := range words {
			switch {
			case metrics[w] != nil:
				used[w] = true
			case promqlWords[w], labels[w]:
			default:
				t.Errorf("%s: %q is no metric the module exports nor a label of those it names (%s)", where, w, q)
			}
		}
	}
	// Every metric is asked about somewhere (a histogram through its
	// buckets).
	for m := range metrics {
		base := strings.TrimSuffix(strings.TrimSuffix(m, "_sum"), "_count")
		if !used[m] && !used[base+"_bucket"] {
			t.Errorf("%s is in no panel or alert", m)
		}
	}
}

// anchors returns the anchors GitHub gives the headings of a Markdown
// file: lowercased, punctuation but - and _ dropped, spaces made -, a
// repeated one suffixed -1, -2...
func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	seen := map[string]int{}
	out := map[string]bool{}
	fence := false
	for s := bufio.NewScanner(f); s.Scan(); {
		line := s.Text()
		if strings.HasPrefix(line, "```") {
			fence = !fence
		}
		if fence || !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// runbookBase is where every alert's runbook is: a section of
// docs/operating.md as GitHub renders it.
const runbookBase = "https://github.com/d61b427a/caddy-rate-limit/blob/main/docs/operating.md#"

// TestAlertsHaveRunbooks: every alert has a summary, a description and a
// runbook_url whose anchor is a heading of docs/operating.md.
func TestAlertsHaveRunbooks(t *testing.T) {
	rules := readRules(t)
	if len(rules) == 0 {
		t.Fatal("alerts.yml has no rules")
	}
	headings := anchors(t, "../docs/operating.md")
	for _, r := range rules {
		if r.Alert == "" || r.Expr == "" {
			t.Errorf("rule %+v: want an alert and an expr", r)
			continue
		}
		for _, a := range []string{"summary", "description", "runbook_url"} {
			if r.Annotations[a] == "" {
				t.Errorf("%s: no %s", r.Alert, a)
			}
		}
		anchor, ok := strings.CutPrefix(r.Annotations["runbook_url"], runbookBase)
		if !ok || !headings[anchor] {
			t.Errorf("%s: runbook_url %q is no heading of docs/operating.md (%s...)", r.Alert, r.Annotations["runbook_url"], runbookBase)
		}
	}
}
