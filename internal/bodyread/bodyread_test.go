package bodyread

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// TestReadWhole: a body of any length, ending on a chunk's edge or not,
// is read whole into a slice of its length, which holds its length in
// the budget until it is released.
func TestReadWhole(t *testing.T) {
	for _, n := range []int{0, 1, chunkSize - 1, chunkSize, chunkSize + 1, 3*chunkSize + 7, MaxSize} {
		want := bytes.Repeat([]byte("abcdefg"), n/7+1)[:n]
		got, err := Read(bytes.NewReader(want), MaxSize, DefaultMemory)
		if err != nil || !bytes.Equal(got, want) || cap(got) != n {
			t.Fatalf("%d bytes: read %d bytes (cap %d), %v; want them all, in a slice of their length", n, len(got), cap(got), err)
		}
		if h := held.Load(); h != int64(n) {
			t.Fatalf("%d bytes read: %d held, want the body's length", n, h)
		}
		Release(int64(len(got)))
		if h := held.Load(); h != 0 {
			t.Fatalf("%d bytes released: %d still held", n, h)
		}
	}
}

// TestReadHoldsWhatArrived: a body announced long that has sent one byte
// holds one chunk, whatever it announced; when it fails, it holds
// nothing.
func TestReadHoldsWhatArrived(t *testing.T) {
	pr, pw := io.Pipe()
	done := make(chan error)
	go func() {
		_, err := Read(pr, MaxSize, DefaultMemory)
		done <- err
	}()
	// The pipe hands the byte over only once Read takes it, into its
	// first chunk.
	if _, err := pw.Write([]byte("{")); err != nil {
		t.Fatal(err)
	}
	if h := held.Load(); h != chunkSize {
		t.Fatalf("one byte arrived: %d held, want one chunk (%d)", h, chunkSize)
	}
	gone := errors.New("client gone")
	pw.CloseWithError(gone)
	if err := <-done; !errors.Is(err, gone) {
		t.Fatalf("Read: %v, want the reader's error", err)
	}
	if h := held.Load(); h != 0 {
		t.Fatalf("after a failed read: %d held, want 0", h)
	}
}

// TestReadWithinBudget: a chunk that would take the memory held past the
// budget fails the read with ErrMemory, and the chunks it had go back; a
// body larger than the most asked for fails with ErrTooLarge.
func TestReadWithinBudget(t *testing.T) {
	body := strings.Repeat("a", 3*chunkSize)
	// Three chunks fill the budget, and the end of the body is seen
	// only by reading into a fourth.
	if _, err := Read(strings.NewReader(body), MaxSize, 3*chunkSize); !errors.Is(err, ErrMemory) {
		t.Fatalf("a body past the budget: %v, want ErrMemory", err)
	}
	if h := held.Load(); h != 0 {
		t.Fatalf("after ErrMemory: %d held, want 0", h)
	}
	got, err := Read(strings.NewReader(body), MaxSize, 4*chunkSize)
	if err != nil || len(got) != len(body) {
		t.Fatalf("a body within the budget: %d bytes, %v", len(got), err)
	}
	Release(int64(len(got)))
	if _, err := Read(strings.NewReader(body), int64(len(body))-1, DefaultMemory); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a body one byte too large: %v, want ErrTooLarge", err)
	}
	if h := held.Load(); h != 0 {
		t.Fatalf("after ErrTooLarge: %d held, want 0", h)
	}
}

// TestChecks: body_memory below MinMemory and body_timeout below 1s are
// refused, naming the value.
func TestChecks(t *testing.T) {
	if err := CheckMemory(MinMemory - 1); err == nil || !strings.Contains(err.Error(), "2097151") {
		t.Errorf("CheckMemory(MinMemory-1): %v", err)
	}
	if err := CheckMemory(MinMemory); err != nil {
		t.Errorf("CheckMemory(MinMemory): %v", err)
	}
	if err := CheckTimeout(999_000_000); err == nil || !strings.Contains(err.Error(), "999ms") {
		t.Errorf("CheckTimeout(999ms): %v", err)
	}
	if err := CheckTimeout(DefaultTimeout); err != nil {
		t.Errorf("CheckTimeout(DefaultTimeout): %v", err)
	}
}

// TestReadCutShort: a body whose reader fails, even with
// io.ErrUnexpectedEOF (a client gone before it sent what it announced),
// fails the read: it is not taken for a body that ended.
func TestReadCutShort(t *testing.T) {
	r := io.MultiReader(strings.NewReader("{\"max_tokens\":"), iotest.ErrReader(io.ErrUnexpectedEOF))
	if b, err := Read(r, MaxSize, DefaultMemory); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("a body cut short: %q, %v; want io.ErrUnexpectedEOF", b, err)
	}
	if h := held.Load(); h != 0 {
		t.Fatalf("after a body cut short: %d held, want 0", h)
	}
}
