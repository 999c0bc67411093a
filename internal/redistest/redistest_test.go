package redistest

import (
	"strings"
	"testing"
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
