package redis

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
	"github.com/d61b427a/caddy-rate-limit/internal/wait"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

func TestVersionBelow(t *testing.T) {
	for _, c := range []struct {
		version   string
		below, ok bool
	}{
		{"4.0.14", true, true},
		{"4.9.999", true, true},
		{"3.2.0", true, true},
		{"5.0.0", false, true},
		{"5.0", false, true},
		{"5", false, true},
		{"5.0.14", false, true},
		{"6.2.6", false, true},
		{"7.0.15", false, true},
		{"7.2.0-rc1", false, true},
		{"10.0.0", false, true},
		{"255.255.255", false, true},
		{"", false, false},
		{"unknown", false, false},
		{"v7.0.0", false, false},
	} {
		below, ok := versionBelow(c.version, minRedisVersion)
		if below != c.below || ok != c.ok {
			t.Errorf("versionBelow(%q) = %v, %v; want %v, %v", c.version, below, ok, c.below, c.ok)
		}
	}
}

func TestServerInfo(t *testing.T) {
	info := "# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\nredis_mode:standalone\r\nos:Linux\r\n"
	if v, m := serverInfo(info); v != "7.0.15" || m != "standalone" {
		t.Fatalf("serverInfo = %q, %q", v, m)
	}
	if v, m := serverInfo("# Server\r\nredis_version:7.0.15\r\nredis_mode:sentinel\r\n"); v != "7.0.15" || m != "sentinel" {
		t.Fatalf("serverInfo of a sentinel = %q, %q", v, m)
	}
}

// TestRedisVersionOfARealServer: the store's client reaches a real
// redis-server, whose version passes, and logs it.
func TestRedisVersionOfARealServer(t *testing.T) {
	s := redistest.Standalone(t)
	want, err := s.Info("server", "redis_version")
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	c := newClient(&goredis.UniversalOptions{Addrs: []string{s.Addr}, Protocol: 2, DisableIdentity: true}, zap.New(core))
	t.Cleanup(func() { c.Destruct() })
	if err := c.checkServers(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	lines := logs.FilterMessage("Redis server version").All()
	if len(lines) != 1 || lines[0].ContextMap()["version"] != want || lines[0].ContextMap()["server"] != s.Addr {
		t.Fatalf("logged %v, want one line with version %s of %s", lines, want, s.Addr)
	}
	// Every new connection checks again, and the version is logged once
	// per client, not per connection.
	_ = c.rdb.Do(context.Background(), "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "no").Err()
	wait.For(t, "the client to connect again", func() bool { return c.checkServers(5*time.Second) == nil })
	stats, err := s.CommandStats()
	if err != nil {
		t.Fatal(err)
	}
	if stats["info"] < 2 {
		t.Fatalf("INFO answered %d times, want a check on the first connection and on the one after it", stats["info"])
	}
	if n := logs.FilterMessage("Redis server version").Len(); n != 1 {
		t.Fatalf("%d version lines after a reconnection, want 1", n)
	}
}

// TestRedisOldServerRefusedAtProvision: a store whose server answers with
// a version older than the scripts need is refused when it is set up, and
// the refusal names the version found and the one needed.
func TestRedisOldServerRefusedAtProvision(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	redistest.ServeOld(t, l, "4.0.14")
	r := &Store{Addresses: []string{l.Addr().String()}, Timeout: caddy.Duration(5 * time.Second)}
	err = r.Provision(caddy.Context{})
	r.Cleanup()
	var old *errOldServer
	if !errors.As(err, &old) || !strings.Contains(err.Error(), "4.0.14") || !strings.Contains(err.Error(), "5.0 or later") || !strings.Contains(err.Error(), l.Addr().String()) {
		t.Fatalf("Provision: %v; want a refusal naming the server, version 4.0.14 and 5.0", err)
	}
}

// TestRedisOldServerRefusedOnConnecting: a store set up while its server
// was out of reach is not refused then; once the server answers, with a
// version too old, every decision fails with the refusal, a store error
// for on_store_error to handle.
func TestRedisOldServerRefusedOnConnecting(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // out of reach at Provision
	r := newRedisStore(t, new(Store), addr)
	if l, err = net.Listen("tcp", addr); err != nil {
		t.Skipf("the port was taken meanwhile: %v", err)
	}
	redistest.ServeOld(t, l, "4.0.14")
	q := storage.Request{Zone: "z", Key: "k", Algorithm: algorithms.FixedWindow, Rate: algorithms.Rate{Units: 5, Window: time.Minute}, Cost: 1}
	err = r.Take(context.Background(), []storage.Request{q}, make([]algorithms.Decision, 1))
	var old *errOldServer
	if !errors.As(err, &old) || !strings.Contains(err.Error(), "4.0.14") {
		t.Fatalf("Take on a server of Redis 4.0.14: %v; want the refusal", err)
	}
}
