package ratelimit_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestStatusPageInBrowser loads the admin endpoint's status page in
// headless Chromium from a running Caddy, after a hammering client
// (runaway) got 429s. Once its script has fetched the JSON routes, the
// page shows the zone, runaway as its hottest key with its counts, and the
// load shedder; a key that is HTML shows as text, not markup; and the page
// fetched again (it refreshes itself).
func TestStatusPageInBrowser(t *testing.T) {
	integration(t)
	browser := chromium(t)
	site, admin := freeLoopbackPort(t), freeLoopbackPort(t)
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	// A browser's navigation to the admin endpoint carries neither Origin
	// nor Referer; Caddy lets it in only where the empty origin is allowed,
	// as docs/operating.md tells operators to do for the status page.
	adminBlock := fmt.Sprintf("admin 127.0.0.1:%d {\n\t\torigins 127.0.0.1:%d \"\"\n\t}\n\t%s", admin, admin, jsonLog(logFile, "INFO"))
	globals := strings.Replace(processGlobals(t, admin, site), fmt.Sprintf("admin 127.0.0.1:%d", admin), adminBlock, 1)
	siteURL := fmt.Sprintf("http://127.0.0.1:%d/", site)
	startProcess(t, globals+fmt.Sprintf(`http://127.0.0.1:%d {
	rate_limit {
		shed backend {
			classes critical normal
			capacity 8
		}
		zone per_client {
			key {header.X-Client}
			limit 5
			window 1h
		}
	}
	respond "ok"
}
`, site), siteURL)

	urls := []string{siteURL}
	if codes := burst(urls, "runaway", 40); codes[http.StatusOK] != 5 || codes[http.StatusTooManyRequests] != 35 {
		t.Fatalf("runaway's 40 requests: %v, want 5 allowed and 35 rejected", codes)
	}
	burst(urls, "<b>x</b>", 2)
	for _, key := range []string{"alice", "bob"} {
		burst(urls, key, 1)
	}

	// Six seconds of the page's virtual time, which Chromium runs at once
	// and stops while a fetch is under way: the first fetches and two
	// refreshes.
	start := time.Now()
	dom := headless(t, browser, fmt.Sprintf("http://127.0.0.1:%d/rate_limit/", admin), "--virtual-time-budget=6000", "--dump-dom")
	t.Logf("Chromium rendered the page in %v", time.Since(start).Round(time.Millisecond))
	_, status, _ := strings.Cut(dom, `id="status"`)
	if status, _, _ = strings.Cut(status, "</p>"); !strings.Contains(status, "Updated") {
		t.Fatalf("the page's status line: %s, want Updated\n%s", status, dom)
	}
	for _, want := range []string{">per_client<", ">backend<", ">40<", ">35<"} {
		if !strings.Contains(dom, want) {
			t.Errorf("the rendered page lacks %q", want)
		}
	}
	if _, rows, _ := strings.Cut(dom, `class="key">`); !strings.HasPrefix(rows, "runaway<") {
		t.Errorf("the first key row is not runaway's")
	}
	if !strings.Contains(dom, ">&lt;b&gt;x&lt;/b&gt;<") || strings.Contains(dom, "<b>x</b>") {
		t.Errorf("the key <b>x</b> is not shown as text")
	}
	if t.Failed() {
		t.Fatalf("rendered page:\n%s", dom)
	}
	// The browser is the only client of GET /rate_limit/zones here.
	if n := len(logLines(logFile, `"received request"`, `"uri":"/rate_limit/zones"`)); n < 2 {
		t.Fatalf("the page fetched /rate_limit/zones %d times, want at least 2: it refreshes itself", n)
	}
}

// chromium returns the path of a Chromium (or Chrome) binary. Without one
// it skips t, or fails it under CI=true: CI must install one.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no chromium on PATH; CI must install it (Debian: apt-get install chromium)")
	}
	t.Skip("no chromium on PATH; install it (Debian: apt-get install chromium) to run the status page's browser test")
	return ""
}

// headless runs the browser headless on url with args (such as
// --dump-dom) and returns what it printed. Its profile is a new empty
// directory; background networking, updates and sync are off, since
// nothing but loopback is reachable, and the sandbox too, since tests may
// run as root.
func headless(t *testing.T, browser, url string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	args = append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir=" + t.TempDir()}, args...)
	cmd := exec.CommandContext(ctx, browser, append(args, url)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	// Its helper processes may hold stdout open after it exits.
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", browser, err, stderr.String())
	}
	return string(out)
}
