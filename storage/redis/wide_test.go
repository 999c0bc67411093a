package redis

import (
	"context"
	"math"
	"math/big"
	"math/rand/v2"
	"strconv"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
)

// TestRedisScriptWideCounts runs the take script's arithmetic of wide
// counts (arith.lua) in a real Redis on counts all over the 64-bit
// range, most of them past 2^53 where doubles are off, and compares each
// answer with exact integers: a sum (stopping at 2^63-1), a difference
// (stopping at 0), an order, and the sliding tail's comparison of
// prev*(window-elapsed) with (room+1)*window for windows of up to a year.
func TestRedisScriptWideCounts(t *testing.T) {
	s := redistest.Standalone(t)
	rdb := goredis.NewClient(&goredis.Options{Addr: s.Addr, Protocol: 2, DisableIdentity: true})
	t.Cleanup(func() { rdb.Close() })
	arith, err := scriptPieces.ReadFile("scripts/arith.lua")
	if err != nil {
		t.Fatal(err)
	}
	script := goredis.NewScript(string(arith) + `
local out = {}
for i = 1, #ARGV, 4 do
  local x, y, w, e = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  out[#out + 1] = wideAdd(x, y)
  out[#out + 1] = wideSub(x, y)
  out[#out + 1] = tostring(wideCmp(x, y))
  out[#out + 1] = tostring(cmpLimbs(mulLimbs(limbsOf(x), w - e), mulLimbs(addLimbs(limbsOf(y), {1}), w)))
end
return out
`)
	rng := rand.New(rand.NewPCG(5, 6))
	count := func() int64 {
		switch rng.IntN(4) {
		case 0:
			return math.MaxInt64 - rng.Int64N(1000)
		case 1:
			return 1<<53 + rng.Int64N(1000) - 500
		case 2:
			return rng.Int64N(10_000_000 * 3)
		}
		return rng.Int64()
	}
	const year = 366 * 24 * 3600 * 1000
	var cases [][4]int64
	for range 3000 {
		w := rng.Int64N(year) + 1
		cases = append(cases, [4]int64{count(), count(), w, rng.Int64N(w)})
	}
	cases = append(cases, [4]int64{math.MaxInt64, math.MaxInt64, year, 0}, [4]int64{0, 0, 1, 0}, [4]int64{math.MaxInt64, 1, 1, 0})
	// Sums and differences that carry or borrow across a limb of 10^7.
	for _, limb := range []int64{1e7, 1e14} {
		for d := int64(-2); d <= 2; d++ {
			cases = append(cases, [4]int64{limb - 1, 3 + d, year, 1}, [4]int64{limb + d, 1, 1e7, 0}, [4]int64{limb * 3, limb + d, 1e7 + 1, 1})
		}
	}
	args := make([]any, 0, 4*len(cases))
	for _, c := range cases {
		args = append(args, c[0], c[1], c[2], c[3])
	}
	got, err := script.Run(context.Background(), rdb, nil, args...).StringSlice()
	if err != nil {
		t.Fatal(err)
	}
	big64 := func(n int64) *big.Int { return big.NewInt(n) }
	wrong := 0
	for i, c := range cases {
		x, y := big64(c[0]), big64(c[1])
		sum := new(big.Int).Add(x, y)
		if sum.Cmp(big64(math.MaxInt64)) > 0 {
			sum = big64(math.MaxInt64)
		}
		diff := new(big.Int).Sub(x, y)
		if diff.Sign() < 0 {
			diff = big64(0)
		}
		tail := new(big.Int).Mul(x, big64(c[2]-c[3])).Cmp(new(big.Int).Mul(new(big.Int).Add(y, big64(1)), big64(c[2])))
		want := []string{sum.String(), diff.String(), strconv.Itoa(x.Cmp(y)), strconv.Itoa(tail)}
		for k, w := range want {
			if got[4*i+k] != w {
				if wrong++; wrong <= 5 {
					t.Errorf("case %v, answer %d: got %s, want %s", c, k, got[4*i+k], w)
				}
			}
		}
	}
	if wrong > 0 {
		t.Fatalf("%d wrong answers of %d", wrong, 4*len(cases))
	}
}
