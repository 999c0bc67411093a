//go:build linux

package threadtime

import (
	"syscall"
	"time"
	"unsafe"
)

// Now is the CPU time the calling thread has used. The caller locks its
// goroutine to its thread.
func Now() time.Duration {
	const clockThreadCPUTime = 3 // CLOCK_THREAD_CPUTIME_ID
	var ts syscall.Timespec
	syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTime, uintptr(unsafe.Pointer(&ts)), 0)
	return time.Duration(ts.Nano())
}
