// Package redistest starts real redis-server processes for tests: a
// standalone server, a Redis Cluster of masters (with a replica each, for
// failover tests), or a master watched by a sentinel (with a replica the
// sentinel promotes when the master dies). Every process listens on a free port on 127.0.0.1 only, keeps
// its files in a test's temporary directory, and is killed when the test
// (or the caller, for shared servers) is done.
//
// Tests that start a redis-server belong to the integration tier: under
// go test -short (the unit tier, which starts no server process) they are
// skipped, and so are benchmarks that start one. If redis-server is not on
// PATH, tests that need it are skipped too, unless the environment variable
// CI is "true", where a missing redis-server fails them: CI must install it.
//
// Every way to start a server goes through Binaries, which does the
// skipping: Standalone, NewCluster, NewClusterWithReplicas, NewSentinel and
// NewSentinelGroup call it, and Start, StartCluster,
// StartClusterWithReplicas, StartSentinel and StartSentinelGroup take the
// binary it returned. ServeOld,
// a stand-in for a server too old to install, starts no process.
package redistest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/d61b427a/caddy-rate-limit/internal/wait"
)

// Binaries returns the paths of redis-server and redis-cli. It skips t
// under -short, since starting redis-server is not in the unit tier, and
// skips (or, under CI=true, fails) t when redis-server is not installed.
func Binaries(t testing.TB) (server, cli string) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts redis-server; not in the -short unit tier")
	}
	server, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server is not on PATH; CI must install it (e.g. apt-get install redis-server)")
		}
		t.Skip("redis-server is not on PATH; install it to run the Redis tests")
	}
	cli, _ = exec.LookPath("redis-cli")
	return server, cli
}

// reservedPorts are never used: 6379 and its cluster bus and sentinel ports
// belong to the machine's shared Redis.
var reservedPorts = map[int]bool{6379: true, 16379: true, 26379: true}

// portsMu keeps two servers started by one process from being handed the
// same free port before either has bound it.
var (
	portsMu    sync.Mutex
	portsTaken = map[int]bool{}
)

// freePort returns a port on 127.0.0.1 that is free now, and, if bus is
// set, whose cluster bus port (port+10000) is free too.
func freePort(bus bool) (int, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if reservedPorts[port] || portsTaken[port] {
			continue
		}
		if bus {
			if port+10000 > 65535 || reservedPorts[port+10000] {
				continue
			}
			lb, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000))
			if err != nil {
				continue
			}
			lb.Close()
		}
		portsTaken[port] = true
		return port, nil
	}
	return 0, errors.New("redistest: no free port found")
}

// Server is one redis-server process (or a sentinel) on 127.0.0.1.
type Server struct {
	// Port is the port it listens on; Addr is "127.0.0.1:<Port>".
	Port int
	Addr string

	bin  string
	dir  string
	args []string

	// tls is the client config for a TLS server, trusting its certificate.
	tls *tls.Config

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// URL is the server's address as a redis:// URL, or rediss:// for TLS.
func (s *Server) URL() string {
	if s.tls != nil {
		return "rediss://" + s.Addr
	}
	return "redis://" + s.Addr
}

// Options for a server.
type Options struct {
	// Args are extra redis-server arguments, e.g. "--cluster-enabled", "yes".
	Args []string
	// ClusterBus asks for a port whose cluster bus port is free too.
	ClusterBus bool
	// Sentinel runs the server as a sentinel with Config as its
	// configuration file (a sentinel needs a writable file).
	Sentinel bool
	Config   string
	// TLS serves TLS only, with a self-signed certificate for 127.0.0.1
	// made in the server's directory; URL then says rediss://.
	TLS bool
}

// Start starts a redis-server in dir (created if missing) on a free port
// and waits until it answers PING. bin is the redis-server that Binaries
// returned, so that a test calling Start skips as Binaries says.
func Start(bin, dir string, o Options) (*Server, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var lastErr error
	for range 3 {
		port, err := freePort(o.ClusterBus)
		if err != nil {
			return nil, err
		}
		s := &Server{Port: port, Addr: "127.0.0.1:" + strconv.Itoa(port), bin: bin, dir: dir}
		if o.Sentinel {
			conf := filepath.Join(dir, "sentinel.conf")
			text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\n%s\n", port, dir, o.Config)
			if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
				return nil, err
			}
			s.args = []string{conf, "--sentinel", "--logfile", filepath.Join(dir, "redis.log")}
		} else if o.TLS {
			cert, key, pool, err := selfSigned(dir)
			if err != nil {
				return nil, err
			}
			s.tls = &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
			s.args = []string{
				"--port", "0",
				"--tls-port", strconv.Itoa(port),
				"--tls-cert-file", cert,
				"--tls-key-file", key,
				"--tls-ca-cert-file", cert,
				"--tls-auth-clients", "no",
			}
		} else {
			s.args = []string{"--port", strconv.Itoa(port)}
		}
		if !o.Sentinel {
			s.args = append(s.args,
				"--bind", "127.0.0.1",
				"--dir", dir,
				"--save", "",
				"--appendonly", "no",
				"--daemonize", "no",
				"--logfile", filepath.Join(dir, "redis.log"),
			)
			s.args = append(s.args, o.Args...)
		}
		if lastErr = s.start(); lastErr == nil {
			return s, nil
		}
	}
	return nil, lastErr
}

func (s *Server) start() error {
	cmd := exec.Command(s.bin, s.args...)
	cmd.Dir = s.dir
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redistest: starting %s: %w", s.bin, err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()

	exited, answered := false, false
	wait.Within(10*time.Second, func() bool {
		select {
		case <-done:
			exited = true
			return true
		default:
		}
		// A plain dial first, so go-redis does not log every refusal.
		if c, err := net.DialTimeout("tcp", s.Addr, time.Second); err == nil {
			c.Close()
			_, err := s.Do("PING")
			answered = err == nil
		}
		return answered
	})
	switch {
	case exited:
		return fmt.Errorf("redistest: redis-server on port %d exited at start; log: %s", s.Port, s.logTail())
	case answered:
		return nil
	}
	s.Kill()
	return fmt.Errorf("redistest: redis-server on port %d did not answer PING within 10s; log: %s", s.Port, s.logTail())
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// Kill stops the server at once (SIGKILL) and waits until it is gone. It
// resumes a paused server first, so that it can die.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGCONT)
	cmd.Process.Kill()
	<-done
}

// running reports whether the server's process is alive (it may be paused).
func (s *Server) running() bool {
	s.mu.Lock()
	done := s.done
	s.mu.Unlock()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// Pause stops the process with SIGSTOP: connections stay open and commands
// hang, as with a server stuck in a long command.
func (s *Server) Pause() error { return s.signal(syscall.SIGSTOP) }

// Resume continues a paused server.
func (s *Server) Resume() error { return s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return errors.New("redistest: server not running")
	}
	return s.cmd.Process.Signal(sig)
}

// Restart kills the server and starts a new, empty one on the same port.
func (s *Server) Restart() error {
	s.Kill()
	return s.start()
}

// Do sends one command on a fresh connection to database 0 and returns the
// reply as text: strings and integers as they are, arrays one element per
// line, nil as "". An error reply is returned as an error.
func (s *Server) Do(args ...string) (string, error) {
	return s.DoIn(0, args...)
}

// DoIn is Do in database db.
func (s *Server) DoIn(db int, args ...string) (string, error) {
	c := redis.NewClient(&redis.Options{
		Addr:            s.Addr,
		DB:              db,
		Protocol:        2,
		PoolSize:        1,
		MaxRetries:      -1,
		DialTimeout:     time.Second,
		ReadTimeout:     5 * time.Second,
		DisableIdentity: true,
		DialerRetries:   1,
		TLSConfig:       s.tls,
	})
	defer c.Close()
	cmdArgs := make([]any, len(args))
	for i, a := range args {
		cmdArgs[i] = a
	}
	v, err := c.Do(context.Background(), cmdArgs...).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return text(v), nil
}

func text(v any) string {
	switch v := v.(type) {
	case []any:
		parts := make([]string, len(v))
		for i, p := range v {
			parts[i] = text(p)
		}
		return strings.Join(parts, "\n")
	case nil:
		return ""
	default:
		return fmt.Sprint(v)
	}
}

// Info returns one field of INFO <section>, e.g. Info("stats",
// "total_commands_processed").
func (s *Server) Info(section, field string) (string, error) {
	text, err := s.Do("INFO", section)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v, nil
		}
	}
	return "", fmt.Errorf("redistest: INFO %s has no %s", section, field)
}

// CommandStats returns the number of successful calls per command since
// the server started or the last CONFIG RESETSTAT, from INFO commandstats
// ("evalsha" → n). Calls that failed or were rejected (an EVALSHA answered
// NOSCRIPT, say) are not counted.
func (s *Server) CommandStats() (map[string]int, error) {
	text, err := s.Do("INFO", "commandstats")
	if err != nil {
		return nil, err
	}
	stats := make(map[string]int)
	for _, line := range strings.Split(text, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		n := 0
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			x, _ := strconv.Atoi(v)
			switch k {
			case "calls":
				n += x
			case "failed_calls", "rejected_calls":
				n -= x
			}
		}
		stats[strings.TrimPrefix(name, "cmdstat_")] = n
	}
	return stats, nil
}

// ScriptCalls returns how many script calls succeeded, as CommandStats
// counts them (EVALSHA, and EVAL after an EVALSHA answered NOSCRIPT), but
// for the instances' announcements: the store's script calls. Every store
// announces itself once a second in the background; counting those would
// make a test's count depend on when one fell. The announcement is the
// only script that calls HGETALL, once a call, and Redis counts the
// commands scripts call: so the announcements are the HGETALL calls, read
// in the same INFO.
func (s *Server) ScriptCalls() (int, error) {
	stats, err := s.CommandStats()
	return stats["evalsha"] + stats["eval"] - stats["hgetall"], err
}

// Clients returns the number of client connections whose name (CLIENT
// SETNAME) is name.
func (s *Server) Clients(name string) (int, error) {
	text, err := s.Do("CLIENT", "LIST")
	if err != nil {
		return 0, err
	}
	n := 0
	for _, line := range strings.Split(text, "\n") {
		for _, f := range strings.Fields(line) {
			if f == "name="+name {
				n++
			}
		}
	}
	return n, nil
}

// Standalone starts one server for test t, killed when t ends.
func Standalone(t testing.TB) *Server {
	t.Helper()
	bin, _ := Binaries(t)
	s, err := Start(bin, t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Kill)
	return s
}

// Cluster is a Redis Cluster: its masters, and, if started with replicas,
// one replica of each.
type Cluster struct {
	// Nodes are the masters as started; FailMaster leaves a killed master
	// in place, and its replica in Replicas becomes the new master.
	Nodes []*Server
	// Replicas[i] replicates Nodes[i]; empty for a cluster of masters only.
	Replicas []*Server
}

// Addrs returns the nodes' redis:// URLs.
func (c *Cluster) URLs() []string {
	urls := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		urls[i] = n.URL()
	}
	return urls
}

// Kill stops every node and replica.
func (c *Cluster) Kill() {
	for _, n := range c.Nodes {
		n.Kill()
	}
	for _, r := range c.Replicas {
		r.Kill()
	}
}

// NodeFor returns the index in Nodes of the node serving the slot of key
// (CLUSTER KEYSLOT, matched against each node's own slot ranges in CLUSTER
// NODES).
func (c *Cluster) NodeFor(key string) (int, error) {
	v, err := c.Nodes[0].Do("CLUSTER", "KEYSLOT", key)
	if err != nil {
		return 0, err
	}
	slot, _ := strconv.Atoi(v)
	for i, n := range c.Nodes {
		nodes, err := n.Do("CLUSTER", "NODES")
		if err != nil {
			return 0, err
		}
		for _, line := range strings.Split(nodes, "\n") {
			f := strings.Fields(line)
			if len(f) < 9 || !strings.Contains(f[2], "myself") {
				continue
			}
			for _, r := range f[8:] {
				lo, hi, found := strings.Cut(r, "-")
				if !found {
					hi = lo
				}
				a, err1 := strconv.Atoi(lo)
				b, err2 := strconv.Atoi(hi)
				if err1 == nil && err2 == nil && a <= slot && slot <= b {
					return i, nil
				}
			}
		}
	}
	return 0, fmt.Errorf("redistest: no node serves slot %d of %q", slot, key)
}

// StartCluster starts masters servers in cluster mode under dir, joins them
// with `redis-cli --cluster create`, and waits until every node reports the
// cluster ok. The caller kills it.
func StartCluster(serverBin, cliBin, dir string, masters int) (*Cluster, error) {
	return startCluster(serverBin, cliBin, dir, masters, false)
}

// StartClusterWithReplicas is StartCluster with one replica per master,
// for tests that fail a master over: Replicas[i] replicates Nodes[i]. It
// waits until every replica's link to its master is up, so that a write
// acknowledged by WAIT survives the master's death.
func StartClusterWithReplicas(serverBin, cliBin, dir string, masters int) (*Cluster, error) {
	return startCluster(serverBin, cliBin, dir, masters, true)
}

func startCluster(serverBin, cliBin, dir string, masters int, replicas bool) (*Cluster, error) {
	if cliBin == "" {
		return nil, errors.New("redistest: redis-cli is not on PATH; it is needed to create a cluster")
	}
	// A master's death is noticed after the node timeout: short where
	// tests fail masters over, so that the replica takes over within
	// seconds.
	n, nodeTimeout, perMaster := masters, "2000", "0"
	if replicas {
		n, nodeTimeout, perMaster = 2*masters, "1000", "1"
	}
	var servers []*Server
	kill := func() {
		for _, s := range servers {
			s.Kill()
		}
	}
	for i := range n {
		nodeDir := filepath.Join(dir, "node"+strconv.Itoa(i))
		s, err := Start(serverBin, nodeDir, Options{
			ClusterBus: true,
			Args: []string{
				"--cluster-enabled", "yes",
				"--cluster-config-file", filepath.Join(nodeDir, "nodes.conf"),
				"--cluster-node-timeout", nodeTimeout,
			},
		})
		if err != nil {
			kill()
			return nil, err
		}
		servers = append(servers, s)
	}
	args := []string{"--cluster", "create"}
	for _, s := range servers {
		args = append(args, s.Addr)
	}
	args = append(args, "--cluster-replicas", perMaster, "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, cliBin, args...).CombinedOutput(); err != nil {
		kill()
		return nil, fmt.Errorf("redistest: redis-cli --cluster create: %w: %s", err, out)
	}
	c := &Cluster{Nodes: servers}
	if replicas {
		var err error
		if c.Nodes, c.Replicas, err = pairReplicas(servers); err != nil {
			kill()
			return nil, err
		}
	}
	ready := func() bool {
		for _, s := range servers {
			if !s.clusterOK() {
				return false
			}
		}
		for _, r := range c.Replicas {
			if !r.linkUp() {
				return false
			}
		}
		return true
	}
	if !wait.Within(15*time.Second, ready) {
		kill()
		return nil, fmt.Errorf("redistest: cluster of %d nodes not ok, or a replica without its link, within 15s", len(servers))
	}
	return c, nil
}

// pairReplicas splits the servers of a cluster just created into masters
// and replicas, in the masters' order of start, with replicas[i]
// replicating masters[i]: redis-cli chooses the pairing, so it is read
// from each server's own line in CLUSTER NODES.
func pairReplicas(servers []*Server) (masters, replicas []*Server, err error) {
	ids := make([]string, len(servers))
	masterOf := make([]string, len(servers))
	for i, s := range servers {
		nodes, err := s.Do("CLUSTER", "NODES")
		if err != nil {
			return nil, nil, err
		}
		for _, line := range strings.Split(nodes, "\n") {
			f := strings.Fields(line)
			if len(f) >= 8 && strings.Contains(f[2], "myself") {
				ids[i] = f[0]
				if strings.Contains(f[2], "slave") {
					masterOf[i] = f[3]
				}
			}
		}
	}
	byMaster := make(map[string]*Server)
	for i, s := range servers {
		if masterOf[i] != "" {
			byMaster[masterOf[i]] = s
		}
	}
	for i, s := range servers {
		if masterOf[i] != "" {
			continue
		}
		r := byMaster[ids[i]]
		if r == nil {
			return nil, nil, fmt.Errorf("redistest: cluster master %s has no replica", s.Addr)
		}
		masters = append(masters, s)
		replicas = append(replicas, r)
	}
	if len(masters) != len(replicas) || 2*len(masters) != len(servers) {
		return nil, nil, fmt.Errorf("redistest: cluster of %d servers has %d masters with a replica", len(servers), len(masters))
	}
	return masters, replicas, nil
}

// NewCluster starts a cluster of masters for test t, killed when t ends.
func NewCluster(t testing.TB, masters int) *Cluster {
	t.Helper()
	bin, cli := Binaries(t)
	c, err := StartCluster(bin, cli, t.TempDir(), masters)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Kill)
	return c
}

// NewClusterWithReplicas starts a cluster of masters, each with one
// replica, for test t, killed when t ends.
func NewClusterWithReplicas(t testing.TB, masters int) *Cluster {
	t.Helper()
	bin, cli := Binaries(t)
	c, err := StartClusterWithReplicas(bin, cli, t.TempDir(), masters)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Kill)
	return c
}

// FailMaster kills master Nodes[i] (SIGKILL) and waits until its replica,
// Replicas[i], reports role:master and every node still running reports
// cluster_state:ok. It returns how long that took after the kill. Nodes[i]
// stays the killed server: the new master is Replicas[i].
func (c *Cluster) FailMaster(i int, timeout time.Duration) (promoted time.Duration, err error) {
	if i < 0 || i >= len(c.Replicas) {
		return 0, fmt.Errorf("redistest: master %d has no replica", i)
	}
	c.Nodes[i].Kill()
	killed := time.Now()
	ready := func() bool {
		if !c.Replicas[i].isMaster() {
			return false
		}
		for _, s := range append(append([]*Server(nil), c.Nodes...), c.Replicas...) {
			if s.running() && !s.clusterOK() {
				return false
			}
		}
		return true
	}
	if !wait.Within(timeout, ready) {
		return 0, fmt.Errorf("redistest: replica %s not promoted with the cluster ok within %v of killing master %s", c.Replicas[i].Addr, timeout, c.Nodes[i].Addr)
	}
	return time.Since(killed), nil
}

// Sentinel is a master watched by one sentinel.
type Sentinel struct {
	Master   *Server
	Sentinel *Server
	Name     string
}

// Kill stops the sentinel and the master.
func (s *Sentinel) Kill() {
	s.Sentinel.Kill()
	s.Master.Kill()
}

// StartSentinel starts a master and one sentinel monitoring it under the
// given master name, and waits until the sentinel reports the master.
func StartSentinel(bin, dir, name string) (*Sentinel, error) {
	master, err := Start(bin, filepath.Join(dir, "master"), Options{})
	if err != nil {
		return nil, err
	}
	conf := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 1\nsentinel down-after-milliseconds %s 5000\n", name, master.Port, name)
	sentinel, err := Start(bin, filepath.Join(dir, "sentinel"), Options{Sentinel: true, Config: conf})
	if err != nil {
		master.Kill()
		return nil, err
	}
	s := &Sentinel{Master: master, Sentinel: sentinel, Name: name}
	if !wait.Within(10*time.Second, func() bool { return sentinelNames(sentinel, name, master) }) {
		s.Kill()
		return nil, fmt.Errorf("redistest: sentinel does not report master %s at %s", name, master.Addr)
	}
	return s, nil
}

// sentinelNames reports whether sentinel names master as the master
// called name (SENTINEL get-master-addr-by-name).
func sentinelNames(sentinel *Server, name string, master *Server) bool {
	addr, err := sentinel.Do("SENTINEL", "get-master-addr-by-name", name)
	return err == nil && addr == "127.0.0.1\n"+strconv.Itoa(master.Port)
}

// linkUp reports whether replica s's link to its master is up.
func (s *Server) linkUp() bool {
	link, err := s.Info("replication", "master_link_status")
	return err == nil && link == "up"
}

// NewSentinel starts a master and a sentinel for test t, killed when t ends.
func NewSentinel(t testing.TB, name string) *Sentinel {
	t.Helper()
	bin, _ := Binaries(t)
	s, err := StartSentinel(bin, t.TempDir(), name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Kill)
	return s
}

// SentinelGroup is a master with one replica, watched by one sentinel that
// fails the master over to the replica when the master dies.
type SentinelGroup struct {
	Master   *Server
	Replica  *Server
	Sentinel *Server
	Name     string
}

// Kill stops the sentinel, the master and the replica.
func (g *SentinelGroup) Kill() {
	g.Sentinel.Kill()
	g.Master.Kill()
	g.Replica.Kill()
}

// StartSentinelGroup starts a master, a replica of it and one sentinel
// monitoring it under the given master name, and waits until the
// replica's link to the master is up and the sentinel knows the replica.
// The sentinel needs a quorum of 1 (it is alone) and deems the master down
// after 1s, so that a failover takes seconds. The replica announces
// 127.0.0.1, the address the sentinel hands clients after a failover.
func StartSentinelGroup(bin, dir, name string) (*SentinelGroup, error) {
	master, err := Start(bin, filepath.Join(dir, "master"), Options{})
	if err != nil {
		return nil, err
	}
	replica, err := Start(bin, filepath.Join(dir, "replica"), Options{Args: []string{
		"--replicaof", "127.0.0.1", strconv.Itoa(master.Port),
		"--replica-announce-ip", "127.0.0.1",
	}})
	if err != nil {
		master.Kill()
		return nil, err
	}
	conf := fmt.Sprintf("sentinel monitor %[1]s 127.0.0.1 %[2]d 1\n"+
		"sentinel down-after-milliseconds %[1]s 1000\n"+
		"sentinel failover-timeout %[1]s 10000\n"+
		"sentinel parallel-syncs %[1]s 1\n", name, master.Port)
	sentinel, err := Start(bin, filepath.Join(dir, "sentinel"), Options{Sentinel: true, Config: conf})
	if err != nil {
		master.Kill()
		replica.Kill()
		return nil, err
	}
	g := &SentinelGroup{Master: master, Replica: replica, Sentinel: sentinel, Name: name}
	if !wait.Within(20*time.Second, g.replicaKnown) {
		g.Kill()
		return nil, fmt.Errorf("redistest: sentinel does not know replica %s of %s online", replica.Addr, name)
	}
	return g, nil
}

// replicaKnown reports whether the replica's link to the master is up and
// the sentinel lists the replica, at 127.0.0.1, as an online replica with
// its link up.
func (g *SentinelGroup) replicaKnown() bool {
	if !g.Replica.linkUp() {
		return false
	}
	text, err := g.Sentinel.Do("SENTINEL", "REPLICAS", g.Name)
	if err != nil {
		return false
	}
	// One replica: its fields and values, one per line.
	lines := strings.Split(text, "\n")
	fields := make(map[string]string)
	for i := 0; i+1 < len(lines); i += 2 {
		fields[lines[i]] = lines[i+1]
	}
	return fields["ip"] == "127.0.0.1" && fields["port"] == strconv.Itoa(g.Replica.Port) &&
		fields["flags"] == "slave" && fields["master-link-status"] == "ok"
}

// NewSentinelGroup starts a master, its replica and a sentinel for test
// t, killed when t ends.
func NewSentinelGroup(t testing.TB, name string) *SentinelGroup {
	t.Helper()
	bin, _ := Binaries(t)
	g, err := StartSentinelGroup(bin, t.TempDir(), name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Kill)
	return g
}

// Failover kills the master (SIGKILL) and waits until the sentinel names
// the replica as the master (SENTINEL get-master-addr-by-name) and the
// replica reports role:master. It returns how long that took after the
// kill.
func (g *SentinelGroup) Failover(timeout time.Duration) (promoted time.Duration, err error) {
	g.Master.Kill()
	killed := time.Now()
	if !wait.Within(timeout, func() bool { return sentinelNames(g.Sentinel, g.Name, g.Replica) && g.Replica.isMaster() }) {
		return 0, fmt.Errorf("redistest: sentinel did not promote replica %s of %s within %v", g.Replica.Addr, g.Name, timeout)
	}
	return time.Since(killed), nil
}

// isMaster reports whether s reports role:master.
func (s *Server) isMaster() bool {
	role, err := s.Info("replication", "role")
	return err == nil && role == "master"
}

// clusterOK reports whether node s reports cluster_state:ok.
func (s *Server) clusterOK() bool {
	info, err := s.Do("CLUSTER", "INFO")
	return err == nil && strings.Contains(info, "cluster_state:ok")
}

// selfSigned writes a self-signed certificate for 127.0.0.1 and its key
// into dir and returns their paths and a pool trusting the certificate.
func selfSigned(dir string) (certFile, keyFile string, pool *x509.CertPool, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "redistest"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return "", "", nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", nil, err
	}
	certFile, keyFile = filepath.Join(dir, "redis.crt"), filepath.Join(dir, "redis.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return "", "", nil, err
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return "", "", nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return "", "", nil, err
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool, nil
}
