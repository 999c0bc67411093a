package admin

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/d61b427a/caddy-rate-limit/internal/badconfig"
)

// TestGlobalOption: a bad value of the global option rate_limit, an
// unknown subdirective and a second rate_limit block are refused, naming
// what is wrong. (What a good one adapts to is in the root package's
// testdata/caddyfile_adapt/global_options.caddyfiletest.)
func TestGlobalOption(t *testing.T) {
	adapter := caddyconfig.GetAdapter("caddyfile")
	site := ":9080 {\n\trespond \"ok\"\n}\n"
	for _, c := range []struct{ name, global, directive, value string }{
		{"bad value", "rate_limit {\n\t\tadmin_changes never\n\t}", "admin_changes", "never"},
		{"unknown", "rate_limit {\n\t\tlog_keys on\n\t}", "rate_limit", "log_keys"},
		{"repeated", "rate_limit {\n\t\tadmin_changes off\n\t\tadmin_changes on\n\t}", "admin_changes", "repeated"},
		{"body_memory too small", "rate_limit {\n\t\tbody_memory 1MiB\n\t}", "body_memory", "1048576"},
		{"body_memory not a size", "rate_limit {\n\t\tbody_memory lots\n\t}", "body_memory", "lots"},
		{"body_timeout too short", "rate_limit {\n\t\tbody_timeout 10ms\n\t}", "body_timeout", "10ms"},
		{"body_timeout not a duration", "rate_limit {\n\t\tbody_timeout soon\n\t}", "body_timeout", "soon"},
		{"twice", "rate_limit {\n\t\tadmin_changes off\n\t}\n\trate_limit {\n\t\tadmin_changes off\n\t}", "rate_limit", "repeated"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := adapter.Adapt([]byte("{\n\t"+c.global+"\n}\n"+site), nil)
			if err == nil {
				t.Fatal("adapted without error")
			}
			badconfig.AssertNames(t, err.Error(), c.directive, c.value)
		})
	}
	if err := (&App{AdminChanges: "never"}).Validate(); err == nil {
		t.Fatal(`JSON admin_changes "never" accepted`)
	}
	if err := (&App{BodyMemory: 1 << 20}).Validate(); err == nil {
		t.Fatal("JSON body_memory of 1 MiB accepted")
	}
	if err := (&App{BodyTimeout: caddy.Duration(time.Millisecond)}).Validate(); err == nil {
		t.Fatal("JSON body_timeout of 1ms accepted")
	}
}

// assertNames fails unless err names the directive, once, and the value
// at fault, and says what was wanted.
func assertNames(t *testing.T, err string, directive, value string) {
	t.Helper()
	if !strings.Contains(err, directive) || !strings.Contains(err, value) {
		t.Fatalf("error does not name %q and %q:\n%s", directive, value, err)
	}
	if n := len(regexp.MustCompile(`(^|[^a-z_.])`+regexp.QuoteMeta(directive)+`:`).FindAllString(err, -1)); n > 1 {
		t.Fatalf("error names %q %d times:\n%s", directive, n, err)
	}
	if !strings.Contains(err, "want") {
		t.Fatalf("error does not say what was expected:\n%s", err)
	}
}
