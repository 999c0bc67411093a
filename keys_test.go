package ratelimit

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// TestHiddenKey: a hidden key is "#" and 16 hex digits, the same for the
// same key, different for different keys, and not the bare SHA-256 of the
// key, which anyone could compute for every IPv4 address and look up.
func TestHiddenKey(t *testing.T) {
	form := regexp.MustCompile(`^#[0-9a-f]{16}$`)
	keys := []string{"192.0.2.7", "192.0.2.8", "sk_live_0123456789", ""}
	seen := map[string]string{}
	for _, k := range keys {
		h := hiddenKey(k)
		if !form.MatchString(h) {
			t.Errorf("hiddenKey(%q) = %q, want # and 16 hex digits", k, h)
		}
		if again := hiddenKey(k); again != h {
			t.Errorf("hiddenKey(%q) = %q, then %q", k, h, again)
		}
		sum := sha256.Sum256([]byte(k))
		if h == "#"+hex.EncodeToString(sum[:8]) {
			t.Errorf("hiddenKey(%q) is the key's bare SHA-256", k)
		}
		if other, ok := seen[h]; ok {
			t.Errorf("keys %q and %q both hash to %s", other, k, h)
		}
		seen[h] = k
	}
}

// TestLogKeyShowsKeys: mholt's log_key shows keys as log_keys on does;
// without either, keys are hashes.
func TestLogKeyShowsKeys(t *testing.T) {
	for _, c := range []struct {
		config string
		want   string
	}{
		{`{"log_key":true,"zones":[{"name":"unit_log_key","limit":1,"window":"1h"}]}`, "k"},
		{`{"log_keys":"on","zones":[{"name":"unit_log_keys_on","limit":1,"window":"1h"}]}`, "k"},
		{`{"zones":[{"name":"unit_log_keys_default","limit":1,"window":"1h"}]}`, hiddenKey("k")},
	} {
		h := provisionHandler(t, c.config)
		if got := h.keyField("k"); got.String != c.want {
			t.Errorf("%s: key logged as %q, want %q", c.config, got.String, c.want)
		}
	}
}

// TestLoggedKeysEscaped: a key shown as it is (log_keys on) with an
// escape sequence and a line break is written escaped in Caddy's log
// formats, json and console alike: it can neither drive the terminal
// that shows the log nor forge a line.
func TestLoggedKeysEscaped(t *testing.T) {
	h := provisionHandler(t, `{"log_keys":"on","zones":[{"name":"unit_logged_escaped","key":["{http.request.header.X-Api-Key}"],"limit":[1],"window":"1m"}]}`)
	for name, enc := range map[string]zapcore.Encoder{
		"json":    zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()),
		"console": zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()),
	} {
		var out strings.Builder
		zap.New(zapcore.NewCore(enc, zapcore.AddSync(&out), zap.InfoLevel)).Info("rate limit exceeded", h.keyField("\x1b[2J\r\nforged"))
		if line := out.String(); strings.ContainsAny(strings.TrimSuffix(line, "\n"), "\x1b\r\n") || !strings.Contains(line, `\u001b[2J\r\nforged`) {
			t.Errorf("%s: logged %q, want the key escaped", name, line)
		}
	}
}
