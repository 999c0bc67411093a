package wait

import (
	"strconv"
	"testing"
	"time"
)

// TestForSeesTheEvent: For returns once cond holds, however many polls
// that takes.
func TestForSeesTheEvent(t *testing.T) {
	calls := 0
	For(t, "the third call", func() bool { calls++; return calls == 3 })
	if calls != 3 {
		t.Fatalf("cond called %d times, want 3: For goes on after it held", calls)
	}
}

// TestPollGivesUpWithWhatItSaw: an event that never comes is a failure
// that quotes what cond last saw.
func TestPollGivesUpWithWhatItSaw(t *testing.T) {
	calls := 0
	ok, saw := poll(5*time.Millisecond, func() (bool, string) {
		calls++
		return false, strconv.Itoa(calls)
	})
	if ok || saw != strconv.Itoa(calls) || calls < 2 {
		t.Fatalf("poll = %v, %q after %d calls; want false and the last call's report, after more than one", ok, saw, calls)
	}
	if Within(time.Millisecond, func() bool { return false }) {
		t.Fatal("Within reports a cond that never held as held")
	}
}
