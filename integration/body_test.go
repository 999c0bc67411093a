package integration

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
	"github.com/d61b427a/caddy-rate-limit/internal/wait"
)

// This file tests how a zone reads request bodies, as a client that
// means harm sends them: bodies announced long and sent slowly, many at
// once, from keys already refused.

// slowClient is a connection that sent a request's header, announcing a
// body of some length, and fewer of its bytes; it reads the answer, if
// one comes.
type slowClient struct {
	conn net.Conn
	// status is the answer's status, once read; 0 until then. header
	// is its header, once status is set.
	status atomic.Int64
	header http.Header
	// closed tells that the server closed the connection after its
	// answer.
	closed atomic.Bool
}

// sendSlow opens a connection to hostport and sends a POST to path with
// headers, announcing a body of length bytes, and sends only sent of
// them. The connection is closed when t ends.
func sendSlow(t *testing.T, hostport, path string, length int, sent string, headers ...string) *slowClient {
	t.Helper()
	conn, err := net.Dial("tcp", hostport)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n", path, hostport, length)
	for _, h := range headers {
		head += h + "\r\n"
	}
	if _, err := conn.Write([]byte(head + "\r\n" + sent)); err != nil {
		t.Fatal(err)
	}
	c := &slowClient{conn: conn}
	go func() {
		r := bufio.NewReader(conn)
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		c.header = resp.Header
		c.status.Store(int64(resp.StatusCode))
		_, err = r.ReadByte()
		c.closed.Store(errors.Is(err, io.EOF))
	}()
	return c
}

// answered counts the clients that got an answer with status, or with
// any status if status is 0.
func answered(clients []*slowClient, status int) int {
	n := 0
	for _, c := range clients {
		if s := c.status.Load(); s != 0 && (status == 0 || s == int64(status)) {
			n++
		}
	}
	return n
}

// rss is the resident memory of process pid, in bytes.
func rss(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Skipf("no /proc to read a process's memory from: %v", err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			var kB int64
			fmt.Sscan(v, &kB)
			return kB << 10
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}

// inFlight is how many requests the sites of the Caddy whose admin
// endpoint is at base are handling now (Caddy's
// caddy_http_requests_in_flight, with the metrics global option on).
func inFlight(t *testing.T, base string) int {
	t.Helper()
	_, body := adminJSON(t, base, http.MethodGet, "/metrics", "")
	n := 0
	for line := range strings.Lines(body) {
		if strings.HasPrefix(line, "caddy_http_requests_in_flight{") {
			_, value, _ := strings.Cut(strings.TrimSpace(line), " ")
			var v int
			fmt.Sscan(value, &v)
			n += v
		}
	}
	return n
}

const mib = 1 << 20

// TestSlowBodiesHoldLittleMemoryBuiltCaddy: clients that announce a
// body of 1 MiB and send one byte of it cost the built Caddy little
// memory: 300 of them at once grow its resident memory by at most the
// memory bodies being read may take (body_memory's default, 64 MiB),
// plus slack (what 300 connections and requests cost Caddy, the Go
// heap's growth, and a margin for the machine); 200 of them from a key
// already banned grow it by at most that slack, each answered 429 before
// its body is read.
func TestSlowBodiesHoldLittleMemoryBuiltCaddy(t *testing.T) {
	const (
		bodyMemory = 64 * mib // body_memory's default
		// Measured on a busy 2-core machine: 300 slow requests held grew
		// Caddy by 11 to 12 MiB, 200 answered at once by 2 to 4 MiB
		// (before bodies were read by bytes received: 312 and 208 MiB).
		// The slack leaves room for a busier machine's heap.
		slack = 32 * mib
	)
	site := `	rate_limit {
		zone tokens {
			key {header.X-Client}
			limit 1000
			window 1h
			ban 1h
			cost_from usage total
			reserve max_tokens 600
		}
	}
	respond "ok"
`
	start := func(t *testing.T) (instance, string) {
		// body_timeout is long, so that the slow requests are still held
		// when the memory is read, however long opening them took.
		in := startInstanceWith(t, "metrics\n\trate_limit {\n\t\tbody_timeout 5m\n\t}", site, "/v1/chat/completions")
		for i := range 20 {
			resp, _ := request(t, client, http.MethodPost, in.url, `{"max_tokens":1,"messages":[]}`, fmt.Sprintf("X-Client: warm-%d", i))
			status(t, resp, http.StatusOK)
		}
		return in, strings.TrimPrefix(strings.TrimSuffix(in.url, "/v1/chat/completions"), "http://")
	}
	t.Run("slow_bodies", func(t *testing.T) {
		in, hostport := start(t)
		before := rss(t, in.proc.Process.Pid)
		var clients []*slowClient
		for i := range 300 {
			clients = append(clients, sendSlow(t, hostport, "/v1/chat/completions", mib, "{", fmt.Sprintf("X-Client: slow-%d", i)))
		}
		wait.For(t, "Caddy to hold the 300 requests", func() bool { return inFlight(t, in.admin) == 300 })
		grown := rss(t, in.proc.Process.Pid) - before
		t.Logf("300 slow bodies of 1 MiB: resident memory grew by %.1f MiB", float64(grown)/mib)
		if grown > bodyMemory+slack {
			t.Errorf("300 slow bodies of 1 MiB grew Caddy's resident memory by %.1f MiB, want at most %d MiB", float64(grown)/mib, (bodyMemory+slack)/mib)
		}
	})
	t.Run("refused_key", func(t *testing.T) {
		in, hostport := start(t)
		body := `{"max_tokens":600,"messages":[]}`
		resp, _ := request(t, client, http.MethodPost, in.url, body, "X-Client: banned")
		status(t, resp, http.StatusOK)
		resp, _ = request(t, client, http.MethodPost, in.url, body, "X-Client: banned")
		status(t, resp, http.StatusTooManyRequests)
		before := rss(t, in.proc.Process.Pid)
		var clients []*slowClient
		for range 200 {
			clients = append(clients, sendSlow(t, hostport, "/v1/chat/completions", mib, "{", "X-Client: banned"))
		}
		wait.For(t, "Caddy to answer or hold the 200 requests", func() bool {
			return answered(clients, 0)+inFlight(t, in.admin) == 200
		})
		grown := rss(t, in.proc.Process.Pid) - before
		t.Logf("200 slow bodies of 1 MiB from a banned key: resident memory grew by %.1f MiB", float64(grown)/mib)
		if grown > slack {
			t.Errorf("200 slow bodies of 1 MiB from a banned key grew Caddy's resident memory by %.1f MiB, want at most %d MiB", float64(grown)/mib, slack/mib)
		}
		wait.For(t, "the 200 requests of the banned key to be answered 429", func() bool {
			return answered(clients, http.StatusTooManyRequests) == 200
		})
	})
}

// bodySite is a site on siteAddr that proxies to upstream, whose
// rate_limit block holds options and a zone, name, that reserves by
// max_tokens, keyed by X-Client, with the lines zone.
func bodySite(upstream, options, name, zone string) string {
	return fmt.Sprintf(`
`+siteAddr+` {
	rate_limit {
		%s
		zone %s {
			key {header.X-Client}
			cost_from usage total
			reserve max_tokens 100
			%s
		}
	}
	reverse_proxy %s
}
`, options, name, zone, upstream)
}

// TestBodyMemoryFullAnswers503: once the bodies being read fill
// body_memory (the handler's, which wins over the global option's), a
// request whose body would take more is answered 503 with Retry-After,
// reaching neither the upstream nor any count; once they go, requests
// pass again.
func TestBodyMemoryFullAnswers503(t *testing.T) {
	u := newLLM(t)
	const zone = "body_memory_full"
	// body_timeout is long, so that no held body is answered 408.
	startCaddy(t, withGlobals("rate_limit {\n\t\tbody_memory 1GiB\n\t}")+
		bodySite(u.url, "body_memory 2MiB\n\t\tbody_timeout 5m", zone, "limit 100000000\n\t\t\twindow 1h"))
	// Each client sends 600 KiB of a body of 1 MiB and holds: four fill
	// the 2 MiB, eight are sure to pass it. None can be answered but
	// for body_memory: whichever reads past it gets the 503.
	part := strings.Repeat("a", 600<<10)
	var clients []*slowClient
	wait.For(t, "a request past body_memory to be answered", func() bool {
		if len(clients) < 8 {
			clients = append(clients, sendSlow(t, siteListen, "/v1/chat/completions", mib, part, fmt.Sprintf("X-Client: holder-%d", len(clients))))
		}
		return answered(clients, 0) > 0
	})
	for i, c := range clients {
		if s := c.status.Load(); s != 0 {
			if s != http.StatusServiceUnavailable || c.header.Get("Retry-After") != "1" {
				t.Errorf("holder-%d answered %d with Retry-After %q, want 503 with 1", i, s, c.header.Get("Retry-After"))
			}
			if used := keyState(t, adminURL, zone, fmt.Sprintf("holder-%d", i)).Used; used != 0 {
				t.Errorf("holder-%d, answered 503, uses %d, want 0", i, used)
			}
		}
	}
	if n := u.hits.Load(); n != 0 {
		t.Errorf("the upstream got %d requests", n)
	}
	for _, c := range clients {
		c.conn.Close()
	}
	wait.For(t, "a request to pass once the bodies being read went", func() bool {
		resp, _ := request(t, client, http.MethodPost, siteURL+"/v1/chat/completions", `{"max_tokens":10,"messages":[]}`, "X-Client: after")
		return resp.StatusCode == http.StatusOK
	})
}

// TestBodyTimeoutAnswers408: a client that sends its body a byte at a
// time, and not all of it within body_timeout (set by the global
// rate_limit option), is answered 408 and its connection closed; the
// upstream never sees it and nothing is taken.
func TestBodyTimeoutAnswers408(t *testing.T) {
	u := newLLM(t)
	const zone = "body_timeout"
	startCaddy(t, withGlobals("rate_limit {\n\t\tbody_timeout 1s\n\t}")+bodySite(u.url, "", zone, "limit 100000000\n\t\t\twindow 1h"))
	c := sendSlow(t, siteListen, "/v1/chat/completions", mib, "{", "X-Client: trickle")
	go func() {
		for c.status.Load() == 0 {
			if _, err := c.conn.Write([]byte(" ")); err != nil {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	wait.For(t, "the trickling client to be answered", func() bool { return c.status.Load() != 0 })
	if s := c.status.Load(); s != http.StatusRequestTimeout {
		t.Fatalf("the trickling client was answered %d, want 408", s)
	}
	wait.For(t, "Caddy to close the trickling client's connection", c.closed.Load)
	if n := u.hits.Load(); n != 0 {
		t.Errorf("the upstream got %d requests", n)
	}
	if used := keyState(t, adminURL, zone, "trickle").Used; used != 0 {
		t.Errorf("the trickling key uses %d, want 0", used)
	}
	resp, _ := request(t, client, http.MethodPost, siteURL+"/v1/chat/completions", `{"max_tokens":10,"messages":[]}`, "X-Client: prompt")
	status(t, resp, http.StatusOK)
}

// TestRefusedKeyAnsweredBeforeItsBody: a request of a key the store
// already knows it refuses, whatever the body would reserve, is answered
// 429 before the client has sent its body, and its connection closed:
// a key banned (the memory store), or one whose rejection the Redis
// store remembers (its deny cache), which answers with no script call.
// The upstream never sees it.
func TestRefusedKeyAnsweredBeforeItsBody(t *testing.T) {
	// refuseKey has the key refused: its first request takes
	// 900 (a usage of 900), which leaves no room for the second's
	// reservation of 200.
	refuseKey := func(t *testing.T, zone, key string) {
		t.Helper()
		resp, _ := request(t, client, http.MethodPost, siteURL+"/usage?n=900", `{"max_tokens":10}`, "X-Client: "+key)
		status(t, resp, http.StatusOK)
		waitUsed(t, adminURL, zone, key, 900)
		resp, _ = request(t, client, http.MethodPost, siteURL+"/usage?n=1", `{"max_tokens":200}`, "X-Client: "+key)
		status(t, resp, http.StatusTooManyRequests)
	}
	// answeredUnsent sends a request of key announcing a body of 1 MiB
	// and sending none of it, and checks that it is answered 429 and its
	// connection closed, and that the upstream never saw it.
	answeredUnsent := func(t *testing.T, u *llm, key string) {
		t.Helper()
		hits := u.hits.Load()
		c := sendSlow(t, siteListen, "/usage?n=1", mib, "", "X-Client: "+key)
		wait.For(t, "the request sent without its body to be answered", func() bool { return c.status.Load() != 0 })
		if s := c.status.Load(); s != http.StatusTooManyRequests {
			t.Fatalf("answered %d, want 429", s)
		}
		wait.For(t, "Caddy to close the connection", c.closed.Load)
		if n := u.hits.Load(); n != hits {
			t.Errorf("the upstream got the request")
		}
	}
	t.Run("memory_ban", func(t *testing.T) {
		u := newLLM(t)
		startCaddy(t, `
`+siteAddr+` {
	rate_limit {
		zone body_banned {
			key {header.X-Client}
			limit 1000
			window 1h
			ban 1h
			cost_from usage total
			reserve max_tokens 100
		}
	}
	reverse_proxy `+u.url+`
}
`)
		refuseKey(t, "body_banned", "banned")
		answeredUnsent(t, u, "banned")
	})
	t.Run("redis_deny_cache", func(t *testing.T) {
		s := redistest.Standalone(t)
		u := newLLM(t)
		startCaddy(t, `
`+siteAddr+` {
	rate_limit {
		`+redisStore("address "+s.URL())+`
		zone body_denied {
			key {header.X-Client}
			limit 1000
			window 1h
			cost_from usage total
			reserve max_tokens 100
		}
		zone body_denied_requests {
			key {header.X-Client}
			limit 1
			window 1h
		}
	}
	reverse_proxy `+u.url+`
}
`)
		refuseKey(t, "body_denied", "denied")
		calls, err := s.ScriptCalls()
		if err != nil {
			t.Fatal(err)
		}
		answeredUnsent(t, u, "denied")
		if n, err := s.ScriptCalls(); err != nil || n != calls {
			t.Errorf("%d script calls answering the request (%v), want none", n-calls, err)
		}
	})
}
