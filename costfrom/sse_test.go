package costfrom

import "testing"

// TestQuietEvents: an event with nothing to read passes unread, whole,
// with its lines ended by LF or by CRLF; Gemini's chunks are read only
// where one may end its response.
func TestQuietEvents(t *testing.T) {
	const (
		chunk = `data: {"candidates": [{"content": {"parts": [{"text": "Hi"}]},"index": 0}],"usageMetadata": {"promptTokenCount": 9,"totalTokenCount": 10},"modelVersion": "gemini-2.5-flash"}`
		last  = `data: {"candidates": [{"content": {"parts": [{"text": ""}]},"finishReason": "STOP","index": 0}],"usageMetadata": {"promptTokenCount": 9,"totalTokenCount": 12}}`
	)
	for _, c := range []struct {
		name, event  string
		whole, quiet bool // wholeEvent takes all of it; quiet
	}{
		{"openai chunk", `data: {"choices":[{"delta":{"content":"Hi"}}],"usage":null}` + "\n\n", true, true},
		{"openai usage", `data: {"choices":[],"usage":{"prompt_tokens":9}}` + "\n\n", true, false},
		{"gemini chunk", chunk + "\r\n\r\n", true, true},
		{"gemini chunk, LF", chunk + "\n\n", true, true},
		{"gemini last", last + "\r\n\r\n", true, false},
		{"gemini blocked", `data: {"promptFeedback": {"blockReason": "SAFETY"},"usage_metadata": {"promptTokenCount": 9}}` + "\r\n\r\n", true, false},
		{"gemini last, keys in capitals", `data: {"candidates": [{"FINISHREASON": "STOP"}],"USAGEMETADATA": {"promptTokenCount": 9}}` + "\r\n\r\n", true, false},
		{"gemini escaped", `data: {"candidates": [{"finishRe\u0061son": "STOP"}],"usageMetadata": {}}` + "\r\n\r\n", true, false},
		// Lines that end otherwise, or an event not whole, are read line
		// by line.
		{"mixed endings", "data: {}\r\n\n", false, false},
		{"CR alone", "data: {}\r\r", false, false},
		{"cut", chunk + "\r\n", false, false},
	} {
		n := wholeEvent([]byte(c.event))
		if want := map[bool]int{true: len(c.event)}[c.whole]; n != want {
			t.Errorf("%s: wholeEvent = %d, want %d", c.name, n, want)
		}
		if n > 0 && quiet([]byte(c.event[:n]), false) != c.quiet {
			t.Errorf("%s: quiet = %v, want %v", c.name, !c.quiet, c.quiet)
		}
	}
}
