// Package integration holds the tests that start processes: most start
// Caddy, in this process or as the built ./cmd/caddy, and send it real
// HTTP requests; those of the Redis store start their own redis-server
// processes on free loopback ports, those of the status page a headless
// Chromium, and the check of go.mod runs go list. Under -short the
// helpers that start Caddy (and internal/redistest's, which start Redis)
// skip the test, leaving the unit tests of the other packages.
// helpers_test.go holds what the tests share, process_test.go what runs
// the built Caddy.
package integration

import (
	"fmt"
	"os"
	"testing"

	// Caddy's standard modules and the module under test, registered as
	// a build of Caddy with the module has them.
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/d61b427a/caddy-rate-limit"
)

// TestMain removes the in-process Caddy's storage and the built Caddy
// (about 90 MB) when the tests are done, and the in-process Caddy's log
// unless a test failed.
func TestMain(m *testing.M) {
	code := m.Run()
	os.RemoveAll(caddyStorage)
	if binaryDir != "" {
		os.RemoveAll(binaryDir)
	}
	if code == 0 {
		os.Remove(caddyLog)
	} else if _, err := os.Stat(caddyLog); err == nil {
		fmt.Fprintf(os.Stderr, "the in-process Caddy's log: %s\n", caddyLog)
	}
	os.Exit(code)
}

// integration skips t under -short: it starts Caddy.
func integration(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts Caddy; not in the -short unit tier")
	}
}
