package integration

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/internal/docs"
	"github.com/d61b427a/caddy-rate-limit/internal/wait"
)

// TestExceededEvents: a flood of 10,000 rejected requests from one key in
// one window emits one rate_limit_exceeded event, with the zone, the key,
// the client's address and the seconds to wait; another key has its own;
// the key is its hash, unless log_keys is on; a banned key's event says
// when its ban ends.
func TestExceededEvents(t *testing.T) {
	startCaddy(t, withEvents(t, `
`+siteAddr+` {
	rate_limit {
		zone ev_flood {
			key {header.X-Client}
			limit 1
			window 1h
		}
	}
	respond "ok"
}
`+site2Addr+` {
	rate_limit {
		log_keys on
		zone ev_shown {
			key {header.X-Client}
			limit 1
			window 1h
			ban 1h
		}
	}
	respond "ok"
}
`))
	hc := &http.Client{}
	send := func(url, client string) int {
		resp, _ := request(t, hc, http.MethodGet, url, "", "X-Client: "+client)
		return resp.StatusCode
	}
	rejected := 0
	for range 10_001 {
		if send(siteURL, "flood") == http.StatusTooManyRequests {
			rejected++
		}
	}
	if rejected != 10_000 {
		t.Fatalf("%d rejected, want 10,000", rejected)
	}
	events := recordedEvents()
	if len(events) != 1 {
		t.Fatalf("%d events for 10,000 rejections of one key in one window, want 1", len(events))
	}
	d := events[0].Data
	hash := keyHash(t, adminURL, "ev_flood", "flood")
	if ra := d["retry_after"].(int64); d["zone"] != "ev_flood" || d["key"] != hash || d["remote_ip"] != "127.0.0.1" || ra < 1 || ra > 3600 {
		t.Fatalf("event data %v, want zone ev_flood, key flood's hash %s, remote_ip 127.0.0.1 and retry_after up to the window's end", d, hash)
	}
	send(siteURL, "other")
	send(siteURL, "other")
	if n := len(recordedEvents()); n != 2 {
		t.Fatalf("%d events after another key's rejection, want 2", n)
	}
	send(site2URL+"/", "secret")
	send(site2URL+"/", "secret")
	events = recordedEvents()
	if len(events) != 3 {
		t.Fatalf("%d events after the log_keys on zone's rejection, want 3", len(events))
	}
	d = events[2].Data
	if d["key"] != "secret" || d["zone"] != "ev_shown" || d["ban_ends"] == nil {
		t.Fatalf("log_keys on zone's event data %v, want key secret and the ban's end", d)
	}
}

// TestDocumentedEventsLog loads the events log of docs/operating.md as it
// is written (only its file moved to a temporary directory) into a Caddy
// with no event handler, and sends two keys over their limit: the file gets
// one rate_limit_exceeded line for each key, no more however many more of
// their requests the window rejects, and no line but the events app's.
func TestDocumentedEventsLog(t *testing.T) {
	blocks := docs.FencedBlocks(docs.Section(t, "../docs/operating.md", "Events"), "caddyfile")
	if len(blocks) != 1 {
		t.Fatalf("%d Caddyfile blocks in the Events section, want 1", len(blocks))
	}
	const documentedFile = "/var/log/caddy/events.log"
	option, isGlobal := strings.CutPrefix(strings.TrimSpace(blocks[0]), "{")
	option, isGlobal2 := strings.CutSuffix(option, "}")
	if !isGlobal || !isGlobal2 || !strings.Contains(option, "output file "+documentedFile+"\n") {
		t.Fatalf("the Events section's Caddyfile is not a global options block that writes %s:\n%s", documentedFile, blocks[0])
	}
	logFile := filepath.Join(t.TempDir(), "events.log")
	startCaddy(t, withGlobals(strings.Replace(option, documentedFile, logFile, 1))+`
`+siteAddr+` {
	rate_limit {
		zone ev_log {
			key {header.X-Client}
			limit 1
			window 1h
		}
	}
	respond "ok"
}
`)

	// Every request below must fall in one of the zone's windows, which
	// are aligned to the epoch.
	wait.For(t, "an hour with ten seconds to spare", func() bool { return time.Now().Unix()%3600 < 3590 })
	// An event is logged before its rejection is answered, so the file
	// has every line by the time a request returns.
	exceeded := func() []map[string]any {
		var out []map[string]any
		for _, e := range logEntries(logLines(logFile)) {
			if e["logger"] != "events" {
				t.Fatalf("a line of another logger than events in the events log: %v", e)
			}
			if e["name"] == "rate_limit_exceeded" {
				out = append(out, e)
			}
		}
		return out
	}
	wantStatuses(t, statuses(t, 5, "client-a"), 200, 429, 429, 429, 429)
	wantStatuses(t, statuses(t, 5, "client-b"), 200, 429, 429, 429, 429)
	lines := exceeded()
	if len(lines) != 2 {
		t.Fatalf("%d rate_limit_exceeded lines for two keys over their limit, want 2:\n%v", len(lines), lines)
	}
	for i, key := range []string{"client-a", "client-b"} {
		e := lines[i]
		d, _ := e["data"].(map[string]any)
		if e["msg"] != "event" || e["level"] != "debug" || e["origin"] != "http.handlers.rate_limit" ||
			d["zone"] != "ev_log" || d["key"] != keyHash(t, adminURL, "ev_log", key) || d["from"] != "{http.request.header.X-Client}" || d["remote_ip"] != "127.0.0.1" {
			t.Fatalf("line %d: %v, want the debug event of zone ev_log for key %s, shown as its hash, from {http.request.header.X-Client}", i+1, e, key)
		}
	}
	wantStatuses(t, statuses(t, 5, "client-a"), 429, 429, 429, 429, 429)
	wantStatuses(t, statuses(t, 5, "client-b"), 429, 429, 429, 429, 429)
	if n := len(exceeded()); n != 2 {
		t.Fatalf("%d rate_limit_exceeded lines after more rejections in the same window, want still 2", n)
	}
}
