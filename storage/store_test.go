package storage

import (
	"strings"
	"testing"
)

func TestBoundKey(t *testing.T) {
	long := strings.Repeat("k", 16<<10)
	for _, c := range []struct {
		key  string
		kept bool
	}{
		{"203.0.113.9", true},
		{"user:42", true},
		{strings.Repeat("x", MaxKeyLen), true},
		{strings.Repeat("x", MaxKeyLen+1), false},
		{long, false},
		{"", false},
		{"#abc", false},
		{"a{b", false},
		{"a}b", false},
	} {
		got := BoundKey(c.key)
		if c.kept && got != c.key {
			t.Errorf("BoundKey(%.20q) = %q, want it kept", c.key, got)
		}
		if !c.kept && (len(got) != 33 || got[0] != '#' || got == c.key) {
			t.Errorf("BoundKey(%.20q) = %q, want '#' and 32 hex digits", c.key, got)
		}
		if BoundKey(c.key) != got {
			t.Errorf("BoundKey(%.20q) is not deterministic", c.key)
		}
	}
	if BoundKey(BoundKey(long)) == BoundKey(long) {
		t.Error("a key that looks hashed maps to the hashed key's counter")
	}
}

// BenchmarkBoundKey measures the check every request's key goes through,
// for keys kept as they are.
func BenchmarkBoundKey(b *testing.B) {
	keys := []string{"203.0.113.9", "key:k-123", "2001:db8::1", "user-1234567890abcdef"}
	for i := 0; b.Loop(); i++ {
		_ = BoundKey(keys[i%len(keys)])
	}
}
