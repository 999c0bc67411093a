package costfrom

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// answer2K is a Chat Completions answer of 2 KiB.
func answer2K() []byte {
	head := `{"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion","created":1741570283,"model":"gpt-4o-2024-08-06","choices":[{"index":0,"message":{"role":"assistant","content":"`
	tail := `","refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":1117,"completion_tokens":46,"total_tokens":1163,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},"service_tier":"default","system_fingerprint":"fp_fc9f1d7035"}`
	content := strings.Repeat(`The sky looks blue because air scatters the short, blue wavelengths of sunlight more than the long, red ones; this is called Rayleigh scattering.\n\nAt sunset, light crosses more air, so the blue is scattered away and the \"reds\" remain. `, 8)
	return []byte(head + content[:2048-len(head)-len(tail)] + tail)
}

// stream200 is a Chat Completions stream of 200 events, the last two the
// usage chunk and [DONE], an event a write.
func stream200() [][]byte {
	events := make([][]byte, 0, 200)
	for i := range 198 {
		events = append(events, fmt.Appendf(nil, `data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[{"index":0,"delta":{"content":" token%d"},"logprobs":null,"finish_reason":null}],"usage":null}`+"\n\n", i))
	}
	events = append(events,
		[]byte(`data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":198,"total_tokens":207,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}}}`+"\n\n"),
		[]byte("data: [DONE]\n\n"))
	return events
}

// geminiChunk is the i-th of the 200 chunks of a Gemini answer, with its
// usageMetadata so far, the last with its finishReason.
func geminiChunk(i int) []byte {
	finish := ""
	if i == 199 {
		finish = `,"finishReason": "STOP"`
	}
	return fmt.Appendf(nil, `{"candidates": [{"content": {"parts": [{"text": " token%d"}],"role": "model"}%s,"index": 0}],"usageMetadata": {"promptTokenCount": 9,"candidatesTokenCount": %d,"totalTokenCount": %d,"promptTokensDetails": [{"modality": "TEXT","tokenCount": 9}],"thoughtsTokenCount": 12},"modelVersion": "gemini-2.5-flash","responseId": "K3mtaOeQC9Lbz7IPh-6ZsQM"}`,
		i, finish, i+1, 22+i)
}

// geminiStream200 is a Gemini API stream (streamGenerateContent?alt=sse)
// of 200 chunks, a chunk a write.
func geminiStream200() [][]byte {
	events := make([][]byte, 0, 200)
	for i := range 200 {
		events = append(events, append(append([]byte("data: "), geminiChunk(i)...), "\r\n\r\n"...))
	}
	return events
}

// geminiArray200 is the same answer streamed without alt=sse: a JSON
// array of the 200 chunks, a chunk a write with the comma or bracket
// before it, the closing bracket the last write.
func geminiArray200() [][]byte {
	writes := make([][]byte, 0, 201)
	for i := range 200 {
		sep := ",\r\n"
		if i == 0 {
			sep = "["
		}
		writes = append(writes, append([]byte(sep), geminiChunk(i)...))
	}
	return append(writes, []byte("]"))
}

// BenchmarkJSON writes a 2 KiB answer straight to the ResponseWriter, and
// through a Writer (reset, as from a pool, or made by Wrap).
func BenchmarkJSON(b *testing.B) {
	body := answer2K()
	rw := &discard{h: http.Header{"Content-Type": {"application/json"}}}
	src := Source{Count: Total}
	b.Run("direct", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for range b.N {
			rw.WriteHeader(http.StatusOK)
			rw.Write(body)
		}
	})
	b.Run("writer", func(b *testing.B) {
		cw := Wrap(rw, src)
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for range b.N {
			cw.Reset(rw, src)
			cw.WriteHeader(http.StatusOK)
			cw.Write(body)
			if _, ok := cw.Cost(); !ok {
				b.Fatal("no cost")
			}
		}
	})
	b.Run("wrap", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for range b.N {
			cw := Wrap(rw, src)
			cw.WriteHeader(http.StatusOK)
			cw.Write(body)
			if _, ok := cw.Cost(); !ok {
				b.Fatal("no cost")
			}
		}
	})
	b.Run("header", func(b *testing.B) {
		rw := &discard{h: http.Header{"Content-Type": {"application/json"}, "X-Tokens": {"1163"}}}
		src := Source{Header: "X-Tokens"}
		cw := Wrap(rw, src)
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for range b.N {
			cw.Reset(rw, src)
			cw.WriteHeader(http.StatusOK)
			cw.Write(body)
			if _, ok := cw.Cost(); !ok {
				b.Fatal("no cost")
			}
		}
	})
}

// BenchmarkStream writes a 200-event stream, an event a write and a
// flush, straight to the ResponseWriter and through a Writer, without and
// with HideStreamUsage; gemini/ the same for a Gemini stream of 200
// chunks, every one of which carries a usageMetadata, and gemini-array/
// for the same chunks as a streamed JSON array.
func BenchmarkStream(b *testing.B) {
	const sse, json = "text/event-stream; charset=utf-8", "application/json; charset=UTF-8"
	benchmarkStream(b, sse, stream200())
	b.Run("gemini", func(b *testing.B) { benchmarkStream(b, sse, geminiStream200()) })
	b.Run("gemini-array", func(b *testing.B) { benchmarkStream(b, json, geminiArray200()) })
}

func benchmarkStream(b *testing.B, contentType string, events [][]byte) {
	size := 0
	for _, e := range events {
		size += len(e)
	}
	rw := &discard{h: http.Header{"Content-Type": {contentType}}}
	src := Source{Count: Total}
	b.Run("direct", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(size))
		for range b.N {
			rw.WriteHeader(http.StatusOK)
			for _, e := range events {
				rw.Write(e)
				rw.Flush()
			}
		}
	})
	for _, hide := range []bool{false, true} {
		name := "writer"
		if hide {
			name = "writer-hide"
		}
		b.Run(name, func(b *testing.B) {
			cw := Wrap(rw, src)
			b.ReportAllocs()
			b.SetBytes(int64(size))
			for range b.N {
				cw.Reset(rw, src)
				if hide {
					cw.HideStreamUsage()
				}
				cw.WriteHeader(http.StatusOK)
				for _, e := range events {
					cw.Write(e)
					cw.Flush()
				}
				if _, ok := cw.Cost(); !ok {
					b.Fatal("no cost")
				}
			}
		})
	}
}

// BenchmarkRequest reads a request's body of 2 KiB.
func BenchmarkRequest(b *testing.B) {
	body := []byte(`{"model":"gpt-4o-mini","stream":true,"max_tokens":512,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"` + strings.Repeat("Tell me about the sky. ", 85) + `"}]}`)
	var r Request
	b.Run("MaxTokens", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for range b.N {
			if err := r.Read("", body); err != nil {
				b.Fatal(err)
			}
			if n, _ := r.MaxTokens(4096); n != 512 {
				b.Fatal("wrong bound")
			}
		}
	})
	b.Run("StreamUsage", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for range b.N {
			if err := r.Read("", body); err != nil {
				b.Fatal(err)
			}
			if _, ok := r.StreamUsage(); !ok {
				b.Fatal("not changed")
			}
		}
	})
}
