// Package docs reads the project's Markdown documents for the tests that
// hold them to the code: the root package's unit tests adapt their
// Caddyfile examples, and the integration tests run what they show (curl
// commands, Caddyfiles) against a running Caddy. Paths are the caller's,
// relative to its package's directory.
package docs

import (
	"os"
	"strings"
	"testing"
)

// Read returns file's text, failing t if it cannot be read.
func Read(t testing.TB, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Section returns the part of file under the heading "## title", up to the
// next heading of that level, failing t if there is no such heading.
func Section(t testing.TB, file, title string) string {
	t.Helper()
	_, section, ok := strings.Cut(Read(t, file), "\n## "+title+"\n")
	if !ok {
		t.Fatalf("%s has no %q section", file, title)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	return section
}

// FencedBlocks returns the contents of text's code blocks fenced as lang
// ("" for none).
func FencedBlocks(text, lang string) []string {
	var out []string
	for _, part := range strings.Split(text, "```"+lang+"\n")[1:] {
		block, _, _ := strings.Cut(part, "```")
		out = append(out, block)
	}
	return out
}
