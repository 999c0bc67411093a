package costfrom

// readRequest reads a request's body, which must be one JSON object.
func readRequest(body []byte) (record, bool) {
	var s scanner
	n, done := s.feed(body, 0)
	if !done || s.rec.top != kindObject {
		return record{}, false
	}
	for _, c := range body[n:] {
		if c != ' ' && c != '\n' && c != '\r' && c != '\t' {
			return record{}, false
		}
	}
	return s.rec, true
}

// MaxTokens returns the most tokens a request's body lets the model
// generate: the largest of max_tokens (Chat Completions, Completions,
// Anthropic's Messages), max_completion_tokens (Chat Completions),
// max_output_tokens (the Responses API) and options.num_predict (Ollama)
// that is a positive integer. It returns def if there is none, or if the
// body is not a JSON object. The largest is taken so that a request that
// gives two bounds, or one twice, cannot be reserved for the smaller one
// and served the larger.
func MaxTokens(body []byte, def int64) int64 {
	r, ok := readRequest(body)
	if !ok || r.maxOut == 0 {
		return def
	}
	return r.maxOut
}

// includeUsage is what RequestStreamUsage asks for.
const includeUsage = `"include_usage":true`

// RequestStreamUsage returns the body of a streamed Chat Completions or
// Completions request (OpenAI's, or a server compatible with it) changed to
// ask for the usage chunk at the end of the stream, and true; or the body
// and false if it needs no change. The request is one with "stream": true
// and messages or prompt, and without input (the Responses API, whose
// stream always ends with its usage) or stream_options.include_usage
// true. Its stream_options gets "include_usage": true, and nothing else
// in the body changes. A Writer then hides the usage chunk from the client
// (Writer.HideStreamUsage), which sees the stream it asked for.
//
// Anthropic's Messages API refuses a stream_options field: a request for
// it must not be changed (the handler tells one by its anthropic-version
// header).
func RequestStreamUsage(body []byte) ([]byte, bool) {
	r, ok := readRequest(body)
	if !ok || !r.stream || !r.chat || r.input || r.include.kind == kindTrue {
		return body, false
	}
	var at, end int
	var insert string
	switch {
	case r.opts.kind == kindNone:
		at = r.topStart + 1
		end, insert = at, `"stream_options":{`+includeUsage+`},`
	case r.opts.kind != kindObject:
		at, end, insert = r.opts.start, r.opts.end, `{`+includeUsage+`}`
	case r.include.kind == kindNone:
		at = r.opts.start + 1
		end, insert = at, includeUsage
		if r.optsFull {
			insert += ","
		}
	default:
		at, end, insert = r.include.start, r.include.end, "true"
	}
	out := make([]byte, 0, len(body)-(end-at)+len(insert))
	out = append(out, body[:at]...)
	out = append(out, insert...)
	return append(out, body[end:]...), true
}
