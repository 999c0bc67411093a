package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
	"github.com/d61b427a/caddy-rate-limit/internal/wait"
)

// This file tests that what each request through a cost_from zone took,
// as its access log line shows it, adds up to what the store counted.

// billUpstream answers as an LLM API: /usage?n=<n> with a usage of n
// total tokens, /cut with the start of a stream and then a cut
// connection, /hang with the start of a stream and then nothing, until
// its client goes away.
func billUpstream(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		event := "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n"
		switch r.URL.Path {
		case "/usage":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":%s}}`, r.URL.Query().Get("n"))
		case "/cut":
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, event)
			http.NewResponseController(w).Flush()
			panic(http.ErrAbortHandler)
		case "/hang":
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, event)
			http.NewResponseController(w).Flush()
			<-r.Context().Done()
		}
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// TestCostLogMatchesTheStore: what each request took, as its access log
// line shows it (rate_limit_cost), adds up to what the store counted for
// the key, over a run of answers with their usage (one past its
// reservation), a stream cut off by the upstream and one whose client
// went away (each keeping its reservation), and refusals (taking
// nothing). Where log_append's {http.rate_limit.cost} is in a line, it
// agrees.
func TestCostLogMatchesTheStore(t *testing.T) { testCostBill(t, "", "bill") }

// TestCostLogMatchesTheStoreRedis runs the same on the Redis store.
func TestCostLogMatchesTheStoreRedis(t *testing.T) {
	s := redistest.Standalone(t)
	testCostBill(t, redisStore("address "+s.URL()), "bill_redis")
}

func testCostBill(t *testing.T, store, zone string) {
	upstream := billUpstream(t)
	accessLog := filepath.Join(t.TempDir(), "access.log")
	roomInWindow(time.Hour, time.Minute)
	startCaddy(t, tokenSite(accessLog, upstream, store, zone, `limit 1000
			window 1h
			algorithm fixed_window
			cost_from usage total
			reserve 100`))
	// The key's count after each: 30, 280, 380, 480, 880, 930, then no
	// room for a reservation of 100.
	steps := []struct {
		path string
		took int
	}{{"/usage?n=30", 30}, {"/usage?n=250", 250}, {"/cut", 100}, {"/hang", 100}, {"/usage?n=400", 400}, {"/usage?n=50", 50}, {"/usage?n=1", 0}, {"/usage?n=1", 0}}
	for i, s := range steps {
		ctx, cancel := context.WithCancel(context.Background())
		// Without a body: Caddy's access log reads a count of the body's
		// bytes that its proxy, aborting a response, may still be
		// updating (a data race in Caddy that the race detector finds).
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, siteURL+s.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Client", "payer")
		resp, err := client.Do(req)
		if err == nil {
			if s.path == "/hang" {
				// The first event, then the client goes away.
				resp.Body.Read(make([]byte, 1))
			} else {
				io.Copy(io.Discard, resp.Body)
			}
			resp.Body.Close()
			if want := map[bool]int{true: 200, false: 429}[s.took > 0]; resp.StatusCode != want {
				t.Fatalf("step %d, %s: %d, want %d", i, s.path, resp.StatusCode, want)
			}
		}
		cancel()
		wait.For(t, fmt.Sprintf("the access log line of step %d", i), func() bool { return len(logLines(accessLog)) == i+1 })
	}

	var bill int64
	for i, e := range logEntries(logLines(accessLog)) {
		costs, _ := e["rate_limit_cost"].(map[string]any)
		took, ok := costs[zone].(float64)
		if !ok {
			t.Errorf("line %d has no rate_limit_cost for %s: %v", i, zone, e)
			continue
		}
		if int(took) != steps[i].took {
			t.Errorf("line %d, %s: took %v, want %d", i, steps[i].path, took, steps[i].took)
		}
		if cost, ok := e["cost"].(float64); ok && cost != took {
			t.Errorf("line %d: {http.rate_limit.cost} %v, rate_limit_cost %v", i, cost, took)
		}
		bill += int64(took)
	}
	if used := keyState(t, adminURL, zone, "payer").Used; bill != 930 || used != bill {
		t.Errorf("the access log bills %d, the store counts %d; want 930 both", bill, used)
	}
}
