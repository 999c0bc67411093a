// Package badconfig holds the rate_limit configurations that Caddy must
// refuse, and the check of the errors that refuse them. The parser's unit
// tests adapt them; the integration tests post them to a running Caddy's
// /load and hand them to the built Caddy's adapt, validate and run: each
// way, the error must name the directive and the bad value.
package badconfig

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/d61b427a/caddy-rate-limit/internal/names"
)

// Caddyfiles are rate_limit blocks, one line each (see Expand), that must
// be refused, with a word the error must contain to name the directive and
// a value it must name.
var Caddyfiles = []struct {
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
	// A name is written into headers and log lines: a line break or
	// another control byte in it could forge one.
	{"zone name with CR LF", "zone \"a\r\nX-Injected: 1\" { limit 1; window 1s }", "name", `zone "a\r\nX-Injected: 1"`},
	{"zone name with LF", "zone \"a\nb\" { limit 1; window 1s }", "name", `zone "a\nb"`},
	{"zone name with CR", "zone \"a\rb\" { limit 1; window 1s }", "name", `zone "a\rb"`},
	{"zone name with NUL", "zone \"a\x00b\" { limit 1; window 1s }", "name", `zone "a\x00b"`},
	{"zone name with ESC", "zone \"a\x1b[31mb\" { limit 1; window 1s }", "name", `zone "a\x1b[31mb"`},
	{"zone name with DEL", "zone \"a\x7fb\" { limit 1; window 1s }", "name", `zone "a\x7fb"`},
	{"shedder name with CR LF", "shed \"a\r\nb\" { classes c; capacity 4 }", "shed", `"a\r\nb"`},
	{"zone named .", `zone . { limit 1; window 1s }`, "name", `"."`},
	{"zone named ..", `zone .. { limit 1; window 1s }`, "name", `".."`},
	{"zone name too long", `zone ` + strings.Repeat("n", names.MaxLen+1) + ` { limit 1; window 1s }`, "name", "129"},
	{"unknown algorithm", `zone z { limit 1; window 1s; algorithm leaky_bucket }`, "algorithm", "leaky_bucket"},
	{"missing limit", `zone z { window 1s }`, "limit", "missing"},
	{"zero limit", `zone z { limit 0; window 1s }`, "limit", "0"},
	{"negative limit", `zone z { events -5; window 1s }`, "events", "-5"},
	{"limit not a number", `zone z { limit lots; window 1s }`, "limit", "lots"},
	{"missing window", `zone z { limit 1 }`, "window", "missing"},
	{"zero window", `zone z { limit 1; window 0s }`, "window", "0s"},
	{"bad window", `zone z { limit 1; window soon }`, "window", "soon"},
	{"unknown calendar period", `zone z { limit 1; window fortnight }`, "window", "fortnight"},
	{"calendar period with gcra", `zone z { limit 1; window month; algorithm gcra }`, "window", "fixed_window or sliding_tail"},
	{"calendar period with sliding_window", `zone z { limit 1; window day; algorithm sliding_window }`, "window", "sliding_window"},
	{"calendar period with concurrency", `zone z { limit 1; window week; algorithm concurrency }`, "window", "concurrency"},
	{"unknown time zone", `zone z { limit 1; window month; timezone Mars/Olympus_Mons }`, "timezone", "Mars/Olympus_Mons"},
	{"machine's time zone", `zone z { limit 1; window month; timezone Local }`, "timezone", "Local"},
	{"timezone without a calendar period", `zone z { limit 1; window 24h; timezone America/New_York }`, "timezone", "America/New_York"},
	{"timezone without a window", `zone z { limit 1; algorithm concurrency; timezone UTC }`, "timezone", "UTC"},
	{"repeated timezone", `zone z { limit 1; window month; timezone UTC; timezone Europe/Paris }`, "timezone", "repeated"},
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
	{"body_memory too small", `body_memory 1MiB; zone z { limit 1; window 1s }`, "body_memory", "1048576"},
	{"body_memory not a size", `body_memory plenty; zone z { limit 1; window 1s }`, "body_memory", "plenty"},
	{"body_timeout too short", `body_timeout 100ms; zone z { limit 1; window 1s }`, "body_timeout", "100ms"},
	{"repeated body_timeout", `body_timeout 5s; body_timeout 6s; zone z { limit 1; window 1s }`, "body_timeout", "repeated"},
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
	{"hold outside concurrency", `zone z { limit 10; window 1s; hold 1m }`, "hold", "sliding_tail"},
	{"hold too short", `zone z { limit 10; algorithm concurrency; hold 10ms }`, "hold", "10ms"},
	{"lease (hold's old name) outside concurrency", `zone z { limit 10; window 1s; lease 1m }`, "lease", "sliding_tail"},
	{"lease (hold's old name) too short", `zone z { limit 10; algorithm concurrency; lease 10ms }`, "lease", "10ms"},
	{"hold and its old name", `zone z { limit 10; algorithm concurrency; hold 1m; lease 2m }`, "lease", "repeated"},
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
	{"body field pattern in key", `zone z { key {header.X}:{body.messages.#.content}; limit 1; window 1s }`, "key", "{body.messages.#.content}"},
	{"body field with an empty key", `zone z { key {body.metadata..user_id}; limit 1; window 1s }`, "key", "{body.metadata..user_id}"},
	{"body field not ASCII in limit", `zone z { limit {body.quotá} 5; window 1s }`, "limit", "{body.quotá}"},
	{"cost_from unknown count", `zone z { limit 100; window 1m; cost_from usage prompt; reserve 10 }`, "cost_from", "prompt"},
	{"cost_from unknown source", `zone z { limit 100; window 1m; cost_from body output; reserve 10 }`, "cost_from", "body"},
	{"cost_from without a value", `zone z { limit 100; window 1m; cost_from usage; reserve 10 }`, "cost_from", "usage input|output|total"},
	{"cost_from bad header", `zone z { limit 100; window 1m; cost_from header X:Cost; reserve 10 }`, "cost_from", "X:Cost"},
	{"cost_from without reserve", `zone z { limit 100; window 1m; cost_from usage output }`, "reserve", "missing"},
	{"cost_from concurrency", `zone z { limit 100; algorithm concurrency; cost_from usage output; reserve 10 }`, "cost_from", "concurrency"},
	{"cost_from and cost", `zone z { limit 100; window 1m; cost_from usage output; reserve 10; cost POST 5 }`, "cost", "reserve"},
	{"repeated cost_from", `zone z { limit 100; window 1m; cost_from usage output; cost_from usage input; reserve 10 }`, "cost_from", "repeated"},
	{"reserve without cost_from", `zone z { limit 100; window 1m; reserve 10 }`, "reserve", "cost_from"},
	{"reserve zero", `zone z { limit 100; window 1m; cost_from usage output; reserve 0 }`, "reserve", "0"},
	{"reserve word", `zone z { limit 100; window 1m; cost_from usage output; reserve lots }`, "reserve", "lots"},
	{"reserve max_tokens without default", `zone z { limit 100; window 1m; cost_from usage output; reserve max_tokens }`, "reserve", "max_tokens"},
	{"reserve max_tokens default zero", `zone z { limit 100; window 1m; cost_from usage output; reserve max_tokens 0 }`, "reserve", "0"},
	{"cost above the limit", `zone z { limit 10; window 1s; cost POST 50 }`, "cost", "50"},
	{"cost above the limit of concurrency", `zone z { limit 2; algorithm concurrency; cost * 3 }`, "cost", "3"},
	{"cost above the burst", `zone z { limit 10; window 1s; algorithm gcra; burst 3; cost GET 4 }`, "cost", "4"},
	{"reserve above the limit", `zone z { limit 100; window 1m; cost_from usage output; reserve 500 }`, "reserve", "500"},
	{"reserve above the burst", `zone z { limit 1000; window 1m; algorithm gcra; burst 100; cost_from header X-Cost; reserve 500 }`, "reserve", "500"},
	{"usage_in_stream without cost_from", `zone z { limit 100; window 1m; usage_in_stream on }`, "usage_in_stream", "cost_from usage"},
	{"usage_in_stream with cost_from header", `zone z { limit 100; window 1m; cost_from header X-Cost; reserve 10; usage_in_stream on }`, "usage_in_stream", "cost_from header"},
	{"bad usage_in_stream", `zone z { limit 100; window 1m; cost_from usage output; reserve 10; usage_in_stream yes }`, "usage_in_stream", "yes"},
	{"money limit without a price", `zone z { limit $50; window 1m; cost_from usage total; reserve max_tokens 100 }`, "limit", "$50"},
	{"price without a money limit", `zone z { limit 50; window 1m; cost_from usage price { * input 1 output 1 }; reserve max_tokens 100 }`, "limit", "50"},
	{"money limit with 13 decimals", `zone z { limit $5.0000000000001; window 1m; cost_from usage price { * input 1 output 1 }; reserve max_tokens 100 }`, "limit", "$5.0000000000001"},
	{"money limit past 2^63-1", `zone z { limit $9999999; window 1m; cost_from usage price { * input 1 output 1 }; reserve max_tokens 100 }`, "limit", "$9999999"},
	{"money limit zero", `zone z { limit $0; window 1m; cost_from usage price { * input 1 output 1 }; reserve max_tokens 100 }`, "limit", "$0"},
	{"price with gcra", `zone z { limit $50; window 1m; algorithm gcra; cost_from usage price { * input 1 output 1 }; reserve max_tokens 100 }`, "algorithm", "gcra"},
	{"price with sliding_window", `zone z { limit $50; window 1m; algorithm sliding_window; cost_from usage price { * input 1 output 1 }; reserve max_tokens 100 }`, "algorithm", "sliding_window"},
	{"price without lines", `zone z { limit $50; window 1m; cost_from usage price; reserve max_tokens 100 }`, "price", "none"},
	{"price without output", `zone z { limit $50; window 1m; cost_from usage price { gpt-4o input 2.50 }; reserve max_tokens 100 }`, "output", "gpt-4o"},
	{"price not a number", `zone z { limit $50; window 1m; cost_from usage price { gpt-4o input 2.5.0 output 10 }; reserve max_tokens 100 }`, "input", "2.5.0"},
	{"price with seven decimals", `zone z { limit $50; window 1m; cost_from usage price { gpt-4o input 0.0000001 output 10 }; reserve max_tokens 100 }`, "input", "0.0000001"},
	{"price of an unknown kind", `zone z { limit $50; window 1m; cost_from usage price { gpt-4o input 1 output 1 cached 1 }; reserve max_tokens 100 }`, "price", "cached"},
	{"price without its value", `zone z { limit $50; window 1m; cost_from usage price { gpt-4o input 1 output }; reserve max_tokens 100 }`, "price", "input 1 output"},
	{"price repeated", `zone z { limit $50; window 1m; cost_from usage price { gpt-4o input 1 output 1 input 2 }; reserve max_tokens 100 }`, "input", "repeated"},
	{"cache_read above input", `zone z { limit $50; window 1m; cost_from usage price { gpt-4o input 1 output 1 cache_read 2 }; reserve max_tokens 100 }`, "cache_read", "2"},
	{"cache_write_1h below cache_write", `zone z { limit $50; window 1m; cost_from usage price { claude* input 3 output 15 cache_write 3.75 cache_write_1h 3 }; reserve max_tokens 100 }`, "cache_write_1h", "3"},
	{"price line after *", `zone z { limit $50; window 1m; cost_from usage price { * input 1 output 1; gpt-4o input 2 output 2 }; reserve max_tokens 100 }`, "gpt-4o", "never used"},
	{"price line twice", `zone z { limit $50; window 1m; cost_from usage price { gpt-4o input 1 output 1; GPT-4o input 2 output 2 }; reserve max_tokens 100 }`, "GPT-4o", "never used"},
	{"price with a fixed reservation", `zone z { limit $50; window 1m; cost_from usage price { * input 1 output 1 }; reserve 1000 }`, "reserve", "max_tokens"},
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

// Expand turns the one-line blocks above into Caddyfile syntax: `;` ends a
// line, and braces open and close blocks.
func Expand(block string) string {
	r := strings.NewReplacer("; ", "\n", "{ ", "{\n", " }", "\n}\n")
	return r.Replace(block)
}

// Site is a site on :9080 whose rate_limit block is block (one line, as
// Expand takes it) and that answers "ok".
func Site(block string) string {
	return fmt.Sprintf(":9080 {\n\trate_limit {\n%s\n\t}\n\trespond \"ok\"\n}\n", Expand(block))
}

// AssertNames checks that err names the directive once and the bad
// value, and says what was expected.
func AssertNames(t testing.TB, err string, directive, value string) {
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
