package ratelimit

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// update rewrites the golden files with what the Caddyfiles adapt to now:
// `go test -run TestCaddyfileAdapt -update .`, then read the diff.
var update = flag.Bool("update", false, "rewrite testdata/caddyfile_adapt/*.caddyfiletest with what their Caddyfiles adapt to")

// adaptSeparator parts a golden file's Caddyfile from what it adapts to,
// as in Caddy's own caddytest/integration/caddyfile_adapt.
const adaptSeparator = "----------"

// TestCaddyfileAdapt adapts the Caddyfile of each
// testdata/caddyfile_adapt/*.caddyfiletest file, as `caddy adapt` does,
// and compares the result with the JSON below the file's line of dashes;
// or, where that part is not JSON, with the error it quotes. A new
// Caddyfile form is a new file, read as the user writes it.
func TestCaddyfileAdapt(t *testing.T) {
	files, err := filepath.Glob("testdata/caddyfile_adapt/*.caddyfiletest")
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden Caddyfiles: %v", err)
	}
	// Every subdirective the parser takes opens a line of some golden
	// Caddyfile.
	written := make(map[string]bool)
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		src, _, _ := strings.Cut(string(b), "\n"+adaptSeparator+"\n")
		for line := range strings.Lines(src) {
			if fields := strings.Fields(line); len(fields) > 0 {
				written[fields[0]] = true
			}
		}
	}
	handler, zone := subdirectives(t)
	for _, sub := range append(handler, zone...) {
		if !written[sub] {
			t.Errorf("no golden Caddyfile writes %s", sub)
		}
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".caddyfiletest"), func(t *testing.T) {
			b, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			src, want, ok := strings.Cut(string(b), "\n"+adaptSeparator+"\n")
			if !ok {
				t.Fatalf("no line %q between the Caddyfile and what it adapts to", adaptSeparator)
			}
			src, want = strings.TrimSpace(src)+"\n", strings.TrimSpace(want)
			got := adaptForGolden(t, src)
			if *update {
				if err := os.WriteFile(file, []byte(strings.TrimSpace(src)+"\n"+adaptSeparator+"\n"+got+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			if strings.HasPrefix(want, "{") {
				if got != want {
					t.Fatalf("adapted JSON differs from the golden file's %s(go test -run TestCaddyfileAdapt -update . rewrites it)", firstDifference(got, want))
				}
			} else if !strings.Contains(got, want) {
				t.Fatalf("adapting said\n%s\nwant an error that says\n%s", got, want)
			}
		})
	}
}

// adaptForGolden returns what src adapts to, as indented JSON, or its
// error's text; a warning fails t, since no golden form should earn one.
func adaptForGolden(t *testing.T, src string) string {
	t.Helper()
	out, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		return err.Error()
	}
	for _, w := range warnings {
		t.Errorf("warning: %s", w)
	}
	var indented bytes.Buffer
	if err := json.Indent(&indented, out, "", "\t"); err != nil {
		t.Fatal(err)
	}
	return indented.String()
}

// firstDifference says where got and want first part, line by line.
func firstDifference(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := range max(len(g), len(w)) {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return fmt.Sprintf("line %d:\n got: %s\nwant: %s\n", i+1, strings.TrimSpace(gl), strings.TrimSpace(wl))
		}
	}
	return ""
}
