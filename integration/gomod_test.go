package integration

import (
	"go/version"
	"os/exec"
	"strings"
	"testing"
)

// TestGoDirectiveAsksNoNewerToolchain: go.mod asks users for no newer Go
// than the newest of its dependencies does, since every build of Caddy
// with this module must meet it.
func TestGoDirectiveAsksNoNewerToolchain(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list; not in the -short unit tier, which starts no process")
	}
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Main}} {{.GoVersion}}", "all").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var own, newest string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		main, v, _ := strings.Cut(line, " ")
		if v == "" {
			continue
		}
		if main == "true" {
			own = v
		} else if newest == "" || version.Compare("go"+v, "go"+newest) > 0 {
			newest = v
		}
	}
	if own == "" || newest == "" {
		t.Fatalf("go list gave no versions:\n%s", out)
	}
	if version.Compare("go"+own, "go"+newest) > 0 {
		t.Fatalf("go.mod says go %s; the newest any dependency asks for is go %s", own, newest)
	}
}
