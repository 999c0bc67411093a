package ratelimit

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	// The Caddyfiles these tests adapt (the documents' examples,
	// Caddyfile.example) use Caddy's standard directives beside
	// rate_limit, as a real build has them.
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	"github.com/d61b427a/caddy-rate-limit/internal/badconfig"
)

// TestBadCaddyfileRefusedAtAdapt is what `caddy adapt` runs: the Caddyfile
// adapter.
func TestBadCaddyfileRefusedAtAdapt(t *testing.T) {
	adapter := caddyconfig.GetAdapter("caddyfile")
	for _, c := range badconfig.Caddyfiles {
		t.Run(c.Name, func(t *testing.T) {
			_, _, err := adapter.Adapt([]byte(badconfig.Site(c.Block)), nil)
			if err == nil {
				t.Fatal("adapted without error")
			}
			badconfig.AssertNames(t, err.Error(), c.Directive, c.Value)
		})
	}
}

// caddyfileForms are rate_limit directives in every form the parser
// takes, each valid: they seed FuzzCaddyfile, which then starts from
// every subdirective and option, not only from refusals.
var caddyfileForms = []string{
	`rate_limit {
	zone z {
		key {client_ip}
		limit 5
		window 1s
	}
}`,
	`rate_limit {
	zone z {
		match {
			path /a
		}
		key a {header.X} {cookie.session}
		limit {header.Q} 5
		window 1m
		algorithm fixed_window
		cost POST 2
		cost * 1
		max_delay 1s
		max_waiting 10
		dry_run
		status 503
		ipv4_prefix 24
		ipv6_prefix 64
	}
}`,
	// mholt/caddy-ratelimit's zones.
	`rate_limit {
	zone z {
		match {
			method POST
		}
		key {remote_host}
		window 1m
		events 10
	}
	log_key
	jitter 0.2
	sweep_interval 1m
	disable_metrics
}`,
	`rate_limit {
	zone g {
		limit 10
		window 1s
		algorithm gcra
		burst 3
	}
	zone s {
		limit 10
		window 1m
		algorithm sliding_window
		buckets 12
	}
	zone t {
		limit 10
		window 1m
		algorithm sliding_tail
	}
	zone c {
		limit 4
		algorithm concurrency
		hold 30s
	}
	zone l {
		limit 4
		algorithm concurrency
		lease 30s
	}
}`,
	`rate_limit {
	zone login {
		match {
			path /login*
		}
		key {client_ip}
		limit 5
		window 15m
		count_status 401 403 4xx
		ban 1h
	}
}`,
	`rate_limit {
	body_memory 64MiB
	body_timeout 30s
	zone tokens {
		key {jwt.sub} {header.Authorization}
		limit 200000
		window 1h
		cost_from usage total
		reserve max_tokens 4096
		usage_in_stream on
	}
	zone output {
		limit 1000
		window 1m
		cost_from usage output
		reserve 100
		usage_in_stream off
	}
	zone input {
		limit 1000
		window 1m
		algorithm gcra
		burst 500
		cost_from usage input
		reserve max_tokens 100
	}
	zone counted {
		limit 1000
		window 1m
		cost_from header X-Token-Count
		reserve 10
		count_status 2xx
	}
}`,
	`rate_limit {
	store memory {
		max_keys 10
	}
	headers both
	on_store_error deny
	log_keys on
	admin_changes off
	zone a {
		limit 1
		window 1s
	}
}`,
	`rate_limit {
	store redis {
		address rediss://user:pass@127.0.0.1:6380/0
		timeout 50ms
		key_prefix rl:
		pool_size 4
		lease on
	}
	on_store_error local
	headers ietf
	zone a {
		limit 10
		window 1m
	}
}`,
	`rate_limit {
	store redis {
		addresses redis://127.0.0.1:7000 redis://127.0.0.1:7001
		cluster
		lease off
	}
	zone a {
		limit 10
		window 1m
	}
}`,
	`rate_limit {
	store redis {
		address redis://127.0.0.1:26379
		sentinel mymaster
	}
	headers off
	on_store_error allow
	zone a {
		limit 10
		window 1m
	}
}`,
	`rate_limit {
	jwt {
		from header Authorization
		secret {env.JWT_SECRET}
		public_key /etc/keys/issuer.pem
		algorithms RS256 ES256 HS256
		issuer https://id.example.com
		audience api other
		leeway 30s
	}
	zone users {
		key user:{jwt.sub} ip:{client_ip}
		limit {jwt.quota} 600
		window 1m
	}
}`,
	`rate_limit {
	jwt {
		from cookie session
		secret s
	}
	zone a {
		key {jwt.org.id}
		limit 10
		window 1m
	}
}`,
	`rate_limit {
	jwt {
		from query access_token
		secret s
	}
	shed backend {
		priority {header.X-Priority}
		classes critical normal low
		capacity 64
		good 0.5
		bad 0.9
		after 1s
		full 4s
		status 503
		dry_run
	}
	zone a {
		limit 10
		window 1m
	}
}`,
	`rate_limit {
	shed {
		classes critical low
		capacity 4
	}
}`,
	"rate_limit {remote.ip} 10r/s",
	"rate_limit {remote.ip_prefix.24} 5r/m 100 503",
	"rate_limit {remote.host_prefix.16} 1r/h",
	"rate_limit {header.X-Api-Key} 100r/d 1000",
}

// TestCaddyfileForms: each of caddyfileForms parses and validates, so
// that the fuzz target's seeds reach past the parser's refusals.
func TestCaddyfileForms(t *testing.T) {
	for _, form := range caddyfileForms {
		var h Handler
		if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(form)); err != nil {
			t.Errorf("%s\n%v", form, err)
			continue
		}
		if err := h.Validate(); err != nil {
			t.Errorf("%s\nvalidate: %v", form, err)
		}
	}
}

// FuzzCaddyfile feeds arbitrary text to the rate_limit parser; it must
// return an error or a handler, never panic. Its seeds are every form
// the parser takes (caddyfileForms), each Caddyfile Caddy must refuse
// (badconfig) and a refused one-liner. .ci/run runs it for a short
// while; run it longer with
// `go test -run '^$' -fuzz '^FuzzCaddyfile$' -fuzztime 60s .`
func FuzzCaddyfile(f *testing.F) {
	for _, form := range caddyfileForms {
		f.Add(form)
	}
	f.Add("rate_limit {body.x} 1r/d")
	for _, c := range badconfig.Caddyfiles {
		f.Add("rate_limit {\n" + badconfig.Expand(c.Block) + "\n}")
	}
	f.Fuzz(func(t *testing.T, input string) {
		tokens, err := caddyfile.Tokenize([]byte(input), "fuzz")
		if err != nil {
			return
		}
		var h Handler
		if err := h.UnmarshalCaddyfile(caddyfile.NewDispenser(tokens)); err != nil {
			return
		}
		// Whatever parses must also survive validation without panicking.
		_ = h.Validate()
	})
}

// TestCaddyfileExampleIsValid adapts and provisions Caddyfile.example the
// way `caddy run` does, so the README's `./caddy run --config Caddyfile.example`
// keeps working.
func TestCaddyfileExampleIsValid(t *testing.T) {
	src, err := os.ReadFile("Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	adapted, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt(src, map[string]any{"filename": "Caddyfile.example"})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range warnings {
		t.Errorf("warning: %s", w)
	}
	for _, zone := range []string{`"per_ip"`, `"per_api_key"`, `"per_customer"`, `"POST":5`, `"jwt"`} {
		if !strings.Contains(string(adapted), zone) {
			t.Errorf("example lost %s", zone)
		}
	}
	var cfg caddy.Config
	if err := json.Unmarshal(adapted, &cfg); err != nil {
		t.Fatal(err)
	}
	if err := caddy.Validate(&cfg); err != nil {
		t.Fatal(err)
	}
}

// adaptSite adapts a site block (on :9080, answering "ok") holding
// directives, and returns the rate_limit handlers of the adapted config, in
// the order Caddy runs them.
func adaptSite(t *testing.T, directives string) ([]map[string]any, error) {
	t.Helper()
	return adaptHandlers(t, ":9080 {\n"+directives+"\n\trespond \"ok\"\n}\n")
}

// adaptHandlers adapts a Caddyfile and returns the rate_limit handlers of
// the adapted config, site by site, in the order Caddy runs them.
func adaptHandlers(t *testing.T, src string) ([]map[string]any, error) {
	t.Helper()
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), nil)
	if err != nil {
		return nil, err
	}
	var cfg any
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	var handlers []map[string]any
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if v["handler"] == "rate_limit" {
				handlers = append(handlers, v)
			}
			for _, k := range slices.Sorted(maps.Keys(v)) {
				walk(v[k])
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	walk(cfg)
	return handlers, nil
}

// adaptedZones adapts a Caddyfile and returns the names of the zones of its
// rate_limit handlers, sorted.
func adaptedZones(t *testing.T, src string) ([]string, error) {
	t.Helper()
	handlers, err := adaptHandlers(t, src)
	if err != nil {
		return nil, err
	}
	var zones []string
	for _, h := range handlers {
		for _, z := range h["zones"].([]any) {
			zones = append(zones, z.(map[string]any)["name"].(string))
		}
	}
	slices.Sort(zones)
	return zones, nil
}

// TestOneLinersSideBySide: a site may hold several one-line rate_limits,
// each its own handler and zone, identical ones too (numbered in the order
// they are written); and the block form still takes a matcher on its line.
func TestOneLinersSideBySide(t *testing.T) {
	handlers, err := adaptSite(t, `	@login path /login
	@api path /api/*
	rate_limit @login {remote.ip} 5r/m
	rate_limit @api {header.X-Api-Key} 100r/m
	rate_limit {remote.ip} 10r/s
	route /again {
		rate_limit {remote.ip} 10r/s
	}
	handle /other {
		rate_limit /x/* {remote.ip} 1r/m
	}
	rate_limit @api {
		zone block_form {
			limit 1
			window 1h
		}
	}`)
	if err != nil {
		t.Fatal(err)
	}
	var zones []string
	for _, h := range handlers {
		for _, z := range h["zones"].([]any) {
			zones = append(zones, z.(map[string]any)["name"].(string))
		}
	}
	slices.Sort(zones)
	if got, want := fmt.Sprint(zones), "[api@:9080 block_form default@:9080 default@:9080~2 default@:9080~3 login@:9080]"; got != want {
		t.Fatalf("zones %v, want %v", got, want)
	}
}

// TestOneLinerNames: each one-liner's zone is named after its named
// matcher (or default) and its site's first address, so that one-liners
// in different sites never share a counter, identical or not; a name
// depends on its line and its site only.
func TestOneLinerNames(t *testing.T) {
	const a = `example.com, www.example.com {
	@auth path /login
	rate_limit @auth {remote.ip} 5r/m
	rate_limit {remote.ip} 10r/s
	respond "a"
}
`
	const b = `:8080 {
	@auth path /login
	rate_limit @auth {remote.ip} 5r/m
	rate_limit {remote.ip} 10r/s
	respond "b"
}
`
	for _, c := range []struct{ name, src, want string }{
		{"one site", a, "[auth@example.com default@example.com]"},
		{"two sites with identical lines", a + b, "[auth@:8080 auth@example.com default@:8080 default@example.com]"},
		{"the other site first", b + a, "[auth@:8080 auth@example.com default@:8080 default@example.com]"},
		{"two sites with other rates", a + strings.ReplaceAll(b, "10r/s", "99r/m"), "[auth@:8080 auth@example.com default@:8080 default@example.com]"},
		{"a site before it with one-liners of its own", ":9090 {\n\trate_limit {remote.ip} 1r/s\n\trate_limit {remote.ip} 2r/s\n}\n" + a,
			"[auth@example.com default@:9090 default@:9090~2 default@example.com]"},
		{"the other site's lines changed and numbered", a + strings.ReplaceAll(b, "rate_limit @auth", "rate_limit"),
			"[auth@example.com default@:8080 default@:8080~2 default@example.com]"},
		{"a block zone of the same base name", a + ":9090 {\n\trate_limit {\n\t\tzone default {\n\t\t\tlimit 1\n\t\t\twindow 1s\n\t\t}\n\t}\n}\n",
			"[auth@example.com default default@example.com]"},
		{"a named route and a site of its name", "&(lim) {\n\trate_limit {remote.ip} 10r/s\n}\n:8080 {\n\tinvoke lim\n}\nlim {\n\trate_limit {remote.ip} 10r/s\n}\n",
			"[default@&(lim) default@lim]"},
		{"an address that is not ASCII", "münchen.de {\n\trate_limit {remote.ip} 10r/s\n}\n", "[default@m%C3%BCnchen.de]"},
		// A zone may not be named . or .., but a one-liner's zone has its
		// site's address too.
		{"matchers named . and ..", ":8080 {\n\t@. path /a\n\trate_limit @. {remote.ip} 10r/s\n\t@.. path /b\n\trate_limit @.. {remote.ip} 10r/s\n}\n", "[..@:8080 .@:8080]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			zones, err := adaptedZones(t, c.src)
			if err != nil {
				t.Fatal(err)
			}
			if got := fmt.Sprint(zones); got != c.want {
				t.Fatalf("zones %s, want %s", got, c.want)
			}
		})
	}
}

// TestOneLinerNameOfABlockZoneRefused: a block-form zone named as a
// one-liner's zone would share its counter, whichever comes first.
func TestOneLinerNameOfABlockZoneRefused(t *testing.T) {
	const oneLiner = ":8080 {\n\trate_limit {remote.ip} 10r/s\n}\n"
	const block = ":9090 {\n\trate_limit {\n\t\tzone default@:8080 {\n\t\t\tlimit 1\n\t\t\twindow 1s\n\t\t}\n\t}\n}\n"
	for name, src := range map[string]string{"one-liner first": oneLiner + block, "block first": block + oneLiner} {
		t.Run(name, func(t *testing.T) {
			_, err := adaptedZones(t, src)
			if err == nil || !strings.Contains(err.Error(), `zone "default@:8080"`) || !strings.Contains(err.Error(), "share one counter") {
				t.Fatalf("adapted with %v; want a refusal naming the zone", err)
			}
		})
	}
}

// TestOneLineNameWithoutSite: where the adapter does not show the site,
// one-liners are still named apart, across the whole Caddyfile.
func TestOneLineNameWithoutSite(t *testing.T) {
	named := oneLineNamesOf(make(map[string]any))
	var got []string
	for _, base := range []string{"default", "auth", "default", "default", ".", "..", "."} {
		name, err := named.name(base, "")
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, name)
	}
	if fmt.Sprint(got) != "[default auth default~2 default~3 .~2 ..~2 .~3]" {
		t.Fatalf("names %v", got)
	}
}

// TestOneLineRefused: a one-liner that cannot work is refused naming the
// token, with the forms that would.
func TestOneLineRefused(t *testing.T) {
	for _, c := range []struct {
		directives string
		want       []string
	}{
		{`rate_limit {remote.ip} 10/s`, []string{`rate: want <n>r/s, <n>r/m, <n>r/h or <n>r/d, such as 10r/s, got "10/s"`}},
		{`rate_limit {remote.ip} 0r/s`, []string{`rate: want a positive number of requests, from 1 to 2147483647`, `"0r/s"`}},
		{`rate_limit {remote.ip} -5r/s`, []string{`rate: want a positive number of requests`, `"-5r/s"`}},
		{`rate_limit {remote.ip} 10r/w`, []string{`"10r/w"`, "<n>r/d"}},
		{`rate_limit {remote.ip} 3000000000r/s`, []string{`"3000000000r/s"`}},
		{`rate_limit {body.items.#.id} 10r/s`, []string{"{body.items.#.id}", `"#"`, "{body.metadata.user_id}"}},
		{`rate_limit {remote.mac} 10r/s`, []string{"{remote.mac}", "{remote.ip}"}},
		{`rate_limit {remote.ip_prefix.40} 10r/s`, []string{"{remote.ip_prefix.40}", "1 to 32 bits"}},
		{`rate_limit {remote.ip} 10r/s lots`, []string{"zone_size", `"lots"`}},
		{`rate_limit {remote.ip} 10r/s 100 302`, []string{"reject_status", "302"}},
		{`rate_limit {remote.ip} 10r/s 100 429 extra`, []string{"5 arguments", "rate_limit [<matcher>] <key> <rate>"}},
		{`rate_limit {remote.ip}`, []string{`got 1 argument ["{remote.ip}"]`, "rate_limit [<matcher>] <key> <rate>"}},
		{`rate_limit`, []string{"one-line form rate_limit [<matcher>] <key> <rate>", "rate_limit {remote.ip} 10r/s", "zone", "shed"}},
		{"rate_limit {\n\t}", []string{"one-line form rate_limit [<matcher>] <key> <rate>", "zone", "shed"}},
		{"rate_limit {remote.ip} 10r/s {\n\t\tzone z {\n\t\t\tlimit 1\n\t\t\twindow 1s\n\t\t}\n\t}", []string{"takes no block"}},
	} {
		t.Run(c.directives, func(t *testing.T) {
			_, err := adaptSite(t, "\t"+c.directives)
			if err == nil {
				t.Fatal("adapted")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error does not say %q:\n%v", w, err)
				}
			}
		})
	}
}

// TestOneLineFormatUnchanged: `caddy fmt` leaves a one-liner as it is.
func TestOneLineFormatUnchanged(t *testing.T) {
	src := ":9080 {\n\t@auth path /login*\n\trate_limit @auth {remote.ip} 5r/m\n\trate_limit {remote.ip} 10r/s 10000 503\n\trespond \"ok\"\n}\n"
	if got := string(caddyfile.Format([]byte(src))); got != src {
		t.Fatalf("caddy fmt made\n%s\nof\n%s", got, src)
	}
}

// TestConcurrencyHoldAndItsOldName: a concurrency zone's hold, written
// hold or by its old name lease (testdata/caddyfile_adapt has both in a
// Caddyfile), is how long the zone's rate keeps units (the Window its
// store is handed), and the admin API shows it as the hold.
func TestConcurrencyHoldAndItsOldName(t *testing.T) {
	for _, name := range []string{"hold", "lease"} {
		t.Run(name, func(t *testing.T) {
			h := provisionHandler(t, `{"zones":[{"name":"c","limit":[2],"algorithm":"concurrency","`+name+`":90000000000}]}`)
			z := h.Zones[0]
			if z.period != 90*time.Second {
				t.Fatalf("the zone's rate keeps units for %s, want 1m30s", z.period)
			}
			if info := z.Info(); info.Hold != "1m30s" {
				t.Fatalf("admin API's zone %+v, want hold 1m30s", info)
			}
		})
	}
	h := provisionHandler(t, `{"zones":[{"name":"c","limit":[2],"algorithm":"concurrency"}]}`)
	if h.Zones[0].period != DefaultHold {
		t.Fatalf("without a hold the zone's rate keeps units for %s, want the default %s", h.Zones[0].period, DefaultHold)
	}
}

// TestUnmarshalCaddyfileDocShowsTheSyntax: the grammar in the doc comment
// of Handler.UnmarshalCaddyfile shows every subdirective the parser
// accepts, handler and zone alike (as its refusal of an unknown one
// lists them), each on a line of its own at its level, and every value
// of those that take one of a list.
func TestUnmarshalCaddyfileDocShowsTheSyntax(t *testing.T) {
	file, err := parser.ParseFile(token.NewFileSet(), "caddyfile.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var doc string
	for _, decl := range file.Decls {
		if fn, ok := decl.(*ast.FuncDecl); ok && fn.Name.Name == "UnmarshalCaddyfile" && fn.Recv != nil {
			doc = fn.Doc.Text()
		}
	}
	// lines maps the first word of each grammar line at a depth of tabs
	// (2: the handler's block, 3: a zone's) to the line.
	lines := func(depth int) map[string]string {
		out := make(map[string]string)
		indent := strings.Repeat("\t", depth)
		for _, l := range strings.Split(doc, "\n") {
			if rest, ok := strings.CutPrefix(l, indent); ok && rest != "" && rest[0] != '\t' {
				out[strings.Fields(rest)[0]] = rest
			}
		}
		return out
	}
	handlerLines, zoneLines := lines(2), lines(3)

	handlerSubs, zoneSubs := subdirectives(t)
	for _, dir := range handlerSubs {
		if handlerLines[dir] == "" {
			t.Errorf("handler subdirective %s: not in the doc comment", dir)
		}
	}
	for _, dir := range zoneSubs {
		if zoneLines[dir] == "" {
			t.Errorf("zone subdirective %s: not in the doc comment", dir)
		}
	}
	for _, c := range []struct {
		line string
		err  error
	}{
		{handlerLines["headers"], checkHeaders("?")},
		{handlerLines["on_store_error"], checkOnStoreError("?")},
		{handlerLines["log_keys"], checkOnOff("?")},
		{handlerLines["admin_changes"], checkOnOff("?")},
		{zoneLines["algorithm"], checkAlgorithm("?")},
		{zoneLines["cost_from"], checkUsage("?")},
		{zoneLines["usage_in_stream"], checkOnOff("?")},
	} {
		if values := strings.Join(wanted(t, c.err), "|"); !strings.Contains(c.line, " "+values) {
			t.Errorf("doc comment line %q: want the values %s", c.line, values)
		}
	}
}

// wanted reads the list of "(want a, b or c)" in an error.
func wanted(t *testing.T, err error) []string {
	t.Helper()
	if err == nil {
		t.Fatal("accepted")
	}
	m := regexp.MustCompile(`want ([a-z0-9_-]+(?:, [a-z0-9_-]+)* or [a-z0-9_-]+)`).FindStringSubmatch(err.Error())
	if m == nil {
		t.Fatalf("no list of what is wanted in %q", err)
	}
	return strings.Split(strings.Replace(m[1], " or ", ", ", 1), ", ")
}

// subdirectives returns the handler's and a zone's subdirectives, as the
// parser lists them when it refuses an unknown one.
func subdirectives(t *testing.T) (handler, zone []string) {
	t.Helper()
	unknown := func(block string) error {
		tokens, err := caddyfile.Tokenize([]byte(block), "Caddyfile")
		if err != nil {
			t.Fatal(err)
		}
		return new(Handler).UnmarshalCaddyfile(caddyfile.NewDispenser(tokens))
	}
	return wanted(t, unknown("rate_limit {\nnot_a_subdirective\n}")),
		wanted(t, unknown("rate_limit {\nzone z {\nnot_a_subdirective\n}\n}"))
}
