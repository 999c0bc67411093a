package redis

import (
	"context"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
)

// TestRedisScriptMulDiv runs the take script's muldiv (arith.lua) in a real Redis on
// products past 2^53 with every divisor a window can be (up to 2^44 ms:
// a Go duration ends at 2^63 ns), on products just under 2^53, where a
// double's quotient could round up, and on the leases' own arguments
// (a previous window's count times what is left of a window of years),
// and compares quotient and remainder with exact integers.
func TestRedisScriptMulDiv(t *testing.T) {
	s := redistest.Standalone(t)
	rdb := goredis.NewClient(&goredis.Options{Addr: s.Addr, Protocol: 2, DisableIdentity: true})
	t.Cleanup(func() { rdb.Close() })
	// The script's arithmetic, and a call of muldiv on each triple of
	// arguments.
	helpers, err := scriptPieces.ReadFile("scripts/arith.lua")
	if err != nil {
		t.Fatal(err)
	}
	script := goredis.NewScript(string(helpers) + `
local out = {}
for i = 1, #ARGV, 3 do
  local q, r = muldiv(tonumber(ARGV[i]), tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]))
  out[#out + 1] = string.format('%.0f', q)
  out[#out + 1] = string.format('%.0f', r)
end
return out
`)

	rng := rand.New(rand.NewPCG(3, 4))
	logUniform := func(lo, hi float64) int64 {
		return int64(math.Exp(math.Log(lo) + rng.Float64()*(math.Log(hi)-math.Log(lo))))
	}
	const exact = 1 << 53
	maxWindow := time.Duration(math.MaxInt64).Milliseconds()
	var cases [][3]int64
	add := func(a, b, d int64) {
		q := new(big.Int).Mul(big.NewInt(a), big.NewInt(b))
		if q.Div(q, big.NewInt(d)).Cmp(big.NewInt(exact)) < 0 {
			cases = append(cases, [3]int64{a, b, d})
		}
	}
	for range 2000 {
		d := logUniform(1<<31, float64(maxWindow))
		add(logUniform(1, exact), logUniform(1, exact), d)
		// A lease's room: prev × (window − elapsed) / window.
		add(logUniform(1, math.MaxInt32), rng.Int64N(d)+1, d)
		// Just under 2^53, with any limit as the divisor.
		d = logUniform(2, math.MaxInt32)
		add(1, exact-1-rng.Int64N(d), d)
	}
	add(exact-1, 1<<44-1, 1<<44)
	add(math.MaxInt32, maxWindow, maxWindow)

	args := make([]any, 0, 3*len(cases))
	for _, c := range cases {
		args = append(args, c[0], c[1], c[2])
	}
	got, err := script.Run(context.Background(), rdb, nil, args...).StringSlice()
	if err != nil {
		t.Fatal(err)
	}
	wrong := 0
	for i, c := range cases {
		q, r := new(big.Int).QuoRem(new(big.Int).Mul(big.NewInt(c[0]), big.NewInt(c[1])), big.NewInt(c[2]), new(big.Int))
		if got[2*i] != q.String() || got[2*i+1] != r.String() {
			if wrong++; wrong <= 5 {
				t.Errorf("muldiv(%d, %d, %d) = %s, %s; want %s, %s", c[0], c[1], c[2], got[2*i], got[2*i+1], q, r)
			}
		}
	}
	if wrong > 0 {
		t.Fatalf("%d of %d products divided wrong", wrong, len(cases))
	}
	if len(cases) < 3000 {
		t.Fatalf("only %d cases", len(cases))
	}
}
