//go:build !linux

package storage

import "time"

// threadTime is, where the thread's CPU clock is not at hand, the wall
// clock.
func threadTime() time.Duration {
	return time.Duration(time.Now().UnixNano())
}
