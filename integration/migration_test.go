package integration

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// mholtExamples are Caddyfiles in the shape of every example in
// mholt/caddy-ratelimit's README (and of its documented syntax), written
// for this test, each as a user would paste it into a site. Those with
// distributed or storage must fail to adapt with the migration line; the
// others must run and limit as their comments say, which check tries.
var mholtExamples = []struct {
	name, globals, site string
	// check is nil for an example that must be refused.
	check func(t *testing.T)
}{
	{
		name: "README Caddyfile example (distributed)",
		site: `
	rate_limit {
		distributed
		zone static_example {
			match {
				method GET
			}
			key    static
			events 100
			window 1m
		}
		zone dynamic_example {
			key    {remote_host}
			events 2
			window 5s
		}
		log_key
	}
	respond "I'm behind the rate limiter!"
`,
	},
	{
		name: "README Caddyfile example without distributed",
		site: `
	# dynamic_example: 2 requests per client IP in 5 seconds.
	# static_example: 100 GET requests a minute across all clients.
	rate_limit {
		zone static_example {
			match {
				method GET
			}
			key    static
			events 100
			window 1m
		}
		zone dynamic_example {
			key    {remote_host}
			events 2
			window 5s
		}
		log_key
	}
	respond "I'm behind the rate limiter!"
`,
		check: func(t *testing.T) {
			roomInWindow(5*time.Second, 2*time.Second)
			for i := range 2 {
				resp, body := do(t, http.MethodGet, siteURL+"/")
				status(t, resp, http.StatusOK)
				if body != "I'm behind the rate limiter!" {
					t.Fatalf("request %d: body %q", i, body)
				}
			}
			resp, _ := do(t, http.MethodPost, siteURL+"/") // dynamic_example counts every method
			status(t, resp, http.StatusTooManyRequests)
			ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
			if err != nil || ra < 1 || ra > 5 {
				t.Fatalf("Retry-After %q, want 1 to 5 s", resp.Header.Get("Retry-After"))
			}
			// A client that waits Retry-After, as urllib3, requests and got
			// do, then gets through.
			time.Sleep(time.Duration(ra) * time.Second)
			resp, _ = do(t, http.MethodGet, siteURL+"/")
			status(t, resp, http.StatusOK)
		},
	},
	{
		name: "README static key with match",
		site: `
	# Only 100 GET requests a minute, across all clients; other methods
	# are not limited.
	rate_limit {
		zone static_example {
			match {
				method GET
			}
			key    static
			events 100
			window 1m
		}
	}
	respond "ok"
`,
		check: func(t *testing.T) {
			roomInWindow(time.Minute, 10*time.Second)
			for i := range 100 {
				// Clients behind different forwarded addresses share the
				// static key.
				resp, _ := do(t, http.MethodGet, siteURL+"/", fmt.Sprintf("X-Forwarded-For: 198.51.100.%d", i))
				status(t, resp, http.StatusOK)
			}
			resp, _ := do(t, http.MethodGet, siteURL+"/")
			status(t, resp, http.StatusTooManyRequests)
			resp, _ = do(t, http.MethodPost, siteURL+"/")
			status(t, resp, http.StatusOK)
		},
	},
	{
		name:    "older README: order before basicauth, no match",
		globals: "order rate_limit before basicauth",
		site: `
	# 2 requests per client IP in 5 seconds.
	rate_limit {
		zone dynamic_example {
			key    {http.request.remote.host}
			events 2
			window 5s
		}
	}
	respond "I'm behind the rate limiter!"
`,
		check: twoThenLimited,
	},
	{
		name:    "order before basic_auth",
		globals: "order rate_limit before basic_auth",
		site: `
	# 2 requests per client IP in 5 seconds.
	rate_limit {
		zone dynamic_zone {
			key    {client_ip}
			events 2
			window 5s
		}
	}
	respond "ok"
`,
		check: twoThenLimited,
	},
	{
		name: "route block",
		site: `
	route {
		# Uncritical resource without rate limit
		respond /ping "pong"

		# Apply rate limit
		rate_limit {
			zone critical {
				key    {remote_host}
				events 2
				window 1m
			}
		}

		# Critical resources after rate limiting
		respond "critical"
	}
`,
		check: func(t *testing.T) {
			twoThenLimited(t)
			for range 3 {
				resp, body := do(t, http.MethodGet, siteURL+"/ping")
				status(t, resp, http.StatusOK)
				if body != "pong" {
					t.Fatalf("/ping: %q", body)
				}
			}
		},
	},
	{
		name: "distributed with its block",
		site: `
	rate_limit {
		zone dynamic_example {
			key    {remote_host}
			events 2
			window 5s
		}
		distributed {
			read_interval  5s
			write_interval 5s
			purge_age      10s
		}
	}
	respond "ok"
`,
	},
	{
		name: "storage module",
		site: `
	rate_limit {
		zone dynamic_example {
			key    {remote_host}
			events 2
			window 5s
		}
		storage file_system {
			root /var/lib/caddy/ratelimit
		}
	}
	respond "ok"
`,
	},
	{
		name: "jitter and sweep_interval",
		site: `
	# 1 request per client a minute; Retry-After spread by up to 20%
	# of the wait.
	rate_limit {
		zone dynamic_example {
			key    {remote_host}
			events 1
			window 1m
		}
		jitter 0.2
		sweep_interval 1m
	}
	respond "ok"
`,
		check: func(t *testing.T) {
			roomInWindow(time.Minute, 2*time.Second)
			resp, _ := do(t, http.MethodGet, siteURL+"/")
			status(t, resp, http.StatusOK)
			before := time.Now()
			resp, _ = do(t, http.MethodGet, siteURL+"/")
			status(t, resp, http.StatusTooManyRequests)
			// The sliding tail allows the next request once the minute
			// this one was counted in has ended.
			end := time.UnixMilli((before.UnixMilli()/60000 + 1) * 60000)
			wait := end.Sub(before).Seconds()
			ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
			if float64(ra) < wait-1 || float64(ra) > wait*1.2+1 {
				t.Fatalf("Retry-After %d, want %.0f to %.0f", ra, wait, wait*1.2)
			}
		},
	},
	{
		name: "ipv4_prefix and ipv6_prefix",
		site: `
	# 2 requests a minute per /24 (IPv4) or /64 (IPv6) network.
	rate_limit {
		zone per_network {
			key         {remote_host}
			events      2
			window      1m
			ipv4_prefix 24
			ipv6_prefix 64
		}
	}
	respond "{http.rate_limit.key}"
`,
		check: func(t *testing.T) {
			roomInWindow(time.Minute, 2*time.Second)
			// Two addresses of 127.0.0.0/24 share one counter.
			for i, from := range []string{"127.0.0.1", "127.0.0.2", "127.0.0.2"} {
				dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
				hc := &http.Client{Transport: &http.Transport{DialContext: dialer.DialContext, DisableKeepAlives: true}, Timeout: 30 * time.Second}
				resp, body := request(t, hc, http.MethodGet, siteURL+"/", "")
				want := http.StatusOK
				if i == 2 {
					want = http.StatusTooManyRequests
				}
				status(t, resp, want)
				if i < 2 && body != "127.0.0.0/24" {
					t.Fatalf("key %q from %s, want the network 127.0.0.0/24", body, from)
				}
			}
		},
	},
	{
		name: "handle_errors with the exceeded zone's name",
		site: `
	# 1 request per client a minute; the 429 names the zone.
	rate_limit {
		zone per_client {
			key    {remote_host}
			events 1
			window 1m
		}
	}
	respond "ok"
	handle_errors 429 {
		respond "limited by {http.rate_limit.exceeded.name}" 429
	}
`,
		check: func(t *testing.T) {
			roomInWindow(time.Minute, 2*time.Second)
			resp, _ := do(t, http.MethodGet, siteURL+"/")
			status(t, resp, http.StatusOK)
			resp, body := do(t, http.MethodGet, siteURL+"/")
			status(t, resp, http.StatusTooManyRequests)
			if body != "limited by per_client" {
				t.Fatalf("429 body %q", body)
			}
		},
	},
	{
		name: "disable_metrics",
		site: `
	# 2 requests per client a minute; no metrics.
	rate_limit {
		zone quiet {
			key    {remote_host}
			events 2
			window 1m
		}
		disable_metrics
	}
	respond "ok"
`,
		check: twoThenLimited,
	},
}

// twoThenLimited: a client gets two requests through, then a 429 with a
// Retry-After.
func twoThenLimited(t *testing.T) {
	t.Helper()
	roomInWindow(5*time.Second, 2*time.Second)
	for range 2 {
		resp, _ := do(t, http.MethodGet, siteURL+"/")
		status(t, resp, http.StatusOK)
	}
	resp, _ := do(t, http.MethodGet, siteURL+"/")
	status(t, resp, http.StatusTooManyRequests)
	if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || ra < 1 {
		t.Fatalf("Retry-After %q", resp.Header.Get("Retry-After"))
	}
}

// TestMholtReadmeExamples adapts each of mholtExamples as `caddy adapt`
// does; runs those that adapt through Caddy and tries what their comments
// say; and checks that those with distributed or storage are refused with
// the one line that says what to write instead.
func TestMholtReadmeExamples(t *testing.T) {
	for _, ex := range mholtExamples {
		t.Run(ex.name, func(t *testing.T) {
			globals := withGlobals(ex.globals)
			caddyfile := globals + siteAddr + " {\n" + ex.site + "}\n"
			_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
			if ex.check == nil {
				if err == nil {
					t.Fatal("adapted, want the migration line")
				}
				msg := err.Error()
				if !strings.Contains(msg, "want store redis { address ... } instead, which shares exact counters between instances") {
					t.Fatalf("error does not say what to write instead:\n%s", msg)
				}
				if strings.Contains(msg, "\n") {
					t.Fatalf("error is more than one line:\n%s", msg)
				}
				t.Log(msg)
				return
			}
			if err != nil {
				t.Fatalf("adapt: %v", err)
			}
			startCaddy(t, caddyfile)
			ex.check(t)
		})
	}
}

// mapLimitService is the external service of "Behind another handler": it
// maps a request to a key and a limit from its credentials, as SlashID
// Gate's map-limit endpoint does, and answers them in headers. The token
// "gold" maps to the key customer-gold with a limit of 3; any other
// request gets no headers.
func mapLimitService(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/map-limit" {
			http.NotFound(w, r)
			return
		}
		if r.Header.Get("Authorization") == "Bearer gold" {
			w.Header().Set("X-Limit-Key", "customer-gold")
			w.Header().Set("X-Limit", "3")
		}
		w.WriteHeader(http.StatusOK)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	return l.Addr().String()
}

// TestBehindForwardAuth runs the "Behind another handler" recipe of
// docs/migrating.md:
// forward_auth asks a service for the request's key and limit, and
// rate_limit, after it in a route, counts with them. The mapped key gets
// the mapped limit; a client's own X-Limit and X-Limit-Key are stripped,
// so its key falls back to its address and its limit to the default. And
// the recipe without route, as a new user might write it, shows why the
// route is needed: rate_limit runs first and reads the client's headers.
func TestBehindForwardAuth(t *testing.T) {
	service := mapLimitService(t)
	zone := `
		rate_limit {
			zone mapped {
				key   {header.X-Limit-Key} {client_ip}
				limit {header.X-Limit} 2
				window 1h
			}
		}`
	auth := fmt.Sprintf(`
		forward_auth %s {
			uri /map-limit
			copy_headers X-Limit-Key X-Limit
		}`, service)
	respond := `
		respond "{http.rate_limit.key} {http.rate_limit.limit}"`

	t.Run("route", func(t *testing.T) {
		startCaddy(t, siteAddr+" {\n\troute {"+auth+zone+respond+"\n\t}\n}\n")
		// A client that forges the headers gets its own address as key
		// and the default limit.
		forged := []string{"X-Limit: 1000", "X-Limit-Key: customer-gold"}
		for range 2 {
			resp, body := do(t, http.MethodGet, siteURL+"/", forged...)
			status(t, resp, http.StatusOK)
			if body != "127.0.0.1 2" {
				t.Fatalf("forged headers: key and limit %q, want the client's address and the default 2", body)
			}
		}
		resp, _ := do(t, http.MethodGet, siteURL+"/", forged...)
		status(t, resp, http.StatusTooManyRequests)
		// The mapped key gets the mapped limit, untouched by the forger.
		for range 3 {
			resp, body := do(t, http.MethodGet, siteURL+"/", "Authorization: Bearer gold", "X-Limit: 1000")
			status(t, resp, http.StatusOK)
			if body != "customer-gold 3" {
				t.Fatalf("mapped: key and limit %q, want customer-gold 3", body)
			}
		}
		resp, _ = do(t, http.MethodGet, siteURL+"/", "Authorization: Bearer gold")
		status(t, resp, http.StatusTooManyRequests)
	})

	t.Run("without route, the client chooses", func(t *testing.T) {
		startCaddy(t, siteAddr+" {"+auth+zone+respond+"\n}\n")
		resp, body := do(t, http.MethodGet, siteURL+"/", "X-Limit: 1000")
		status(t, resp, http.StatusOK)
		if body != "127.0.0.1 1000" {
			t.Fatalf("key and limit %q: want the pitfall docs/migrating.md warns of, the client's own limit 1000", body)
		}
		resp, body = do(t, http.MethodGet, siteURL+"/", "Authorization: Bearer gold")
		status(t, resp, http.StatusOK)
		if body != "127.0.0.1 2" {
			t.Fatalf("key and limit %q: want the mapping unseen (rate_limit ran before forward_auth)", body)
		}
	})
}
