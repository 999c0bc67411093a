package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/d61b427a/caddy-rate-limit/internal/badconfig"
)

// TestCLIRefusesBadConfig runs the built Caddy's adapt, validate and run
// commands on bad configs, as an operator would: each exits non-zero and
// names the directive and the bad value. Parse errors stop all three;
// a PEM file that cannot be read is found when the config is provisioned,
// so adapt (which only translates the Caddyfile) passes it.
func TestCLIRefusesBadConfig(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.pem")
	cases := []struct {
		name, block, directive, value string
		adapts                        bool
	}{
		{"unknown algorithm", `zone z { limit 1; window 1s; algorithm leaky_bucket }`, "algorithm", "leaky_bucket", false},
		{"zero limit", `zone z { limit 0; window 1s }`, "limit", "0", false},
		{"bad max_delay", `zone z { limit 1; window 1s; max_delay forever }`, "max_delay", "forever", false},
		{"unknown store", `store etcd; zone z { limit 1; window 1s }`, "store", "etcd", false},
		{"mholt distributed", `distributed; zone z { limit 1; window 1s }`, "distributed", "store redis { address ... }", false},
		{"calendar period with gcra", `zone z { limit 1; window month; algorithm gcra }`, "window", "fixed_window or sliding_tail", false},
		{"unknown time zone", `zone z { limit 1; window month; timezone Mars/Olympus_Mons }`, "timezone", "Mars/Olympus_Mons", false},
		{"unreadable public key", `jwt { public_key ` + missing + ` }; zone z { key u:{jwt.sub}; limit 1; window 1s }`, "public_key", missing, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "Caddyfile")
			port := freePort()
			config := caddyGlobals("admin off", port, freePort(), "") + fmt.Sprintf("http://%s {\n\trate_limit {\n%s\n\t}\n\trespond \"ok\"\n}\n", onLoopback(port), badconfig.Expand(c.block))
			if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
				t.Fatal(err)
			}
			for _, command := range []string{"adapt", "validate", "run"} {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				out, err := caddyCommand(ctx, t, command, "--config", path, "--adapter", "caddyfile").CombinedOutput()
				timedOut := ctx.Err() != nil
				cancel()
				if timedOut {
					t.Fatalf("caddy %s still running after a minute: the config was accepted\n%s", command, out)
				}
				var exit *exec.ExitError
				if command == "adapt" && c.adapts {
					if err != nil {
						t.Fatalf("caddy adapt: %v\n%s", err, out)
					}
					continue
				}
				if !errors.As(err, &exit) {
					t.Fatalf("caddy %s: %v, want a non-zero exit\n%s", command, err, out)
				}
				badconfig.AssertNames(t, string(out), c.directive, c.value)
			}
		})
	}
}

// TestCaddyfileExampleRuns runs Caddyfile.example with the built Caddy,
// as the README says to (on a free port, given as PORT, instead of 8080),
// and tries what its comments suggest: per-key limits, a POST that costs
// 5, the JSON 429 from handle_errors and a customer-wide limit across keys.
func TestCaddyfileExampleRuns(t *testing.T) {
	src, err := os.ReadFile("../Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(src), "http://localhost:{$PORT:8080} {") {
		t.Fatal("Caddyfile.example no longer serves http://localhost:{$PORT:8080}")
	}
	// The example's site, localhost, is bound to the suite's address, so
	// requests go there and name localhost as their Host.
	port := freePort()
	t.Setenv("PORT", strconv.Itoa(port))
	host := fmt.Sprintf("Host: localhost:%d", port)
	config := strings.Replace(string(src), "{\n\tauto_https off\n}",
		fmt.Sprintf("{\n\tauto_https off\n\t%s\n\tdefault_bind %s\n\tpersist_config off\n}", adminOption(onLoopback(freePort())), loopback), 1)
	startProcess(t, config, "http://"+onLoopback(port)+"/", host)

	get := func(method, path string, headers ...string) (int, string) {
		t.Helper()
		resp, body := do(t, method, "http://"+onLoopback(port)+path, append(headers, host)...)
		return resp.StatusCode, body
	}

	// The example's API windows are 10 s, aligned to the epoch. Start
	// early in one, so that every request below falls in it.
	roomInWindow(10*time.Second, 6*time.Second)

	// 10 units per 10 s per API key: ten GETs pass, the eleventh is
	// turned away with the example's JSON body.
	for i := range 10 {
		if code, body := get(http.MethodGet, "/api/items", "X-Api-Key: demo"); code != http.StatusOK {
			t.Fatalf("GET %d: %d %s", i, code, body)
		}
	}
	code, body := get(http.MethodGet, "/api/items", "X-Api-Key: demo")
	var rejection struct {
		Error      string `json:"error"`
		Zone       string `json:"zone"`
		RetryAfter int    `json:"retry_after"`
	}
	if err := json.Unmarshal([]byte(body), &rejection); code != http.StatusTooManyRequests || err != nil ||
		rejection.Zone != "per_api_key" || rejection.RetryAfter < 1 {
		t.Fatalf("eleventh GET: %d %s (%v)", code, body, err)
	}

	// A POST costs 5: another key gets two.
	for i, want := range []int{200, 200, 429} {
		if code, body := get(http.MethodPost, "/api/items", "X-Api-Key: poster"); code != want {
			t.Fatalf("POST %d: %d %s, want %d", i, code, body, want)
		}
	}

	// All keys of one customer share 30 units: three fresh keys with the
	// same customer token get 10 each, and a fourth gets nothing.
	token, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"customer": "acme"}).
		SignedString([]byte("demo-secret-change-me-0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	for k := range 4 {
		for i := range 10 {
			code, body := get(http.MethodGet, "/api/items", fmt.Sprintf("X-Api-Key: acme-%d", k), "Authorization: Bearer "+token)
			want := http.StatusOK
			if k == 3 {
				want = http.StatusTooManyRequests
			}
			if code != want {
				t.Fatalf("customer key %d, request %d: %d %s, want %d", k, i, code, body, want)
			}
			if k == 3 && !strings.Contains(body, `"zone":"per_customer"`) {
				t.Fatalf("fourth key rejected by %s, want per_customer", body)
			}
		}
	}
}
