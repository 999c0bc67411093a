package costfrom

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

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
		{"gemini chunk, a usage after its usageMetadata", `data: {"usageMetadata": {"promptTokenCount": 9},"USAGE": {"prompt_tokens": 9}}` + "\r\n\r\n", true, false},
		{"gemini chunk, a usage null after its usageMetadata", `data: {"usageMetadata": {"promptTokenCount": 9},"Usage": null}` + "\r\n\r\n", true, true},
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

// TestQuietGeminiEndKeys: a Gemini chunk that ends its response is read
// however the key that tells it is spelled, as long as the scanner reads
// it as that key: in any case, in snake case, with a long s, or with the
// Kelvin sign for the k of block. Each spelling is checked against the
// Writer, which must read the chunk's usage whole as in two pieces.
func TestQuietGeminiEndKeys(t *testing.T) {
	for _, key := range []string{"finishReason", "finish_reason", "blockReason", "block_reason"} {
		var spellings []string
		for _, s := range []string{key, strings.ToLower(key), strings.ToUpper(key),
			strings.ReplaceAll(key, "s", "ſ"), strings.ReplaceAll(key, "k", "\u212a")} {
			spellings = append(spellings, s)
		}
		for i := range key {
			// The key with its i-th letter in the other case.
			b := []byte(key)
			b[i] ^= 0x20
			if b[i]|0x20 >= 'a' && b[i]|0x20 <= 'z' {
				spellings = append(spellings, string(b))
			}
		}
		for _, k := range spellings {
			body := `{"candidates": [{"` + k + `": "STOP"}],"usageMetadata": {"promptTokenCount": 9,"totalTokenCount": 12}}`
			if strings.HasPrefix(key, "block") {
				body = `{"promptFeedback": {"` + k + `": "SAFETY"},"usageMetadata": {"promptTokenCount": 9,"totalTokenCount": 12}}`
			}
			event := "data: " + body + "\r\n\r\n"
			if quiet([]byte(event), false) {
				t.Errorf("%s: quiet, and the chunk ends its response", k)
			}
			for _, at := range []int{len(event), len(event) / 2} {
				cw := Wrap(newRecorder(), Source{Count: Total})
				cw.Header().Set("Content-Type", "text/event-stream")
				cw.Write([]byte(event[:at]))
				cw.Write([]byte(event[at:]))
				if n, ok := cw.Tokens(Total); !ok || n != 12 {
					t.Errorf("%s, written in pieces at %d: Tokens(Total) = %d, %v, want 12", k, at, n, ok)
				}
			}
		}
	}
}

// TestKeyByteNonASCII: of the runes beyond ASCII, only the long s and the
// Kelvin sign fold to an ASCII letter. quiet and hasEndKey rely on it:
// they look for keys as ASCII in any case, and for those two runes apart.
func TestKeyByteNonASCII(t *testing.T) {
	want := map[rune]byte{'ſ': 's', '\u212a': 'k'}
	for r := rune(utf8.RuneSelf); r <= unicode.MaxRune; r++ {
		b, ok := keyByte(r)
		if !ok || !('a' <= b && b <= 'z') {
			continue
		}
		if want[r] != b {
			t.Errorf("keyByte(%U) = %q", r, b)
		}
		delete(want, r)
	}
	for r := range want {
		t.Errorf("keyByte(%U) folds to no letter", r)
	}
}

// TestHolds: holds finds its pair wherever it is, after any number of
// its first byte alone.
func TestHolds(t *testing.T) {
	for _, c := range []struct {
		p    string
		want bool
	}{
		{``, false},
		{`\`, false},
		{`\u`, true},
		{`ab\`, false},
		{`\n\t\\u`, true},
		{`\n\t\\`, false},
		{`{"a":"ſ"}`, true},
		{"\xc5\xc5\xc5\xbf", true},
		{"\xc5\xc5\xc5", false},
	} {
		pair := escapeU
		if strings.ContainsRune(c.p, 'ſ') || strings.Contains(c.p, "\xc5") {
			pair = longS
		}
		if got := holds([]byte(c.p), pair); got != c.want {
			t.Errorf("holds(%q, %q) = %v, want %v", c.p, pair, got, c.want)
		}
	}
}
