// Google's official Gen AI client (@google/genai) against a base URL
// (Caddy in front of an upstream answering as the Gemini API and Vertex
// AI do). Modes:
//
//	generate             models.generateContent on the Gemini API
//	generate-stream      models.generateContentStream on the Gemini API
//	                     (streamGenerateContent?alt=sse)
//	vertex-stream        models.generateContentStream on Vertex AI, in
//	                     express mode (an API key, no project)
//
// Prints one JSON line: the text, the usage the client got
// (usageMetadata, of the last chunk of a stream), the number of chunks,
// and those with usage counts; or the error.
import { ApiError, GoogleGenAI } from "@google/genai";
import { args, failure, report } from "./report.mjs";

const { baseURL, apiKey, mode } = args("GOOGLE_GEMINI_BASE_URL", "GEMINI_API_KEY");
const vertexai = mode.startsWith("vertex");
// The client's ApiError carries no headers: the last answer's are kept,
// for the Retry-After a client would wait.
let answered;
const fetchKeepingHeaders = async (url, init) => {
  const response = await fetch(url, init);
  answered = response.headers;
  return response;
};
const client = new GoogleGenAI({
  vertexai,
  apiKey,
  httpOptions: { baseUrl: baseURL, timeout: 20000, fetch: fetchKeepingHeaders },
});
const request = {
  model: vertexai ? "gemini-2.5-flash-lite" : "gemini-2.5-flash",
  contents: "Why are there two tides a day?",
  config: { maxOutputTokens: 2000, thinkingConfig: { includeThoughts: true } },
};

// text is the answer's text, without its thoughts (a part with
// thought: true) or its function calls.
const text = (r) =>
  (r.candidates?.[0]?.content?.parts ?? []).filter((p) => typeof p.text === "string" && !p.thought).map((p) => p.text).join("");

async function run() {
  switch (mode) {
    case "generate": {
      const r = await client.models.generateContent(request);
      return { text: text(r), usage: r.usageMetadata, chunks: 1, usageChunks: 1, finish: r.candidates?.[0]?.finishReason };
    }
    case "generate-stream":
    case "vertex-stream": {
      let chunks = 0, usageChunks = 0, all = "", usage, finish;
      for await (const chunk of await client.models.generateContentStream(request)) {
        chunks++;
        all += text(chunk);
        if (chunk.usageMetadata?.totalTokenCount !== undefined) {
          usageChunks++;
          usage = chunk.usageMetadata;
        }
        finish = chunk.candidates?.[0]?.finishReason ?? finish;
      }
      return { text: all, usage, chunks, usageChunks, finish };
    }
  }
  throw new Error(`unknown mode ${mode}`);
}

try {
  report(await run());
} catch (err) {
  const seen = failure(err, ApiError);
  // The client throws one class for every status: a 429 is its rate
  // limit error.
  seen.error.rateLimit = err instanceof ApiError && err.status === 429;
  seen.error.retryAfter = answered?.get("retry-after") ?? null;
  seen.error.remaining = answered?.get("x-ratelimit-remaining") ?? null;
  report(seen);
}
