//go:build linux

package storage

import (
	"syscall"
	"time"
	"unsafe"
)

// threadTime is the CPU time the calling thread has used. Timing a
// section of code by it leaves out the time the machine gave to other
// work meanwhile, which on a shared machine is most of a long section's
// wall time. The caller locks its goroutine to its thread.
func threadTime() time.Duration {
	const clockThreadCPUTime = 3 // CLOCK_THREAD_CPUTIME_ID
	var ts syscall.Timespec
	syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTime, uintptr(unsafe.Pointer(&ts)), 0)
	return time.Duration(ts.Nano())
}
