package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/internal/wait"
)

// rateLimitCLI runs the built Caddy's rate-limit command with args and
// returns what it printed on stdout and stderr, and how it exited.
func rateLimitCLI(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := caddyCommand(ctx, t, append([]string{"rate-limit"}, args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	t.Logf("$ caddy rate-limit %s\n%s%s", strings.Join(args, " "), stdout.String(), stderr.String())
	return stdout.String(), stderr.String(), err
}

// tableRow returns the fields of the row of table (tabwriter output)
// whose first field is first, or nil.
func tableRow(table, first string) []string {
	for _, line := range strings.Split(table, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == first {
			return f
		}
	}
	return nil
}

// topRows returns the fields of each row of top's table, below its
// header and above the line of its error bound.
func topRows(out string) [][]string {
	table, _, _ := strings.Cut(out, "\n\n")
	var rows [][]string
	for _, line := range strings.Split(table, "\n")[1:] {
		rows = append(rows, strings.Fields(line))
	}
	return rows
}

// loggedError returns the message of the error Caddy logged as JSON to
// stderr (not a terminal), or "".
func loggedError(stderr string) string {
	for _, e := range logEntries(linesWith(stderr, `"level":"error"`)) {
		if msg, ok := e["msg"].(string); ok {
			return msg
		}
	}
	return ""
}

// TestRateLimitCommandThroughCaddy runs caddy rate-limit, as an operator
// would, against a running Caddy whose zone a client hammers: the zones
// table lists the zone, top names the hammering client first (by its
// key's hash, the same in every answer and in the log of the admin
// changes, and never the key; by the key itself in a zone with log_keys
// on), key shows its counts, an override and a dial show where they are
// set and are gone when removed, and reset clears the counts. An unknown
// zone exits 1 with the endpoint's message, and so does an admin address
// nothing listens on; --config finds the address in a Caddyfile.
func TestRateLimitCommandThroughCaddy(t *testing.T) {
	// cli_shown sees the requests cli lets through.
	in := startInstance(t, `	rate_limit {
		zone cli {
			key {header.X-Client}
			limit 5
			window 1h
		}
	}
	rate_limit {
		log_keys on
		zone cli_shown {
			key {header.X-Client}
			limit 100
			window 1h
		}
	}
	respond "ok"
`, "/")
	cli := commandAt(t, in)
	address := strings.TrimPrefix(in.admin, "http://")

	// The hammering client's key has a slash and a percent sign, which
	// only reach the endpoint as one path segment if escaped.
	const bot = "bot/7%"
	for i := range 3 {
		burst([]string{in.url}, 1, fmt.Sprint("X-Client: client-", i))
	}
	if codes := burst([]string{in.url}, 12, "X-Client: "+bot); codes[200] != 5 || codes[429] != 7 {
		t.Fatalf("12 requests from one client: %v, want 5 allowed and 7 rejected", codes)
	}

	zones := cli("zones")
	if got, want := strings.Fields(strings.SplitN(zones, "\n", 2)[0]), []string{"NAME", "ALGORITHM", "LIMIT", "WINDOW", "STORE", "DIAL", "INSTANCES"}; !slices.Equal(got, want) {
		t.Fatalf("zones header %q, want %q", got, want)
	}
	if got, want := tableRow(zones, "cli"), []string{"cli", "sliding_tail", "5", "1h0m0s", "memory", "-", "-"}; !slices.Equal(got, want) {
		t.Fatalf("zones row %q, want %q", got, want)
	}

	const from = "{http.request.header.X-Client}"
	top := cli("top", "cli")
	rows := topRows(top)
	if len(rows) < 4 || !hashForm.MatchString(rows[0][0]) || !slices.Equal(rows[0][1:], []string{"12", "7", from}) {
		t.Fatalf("top:\n%s\nwant the 4 clients, %s's hash first with 12 requests, 7 rejected, from %s", top, bot, from)
	}
	hash := rows[0][0]
	if strings.Contains(top, bot) {
		t.Fatalf("top:\n%s\nshows the key %s", top, bot)
	}
	if !strings.Contains(top, "the counts are exact") {
		t.Fatalf("top:\n%s\nwant the counts said to be exact", top)
	}
	if rows := topRows(cli("top", "cli", "--n", "2")); len(rows) != 2 {
		t.Fatalf("top --n 2 showed %d keys", len(rows))
	}
	var answer struct {
		Zone string
		Keys []struct {
			Key                string
			Requests, Rejected int64
		}
	}
	if err := json.Unmarshal([]byte(cli("top", "cli", "--json")), &answer); err != nil || answer.Zone != "cli" || len(answer.Keys) < 4 || answer.Keys[0].Key != hash {
		t.Fatalf("top --json: %+v, %v; want zone cli, the 4 clients, %s first", answer, err, hash)
	}
	if rows := topRows(cli("top", "cli_shown")); len(rows) < 4 || !slices.Equal(rows[0], []string{bot, "5", "0", from}) {
		t.Fatalf("top of cli_shown (log_keys on):\n%s\nwant %s first with 5 requests", cli("top", "cli_shown"), bot)
	}

	key := func() map[string]string {
		fields := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(cli("key", "cli", bot)), "\n") {
			f := strings.Fields(line)
			fields[f[0]] = strings.Join(f[1:], " ")
		}
		return fields
	}
	if k := key(); k["zone"] != "cli" || k["key"] != bot || k["from"] != from || k["hash"] != hash || k["used"] != "5" || k["current"] != "5" || k["override"] != "-" {
		t.Fatalf("key: %v, want %s from %s, the hash top shows, 5 used, no override", k, bot, from)
	}

	if out := cli("override", "cli", bot, "10", "--ttl", "1h"); !strings.HasPrefix(out, fmt.Sprintf("zone %q: key %q: override 10 until ", "cli", bot)) {
		t.Fatalf("override printed %q", out)
	}
	if o := key()["override"]; !strings.HasPrefix(o, "10 until ") {
		t.Fatalf("key shows override %q, want 10 until an hour from now", o)
	}
	cli("override", "cli", bot, "--remove")
	if o := key()["override"]; o != "-" {
		t.Fatalf("key shows override %q after --remove, want none", o)
	}

	cli("dial", "cli", "--mode", "dry_run", "--ttl", "1h")
	if row := tableRow(cli("zones"), "cli"); len(row) < 7 || row[5] != "dry_run" || row[6] != "until" {
		t.Fatalf("zones row %q after dial --mode dry_run, want the dial shown", row)
	}
	cli("dial", "cli", "--remove")
	if row := tableRow(cli("zones"), "cli"); len(row) != 7 || row[5] != "-" {
		t.Fatalf("zones row %q after dial --remove, want no dial", row)
	}

	cli("reset", "cli", bot)
	if k := key(); k["used"] != "0" || k["current"] != "0" {
		t.Fatalf("key after reset: %v, want 0 used", k)
	}
	// The admin changes are logged with the key's hash, the one top shows.
	wait.For(t, "the reset's log line", func() bool {
		return len(logLines(in.log, "rate limit admin: key reset", `"key":"`+hash+`"`)) == 1
	})
	if lines := logLines(in.log, "rate limit admin", bot); len(lines) != 0 {
		t.Fatalf("the key is in the admin changes' log lines:\n%s", strings.Join(lines, ""))
	}

	var exit *exec.ExitError
	out, stderr, err := rateLimitCLI(t, "key", "nosuch", "k", "--address", address)
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || out != "" {
		t.Fatalf("an unknown zone: %v, printed %q; want exit status 1 and nothing printed", err, out)
	}
	if msg := loggedError(stderr); msg != `zone "nosuch": no such zone in the running config` {
		t.Fatalf("an unknown zone logged %q, want the endpoint's message", msg)
	}

	nowhere := onLoopback(freePort())
	_, stderr, err = rateLimitCLI(t, "zones", "--address", nowhere)
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(loggedError(stderr), nowhere) {
		t.Fatalf("an address nothing listens on: %v, logged %q; want exit status 1 naming it", err, loggedError(stderr))
	}

	caddyfile := filepath.Join(t.TempDir(), "Caddyfile")
	if err := os.WriteFile(caddyfile, []byte("{\n\tadmin "+address+"\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, err = rateLimitCLI(t, "zones", "--config", caddyfile, "--adapter", "caddyfile")
	if err != nil || tableRow(out, "cli") == nil {
		t.Fatalf("zones --config: %v\n%s\nwant the zone, from the admin address in the Caddyfile", err, out)
	}
}

// commandAt returns a runner of `caddy rate-limit` against in's admin
// endpoint, which fails t if the command fails, and returns its output.
func commandAt(t *testing.T, in instance) func(args ...string) string {
	address := strings.TrimPrefix(in.admin, "http://")
	return func(args ...string) string {
		t.Helper()
		out, _, err := rateLimitCLI(t, append(args, "--address", address)...)
		if err != nil {
			t.Fatalf("caddy rate-limit %q: %v", args, err)
		}
		return out
	}
}

// inProcessCLI is commandAt for the in-process Caddy.
func inProcessCLI(t *testing.T) func(args ...string) string {
	return commandAt(t, instance{admin: adminURL})
}

// TestCommandResetsAHashedKey: reset given a key's hash, as top shows it
// under log_keys off, resets that key; a hash that no top key of this
// instance has is refused, saying to pass the key itself, and resets
// nothing.
func TestCommandResetsAHashedKey(t *testing.T) {
	startCaddy(t, clientSite("hashed", 2, ""))
	cli := inProcessCLI(t)
	wantStatuses(t, statuses(t, 3, "bot"), 200, 200, 429)
	rows := topRows(cli("top", "hashed"))
	if len(rows) != 1 || !hashForm.MatchString(rows[0][0]) {
		t.Fatalf("top rows %q, want bot's hash", rows)
	}
	hash := rows[0][0]

	var exit *exec.ExitError
	const unknown = "#0123456789abcdef"
	out, stderr, err := rateLimitCLI(t, "reset", "hashed", unknown, "--address", adminAddr)
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || out != "" || !strings.Contains(loggedError(stderr), "pass the key itself") {
		t.Fatalf("reset of a hash no top key has: %v, printed %q, logged %q; want exit status 1 saying to pass the key itself", err, out, loggedError(stderr))
	}
	if used := keyState(t, adminURL, "hashed", "bot").Used; used != 2 {
		t.Fatalf("bot used %d after the refused reset, want 2", used)
	}

	cli("reset", "hashed", hash)
	if used := keyState(t, adminURL, "hashed", "bot").Used; used != 0 {
		t.Fatalf("bot used %d after reset %s, want 0", used, hash)
	}
	wantStatuses(t, statuses(t, 3, "bot"), 200, 200, 429)
}

// TestCommandEscapesKeys: a key with an escape sequence or a line break
// (a query parameter can carry both) is printed by top with them escaped,
// so that it can neither clear the operator's screen nor forge a row.
func TestCommandEscapesKeys(t *testing.T) {
	startCaddy(t, siteAddr+` {
	rate_limit {
		log_keys on
		zone escaped {
			key {query.id}
			limit 5
			window 1h
		}
	}
	respond "ok"
}
`)
	cli := inProcessCLI(t)
	for _, id := range []string{"%1b%5b2J", "x%0d%0aforged%099%090"} {
		if resp, _ := do(t, http.MethodGet, siteURL+"/?id="+id); resp.StatusCode != http.StatusOK {
			t.Fatalf("id=%s: %d, want 200", id, resp.StatusCode)
		}
	}
	top := cli("top", "escaped")
	if strings.ContainsAny(top, "\x1b\r") || len(topRows(top)) != 2 {
		t.Fatalf("top printed %q, want 2 rows and no escape or carriage return", top)
	}
	for _, want := range []string{`\x1b[2J`, `x\r\nforged\t9\t0`} {
		if !strings.Contains(top, want) {
			t.Fatalf("top printed %q, want the key %s escaped", top, want)
		}
	}
}
