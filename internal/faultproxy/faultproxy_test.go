package faultproxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
	"github.com/d61b427a/caddy-rate-limit/internal/wait"
	"github.com/redis/go-redis/v9"
)

// start runs a redis-server behind a proxy, both stopped when t ends.
func start(t *testing.T) (*redistest.Server, *Proxy) {
	t.Helper()
	s := redistest.Standalone(t)
	p, err := Start(s.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return s, p
}

// client is a go-redis client of the proxy that never retries, so that a
// fault shows as the command's error.
func client(t *testing.T, p *Proxy) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL(p.URL())
	if err != nil {
		t.Fatal(err)
	}
	opts.Protocol = 2
	opts.PoolSize = 1
	opts.MaxRetries = -1
	opts.DisableIdentity = true
	opts.ReadTimeout = 15 * time.Second
	opts.WriteTimeout = 15 * time.Second
	c := redis.NewClient(opts)
	t.Cleanup(func() { c.Close() })
	return c
}

// latency is what TestLatency and the fault tier's timing set.
const latency = 300 * time.Millisecond

// slowed starts a proxy and a client connected through it, then sets the
// proxy's latency.
func slowed(t *testing.T) (*Proxy, *redis.Client) {
	t.Helper()
	_, p := start(t)
	c := client(t, p)
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	p.SetLatency(latency)
	return p, c
}

func TestLatency(t *testing.T) {
	p, c := slowed(t)
	ctx := context.Background()
	const d = latency
	begin := time.Now()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// The command and its reply are each delayed by d.
	if rtt := time.Since(begin); rtt < 2*d {
		t.Fatalf("PING took %v with latency %v, want at least %v", rtt, d, 2*d)
	}

	// Five commands written one by one reach the server in order, each
	// delayed by d: the replies are in order, and the first comes no sooner
	// than the latency there and back. (That each is delayed d after its
	// own write, not d after the one before, is a bound from above, checked
	// in the fault tier: TestLatencyDoesNotSerialize.)
	conn, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	begin = time.Now()
	r := echoFive(t, conn)
	if took := time.Since(begin); took < 2*d {
		t.Fatalf("five ECHOs took %v with latency %v, want at least %v", took, d, 2*d)
	}

	// A chunk already waiting under a long latency goes as soon as the
	// latency is turned off.
	p.SetLatency(time.Minute)
	fmt.Fprintf(conn, "PING\r\n")
	conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := r.ReadByte(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("PING under a minute's latency: %v, want no reply yet", err)
	}
	p.SetLatency(0)
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if line, err := r.ReadString('\n'); err != nil || line != "+PONG\r\n" {
		t.Fatalf("PING after the latency was turned off: %q, %v", line, err)
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
}

// echoFive writes five ECHOs on conn one by one, each in a read of its own
// at the proxy, and reads their replies, which must come in order.
func echoFive(t *testing.T, conn net.Conn) *bufio.Reader {
	t.Helper()
	for i := range 5 {
		fmt.Fprintf(conn, "ECHO %d\r\n", i)
		time.Sleep(time.Millisecond) // separate reads at the proxy
	}
	r := bufio.NewReader(conn)
	for i := range 5 {
		var n int
		if _, err := fmt.Fscanf(r, "$1\r\n%d\r\n", &n); err != nil || n != i {
			t.Fatalf("reply %d: %d, %v", i, n, err)
		}
	}
	return r
}

func TestReset(t *testing.T) {
	_, p := start(t)
	c := client(t, p)
	ctx := context.Background()
	// A dedicated connection: the pool would check a connection taken
	// from it and quietly replace one that was reset while idle.
	conn := c.Conn()
	if err := conn.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if n := p.Reset(); n != 1 {
		t.Fatalf("Reset closed %d connections, want 1", n)
	}
	err := conn.Ping(ctx).Err()
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("PING on the reset connection: %v, want a connection reset", err)
	}
	conn.Close()
	// The proxy still accepts: a new connection works.
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING on a new connection after Reset: %v", err)
	}
	if n := p.Reset(); n != 1 {
		t.Fatalf("second Reset closed %d connections, want 1", n)
	}
}

func TestRefuse(t *testing.T) {
	_, p := start(t)
	c := client(t, p)
	ctx := context.Background()
	p.SetRefuse(true)
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING through a refusing proxy succeeded")
	}
	p.SetRefuse(false)
	// A reset that came during the client's dial counts as a failed dial,
	// and go-redis then answers from its last dial error until its own
	// background dial succeeds: wait for that, not for the next PING.
	wait.Seen(t, "a PING after refusing ended", func() (bool, string) {
		err := c.Ping(ctx).Err()
		return err == nil, fmt.Sprint(err)
	})
}

func TestCloseLeavesNoGoroutines(t *testing.T) {
	s := redistest.Standalone(t)
	before := runtime.NumGoroutine()
	p, err := Start(s.Addr)
	if err != nil {
		t.Fatal(err)
	}
	opts, _ := redis.ParseURL(p.URL())
	opts.MaxRetries = -1
	opts.DisableIdentity = true
	c := redis.NewClient(opts)
	for range 3 {
		if err := c.Ping(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// One connection with a chunk held by a long latency: Close must not
	// wait it out.
	p.SetLatency(time.Hour)
	held, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(held, "PING\r\n")
	p.Close()
	held.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := held.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a connection is still open after Close: %v", err)
	}
	held.Close()
	c.Close()
	if _, err := net.Dial("tcp", p.Addr()); err == nil {
		t.Fatal("the proxy still accepts after Close")
	}
	wait.For(t, "the proxy's goroutines to end", func() bool { return runtime.NumGoroutine() <= before })
}
