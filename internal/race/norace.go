//go:build !race

// Package race tells tests whether the race detector is built in: under it,
// sync.Pool drops some of what is put back and instrumented code allocates
// more, so tests do not count allocations there.
package race

// Enabled is true when the race detector is built in.
const Enabled = false
