package ratelimit

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// This file runs the Caddy that users build: ./cmd/caddy, compiled once
// per test binary, as separate processes.

// caddyBinary builds ./cmd/caddy once per test binary, in binaryDir,
// which TestMain removes.
var caddyBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "rate-limit-caddy-")
	if err != nil {
		return "", err
	}
	binaryDir = dir
	bin := filepath.Join(dir, "caddy")
	out, err := exec.Command("go", "build", "-o", bin, "./cmd/caddy").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build ./cmd/caddy: %w\n%s", err, out)
	}
	return bin, nil
})

var binaryDir string

// TestMain removes the built Caddy (about 90 MB) when the tests are done.
func TestMain(m *testing.M) {
	code := m.Run()
	if binaryDir != "" {
		os.RemoveAll(binaryDir)
	}
	os.Exit(code)
}

// caddyCommand returns the built Caddy with args, killed if ctx ends, its
// home and data directories in a temporary directory so it leaves nothing
// behind.
func caddyCommand(ctx context.Context, t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	bin, err := caddyBinary()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	return cmd
}

// freeLoopbackPort returns a port that is free on 127.0.0.1 now.
func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// processGlobals is the global options block of a Caddy run as a
// process of its own: its admin API and its HTTP port on loopback, an
// unused HTTPS port, and nothing installed or saved.
func processGlobals(t *testing.T, admin, site int) string {
	return fmt.Sprintf(`{
	admin 127.0.0.1:%d
	http_port %d
	https_port %d
	skip_install_trust
	persist_config off
}
`, admin, site, freeLoopbackPort(t))
}

// startProcess runs the built Caddy with caddyfile and waits until it
// answers readyURL. The process is killed when t ends; its output is
// logged if t failed.
func startProcess(t *testing.T, caddyfile, readyURL string) {
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
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
		select {
		case <-done:
			t.Fatalf("caddy exited: %v\n%s", cmd.ProcessState, logs.String())
		default:
		}
		resp, err := http.Get(readyURL)
		if err == nil {
			resp.Body.Close()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("caddy did not serve %s within 20s", readyURL)
}
