// Command llm answers as an OpenAI-compatible model server does, so that
// bench/load.sh can measure Caddy reading token usage from a proxied
// answer: GET /json is a 2 KB Chat Completion, GET /stream a streamed one
// of 200 server-sent events, each written and flushed on its own as a
// model server writes its tokens. GET /gemini is a stream of 200 chunks
// as Google's Gemini API sends them (streamGenerateContent?alt=sse): each
// with its usageMetadata so far, the last with its finishReason.
//
//	go run ./bench/llm -listen 127.0.0.1:9099
package main

import (
	"flag"
	"fmt"
	"log"
	"net/http"
	"strings"
)

const (
	chunk = `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"tok "},"finish_reason":null}]}` + "\n\n"
	usage = `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":20,"completion_tokens":198,"total_tokens":218}}` + "\n\n"
	done  = "data: [DONE]\n\n"
)

// geminiChunk is the i-th of the 200 chunks of /gemini, the last of
// which ends the answer.
func geminiChunk(i int) string {
	finish := ""
	if i == 199 {
		finish = `,"finishReason": "STOP"`
	}
	return fmt.Sprintf(`data: {"candidates": [{"content": {"parts": [{"text": "tok "}],"role": "model"}%s,"index": 0}],"usageMetadata": {"promptTokenCount": 20,"candidatesTokenCount": %d,"totalTokenCount": %d,"promptTokensDetails": [{"modality": "TEXT","tokenCount": 20}]},"modelVersion": "gemini-2.5-flash","responseId": "K3mtaOeQC9Lbz7IPh-6ZsQM"}`+"\r\n\r\n",
		finish, i+1, 21+i)
}

var answer = fmt.Sprintf(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"%s"},"finish_reason":"stop"}],"usage":{"prompt_tokens":20,"completion_tokens":40,"total_tokens":60}}`,
	strings.Repeat("lorem ipsum dolor sit amet ", 70))

func main() {
	listen := flag.String("listen", "127.0.0.1:9099", "the address to serve on")
	flag.Parse()
	http.HandleFunc("GET /json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, answer)
	})
	http.HandleFunc("GET /stream", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for range 198 {
			fmt.Fprint(w, chunk)
			rc.Flush()
		}
		fmt.Fprint(w, usage)
		rc.Flush()
		fmt.Fprint(w, done)
	})
	gemini := make([]string, 200)
	for i := range gemini {
		gemini[i] = geminiChunk(i)
	}
	http.HandleFunc("GET /gemini", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for _, c := range gemini {
			fmt.Fprint(w, c)
			rc.Flush()
		}
	})
	log.Fatal(http.ListenAndServe(*listen, nil))
}
