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

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/d61b427a/caddy-rate-limit/internal/names"
)

// badCaddyfiles are rate_limit blocks that must be refused, with a word the
// error must contain to name the directive and a value it must name.
var badCaddyfiles = []struct {
	Name, Block, Directive, Value string
}{
	{"unknown subdirective", `zone z { limit 1; window 1s; rate 5 }`, "unknown subdirective", "rate"},
	{"unknown handler subdirective", `sync_interval 5s; zone z { limit 1; window 1s }`, "unknown subdirective", "sync_interval"},
	{"mholt distributed", `distributed; zone z { limit 1; window 1s }`, "distributed", "store redis { address ... }"},
	{"mholt distributed block", `distributed { read_interval 5s; write_interval 5s; purge_age 10s }; zone z { limit 1; window 1s }`, "distributed", "store redis { address ... }"},
	{"mholt storage", `storage file_system { root /tmp/rl }; zone z { limit 1; window 1s }`, "storage", "store redis { address ... }"},
	{"jitter above 1", `jitter 1.5; zone z { limit 1; window 1s }`, "jitter", "1.5"},
	{"negative jitter", `jitter -0.1; zone z { limit 1; window 1s }`, "jitter", "-0.1"},
	{"jitter not a number", `jitter 20%; zone z { limit 1; window 1s }`, "jitter", "20%"},
	{"repeated jitter", `jitter 0.1; jitter 0.2; zone z { limit 1; window 1s }`, "jitter", "repeated"},
	{"bad sweep_interval", `sweep_interval often; zone z { limit 1; window 1s }`, "sweep_interval", "often"},
	{"tiny sweep_interval", `sweep_interval 1ms; zone z { limit 1; window 1s }`, "sweep_interval", "1ms"},
	{"sweep_interval with redis", `store redis { address redis://127.0.0.1:1 }; sweep_interval 1m; zone z { limit 1; window 1s }`, "sweep_interval", "redis"},
	{"log_key and log_keys", `log_keys off; log_key; zone z { limit 1; window 1s }`, "log_key", "log_keys"},
	{"zone name not ASCII", `zone "zöne" { limit 1; window 1s }`, "name", "0xc3"},
	{"zone name with a tab", "zone \"a\tb\" { limit 1; window 1s }", "name", "0x09"},
	{"zone name too long", `zone ` + strings.Repeat("n", names.MaxLen+1) + ` { limit 1; window 1s }`, "name", "129"},
	{"unknown algorithm", `zone z { limit 1; window 1s; algorithm leaky_bucket }`, "algorithm", "leaky_bucket"},
	{"missing limit", `zone z { window 1s }`, "limit", "missing"},
	{"zero limit", `zone z { limit 0; window 1s }`, "limit", "0"},
	{"negative limit", `zone z { events -5; window 1s }`, "events", "-5"},
	{"limit not a number", `zone z { limit lots; window 1s }`, "limit", "lots"},
	{"missing window", `zone z { limit 1 }`, "window", "missing"},
	{"zero window", `zone z { limit 1; window 0s }`, "window", "0s"},
	{"bad window", `zone z { limit 1; window soon }`, "window", "soon"},
	{"bad cost", `zone z { limit 1; window 1s; cost POST many }`, "cost", "many"},
	{"negative cost", `zone z { limit 1; window 1s; cost POST -1 }`, "cost", "-1"},
	{"unknown method", `zone z { limit 1; window 1s; cost FETCH 2 }`, "unknown HTTP method", "FETCH"},
	{"duplicate zone", `zone z { limit 1; window 1s } zone z { limit 2; window 1s }`, "duplicate zone", "z"},
	{"no zone", `headers ietf`, "zone", "at least one"},
	{"bad headers", `headers loud; zone z { limit 1; window 1s }`, "headers", "loud"},
	{"bad on_store_error", `on_store_error panic; zone z { limit 1; window 1s }`, "on_store_error", "panic"},
	{"on_store_error locally", `on_store_error locally; zone z { limit 1; window 1s }`, "on_store_error", "allow, deny or local"},
	{"bad log_keys", `log_keys maybe; zone z { limit 1; window 1s }`, "log_keys", "maybe"},
	{"repeated log_keys", `log_keys on; log_keys off; zone z { limit 1; window 1s }`, "log_keys", "repeated"},
	{"bad admin_changes", `admin_changes never; zone z { limit 1; window 1s }`, "admin_changes", "never"},
	{"repeated admin_changes", `admin_changes off; admin_changes on; zone z { limit 1; window 1s }`, "admin_changes", "repeated"},
	{"bad prefix", `zone z { limit 1; window 1s; ipv4_prefix 33 }`, "ipv4_prefix", "33"},
	{"bad max_delay", `zone z { limit 1; window 1s; max_delay forever }`, "max_delay", "forever"},
	{"unknown store", `store etcd; zone z { limit 1; window 1s }`, "store", "etcd"},
	{"bad max_keys", `store memory { max_keys -1 }; zone z { limit 1; window 1s }`, "max_keys", "-1"},
	{"unknown match", `zone z { match { nosuch x }; limit 1; window 1s }`, "match", "nosuch"},
	{"repeated key", `zone z { key a; key b; limit 1; window 1s }`, "key", "repeated"},
	{"repeated limit", `zone z { limit 1; limit 2; window 1s }`, "limit", "repeated"},
	{"limit then events", `zone z { limit 1; events 2; window 1s }`, "events", "repeated"},
	{"repeated window", `zone z { limit 1; window 1s; window 2s }`, "window", "repeated"},
	{"burst outside gcra", `zone z { limit 10; window 1s; burst 5 }`, "burst", "sliding_tail"},
	{"burst with fixed_window", `zone z { limit 10; window 1s; burst 5; algorithm fixed_window }`, "burst", "fixed_window"},
	{"burst zero", `zone z { limit 10; window 1s; algorithm gcra; burst 0 }`, "burst", "0"},
	{"burst not a number", `zone z { limit 10; window 1s; algorithm gcra; burst many }`, "burst", "many"},
	{"repeated burst", `zone z { limit 10; window 1s; algorithm gcra; burst 2; burst 3 }`, "burst", "repeated"},
	{"lease outside concurrency", `zone z { limit 10; window 1s; lease 1m }`, "lease", "sliding_tail"},
	{"lease too short", `zone z { limit 10; algorithm concurrency; lease 10ms }`, "lease", "10ms"},
	{"concurrency with a window", `zone z { limit 2; algorithm concurrency; window 1s }`, "window", "concurrency"},
	{"concurrency with a burst", `zone z { limit 2; algorithm concurrency; burst 3 }`, "burst", "concurrency"},
	{"gcra without a window", `zone z { limit 2; algorithm gcra }`, "window", "missing"},
	{"repeated algorithm", `zone z { limit 1; window 1s; algorithm fixed_window; algorithm sliding_tail }`, "algorithm", "repeated"},
	{"repeated cost method", `zone z { limit 1; window 1s; cost POST 2; cost POST 3 }`, "cost", "POST: repeated"},
	{"repeated store", `store memory; store memory; zone z { limit 1; window 1s }`, "store", "repeated"},
	{"repeated headers", `headers ietf; headers both; zone z { limit 1; window 1s }`, "headers", "repeated"},
	{"repeated on_store_error", `on_store_error allow; on_store_error deny; zone z { limit 1; window 1s }`, "on_store_error", "repeated"},
	{"repeated jwt", `jwt { secret a }; jwt { secret b }; zone z { limit 1; window 1s }`, "jwt", "repeated"},
	{"repeated max_keys", `store memory { max_keys 5; max_keys 6 }; zone z { limit 1; window 1s }`, "max_keys", "repeated"},
	{"repeated redis option", `store redis { address redis://127.0.0.1:1; pool_size 1; pool_size 2 }; zone z { limit 1; window 1s }`, "pool_size", "repeated"},
	{"bad lease", `store redis { address redis://127.0.0.1:1; lease maybe }; zone z { limit 1; window 1s }`, "lease", "maybe"},
	{"lease without a value", `store redis { address redis://127.0.0.1:1; lease }; zone z { limit 1; window 1s }`, "lease", "want on or off"},
	{"zone status 3xx", `zone z { limit 1; window 1s; status 302 }`, "status", "302"},
	{"zone status 600", `zone z { limit 1; window 1s; status 600 }`, "status", "600"},
	{"zone status not a number", `zone z { limit 1; window 1s; status busy }`, "status", "busy"},
	{"repeated zone status", `zone z { limit 1; window 1s; status 503; status 429 }`, "status", "repeated"},
	{"buckets 1", `zone z { limit 1; window 1s; algorithm sliding_window; buckets 1 }`, "buckets", "1"},
	{"buckets 61", `zone z { limit 1; window 1s; algorithm sliding_window; buckets 61 }`, "buckets", "61"},
	{"buckets word", `zone z { limit 1; window 1s; algorithm sliding_window; buckets many }`, "buckets", "many"},
	{"buckets outside sliding_window", `zone z { limit 1; window 1s; buckets 10 }`, "buckets", "sliding_tail"},
	{"buckets finer than a millisecond", `zone z { limit 1; window 5ms; algorithm sliding_window; buckets 6 }`, "buckets", "5ms"},
	{"default buckets finer than a millisecond", `zone z { limit 1; window 5ms; algorithm sliding_window }`, "window", "5ms"},
	{"count_status 600", `zone z { limit 1; window 1s; count_status 401 600 }`, "count_status", "600"},
	{"count_status 099", `zone z { limit 1; window 1s; count_status 099 }`, "count_status", "099"},
	{"count_status class 6xx", `zone z { limit 1; window 1s; count_status 6xx }`, "count_status", "6xx"},
	{"count_status word", `zone z { limit 1; window 1s; count_status failed }`, "count_status", "failed"},
	{"count_status none", `zone z { limit 1; window 1s; count_status }`, "count_status", "none"},
	{"count_status concurrency", `zone z { limit 1; algorithm concurrency; count_status 401 }`, "count_status", "concurrency"},
	{"ban too short", `zone z { limit 1; window 1s; ban 500ms }`, "ban", "500ms"},
	{"ban not a duration", `zone z { limit 1; window 1s; ban forever }`, "ban", "forever"},
	{"ban concurrency", `zone z { limit 1; algorithm concurrency; ban 1h }`, "ban", "concurrency"},
	{"repeated ban", `zone z { limit 1; window 1s; ban 1h; ban 2h }`, "ban", "repeated"},
	{"shed no classes", `shed { classes; capacity 4 }`, "classes", "none"},
	{"shed missing classes", `shed { capacity 4 }`, "classes", "missing"},
	{"shed repeated class", `shed { classes critical low critical; capacity 4 }`, "classes", "critical"},
	{"shed missing capacity", `shed { classes critical low }`, "capacity", "missing"},
	{"shed zero capacity", `shed { classes critical low; capacity 0 }`, "capacity", "0"},
	{"shed negative capacity", `shed { classes critical low; capacity -4 }`, "capacity", "-4"},
	{"shed capacity not a number", `shed { classes critical low; capacity lots }`, "capacity", "lots"},
	{"shed good at bad", `shed { classes critical low; capacity 4; good 0.8; bad 0.8 }`, "good", "0.8"},
	{"shed good above default bad", `shed { classes critical low; capacity 4; good 0.9 }`, "good", "0.9"},
	{"shed good 0", `shed { classes critical low; capacity 4; good 0 }`, "good", "0"},
	{"shed bad above 1", `shed { classes critical low; capacity 4; bad 1.5 }`, "bad", "1.5"},
	{"shed bad negative", `shed { classes critical low; capacity 4; bad -0.2 }`, "bad", "-0.2"},
	{"shed good not a number", `shed { classes critical low; capacity 4; good NaN }`, "good", "NaN"},
	{"shed good words", `shed { classes critical low; capacity 4; good most }`, "good", "most"},
	{"shed zero after", `shed { classes critical low; capacity 4; after 0s }`, "after", "0s"},
	{"shed negative full", `shed { classes critical low; capacity 4; full -1m }`, "full", "-1m"},
	{"shed bad after", `shed { classes critical low; capacity 4; after later }`, "after", "later"},
	{"shed status 200", `shed { classes critical low; capacity 4; status 200 }`, "status", "200"},
	{"shed repeated capacity", `shed { classes critical low; capacity 4; capacity 8 }`, "capacity", "repeated"},
	{"shed repeated classes", `shed { classes critical low; classes a b; capacity 4 }`, "classes", "repeated"},
	{"shed repeated priority", `shed { priority a; priority b; classes critical low; capacity 4 }`, "priority", "repeated"},
	{"shed repeated dry_run", `shed { classes critical low; capacity 4; dry_run; dry_run }`, "dry_run", "repeated"},
	{"shed unknown subdirective", `shed { classes critical low; capacity 4; ratio 2 }`, "unknown subdirective", "ratio"},
	{"repeated shed", `shed a { classes c; capacity 4 }; shed b { classes c; capacity 4 }`, "shed", "repeated"},
	{"shedder name not ASCII", `shed café { classes c; capacity 4 }`, "shed", "café"},
}

// expand turns the one-line blocks above into Caddyfile syntax: `;` ends a
// line, and braces open and close blocks.
func expand(block string) string {
	r := strings.NewReplacer("; ", "\n", "{ ", "{\n", " }", "\n}\n")
	return r.Replace(block)
}

func badSite(block string) string {
	return fmt.Sprintf(":9080 {\n\trate_limit {\n%s\n\t}\n\trespond \"ok\"\n}\n", expand(block))
}

// assertNames checks that err names the directive once and the bad
// value, and says what was expected.
func assertNames(t *testing.T, err string, directive, value string) {
	t.Helper()
	if !strings.Contains(err, directive) || !strings.Contains(err, value) {
		t.Fatalf("error does not name %q and %q:\n%s", directive, value, err)
	}
	if n := len(regexp.MustCompile(`(^|[^a-z_.])`+regexp.QuoteMeta(directive)+`:`).FindAllString(err, -1)); n > 1 {
		t.Fatalf("error names %q %d times:\n%s", directive, n, err)
	}
	if !strings.Contains(err, "want") && !strings.Contains(err, "required") && !strings.Contains(err, "module not registered") {
		t.Fatalf("error does not say what was expected:\n%s", err)
	}
}

// TestBadCaddyfileRefusedAtAdapt is what `caddy adapt` runs: the Caddyfile
// adapter.
func TestBadCaddyfileRefusedAtAdapt(t *testing.T) {
	adapter := caddyconfig.GetAdapter("caddyfile")
	for _, c := range badCaddyfiles {
		t.Run(c.Name, func(t *testing.T) {
			_, _, err := adapter.Adapt([]byte(badSite(c.Block)), nil)
			if err == nil {
				t.Fatal("adapted without error")
			}
			assertNames(t, err.Error(), c.Directive, c.Value)
		})
	}
}

// FuzzCaddyfile feeds arbitrary text to the rate_limit parser; it must
// return an error or a handler, never panic. Run it with
// `go test -run XXX -fuzz FuzzCaddyfile -fuzztime 60s .`
func FuzzCaddyfile(f *testing.F) {
	f.Add(`rate_limit { zone z { key {client_ip} limit 5 window 1s } }`)
	f.Add("rate_limit {\nzone z {\nmatch {\npath /a\n}\nkey a {header.X}\nlimit {header.Q} 5\nwindow 1m\nalgorithm fixed_window\ncost POST 2\ncost * 1\nmax_delay 1s\ndry_run\nipv4_prefix 24\nipv6_prefix 64\n}\n}")
	f.Add("rate_limit {\nstore memory {\nmax_keys 10\n}\nheaders both\non_store_error deny\nzone a {\nevents 1\nwindow 1s\n}\n}")
	f.Add("rate_limit {remote.ip} 10r/s")
	f.Add("rate_limit {remote.ip_prefix.24} 5r/m 100 503")
	f.Add("rate_limit {body.x} 1r/d")
	f.Add("rate_limit {\nshed s {\npriority {header.X}\nclasses a b\ncapacity 4\ngood 0.5\nbad 0.9\nafter 1s\nfull 2s\nstatus 503\ndry_run\n}\nzone z {\nlimit 1\nwindow 1s\nstatus 503\n}\n}")
	for _, c := range badCaddyfiles {
		f.Add("rate_limit {\n" + expand(c.Block) + "\n}")
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

// TestStoreBlockParses checks that a store's own block reaches the store
// module: its options are set and its mistakes are its own.
func TestStoreBlockParses(t *testing.T) {
	adapter := caddyconfig.GetAdapter("caddyfile")
	out, _, err := adapter.Adapt([]byte(badSite(`store memory { max_keys 42 }; zone z { limit 1; window 1s }`)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), `"store":{"backend":"memory","max_keys":42}`) {
		t.Fatalf("store options lost: %s", out)
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

// TestOneLineForm: each one-line rate_limit adapts to one zone, named after
// its named matcher or default and its site's address, with the key the shorthand means, the
// rate's limit and window, zone_size as the memory store's max_keys and
// reject_status as the zone's status.
func TestOneLineForm(t *testing.T) {
	for _, c := range []struct {
		line string
		want string // the handler, as adapted JSON
	}{
		{`rate_limit {remote.ip} 10r/s`,
			`{"handler":"rate_limit","zones":[{"key":["{http.vars.client_ip}"],"limit":["10"],"name":"default@:9080","window":1000000000}]}`},
		{"@auth path /login*\n\trate_limit @auth {remote.ip} 5r/m",
			`{"handler":"rate_limit","zones":[{"key":["{http.vars.client_ip}"],"limit":["5"],"name":"auth@:9080","window":60000000000}]}`},
		{`rate_limit {remote.host} 100r/h`,
			`{"handler":"rate_limit","zones":[{"key":["{http.request.remote.host}"],"limit":["100"],"name":"default@:9080","window":3600000000000}]}`},
		{`rate_limit {header.X-Api-Key} 1000r/d 50000 503`,
			`{"handler":"rate_limit","store":{"backend":"memory","max_keys":50000},"zones":[{"key":["{http.request.header.X-Api-Key}"],"limit":["1000"],"name":"default@:9080","status":503,"window":86400000000000}]}`},
		{`rate_limit {remote.ip_prefix.24} 30r/m`,
			`{"handler":"rate_limit","zones":[{"ipv4_prefix":24,"key":["{http.vars.client_ip}"],"limit":["30"],"name":"default@:9080","window":60000000000}]}`},
		{`rate_limit {remote.host_prefix.16} 30r/m 100`,
			`{"handler":"rate_limit","store":{"backend":"memory","max_keys":100},"zones":[{"ipv4_prefix":16,"key":["{http.request.remote.host}"],"limit":["30"],"name":"default@:9080","window":60000000000}]}`},
		{`rate_limit {query.id} 2r/m`,
			`{"handler":"rate_limit","zones":[{"key":["{http.request.uri.query.id}"],"limit":["2"],"name":"default@:9080","window":60000000000}]}`},
		{`rate_limit {remote.ip}:{remote.port} 2r/s`,
			`{"handler":"rate_limit","zones":[{"key":["{http.vars.client_ip}:{http.request.remote.port}"],"limit":["2"],"name":"default@:9080","window":1000000000}]}`},
	} {
		t.Run(c.line, func(t *testing.T) {
			handlers, err := adaptSite(t, "\t"+c.line)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := json.Marshal(handlers)
			if string(got) != "["+c.want+"]" {
				t.Fatalf("adapted to\n%s\nwant\n[%s]", got, c.want)
			}
		})
	}
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
	for _, base := range []string{"default", "auth", "default", "default"} {
		name, err := named.name(base, "")
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, name)
	}
	if fmt.Sprint(got) != "[default auth default~2 default~3]" {
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
		{`rate_limit {body.user} 10r/s`, []string{"{body.user}", "not supported", "{header.X-Api-Key}", "{query.id}", "{cookie.session}"}},
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

	// wanted reads the list of "(want a, b or c)" in an error.
	wanted := func(err error) []string {
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
	unknown := func(block string) error {
		tokens, err := caddyfile.Tokenize([]byte(block), "Caddyfile")
		if err != nil {
			t.Fatal(err)
		}
		return new(Handler).UnmarshalCaddyfile(caddyfile.NewDispenser(tokens))
	}
	for _, dir := range wanted(unknown("rate_limit {\nnot_a_subdirective\n}")) {
		if handlerLines[dir] == "" {
			t.Errorf("handler subdirective %s: not in the doc comment", dir)
		}
	}
	for _, dir := range wanted(unknown("rate_limit {\nzone z {\nnot_a_subdirective\n}\n}")) {
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
	} {
		if values := strings.Join(wanted(c.err), "|"); !strings.Contains(c.line, " "+values) {
			t.Errorf("doc comment line %q: want the values %s", c.line, values)
		}
	}
}
