package integration

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
)

// TestRedisClusterKeysSpread: on a Redis Cluster, a client cannot choose
// the node its keys live on. It picks 8,000 keys for one slot, as CRC16
// of the key would place them were the key their hash tag, and sends
// each through Caddy once: their counters spread over the 3 masters as
// random keys do, each holding a third, within 10%.
func TestRedisClusterKeysSpread(t *testing.T) {
	c := redistest.NewCluster(t, 3)
	const n = 8000
	keys, slot := keysInOneSlot(n)
	for _, key := range keys[:3] {
		if got, err := c.Nodes[0].Do("CLUSTER", "KEYSLOT", key); err != nil || got != strconv.Itoa(slot) {
			t.Fatalf("Redis puts %q in slot %s (%v); the attacker's CRC16 says %d", key, got, err, slot)
		}
	}
	startCaddy(t, redisSite("address "+strings.Join(c.URLs(), " ")+"\ncluster", 5, ""))

	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	defer hc.CloseIdleConnections()
	var wg sync.WaitGroup
	work := make(chan string)
	for range 16 {
		wg.Go(func() {
			for key := range work {
				req, _ := http.NewRequest(http.MethodGet, siteURL+"/", nil)
				req.Header.Set("X-Client", key)
				resp, err := hc.Do(req)
				if err != nil {
					t.Errorf("key %s: %v", key, err)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Errorf("key %s: %d, want 200", key, resp.StatusCode)
				}
			}
		})
	}
	for _, key := range keys {
		work <- key
	}
	close(work)
	wg.Wait()

	counts := make([]int, len(c.Nodes))
	total := 0
	for i, node := range c.Nodes {
		held, err := node.Do("KEYS", "rl:{*:per_client")
		if err != nil {
			t.Fatal(err)
		}
		if held != "" {
			counts[i] = len(strings.Split(held, "\n"))
		}
		total += counts[i]
	}
	t.Logf("%d keys chosen for slot %d: counters per master %v", n, slot, counts)
	if total != n {
		t.Fatalf("%d counters on the masters, want one for each of the %d keys", total, n)
	}
	third := n / len(c.Nodes)
	for i, got := range counts {
		if got < third*9/10 || got > third*11/10 {
			t.Errorf("master %d holds %d of the %d counters, want %d ± 10%%", i, got, n, third)
		}
	}
}

// keysInOneSlot returns n keys that share one Redis Cluster slot, and the
// slot, as a client finds them to put a store's counters on one node
// where its key is their hash tag: the slot of a tag is CRC16 (XMODEM) of
// it, modulo 16384. Each key is a prefix and four characters that a
// search over all of them picks, updating the CRC a byte at a time.
func keysInOneSlot(n int) ([]string, int) {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	update := func(crc uint16, b byte) uint16 {
		crc ^= uint16(b) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		return crc
	}
	const slot = 4242
	var keys []string
	for p := 0; len(keys) < n; p++ {
		prefix := "client-" + strconv.Itoa(p) + "-"
		var crc uint16
		for i := range len(prefix) {
			crc = update(crc, prefix[i])
		}
		for _, a := range []byte(alphabet) {
			ca := update(crc, a)
			for _, b := range []byte(alphabet) {
				cb := update(ca, b)
				for _, c := range []byte(alphabet) {
					cc := update(cb, c)
					for _, d := range []byte(alphabet) {
						if update(cc, d)%16384 == slot && len(keys) < n {
							keys = append(keys, prefix+string([]byte{a, b, c, d}))
						}
					}
				}
			}
		}
	}
	return keys, slot
}

// TestRedisTagSecretSurvivesRestart: the secret key names derive from is
// the fleet's, in Redis, not an instance's: a Caddy started after another
// was stopped names a key as it did, and counts on in the same hash.
func TestRedisTagSecretSurvivesRestart(t *testing.T) {
	s := redistest.Standalone(t)
	spec := fleetSpec{store: "address " + s.URL(), zone: perClient(10)}
	first := startFleet(t, 1, spec)[0]
	if codes := burst([]string{first.url}, 1, "X-Client: k"); codes[http.StatusOK] != 1 {
		t.Fatalf("the first Caddy: %v, want 200", codes)
	}
	name, err := s.Counter("fleet", clientKey("k"))
	if err != nil {
		t.Fatal(err)
	}
	if n := hashCount(t, s, name); n != 1 {
		t.Fatalf("%s counts %d, want the first Caddy's 1", name, n)
	}
	if err := first.proc.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	first.proc.Process.Wait()

	second := startFleet(t, 1, spec)[0]
	if codes := burst([]string{second.url}, 1, "X-Client: k"); codes[http.StatusOK] != 1 {
		t.Fatalf("the Caddy started after it: %v, want 200", codes)
	}
	if n := hashCount(t, s, name); n != 2 {
		t.Fatalf("%s counts %d, want 2: one request from each Caddy", name, n)
	}
	if keys, err := s.Do("KEYS", "rl:{*}{"+clientKey("k")+"}:fleet"); err != nil || keys != name {
		t.Fatalf("k's counters in Redis: %q (%v), want %s alone", keys, err, name)
	}
}
