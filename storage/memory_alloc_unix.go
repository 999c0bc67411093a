//go:build unix

package storage

import (
	"syscall"
	"unsafe"
)

// newSlots returns n zeroed slots of type S, which must hold no Go
// pointers, in memory mapped for them outside the Go heap, and whether it
// is (false: on the heap, if the mapping failed).
//
// The tables are the memory store's bulk, and live as long as their keys.
// On the heap, every live byte raises the collector's goal by as much
// again (GOGC=100), and under traffic the garbage of requests fills that
// room: a table's byte costs about two of RSS. Mapped apart, a byte of
// table is a byte of RSS, and the collector never scans or moves it.
func newSlots[S any](n int) ([]S, bool) {
	size := n * int(unsafe.Sizeof(*new(S)))
	b, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return make([]S, n), false
	}
	return unsafe.Slice((*S)(unsafe.Pointer(unsafe.SliceData(b))), n), true
}

// freeSlots gives back the memory of slots that newSlots mapped.
func freeSlots[S any](slots []S) {
	size := len(slots) * int(unsafe.Sizeof(*new(S)))
	_ = syscall.Munmap(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(slots))), size))
}
