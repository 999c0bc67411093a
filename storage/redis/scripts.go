package redis

import (
	"embed"
	"io/fs"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// This file assembles the store's Lua scripts from the pieces in
// scripts/: each piece is named for what it holds, those that serve one
// script for that script (take_*.lua, finish.lua), those both share for
// what they are (arith.lua, period.lua, ring.lua, tat.lua).

var (
	//go:embed scripts/take*.lua scripts/arith.lua scripts/period.lua scripts/ring.lua scripts/tat.lua scripts/finish.lua
	scriptPieces embed.FS

	takeSource   = joinPieces(scriptPieces, takeOrder)
	takeScript   = goredis.NewScript(takeSource)
	finishSource = joinPieces(scriptPieces, finishOrder)
	finishScript = goredis.NewScript(finishSource)
)

// finishOrder lists the pieces of the finish script: the arithmetic, the
// periods, the ring roll and the TAT it shares with the take script, then
// its own (see scripts/finish.lua).
var finishOrder = []string{
	"scripts/arith.lua",
	"scripts/period.lua",
	"scripts/ring.lua",
	"scripts/tat.lua",
	"scripts/finish.lua",
}

// takeOrder lists the pieces of the take script in the order they are
// joined into one: each piece uses the locals of those before it (see
// scripts/take.lua).
var takeOrder = []string{
	"scripts/take.lua",
	"scripts/arith.lua",
	"scripts/period.lua",
	"scripts/ring.lua",
	"scripts/tat.lua",
	"scripts/take_bans.lua",
	"scripts/take_fixed_window.lua",
	"scripts/take_sliding_tail.lua",
	"scripts/take_wide.lua",
	"scripts/take_sliding_window.lua",
	"scripts/take_gcra.lua",
	"scripts/take_concurrency.lua",
	"scripts/take_lease.lua",
	"scripts/take_main.lua",
	"scripts/take_write_back.lua",
}

// joinPieces joins the script pieces names of fsys, in order, into one
// script, which the store loads once and runs by its hash. The pieces are
// embedded, so a missing one is a build's mistake, found by any test.
func joinPieces(fsys fs.FS, names []string) string {
	var b strings.Builder
	for _, name := range names {
		src, err := fs.ReadFile(fsys, name)
		if err != nil {
			panic(err)
		}
		b.Write(src)
		b.WriteByte('\n')
	}
	return b.String()
}
