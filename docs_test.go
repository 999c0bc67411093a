package ratelimit

import (
	"encoding/json"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/d61b427a/caddy-rate-limit/internal/badconfig"
	"github.com/d61b427a/caddy-rate-limit/internal/docs"
)

// The documents' examples are tested here, so that they stay true to the
// parser: every Caddyfile block adapts, and what they quote of an error is
// what Caddy says. (The curl commands of the admin API are run against a
// running Caddy by the integration tests.)

// docFiles are the Markdown files a user reads.
func docFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{"README.md", "xcaddy.md"}, files...)
}

// grammar tells a block that sums up syntax (`zone <name> { ... }`) from
// one that is a working example.
var grammar = regexp.MustCompile(`<[a-z][a-z_ ]*>|\[<`)

// docExample is one Caddyfile example of the documents, as a whole
// Caddyfile that `caddy adapt` takes.
type docExample struct {
	where     string // the file and the block's number in it
	caddyfile string
}

// documentedCaddyfiles extracts every ```caddyfile block of the README,
// xcaddy.md and docs/*.md, so that no example is copied into a test to
// drift from the document. A block is one of:
//   - a grammar summary, which shows placeholders (<name>, [<...>]): it
//     is syntax, not a config, and is left out;
//   - a zone (its first line opens with zone): it is put in a rate_limit
//     block of a site;
//   - a rate_limit directive, block or one-liner: it is put in a site;
//   - anything else is a whole Caddyfile (global options, sites) and
//     stands as it is.
func documentedCaddyfiles(t *testing.T) []docExample {
	t.Helper()
	var out []docExample
	for _, file := range docFiles(t) {
		for i, block := range docs.FencedBlocks(docs.Read(t, file), "caddyfile") {
			if grammar.MatchString(block) {
				continue
			}
			trimmed := strings.TrimSpace(block)
			switch {
			case strings.HasPrefix(trimmed, "zone "):
				block = ":9080 {\n\trate_limit {\n" + block + "\n\t}\n\trespond \"ok\"\n}\n"
			case strings.HasPrefix(trimmed, "rate_limit ") || trimmed == "rate_limit":
				block = ":9080 {\n" + block + "\n\trespond \"ok\"\n}\n"
			}
			out = append(out, docExample{where: file + ", Caddyfile block " + strconv.Itoa(i+1), caddyfile: block})
		}
	}
	if len(out) < 20 {
		t.Fatalf("%d Caddyfile examples in the documents; the test is not reading them", len(out))
	}
	return out
}

// TestDocumentedCaddyfilesAdapt: every Caddyfile example of the README
// and docs/ adapts as `caddy adapt` would adapt it.
func TestDocumentedCaddyfilesAdapt(t *testing.T) {
	for _, e := range documentedCaddyfiles(t) {
		if _, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(e.caddyfile), nil); err != nil {
			t.Errorf("%s does not adapt: %v\n%s", e.where, err, e.caddyfile)
		}
	}
}

// TestAlgorithmsDocShowsEveryAlgorithm: docs/algorithms.md has a zone for
// each algorithm, the default (sliding_tail) among them
// (TestDocumentedCaddyfilesAdapt adapts them).
func TestAlgorithmsDocShowsEveryAlgorithm(t *testing.T) {
	zones := docs.FencedBlocks(docs.Read(t, "docs/algorithms.md"), "caddyfile")
	all := strings.Join(zones, "\n")
	for _, a := range []string{"fixed_window", "sliding_window", "gcra", "concurrency"} {
		if !strings.Contains(all, "algorithm "+a) {
			t.Errorf("docs/algorithms.md shows no zone with algorithm %s", a)
		}
	}
	if len(zones) < 5 {
		t.Errorf("%d zones in docs/algorithms.md, want one per algorithm", len(zones))
	}
}

// TestMigrationDocQuotesTheRefusal: the forward_auth recipe of
// docs/migrating.md is one Caddyfile block (adapted above), and the
// refusal of distributed it quotes is the one `caddy adapt` gives.
func TestMigrationDocQuotesTheRefusal(t *testing.T) {
	if recipes := docs.FencedBlocks(docs.Section(t, "docs/migrating.md", "Behind another handler"), "caddyfile"); len(recipes) != 1 {
		t.Fatalf("%d Caddyfile blocks in Behind another handler, want 1", len(recipes))
	}
	quoted := docs.FencedBlocks(docs.Section(t, "docs/migrating.md", "Migrating from mholt/caddy-ratelimit"), "")
	if len(quoted) == 0 {
		t.Fatal("the migration section quotes no refusal")
	}
	_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(badconfig.Site(`distributed; zone z { events 1; window 1m }`)), nil)
	if err == nil {
		t.Fatal("distributed adapted")
	}
	want := strings.TrimSpace(quoted[0])
	want = want[:strings.LastIndex(want, ", at Caddyfile:")]
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("caddy adapt says\n%v\nthe document quotes\n%s", err, want)
	}
}

// TestRemoteAdminDocIsCaddysJSON: the remote admin endpoint that
// docs/operating.md shows for a read-only operator is Caddy's admin
// config, field for field, and allows GET on /rate_limit/ only.
func TestRemoteAdminDocIsCaddysJSON(t *testing.T) {
	var block string
	for _, b := range docs.FencedBlocks(docs.Section(t, "docs/operating.md", "Who sees keys, who changes limits"), "json") {
		if strings.Contains(b, `"remote"`) {
			block = b
		}
	}
	if block == "" {
		t.Fatal(`docs/operating.md shows no "remote" admin config`)
	}
	var cfg caddy.Config
	dec := json.NewDecoder(strings.NewReader(block))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		t.Fatalf("not Caddy's config: %v\n%s", err, block)
	}
	if cfg.Admin == nil || cfg.Admin.Identity == nil || cfg.Admin.Remote == nil || len(cfg.Admin.Remote.AccessControl) != 1 {
		t.Fatalf("want an identity and a remote endpoint with one access control:\n%s", block)
	}
	perms := cfg.Admin.Remote.AccessControl[0].Permissions
	if len(perms) != 1 || !slices.Equal(perms[0].Paths, []string{"/rate_limit/"}) || !slices.Equal(perms[0].Methods, []string{"GET"}) {
		t.Fatalf("permissions %+v, want GET on /rate_limit/ only", perms)
	}
}

// TestDocumentedBansCountOnlyGuesses: every documented zone that counts
// failures and bans (count_status and ban) matches only requests that can
// carry a guess: those that send a password (a header Authorization
// matcher, as basic_auth needs) or a login form's POSTs (a method matcher
// without GET or HEAD). A zone that also counted the 401 basic_auth
// answers to a request without a password, which every browser sends
// first, would ban people who never guessed.
func TestDocumentedBansCountOnlyGuesses(t *testing.T) {
	configs := map[string]any{}
	add := func(what string, raw []byte) {
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		configs[what] = v
	}
	for _, e := range documentedCaddyfiles(t) {
		// TestDocumentedCaddyfilesAdapt reports a block that does not adapt.
		if out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(e.caddyfile), nil); err == nil {
			add(e.where, out)
		}
	}
	for _, file := range docFiles(t) {
		for i, block := range docs.FencedBlocks(docs.Read(t, file), "json") {
			if strings.Contains(block, `"ban"`) {
				add(file+", JSON block "+strconv.Itoa(i+1), []byte(block))
			}
		}
	}
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(docs.Read(t, "Caddyfile.example")), nil)
	if err != nil {
		t.Fatal(err)
	}
	add("Caddyfile.example", out)

	bans := 0
	var walk func(what string, v any)
	walk = func(what string, v any) {
		switch v := v.(type) {
		case []any:
			for _, e := range v {
				walk(what, e)
			}
		case map[string]any:
			if _, ok := v["ban"]; ok && v["count_status"] != nil {
				bans++
				if !matchesGuessesOnly(v["match"]) {
					t.Errorf("%s: zone %v counts failures and bans, and matches requests that carry no guess (match %v)", what, v["name"], v["match"])
				}
			}
			for _, e := range v {
				walk(what, e)
			}
		}
	}
	for what, c := range configs {
		walk(what, c)
	}
	if bans < 4 {
		t.Fatalf("%d documented zones with count_status and ban; the test is not reading them", bans)
	}
}

// matchesGuessesOnly reports whether every matcher set of a zone's match
// (JSON) requires an Authorization header or a method other than GET and
// HEAD.
func matchesGuessesOnly(match any) bool {
	sets, _ := match.([]any)
	for _, s := range sets {
		set, _ := s.(map[string]any)
		header, _ := set["header"].(map[string]any)
		_, auth := header["Authorization"]
		methods, _ := set["method"].([]any)
		posts := len(methods) > 0 && !slices.ContainsFunc(methods, func(m any) bool { return m == "GET" || m == "HEAD" })
		if !auth && !posts {
			return false
		}
	}
	return len(sets) > 0
}
