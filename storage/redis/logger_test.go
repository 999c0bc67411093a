package redis

import (
	"context"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestGoRedisLogBounded: go-redis's own lines reach the logger at warn
// level, at most one a second, the first at once.
func TestGoRedisLogBounded(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	l := &goredisLog{logger: func() *zap.Logger { return zap.New(core) }}
	for range 100 {
		l.Printf(context.Background(), "redis: connection pool: failed to dial after %d attempts: %v\n", 5, "connection refused")
	}
	entries := logs.All()
	if len(entries) != 1 {
		t.Fatalf("%d lines for 100 within a second, want 1", len(entries))
	}
	e := entries[0]
	if e.Level != zapcore.WarnLevel || e.LoggerName != "rate_limit.redis" ||
		e.Message != "redis: connection pool: failed to dial after 5 attempts: connection refused" ||
		e.ContextMap()["lines_since_last_log"] != int64(1) {
		t.Fatalf("line: %+v %v", e.Entry, e.ContextMap())
	}
}
