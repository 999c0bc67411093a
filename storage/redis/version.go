package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// minRedisVersion is the oldest Redis the store's scripts run on. The
// take, admin and announce scripts read the server's clock (TIME) and then
// write; Redis lets a script write after a command whose answer varies
// only when it replicates the script by its effects, which is the default
// from Redis 5.0 on (and the only way from 7.0 on). Older servers refuse
// the write ("Write commands not allowed after non deterministic
// commands"). The scripts also set several hash fields in one HSET, which
// Redis 4.0 brought.
var minRedisVersion = [3]int{5, 0, 0}

// minRedisText is minRedisVersion as the store's messages write it.
const minRedisText = "5.0"

// serverCheckTimeout bounds the version check Provision makes: a Redis
// that does not answer within it is checked when its connections are
// made.
const serverCheckTimeout = time.Second

// errOldServer is a Redis server older than minRedisVersion.
type errOldServer struct {
	server, version string
}

func (e *errOldServer) Error() string {
	return fmt.Sprintf("Redis at %s is version %s; the rate_limit store needs Redis %s or later (its scripts read the server's clock and then write, which Redis allows by default from %s on)",
		e.server, e.version, minRedisText, minRedisText)
}

// versionBelow reports whether version ("7.0.15", "4.0.14") is older
// than least; ok is false if version cannot be read as numbers.
func versionBelow(version string, least [3]int) (below, ok bool) {
	fields := strings.SplitN(version, ".", 3)
	var v [3]int
	for i, f := range fields {
		// Digits only, so "7.2.0-rc1" reads as 7.2.0.
		end := 0
		for end < len(f) && f[end] >= '0' && f[end] <= '9' {
			end++
		}
		n, err := strconv.Atoi(f[:end])
		if err != nil {
			return false, false
		}
		v[i] = n
	}
	for i := range v {
		if v[i] != least[i] {
			return v[i] < least[i], true
		}
	}
	return false, true
}

// serverInfo reads the fields the version check needs from INFO server's
// answer: redis_version and redis_mode.
func serverInfo(info string) (version, mode string) {
	for line := range strings.Lines(info) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		switch {
		case !ok:
		case k == "redis_version":
			version = v
		case k == "redis_mode":
			mode = v
		}
	}
	return version, mode
}

// versionCheck checks every connection the store's client makes, before
// any command of the store goes on it, so that a server too old for the
// scripts is refused whenever the client first reaches it: at Provision,
// or, if Redis was out of reach then, on the first connection made
// later, and after a failover to an old replica too. It logs the first
// version it finds, and once, why it could not check.
type versionCheck struct {
	logger  *zap.Logger
	logged  sync.Once
	refused sync.Once
	blind   sync.Once
}

// onConnect is the go-redis OnConnect hook. A server that will not say
// its version (INFO renamed away, or not allowed to the store's ACL user)
// is let through: only a version known to be too old is refused. A
// Sentinel is not checked: the scripts run on the master it names, whose
// connections are.
func (v *versionCheck) onConnect(ctx context.Context, cn *goredis.Conn) error {
	server := serverName(cn)
	info, err := cn.Info(ctx, "server").Result()
	var refusal goredis.Error
	if errors.As(err, &refusal) {
		v.blind.Do(func() {
			v.logger.Warn("cannot read the Redis server's version, so the rate_limit store does not check it",
				zap.String("server", server), zap.Error(err), zap.String("needs", minRedisText+" or later"))
		})
		return nil
	}
	if err != nil {
		return err
	}
	version, mode := serverInfo(info)
	if mode == "sentinel" {
		return nil
	}
	below, ok := versionBelow(version, minRedisVersion)
	if below {
		old := &errOldServer{server: server, version: version}
		v.refused.Do(func() { v.logger.Error("Redis server too old for the rate_limit store", zap.Error(old)) })
		return old
	}
	if ok {
		v.logged.Do(func() {
			v.logger.Info("Redis server version", zap.String("server", server), zap.String("version", version),
				zap.String("needs", minRedisText+" or later"))
		})
	}
	return nil
}

// serverName is the address a connection is to, as go-redis names its
// client ("Redis<127.0.0.1:6379 db:0>"); a Sentinel group's master is
// reached through the sentinels.
func serverName(cn *goredis.Conn) string {
	name := strings.TrimPrefix(cn.String(), "Redis<")
	name, _, _ = strings.Cut(name, " db:")
	if name == "FailoverClient" {
		return "the sentinels' master"
	}
	return name
}

// checkServers makes sure the client has reached its servers within
// timeout, so that a connection's version check has run: every master of
// a cluster, else the one server. It returns the refusal of a server too
// old, and any other error as such (Redis out of reach).
func (c *client) checkServers(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if cc, ok := c.rdb.(*goredis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, m *goredis.Client) error {
			return m.Ping(ctx).Err()
		})
	}
	return c.rdb.Ping(ctx).Err()
}
