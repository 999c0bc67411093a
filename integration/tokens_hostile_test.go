package integration

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
	"github.com/d61b427a/caddy-rate-limit/internal/wait"
)

// hostileAnswer is an answer an upstream a cost_from zone reads may send:
// broken, malicious or merely odd. body is sent in the pieces given,
// each flushed, as a stream arrives. used is what the key that asked
// uses once the answer is trued up: the reservation (hostileReserve)
// where no cost can be read from it.
type hostileAnswer struct {
	name        string
	contentType string
	header      map[string][]string
	body        []string
	used        int64
}

// hostileLimit and hostileReserve are the limit and the reservation of
// the zones the hostile answers are sent through; a key owes at most one
// limit past its limit, so its use never passes hostileMost.
const (
	hostileLimit   = 1000
	hostileReserve = 100
	hostileMost    = 2 * hostileLimit
)

// hostileUsage are answers whose body a cost_from usage zone reads.
func hostileUsage() []hostileAnswer {
	const jsonType = "application/json"
	deep := 100_000
	var zipped bytes.Buffer
	zw := gzip.NewWriter(&zipped)
	io.WriteString(zw, `{"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}`)
	zw.Close()
	usageless := `{"choices":[{"message":{"content":"` + strings.Repeat("a", 2<<20) + `"}}]}`
	return []hostileAnswer{
		{name: "negative counts", contentType: jsonType, body: []string{`{"usage":{"prompt_tokens":-5,"completion_tokens":-900,"total_tokens":-905}}`}, used: hostileReserve},
		{name: "counts as strings", contentType: jsonType, body: []string{`{"usage":{"prompt_tokens":"5","completion_tokens":"7","total_tokens":"-12"}}`}, used: hostileReserve},
		{name: "floats", contentType: jsonType, body: []string{`{"usage":{"prompt_tokens":1.5,"completion_tokens":2e2,"total_tokens":-0.5}}`}, used: hostileReserve},
		{name: "1e400", contentType: jsonType, body: []string{`{"usage":{"prompt_tokens":1e400,"completion_tokens":-1e400,"total_tokens":1e400}}`}, used: hostileReserve},
		{name: "NaN and Infinity", contentType: jsonType, body: []string{`{"usage":{"prompt_tokens":NaN,"completion_tokens":-Infinity,"total_tokens":Infinity}}`}, used: hostileReserve},
		{name: "19 digits and more", contentType: jsonType, body: []string{`{"usage":{"prompt_tokens":9223372036854775807,"completion_tokens":9223372036854775808,"total_tokens":` + strings.Repeat("9", 400) + `}}`}, used: hostileMost},
		{name: "usage null", contentType: jsonType, body: []string{`{"usage":null}`}, used: hostileReserve},
		{name: "usage an array", contentType: jsonType, body: []string{`{"usage":[{"total_tokens":-50},-50]}`}, used: hostileReserve},
		{name: "usage a string", contentType: jsonType, body: []string{`{"usage":"{\"total_tokens\":-50}"}`}, used: hostileReserve},
		{name: "objects nested deep", contentType: jsonType, body: []string{`{"usage":` + strings.Repeat(`{"total_tokens":`, deep) + "-1" + strings.Repeat("}", deep) + "}"}, used: hostileReserve},
		{name: "arrays nested deep", contentType: jsonType, body: []string{`{"usage":{"total_tokens":` + strings.Repeat("[", deep) + strings.Repeat("]", deep) + "}}"}, used: hostileReserve},
		{name: "truncated JSON", contentType: jsonType, body: []string{`{"usage":{"prompt_tokens":10,"completion_tokens":-20,"total_tok`}, used: hostileReserve},
		{name: "not JSON", contentType: jsonType, body: []string{"<html><body>502 Bad Gateway</body></html>\x00\xff\xfe"}, used: hostileReserve},
		{name: "empty", contentType: jsonType, used: hostileReserve},
		{name: "events of garbage", contentType: "text/event-stream", body: []string{
			"data: {garbage\n\n",
			"event: message_delta\ndata: {\"usage\":{\"output_tokens\":-7}}\n\n",
			"data: {\"choices\":[],\"usage\":{\"total_tokens\":\"12\"}}\n\n",
			"data: \x00\xff\xfe\r\r\n\n",
			"data: [DONE]\n\n",
			"data: {\"usage\":{\"total_tokens\":-3}}\n\n",
			"data:" + strings.Repeat(" ", 1<<20) + "\n",
		}, used: hostileReserve},
		{name: "an event without end", contentType: "text/event-stream", body: []string{"data: {\"usage\":{\"total_tokens\":5", strings.Repeat("9", 2<<20)}, used: hostileReserve},
		{name: "ndjson of garbage", contentType: "application/x-ndjson", body: []string{"{\"done\":true,\"eval_count\":-4}\n", "nope\n", "{\"done\":true,\"prompt_eval_count\":\"3\",\"eval_count\":1e400}\n"}, used: hostileReserve},
		// reverse_proxy asks for gzip and decompresses what it asked for.
		{name: "gzip", contentType: jsonType, header: map[string][]string{"Content-Encoding": {"gzip"}}, body: []string{zipped.String()}, used: 7},
		{name: "gzip that is not", contentType: jsonType, header: map[string][]string{"Content-Encoding": {"gzip"}}, body: []string{`{"usage":{"total_tokens":7}}`}, used: hostileReserve},
		{name: "an unknown encoding", contentType: jsonType, header: map[string][]string{"Content-Encoding": {"x-garbage"}}, body: []string{`{"usage":{"total_tokens":7}}`}, used: hostileReserve},
		// Of a count given twice the larger is kept; a negative is none.
		{name: "duplicate usage", contentType: jsonType, body: []string{`{"usage":{"total_tokens":5},"usage":{"total_tokens":-900},"usage":{"total_tokens":5,"total_tokens":-9,"TOTAL_TOKENS":-9}}`}, used: 5},
		{name: "2 MiB without usage", contentType: jsonType, body: []string{usageless[:1<<20], usageless[1<<20:]}, used: hostileReserve},
	}
}

// hostileCosts are answers whose cost header a cost_from header zone
// reads: a cost is a non-negative integer, the header's first value.
func hostileCosts() []hostileAnswer {
	var out []hostileAnswer
	for _, c := range []struct {
		name   string
		values []string
		used   int64
	}{
		{"garbage", []string{"lots"}, hostileReserve},
		{"negative", []string{"-50"}, hostileReserve},
		{"a float", []string{"1.5e3"}, hostileReserve},
		{"1e400", []string{"1e400"}, hostileReserve},
		{"hex", []string{"0x10"}, hostileReserve},
		{"signed", []string{"+7"}, hostileReserve},
		{"empty", []string{""}, hostileReserve},
		{"control bytes", []string{"7\x00"}, hostileReserve},
		{"twice", []string{"5", "-900"}, 5},
		{"19 digits", []string{"9223372036854775808"}, hostileMost},
		{"huge", []string{strings.Repeat("9", 400)}, hostileMost},
	} {
		out = append(out, hostileAnswer{name: "cost " + c.name, contentType: "text/plain",
			header: map[string][]string{"X-Cost": c.values}, body: []string{"ok"}, used: c.used})
	}
	return out
}

// TestCostFromHostileUpstream sends, through Caddy, requests of zones
// that read a response's cost (from its usage, also from a stream that
// usage_in_stream filters, and from a header) to an upstream answering
// each in a hostile way: counts negative, as strings, floats, 1e400,
// NaN, 19 digits and more; usage null, an array, a string; JSON nested
// deep, truncated, not JSON at all; events and NDJSON of garbage; a body
// gzipped, falsely said to be, or in an unknown encoding; usage given
// twice; 2 MiB without usage; and a cost header of garbage, negative,
// huge or given twice. On the memory and the Redis store, after each:
// Caddy answers and no panic is in its log; once the response is trued
// up, the key's use is between 0 and the limit plus the most debt a key
// may owe (one limit), and is what the answer cost: its reservation if
// no cost can be read from it, one limit past the limit for a cost too
// large to hold.
func TestCostFromHostileUpstream(t *testing.T) {
	answers := map[string]hostileAnswer{}
	for _, a := range append(hostileUsage(), hostileCosts()...) {
		answers[a.name] = a
	}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		a, ok := answers[r.Header.Get("X-Answer")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		for name, values := range a.header {
			w.Header()[name] = values
		}
		w.Header().Set("Content-Type", a.contentType)
		w.WriteHeader(http.StatusOK)
		for _, part := range a.body {
			io.WriteString(w, part)
			http.NewResponseController(w).Flush()
		}
	}))
	t.Cleanup(upstream.Close)

	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			block := ""
			if store == "redis" {
				block = redisStore("address " + redistest.Standalone(t).URL())
			}
			logFile := filepath.Join(t.TempDir(), "caddy.log")
			zone := func(name, path, lines string) string {
				return fmt.Sprintf(`zone hostile_%s_%s {
			match {
				path %s
			}
			key {header.X-Client}
			limit %d
			window 1h
			algorithm fixed_window
			%s
			reserve %d
		}
		`, name, store, path, hostileLimit, lines, hostileReserve)
			}
			startCaddy(t, withGlobals(jsonLog(logFile, "INFO"))+siteAddr+` {
	rate_limit {
		`+block+`
		`+zone("usage", "/usage", "cost_from usage total")+
				zone("stream", "/stream", "cost_from usage total\n\t\t\tusage_in_stream on")+
				zone("header", "/header", "cost_from header X-Cost")+`
	}
	handle /alive {
		respond "alive"
	}
	reverse_proxy `+strings.TrimPrefix(upstream.URL, "http://")+`
}
`)
			alive := func(t *testing.T) {
				t.Helper()
				if resp, body := do(t, http.MethodGet, siteURL+"/alive"); resp.StatusCode != http.StatusOK || body != "alive" {
					t.Fatalf("Caddy answers %d %q, want 200 alive", resp.StatusCode, body)
				}
			}
			alive(t)
			check := func(t *testing.T, zone, path string, a hostileAnswer, body string) {
				t.Helper()
				key, zoneName := zone+": "+a.name, "hostile_"+zone+"_"+store
				allowed := fmt.Sprintf(`caddy_http_rate_limit_requests_total{result="allowed",zone=%q}`, zoneName)
				before := metricCount(t, adminURL, allowed)
				req, err := http.NewRequest(http.MethodPost, siteURL+path, strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("X-Client", key)
				req.Header.Set("X-Answer", a.name)
				// An answer Caddy cannot pass on whole may cut the
				// connection: that is no failure; that Caddy answers the
				// next request is what counts.
				if resp, err := client.Do(req); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				alive(t)
				if panics := logLines(logFile, "panic"); len(panics) > 0 {
					t.Fatalf("%s: Caddy's log holds a panic:\n%s", key, strings.Join(panics, ""))
				}
				// Admitted, its reservation in flight, then trued up.
				wait.For(t, key+"'s response to be trued up", func() bool {
					r := keyState(t, adminURL, zoneName, key).Reserved
					return metricCount(t, adminURL, allowed) == before+1 && r != nil && *r == 0
				})
				used := keyState(t, adminURL, zoneName, key).Used
				if used < 0 || used > hostileMost {
					t.Fatalf("%s: the key uses %d, want from 0 to %d (the limit and the most debt a key owes)", key, used, hostileMost)
				}
				if used != a.used {
					t.Errorf("%s: the key uses %d, want %d", key, used, a.used)
				}
			}
			for _, a := range hostileUsage() {
				check(t, "usage", "/usage", a, "")
				check(t, "stream", "/stream", a, `{"model":"m","stream":true}`)
			}
			for _, a := range hostileCosts() {
				check(t, "header", "/header", a, "")
			}
		})
	}
}
