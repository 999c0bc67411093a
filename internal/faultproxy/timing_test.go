//go:build faults

package faultproxy

import (
	"context"
	"net"
	"testing"
	"time"
)

// The bounds from above on the proxy's latency: a loaded machine can make
// any of them fail, so they run in the fault tier (build tag faults,
// bench/faults.sh), on a machine given to it, not with go test ./....

// TestLatencyDoesNotSerialize: under a latency d, five commands written
// one by one are each delayed d after their own write, not d after the
// one before, so they take about 2d there and back, well under 5d; and
// with the latency off a PING takes less than d.
func TestLatencyDoesNotSerialize(t *testing.T) {
	p, c := slowed(t)
	const d = latency
	conn, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	begin := time.Now()
	echoFive(t, conn)
	if took := time.Since(begin); took >= 5*d {
		t.Fatalf("five ECHOs written apart took %v, want about %v (the connection is serialized by the latency)", took, 2*d)
	}

	p.SetLatency(0)
	begin = time.Now()
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	if rtt := time.Since(begin); rtt >= d {
		t.Fatalf("PING took %v with the latency off", rtt)
	}
}
