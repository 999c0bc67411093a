package redis

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/d61b427a/caddy-rate-limit/internal/logevery"
)

// go-redis writes lines of its own (a pool's failed dial, a sentinel's
// new master) to standard error, one each, with no level: while Redis is
// down that is a line per dial, outside Caddy's log and its settings.
// Its logger is one for the process, so the first Redis store provisioned
// sends them to Caddy's log instead, at warn level and at most one a
// second, each counting those held back.
var useCaddyLog sync.Once

func routeGoRedisLog() {
	useCaddyLog.Do(func() { goredis.SetLogger(&goredisLog{logger: caddy.Log}) })
}

// goredisLog is go-redis's logger in Caddy's log.
type goredisLog struct {
	every logevery.Limiter
	// logger returns the logger of the moment (Caddy's default logger,
	// so that a line follows the config loaded last).
	logger func() *zap.Logger
}

func (l *goredisLog) Printf(_ context.Context, format string, v ...any) {
	if n, ok := l.every.Allow(time.Now()); ok {
		l.logger().Named("rate_limit.redis").Warn(strings.TrimSpace(fmt.Sprintf(format, v...)),
			zap.Int64("lines_since_last_log", n))
	}
}
