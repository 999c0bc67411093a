package redistest

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestStandaloneKillPauseRestart(t *testing.T) {
	s := Standalone(t)
	if s.Port == 6379 {
		t.Fatal("used the shared Redis port")
	}
	if _, err := s.Do("SET", "k", "v"); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Do("GET", "k"); err != nil || v != "v" {
		t.Fatalf("GET k = %q, %v", v, err)
	}
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	port := s.Port
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if s.Port != port {
		t.Fatalf("restarted on port %d, want %d", s.Port, port)
	}
	if v, err := s.Do("GET", "k"); err != nil || v != "" {
		t.Fatalf("after restart GET k = %q, %v; want an empty server", v, err)
	}
	s.Kill()
	if _, err := s.Do("PING"); err == nil {
		t.Fatal("killed server still answers")
	}
}

func TestClusterAndSentinel(t *testing.T) {
	c := NewCluster(t, 3)
	info, err := c.Nodes[0].Do("CLUSTER", "INFO")
	if err != nil || !strings.Contains(info, "cluster_known_nodes:3") {
		t.Fatalf("CLUSTER INFO: %v\n%s", err, info)
	}
	nodes := map[int]bool{}
	for _, key := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		i, err := c.NodeFor(key)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Nodes[i].Do("SET", key, "1"); err != nil {
			t.Fatalf("node %d does not serve %q: %v", i, key, err)
		}
		nodes[i] = true
	}
	if len(nodes) < 2 {
		t.Fatal("8 keys on one node")
	}
	s := NewSentinel(t, "mymaster")
	if s.Sentinel.Port == 26379 {
		t.Fatal("used the shared sentinel port")
	}
}

func TestSentinelGroupFailover(t *testing.T) {
	g := NewSentinelGroup(t, "faultmaster")
	if _, err := g.Master.Do("SET", "k", "before"); err != nil {
		t.Fatal(err)
	}
	if n, err := g.Master.Do("WAIT", "1", "0"); err != nil || n != "1" {
		t.Fatalf("WAIT 1 0 = %q, %v", n, err)
	}
	promoted, err := g.Failover(30 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sentinel promoted the replica %v after the master's kill", promoted)
	if v, err := g.Replica.Do("GET", "k"); err != nil || v != "before" {
		t.Fatalf("GET k on the promoted replica = %q, %v", v, err)
	}
	if _, err := g.Replica.Do("SET", "k", "after"); err != nil {
		t.Fatalf("the promoted replica refuses writes: %v", err)
	}
}

func TestClusterFailMaster(t *testing.T) {
	c := NewClusterWithReplicas(t, 3)
	if len(c.Nodes) != 3 || len(c.Replicas) != 3 {
		t.Fatalf("%d masters and %d replicas, want 3 and 3", len(c.Nodes), len(c.Replicas))
	}
	for i, r := range c.Replicas {
		if port, err := r.Info("replication", "master_port"); err != nil || port != strconv.Itoa(c.Nodes[i].Port) {
			t.Fatalf("replica %d replicates port %q (%v), want master %d's %d", i, port, err, i, c.Nodes[i].Port)
		}
	}
	key := ""
	for i := 0; key == ""; i++ {
		k := "k" + strconv.Itoa(i)
		if n, err := c.NodeFor(k); err != nil {
			t.Fatal(err)
		} else if n == 0 {
			key = k
		}
	}
	if _, err := c.Nodes[0].Do("SET", key, "before"); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Nodes[0].Do("WAIT", "1", "0"); err != nil || n != "1" {
		t.Fatalf("WAIT 1 0 = %q, %v", n, err)
	}
	promoted, err := c.FailMaster(0, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster promoted replica 0 %v after its master's kill", promoted)
	// A replica answers MOVED for its master's slots: a value here means
	// the promoted replica serves them.
	if v, err := c.Replicas[0].Do("GET", key); err != nil || v != "before" {
		t.Fatalf("GET on the promoted replica = %q, %v", v, err)
	}
}
