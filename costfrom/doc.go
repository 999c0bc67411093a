// Package costfrom reads the cost of a response to an LLM API from the
// response itself: the tokens its body reports it used, or a number in a
// header or trailer. A zone that limits tokens takes a reservation at
// admission (Request reads the bound a request's body asks for) and, once
// the response is written, trues it up to what Writer.Cost read.
//
// A request's body, whole once the handler has read it, is read once for
// every zone, as the most lenient server behind the zone would read it
// (Fields): keys with their escapes decoded and without regard to case,
// values coerced as a lax validator coerces them, and a field given twice
// refused, so that a client cannot spell a field for the zone to read one
// bound and the server another.
//
// A Writer reads a response as it passes it on: the body is never held,
// and the memory it takes does not grow with the body, however large.
// It compares keys as Fields does.
//
// # Formats
//
// A response's format is told from its Content-Type and from the fields
// of its body, never from the request's path, so that one zone can front
// several APIs and an API behind a rewrite:
//
//   - application/json (or +json), one JSON value: the top-level "usage"
//     object of OpenAI's Chat Completions and Completions (prompt_tokens,
//     completion_tokens, total_tokens), of its Responses API (input_tokens,
//     output_tokens, total_tokens) and of Anthropic's Messages
//     (input_tokens, cache_creation_input_tokens, cache_read_input_tokens,
//     output_tokens); or Ollama's prompt_eval_count and eval_count, with
//     "done": true (/api/chat, /api/generate); or the top-level
//     "usageMetadata" of Google's Gemini API and Vertex AI
//     (generateContent: promptTokenCount, cachedContentTokenCount,
//     toolUsePromptTokenCount, candidatesTokenCount, thoughtsTokenCount,
//     totalTokenCount).
//   - A JSON array: Gemini's streamGenerateContent without alt=sse, a
//     chunk an element, each with the usageMetadata so far.
//   - application/x-ndjson, one JSON value a line: Ollama's stream, whose
//     last object ("done": true) has the counts.
//   - text/event-stream, JSON in each event's data: the chunks of Chat
//     Completions and Completions, the last of which (choices empty) has
//     the usage when the request asked for it
//     (stream_options.include_usage, see RequestStreamUsage); the events of
//     the Responses API, whose last (response.completed, or incomplete or
//     failed) has response.usage; Anthropic's events, message_start with
//     message.usage (the input) and message_delta with usage (the output
//     so far, so the last one counts); Gemini's chunks
//     (streamGenerateContent?alt=sse), each with the usageMetadata so far.
//
// A Gemini stream's usage is whole in its last chunk, the one whose
// candidate has a finishReason (or whose promptFeedback a blockReason):
// a stream cut before it has none.
//
// Input is the prompt's tokens: Anthropic counts the tokens read from its
// prompt cache, and those written to it, apart from input_tokens, and they
// are added to it, so that input means the same for every format (OpenAI's
// prompt_tokens and input_tokens include cached tokens, and Gemini's
// promptTokenCount its cached content's). Gemini's input adds the tokens
// of tool results given back to the model (toolUsePromptTokenCount), and
// its output the thoughts of a thinking model (thoughtsTokenCount), which
// are billed as output but not counted in candidatesTokenCount. Total is
// the total given, or input plus output.
//
// A zone priced in money prices each kind of token apart (Usage, Prices):
// OpenAI's cached tokens (usage.prompt_tokens_details.cached_tokens, and
// the Responses API's input_tokens_details.cached_tokens), and Gemini's
// (cachedContentTokenCount), are taken out of the prompt's and priced as
// cache reads; Anthropic's cache reads and
// writes are priced beside its input, and its 1-hour writes
// (usage.cache_creation.ephemeral_1h_input_tokens) apart from the other
// writes. The model a response names (its model, message.model in
// Anthropic's stream, response.model in the Responses API's, Gemini's
// modelVersion) is read too, to price by it.
//
// A request's model and bound are read from its body (Request), but for
// Google's Gemini API and Vertex AI, whose path names the model
// (.../models/gemini-2.5-flash:generateContent, see PathModel): their
// model is the path's, and their bound generationConfig's.
//
// A response has a cost only once a whole usage was read: a stream cut
// before its usage, an error without usage, a body that is not JSON or is
// compressed (Content-Encoding), have none, and the caller keeps its
// reservation.
package costfrom
