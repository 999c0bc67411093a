// Package wait is how tests wait for an event: they poll for it with a
// deadline rather than sleep for a time that is long enough on one machine
// and too short on a busy one. The deadline is no bound on how long the
// event may take, only a failure for one that never comes.
package wait

import (
	"fmt"
	"testing"
	"time"
)

// Budget is how long For and Seen wait before they fail the test. It is
// long, because only a broken build should ever reach it.
const Budget = 30 * time.Second

// For polls cond until it holds, failing t with what it waited for if it
// has not held within Budget.
func For(t testing.TB, what string, cond func() bool) {
	t.Helper()
	Seen(t, what, func() (bool, string) { return cond(), "" })
}

// Seen is For for a cond that says what it saw each time: a failure quotes
// the last thing seen, which is what tells a slow event from a wrong one.
func Seen(t testing.TB, what string, cond func() (ok bool, saw string)) {
	t.Helper()
	if ok, saw := poll(Budget, cond); !ok {
		msg := fmt.Sprintf("timed out after %v waiting for %s", Budget, what)
		if saw != "" {
			msg += "; last saw " + saw
		}
		t.Fatal(msg)
	}
}

// Within polls cond until it holds or timeout passes, and reports whether
// it held; it is for test support that returns an error rather than fail a
// test, and for waits whose timeout the caller chose.
func Within(timeout time.Duration, cond func() bool) bool {
	ok, _ := poll(timeout, func() (bool, string) { return cond(), "" })
	return ok
}

// poll calls cond, at first every millisecond so that a quick event is
// seen at once, backing off to every 20 ms so that a slow one does not
// spin a shared machine, until cond holds or timeout passes. It returns
// whether cond held and what cond last said.
func poll(timeout time.Duration, cond func() (bool, string)) (bool, string) {
	deadline := time.Now().Add(timeout)
	for pause := time.Millisecond; ; pause = min(2*pause, 20*time.Millisecond) {
		ok, saw := cond()
		if ok || time.Now().After(deadline) {
			return ok, saw
		}
		time.Sleep(pause)
	}
}
