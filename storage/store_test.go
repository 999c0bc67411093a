package storage

import (
	"strings"
	"testing"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
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

// TestFinishing: a finish keeps a true-up's actual cost in place of the
// reservation, whatever Counted says; without a true-up, a Counted cost
// stays and any other is released whole; a concurrency request releases
// its whole cost whatever it is told.
func TestFinishing(t *testing.T) {
	for _, c := range []struct {
		name          string
		q             Request
		release, debt int64
	}{
		{"released", Request{Cost: 5}, 5, 0},
		{"counted", Request{Cost: 5, Counted: true}, 0, 0},
		{"trued up to less", Request{Cost: 5, TrueUp: true, Actual: 2}, 3, 0},
		{"trued up to more", Request{Cost: 5, TrueUp: true, Actual: 9}, 0, 4},
		{"trued up to itself", Request{Cost: 5, TrueUp: true, Actual: 5}, 0, 0},
		{"trued up and counted", Request{Cost: 5, TrueUp: true, Actual: 7, Counted: true}, 0, 2},
		{"trued up to a negative cost", Request{Cost: 5, TrueUp: true, Actual: -3}, 5, 0},
		{"an actual without a true-up", Request{Cost: 5, Actual: 9}, 5, 0},
		{"concurrency", Request{Algorithm: algorithms.Concurrency, Cost: 2, TrueUp: true, Actual: 9, Counted: true}, 2, 0},
	} {
		if release, debt := c.q.Finishing(); release != c.release || debt != c.debt {
			t.Errorf("%s: releases %d and owes %d, want %d and %d", c.name, release, debt, c.release, c.debt)
		}
	}
}
