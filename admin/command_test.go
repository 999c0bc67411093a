package admin

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// These tests run caddy rate-limit in this process against a stand-in
// for the admin endpoint, so that they run under -short: the requests
// each subcommand sends, and the arguments it refuses before sending
// any. The integration tests run it against a running Caddy.

// rateLimit runs caddy rate-limit with args and returns what it printed.
func rateLimit(args ...string) (string, error) {
	cmd := &cobra.Command{Use: "rate-limit"}
	rateLimitCommands(cmd)
	root := &cobra.Command{Use: "caddy", SilenceUsage: true}
	root.AddCommand(cmd)
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(io.Discard)
	root.SetArgs(append([]string{"rate-limit"}, args...))
	err := root.Execute()
	return out.String(), err
}

// standIn is an admin endpoint that records the last request it got and
// answers with status and body.
type standIn struct {
	address                  string // host:port
	status                   int
	answer                   string
	method, uri, body, ctype string
	requests                 int
}

func newStandIn(t *testing.T) *standIn {
	s := &standIn{status: http.StatusOK}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.requests++
		s.method, s.uri, s.body, s.ctype = r.Method, r.URL.RequestURI(), string(b), r.Header.Get("Content-Type")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(s.status)
		io.WriteString(w, s.answer)
	}))
	t.Cleanup(srv.Close)
	s.address = strings.TrimPrefix(srv.URL, "http://")
	return s
}

// TestRateLimitCommandRequests: each subcommand sends its method, path
// (zone names and keys escaped) and JSON body, and with --json prints
// the answer as it is.
func TestRateLimitCommandRequests(t *testing.T) {
	s := newStandIn(t)
	s.answer = "{\"answer\":\"as it is\"}\n"
	cases := []struct {
		args              []string
		method, uri, body string
	}{
		{[]string{"zones"}, "GET", "/rate_limit/zones", ""},
		{[]string{"top", "api"}, "GET", "/rate_limit/zones/api/top?n=20", ""},
		{[]string{"top", "a/b", "--n", "3"}, "GET", "/rate_limit/zones/a%2Fb/top?n=3", ""},
		{[]string{"top", "default@:8080~2"}, "GET", "/rate_limit/zones/default@:8080~2/top?n=20", ""},
		{[]string{"key", "default@m%C3%BCnchen.de", "k"}, "GET", "/rate_limit/zones/default@m%25C3%25BCnchen.de/keys/k", ""},
		{[]string{"key", "api", "bot 7/%"}, "GET", "/rate_limit/zones/api/keys/bot%207%2F%25", ""},
		{[]string{"reset", "api", "k"}, "DELETE", "/rate_limit/zones/api/keys/k", ""},
		{[]string{"reset", "api", "#0123456789abcdef"}, "DELETE", "/rate_limit/zones/api/keys/%230123456789abcdef", ""},
		{[]string{"key", "api", "k", "--from", "{header.X-Api-Key}"}, "GET", "/rate_limit/zones/api/keys/k?from=%7Bheader.X-Api-Key%7D", ""},
		{[]string{"reset", "api", "k", "--from", "{client_ip}"}, "DELETE", "/rate_limit/zones/api/keys/k?from=%7Bclient_ip%7D", ""},
		{[]string{"override", "api", "k", "7", "--from", "a b"}, "PUT", "/rate_limit/zones/api/keys/k/limit?from=a+b", `{"limit":7}`},
		{[]string{"override", "api", "k", "--remove", "--from", "{client_ip}"}, "DELETE", "/rate_limit/zones/api/keys/k/limit?from=%7Bclient_ip%7D", ""},
		{[]string{"override", "api", "k", "5000", "--ttl", "24h"}, "PUT", "/rate_limit/zones/api/keys/k/limit", `{"limit":5000,"ttl":"24h"}`},
		{[]string{"override", "api", "k", "10"}, "PUT", "/rate_limit/zones/api/keys/k/limit", `{"limit":10}`},
		{[]string{"override", "api", "k", "--remove"}, "DELETE", "/rate_limit/zones/api/keys/k/limit", ""},
		{[]string{"dial", "api", "--mode", "dry_run", "--ttl", "1h"}, "PUT", "/rate_limit/zones/api/dial", `{"mode":"dry_run","ttl":"1h"}`},
		{[]string{"dial", "api", "--mode", "enforce", "--limit", "200"}, "PUT", "/rate_limit/zones/api/dial", `{"mode":"enforce","limit":200}`},
		{[]string{"dial", "api", "--remove"}, "DELETE", "/rate_limit/zones/api/dial", ""},
	}
	for _, c := range cases {
		out, err := rateLimit(append(c.args, "--json", "--address", s.address)...)
		if err != nil {
			t.Errorf("%q: %v", c.args, err)
			continue
		}
		if s.method != c.method || s.uri != c.uri || s.body != c.body {
			t.Errorf("%q sent %s %s %s, want %s %s %s", c.args, s.method, s.uri, s.body, c.method, c.uri, c.body)
		}
		if c.body != "" && s.ctype != "application/json" {
			t.Errorf("%q sent Content-Type %q, want application/json", c.args, s.ctype)
		}
		if out != s.answer {
			t.Errorf("%q printed %q, want the answer as it is", c.args, out)
		}
	}
}

// TestRateLimitTopFooter: the top table ends with how far its counts may
// be from the truth, or that they are exact when no key was ever dropped
// from the summary.
func TestRateLimitTopFooter(t *testing.T) {
	s := newStandIn(t)
	for bound, want := range map[int]string{
		0: "Requests over about the last minute; the counts are exact.\n",
		3: "Requests over about the last minute; each count is at most 3 over the truth.\n",
	} {
		s.answer = fmt.Sprintf(`{"zone":"api","keys":[{"key":"k","requests":9,"rejected":2}],"error":%d}`, bound)
		out, err := rateLimit("top", "api", "--address", s.address)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(out, "\n"+want) || !strings.Contains(out, "k  ") {
			t.Errorf("error bound %d: printed\n%s\nwant the table and %q", bound, out, want)
		}
	}
}

// TestRateLimitCommandShowsAlternatives: top shows the alternative each
// key came from, last, and key shows it; a change made with --from says
// which.
func TestRateLimitCommandShowsAlternatives(t *testing.T) {
	s := newStandIn(t)
	s.answer = `{"zone":"api","keys":[{"key":"k","from":"{http.request.header.X-Api-Key}","requests":9,"rejected":2},{"key":"k","from":"{http.vars.client_ip}","requests":1,"rejected":0}],"error":0}`
	out, err := rateLimit("top", "api", "--address", s.address)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(out, "\n")
	for i, want := range [][]string{{"KEY", "REQUESTS", "REJECTED", "FROM"}, {"k", "9", "2", "{http.request.header.X-Api-Key}"}, {"k", "1", "0", "{http.vars.client_ip}"}} {
		if got := strings.Fields(lines[i]); !slices.Equal(got, want) {
			t.Errorf("top line %d: %q, want %q", i, got, want)
		}
	}
	s.answer = `{"zone":"api","key":"k","from":"{http.vars.client_ip}","used":1,"reset":"2030-01-01T00:00:00Z"}`
	if out, err := rateLimit("key", "api", "k", "--address", s.address); err != nil || !strings.Contains(out, "\nfrom               {http.vars.client_ip}\n") {
		t.Errorf("key printed\n%s\n(%v), want its alternative", out, err)
	}
	s.answer = ""
	if out, err := rateLimit("reset", "api", "k", "--from", "{client_ip}", "--address", s.address); err != nil || out != "zone \"api\": key \"k\" from \"{client_ip}\" reset\n" {
		t.Errorf("reset --from printed %q (%v), want the alternative named", out, err)
	}
}

// TestRateLimitCommandEscapes: the tables print keys, alternatives and
// zone names that hold control characters or other characters a
// terminal does not print as Go-quoted strings, and leave printable ones
// as they are.
func TestRateLimitCommandEscapes(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"203.0.113.9", "203.0.113.9"},
		{"a/b c", "a/b c"},
		{"münchen", "münchen"},
		{"\x1b[2J", `"\x1b[2J"`},
		{"x\r\nforged", `"x\r\nforged"`},
		{"tab\there", `"tab\there"`},
		{"\u202eevil", `"\u202eevil"`},
		{"\xff", `"\xff"`},
		{`"quoted"`, `"\"quoted\""`},
	} {
		if got := printable(c.in); got != c.want {
			t.Errorf("printable(%q) = %s, want %s", c.in, got, c.want)
		}
	}
	s := newStandIn(t)
	show := func(answer string, args ...string) string {
		t.Helper()
		s.answer = answer
		out, err := rateLimit(append(args, "--address", s.address)...)
		if err != nil {
			t.Fatal(err)
		}
		if strings.ContainsAny(out, "\x1b\r") {
			t.Errorf("%q printed %q, with an escape or a carriage return", args, out)
		}
		return out
	}
	show(`{"zone":"api","keys":[{"key":"\u001b[2J","from":"{x}\r\n","requests":1,"rejected":0}],"error":0}`, "top", "api")
	show(`{"zone":"a\u001b","key":"\u001b[2J","from":"\r","used":1,"reset":"2030-01-01T00:00:00Z"}`, "key", "api", "k")
	if out := show(`[{"name":"a\u001b]0;x\u0007","algorithm":"gcra","window":"1s","limit":["{l\r}"],"store":"memory"}]`, "zones"); !strings.Contains(out, `"a\x1b]0;x\a"`) {
		t.Errorf("zones printed %q, want the name quoted", out)
	}
}

// TestRateLimitCommandCalendarPeriod: a zone whose window is a calendar
// period shows it with its time zone and when the current period ends,
// in that zone's time: midnight on the 1st in New York.
func TestRateLimitCommandCalendarPeriod(t *testing.T) {
	s := newStandIn(t)
	s.answer = `[{"name":"monthly","algorithm":"fixed_window","window":"month","timezone":"America/New_York","period_ends":"2026-02-01T05:00:00Z","limit":["10000"],"store":"redis"}]`
	out, err := rateLimit("zones", "--address", s.address)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "month in America/New_York, ends 2026-02-01T00:00:00-05:00") {
		t.Errorf("zones printed\n%s\nwant the month in America/New_York, ending at midnight there", out)
	}
}

// TestRateLimitCommandUnits: for a zone that limits what responses cost,
// the zone list says its limit is in units, the top table counts units,
// and a key shows its debt and the units its requests in flight hold
// reserved, 0 included; a key of any other zone shows neither.
func TestRateLimitCommandUnits(t *testing.T) {
	s := newStandIn(t)
	show := func(answer string, args ...string) string {
		t.Helper()
		s.answer = answer
		out, err := rateLimit(append(args, "--address", s.address)...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	if out := show(`[{"name":"tokens","algorithm":"fixed_window","window":"1m0s","limit":["1000"],"store":"memory","units":true}]`, "zones"); !strings.Contains(out, "1000 units") {
		t.Errorf("zones printed\n%s\nwant the limit in units", out)
	}
	out := show(`{"zone":"tokens","units":true,"keys":[{"key":"k","units":4200,"rejected":2}],"error":0}`, "top", "tokens")
	if !strings.Contains(out, "UNITS") || !strings.Contains(out, "4200") || !strings.HasSuffix(out, "\nUnits over about the last minute; the counts are exact.\n") {
		t.Errorf("top printed\n%s\nwant a UNITS column with 4200 and a footer in units", out)
	}
	key := `{"zone":"tokens","key":"k","used":1240,"current":1240,"reset":"2030-01-01T00:00:00Z"%s}`
	if out := show(fmt.Sprintf(key, `,"debt":240,"reserved":300`), "key", "tokens", "k"); !strings.Contains(out, "\ndebt               240\nreserved           300\n") {
		t.Errorf("key printed\n%s\nwant its debt, 240, and 300 reserved", out)
	}
	if out := show(fmt.Sprintf(key, `,"debt":0,"reserved":0`), "key", "tokens", "k"); !strings.Contains(out, "\nreserved           0\n") {
		t.Errorf("key printed\n%s\nwant 0 reserved", out)
	}
	if out := show(fmt.Sprintf(key, ""), "key", "tokens", "k"); strings.Contains(out, "debt") || strings.Contains(out, "reserved") {
		t.Errorf("key without a debt printed\n%s\nwant no debt or reserved line", out)
	}
}

// TestRateLimitCommandMoney: the command sends a limit in dollars as
// written, and shows a zone priced in money in dollars: its dial, its
// top keys, a key's counts and override, the override and dial it set.
func TestRateLimitCommandMoney(t *testing.T) {
	s := newStandIn(t)
	show := func(answer string, args ...string) string {
		t.Helper()
		s.answer = answer
		out, err := rateLimit(append(args, "--address", s.address)...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	for _, c := range []struct {
		args []string
		body string
	}{
		{[]string{"override", "spend", "k", "$75"}, `{"limit":"$75"}`},
		{[]string{"override", "spend", "k", "0.25"}, `{"limit":"0.25"}`},
		{[]string{"dial", "spend", "--limit", "$100"}, `{"limit":"$100"}`},
		{[]string{"dial", "spend", "--limit", "100"}, `{"limit":100}`},
	} {
		show(`{}`, c.args...)
		if s.body != c.body {
			t.Errorf("%q sent %s, want %s", c.args, s.body, c.body)
		}
	}
	if out := show(`{"limit":75000000000000,"dollars":{"limit":"$75.00"}}`, "override", "spend", "k", "$75"); out != "zone \"spend\": key \"k\": override $75.00\n" {
		t.Errorf("override printed %q, want it in dollars", out)
	}
	if out := show(`{"limit":100000000000000,"dollars":{"limit":"$100.00"}}`, "dial", "spend", "--limit", "$100"); out != "zone \"spend\": dial limit $100.00\n" {
		t.Errorf("dial printed %q, want it in dollars", out)
	}
	zones := `[{"name":"spend","algorithm":"fixed_window","window":"720h0m0s","limit":["$50"],"store":"memory","units":true,"unit":"picodollars",` +
		`"dial":{"limit":100000000000000},"dollars":{"dial_limit":"$100.00"}}]`
	if out := show(zones, "zones"); !strings.Contains(out, "$50 ") || strings.Contains(out, "units") || !strings.Contains(out, "limit $100.00") {
		t.Errorf("zones printed\n%s\nwant the limit $50 and the dial's $100.00, and no units", out)
	}
	out := show(`{"zone":"spend","units":true,"unit":"picodollars","keys":[{"key":"k","units":1500000000000,"rejected":2,"dollars":"$1.50"}],"error":3,"dollars":{"error":"$0.000000000003"}}`, "top", "spend")
	if !strings.Contains(out, "DOLLARS") || !strings.Contains(out, "$1.50") || strings.Contains(out, "1500000000000") ||
		!strings.HasSuffix(out, "\nDollars over about the last minute; each count is at most $0.000000000003 over the truth.\n") {
		t.Errorf("top printed\n%s\nwant a DOLLARS column with $1.50 and a footer in dollars", out)
	}
	key := `{"zone":"spend","key":"k","used":12345678000000,"current":12345678000000,"reset":"2030-01-01T00:00:00Z","debt":0,"reserved":500000000000,` +
		`"override":{"limit":75000000000000},"unit":"picodollars","dollars":{"used":"$12.345678","current":"$12.345678","previous":"$0.00","previous_weighted":"$0.00","debt":"$0.00","reserved":"$0.50","override":"$75.00"}}`
	out = show(key, "key", "spend", "k")
	for _, want := range []string{"\nused               $12.345678\n", "\nprevious           $0.00\n", "\noverride           $75.00\n", "\nreserved           $0.50\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("key printed\n%s\nwant %q", out, want)
		}
	}
}

// TestRateLimitCommandRefuses: arguments that make no request are
// refused before one is sent, naming what is wrong.
func TestRateLimitCommandRefuses(t *testing.T) {
	s := newStandIn(t)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"bogus"}, `unknown command "bogus"`},
		{[]string{"zones", "api"}, `unknown command "api"`},
		{[]string{"top"}, "accepts 1 arg(s), received 0"},
		{[]string{"key", "api"}, "accepts 2 arg(s), received 1"},
		{[]string{"reset", "api", "k", "more"}, "accepts 2 arg(s), received 3"},
		{[]string{"override", "api", "k"}, "override takes a zone, a key and a limit, or --remove"},
		{[]string{"override", "api", "k", "lots"}, `limit: want an integer, or dollars such as $75 for a zone priced in money, got "lots"`},
		{[]string{"dial", "api", "--limit", "-5"}, `--limit: want an integer, or dollars such as $75 for a zone priced in money, got "-5"`},
		{[]string{"override", "api", "k", "5", "--ttl", "forever"}, `--ttl: want a positive duration such as 24h, got "forever"`},
		{[]string{"override", "api", "k", "5", "--ttl=0s"}, `--ttl: want a positive duration such as 24h, got "0s"`},
		{[]string{"override", "api", "k", "5", "--remove"}, "override --remove takes a zone and a key, and no limit or --ttl"},
		{[]string{"override", "api", "k", "--remove", "--ttl", "1h"}, "override --remove takes a zone and a key, and no limit or --ttl"},
		{[]string{"dial", "api", "--remove", "--mode", "off"}, "dial --remove takes no --mode, --limit or --ttl"},
		{[]string{"dial", "api", "--ttl", "soon"}, `--ttl: want a positive duration such as 24h, got "soon"`},
	}
	for _, c := range cases {
		_, err := rateLimit(append(c.args, "--address", s.address)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error naming %q", c.args, err, c.want)
		}
	}
	if s.requests != 0 {
		t.Fatalf("%d refused commands reached the endpoint", s.requests)
	}
}

// TestRateLimitCommandErrors: an error the endpoint answers is its own
// message, unescaped; an answer that is not one of its errors is shown
// with its status.
func TestRateLimitCommandErrors(t *testing.T) {
	s := newStandIn(t)
	s.status, s.answer = http.StatusNotFound, `{"error":"zone \"x\": no such zone in the running config"}`
	if _, err := rateLimit("key", "x", "k", "--address", s.address); err == nil || err.Error() != `zone "x": no such zone in the running config` {
		t.Errorf("a 404: %v, want the endpoint's message", err)
	}
	s.status, s.answer = http.StatusBadGateway, "upstream gone"
	if _, err := rateLimit("zones", "--address", s.address); err == nil || !strings.Contains(err.Error(), "HTTP 502: upstream gone") {
		t.Errorf("a 502 that is not JSON: %v, want its status and body", err)
	}
}
