// Package bodyread reads the request bodies that rate_limit zones read
// (to reserve by them, or to ask a stream for its usage) as an attacker
// sends them: announced long and sent slowly, many at once. A body is
// read in chunks as its bytes arrive, so what it holds is what arrived
// and one chunk more, never what its Content-Length announced; and every
// chunk is held against one budget for the whole process, the memory
// that bodies being read may take together (body_memory), past which a
// read fails at once instead of waiting for memory to free up.
package bodyread

import (
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dustin/go-humanize"
)

// MaxSize is the largest body read: a larger one fails with ErrTooLarge.
const MaxSize = 1 << 20

// DefaultMemory is body_memory's default: room for 64 bodies of MaxSize
// being read at once, or thousands of the few kilobytes an LLM API's
// request usually takes.
const DefaultMemory = 64 << 20

// MinMemory is the least body_memory accepted: room for one body of
// MaxSize as it is read, with room to spare, so that every body a zone
// accepts can be read when nothing else is.
const MinMemory = 2 * MaxSize

// DefaultTimeout is body_timeout's default: how long a client has to
// send a body a zone reads.
const DefaultTimeout = 10 * time.Second

// chunkSize is what a body takes at a time: a body holds its bytes, and
// at most this many more. It is the size of the buffer Go's HTTP server
// reads a connection through, so a client that sent one byte holds no
// more than its connection does already.
const chunkSize = 4 << 10

type chunk [chunkSize]byte

var chunks = sync.Pool{New: func() any { return new(chunk) }}

// held is what the bodies being read, and those read and not yet
// released, hold in this process.
var held atomic.Int64

var (
	// ErrTooLarge fails a body larger than the most Read was asked to
	// read.
	ErrTooLarge = errors.New("request body too large")
	// ErrMemory fails a body whose next chunk would take the memory that
	// bodies hold past the budget.
	ErrMemory = errors.New("the request bodies being read take all the memory body_memory allows")
)

// Read reads r to its end, and returns its bytes in a slice of their
// own length. More than most bytes fail with ErrTooLarge. The bytes are
// read into chunks as they arrive, each held against the process's
// budget, memory, which a chunk that does not fit fails with ErrMemory.
// Once read, the body's bytes take the place of its chunks in the
// budget, and stay there until Release(len(body)). (While the chunks are
// copied into the body, both are in memory, for the time a copy takes,
// not the time a client takes.)
func Read(r io.Reader, most, memory int64) ([]byte, error) {
	var buf [16]*chunk
	read := buf[:0]
	var taken, n int64
	defer func() {
		for _, c := range read {
			chunks.Put(c)
		}
		Release(taken)
	}()
	for {
		if held.Add(chunkSize) > memory {
			held.Add(-chunkSize)
			return nil, ErrMemory
		}
		taken += chunkSize
		c := chunks.Get().(*chunk)
		read = append(read, c)
		end, err := fill(r, c, &n)
		if n > most {
			return nil, ErrTooLarge
		}
		if err != nil {
			return nil, err
		}
		if end {
			break
		}
	}
	body := make([]byte, n)
	for i, c := range read {
		copy(body[i*chunkSize:], c[:])
	}
	// The body keeps n of what its chunks took; the rest is released.
	taken -= n
	return body, nil
}

// fill reads r into c until c is full or r ends, adding what it reads
// to n, and reports whether r ended. Unlike io.ReadFull, it tells the
// end of r from an error that a read returns, io.ErrUnexpectedEOF
// included: that is how a server's body tells of a client gone before
// it sent all it announced.
func fill(r io.Reader, c *chunk, n *int64) (end bool, err error) {
	for m := 0; m < chunkSize; {
		k, err := r.Read(c[m:])
		m += k
		*n += int64(k)
		switch {
		case err == io.EOF:
			return true, nil
		case err != nil:
			return false, err
		}
	}
	return false, nil
}

// Release gives back n bytes a body held: the length of a body Read
// returned, once the request is done with it.
func Release(n int64) {
	held.Add(-n)
}

// ParseSize reads a body_memory as the Caddyfile gives it, as Caddy
// reads request_body's max_size: bytes, or a number with a unit such as
// 64MiB or 64MB.
func ParseSize(v string) (int64, error) {
	n, err := humanize.ParseBytes(v)
	if err != nil || n > math.MaxInt64 {
		return 0, fmt.Errorf("want a size such as 64MiB, got %q", v)
	}
	return int64(n), nil
}

// CheckMemory accepts a body_memory: at least MinMemory bytes.
func CheckMemory(n int64) error {
	if n < MinMemory {
		return fmt.Errorf("want at least %d bytes (2MiB: twice the largest body a zone reads), got %d", MinMemory, n)
	}
	return nil
}

// CheckTimeout accepts a body_timeout: at least 1s.
func CheckTimeout(d time.Duration) error {
	if d < time.Second {
		return fmt.Errorf("want a duration of at least 1s, got %s", d)
	}
	return nil
}
