package integration

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/d61b427a/caddy-rate-limit/internal/wait"
)

// This file runs the Caddy that users build, ./cmd/caddy compiled once per
// test binary, as processes of their own, alone or as a fleet sharing a
// Redis store, and sends them concurrent traffic.

// caddyBinary builds ./cmd/caddy once per test binary, in binaryDir,
// which TestMain removes.
var caddyBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "rate-limit-caddy-")
	if err != nil {
		return "", err
	}
	binaryDir = dir
	bin := filepath.Join(dir, "caddy")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/d61b427a/caddy-rate-limit/cmd/caddy").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build ./cmd/caddy: %w\n%s", err, out)
	}
	return bin, nil
})

var binaryDir string

// caddyCommand returns the built Caddy with args, killed if ctx ends, its
// home and data directories in a temporary directory so it leaves nothing
// behind.
func caddyCommand(ctx context.Context, t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	integration(t)
	bin, err := caddyBinary()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	return cmd
}

// startProcess runs the built Caddy with caddyfile and waits until it
// answers readyURL (sent with headers). The process is killed when t
// ends, if it still runs; its output is logged if t failed.
func startProcess(t *testing.T, caddyfile, readyURL string, headers ...string) *exec.Cmd {
	t.Helper()
	path := filepath.Join(t.TempDir(), "Caddyfile")
	if err := os.WriteFile(path, []byte(caddyfile), 0o644); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	cmd := caddyCommand(context.Background(), t, "run", "--config", path, "--adapter", "caddyfile")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("caddy output:\n%s", logs.String())
		}
	})
	wait.For(t, "caddy to serve "+readyURL, func() bool {
		select {
		case <-done:
			t.Fatalf("caddy exited: %v\n%s", cmd.ProcessState, logs.String())
		default:
		}
		req, _ := http.NewRequest(http.MethodGet, readyURL, nil)
		setHeaders(req, headers)
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
	return cmd
}

// instance is one Caddy process of a fleet.
type instance struct {
	url   string // the zone's site: http://<loopback>:<port>/work
	admin string // the admin endpoint: http://<loopback>:<port>
	log   string // its log file, JSON at INFO
	proc  *exec.Cmd
}

// fleetSpec is what the instances of a fleet run: a rate_limit handler on
// /work with a Redis store and a zone named fleet.
type fleetSpec struct {
	// store is the store redis block's body (redisStore).
	store string
	// options are the handler's other lines; default on_store_error
	// deny, so that no store error passes for an allowed request.
	options string
	// zone is the zone block's body.
	zone string
	// upstream is the app (host:port), or "" for Caddy to answer "ok".
	upstream string
}

// startFleet starts n Caddy processes as spec says, each answering /ready
// itself. The processes are killed when t ends.
func startFleet(t *testing.T, n int, spec fleetSpec) []instance {
	t.Helper()
	serve := "respond \"ok\""
	if spec.upstream != "" {
		serve = "reverse_proxy " + spec.upstream
	}
	if spec.options == "" {
		spec.options = "on_store_error deny"
	}
	var fleet []instance
	for range n {
		fleet = append(fleet, startInstance(t, fmt.Sprintf(`	rate_limit {
		%s
		%s
		zone fleet {
%s
		}
	}
	%s
`, redisStore(spec.store), spec.options, spec.zone, serve), "/work"))
	}
	return fleet
}

// startInstance starts one Caddy process, logging JSON to a file of its
// own, whose site on a free port of the suite's address answers /ready
// itself and holds body (site block lines) for everything else; the
// instance's url names path on the site.
func startInstance(t *testing.T, body, path string) instance {
	t.Helper()
	return startInstanceWith(t, "", body, path)
}

// startInstanceWith is startInstance with extra global options.
func startInstanceWith(t *testing.T, options, body, path string) instance {
	t.Helper()
	site, admin := freePort(), onLoopback(freePort())
	siteURL := "http://" + onLoopback(site)
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	globals := caddyGlobals(adminOption(admin), site, freePort(), jsonLog(logFile, "INFO")+"\n\t"+options)
	proc := startProcess(t, globals+siteURL+" {\n\thandle /ready {\n\t\trespond \"ok\"\n\t}\n"+body+"}\n", siteURL+"/ready")
	return instance{url: siteURL + path, admin: "http://" + admin, log: logFile, proc: proc}
}

// urls are the fleet's zone sites.
func urls(fleet []instance) []string {
	var out []string
	for _, in := range fleet {
		out = append(out, in.url)
	}
	return out
}

// perClient is a zone body for startFleet: limit requests per hour per
// X-Client.
func perClient(limit int) string {
	return fmt.Sprintf("\t\t\tkey {header.X-Client}\n\t\t\tlimit %d\n\t\t\twindow 1h", limit)
}
