// The official Anthropic client against a base URL (Caddy in front of an
// upstream answering as Anthropic's Messages API). Modes:
//
//	messages         non-streaming messages.create
//	messages-stream  messages.stream, to its final message
//
// Prints one JSON line: the text, the usage the client got, the number
// of events, and those with usage; or the error.
import Anthropic from "@anthropic-ai/sdk";
import { args, failure, report } from "./report.mjs";

const { baseURL, apiKey, mode } = args("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY");
const client = new Anthropic({ baseURL, apiKey, maxRetries: 0, timeout: 20000 });
const request = { model: "claude-sonnet-4-5", max_tokens: 1024, messages: [{ role: "user", content: "Hello" }] };

const text = (m) => m.content.filter((b) => b.type === "text").map((b) => b.text).join("");

async function run() {
  switch (mode) {
    case "messages": {
      const m = await client.messages.create(request);
      return { text: text(m), usage: m.usage, chunks: 1, usageChunks: 1, finish: m.stop_reason };
    }
    case "messages-stream": {
      const stream = client.messages.stream(request);
      let chunks = 0, usageChunks = 0;
      for await (const event of stream) {
        chunks++;
        if (event.type === "message_start" || event.type === "message_delta") usageChunks++;
      }
      const m = await stream.finalMessage();
      return { text: text(m), usage: m.usage, chunks, usageChunks, finish: m.stop_reason };
    }
  }
  throw new Error(`unknown mode ${mode}`);
}

try {
  report(await run());
} catch (err) {
  report(failure(err, Anthropic.RateLimitError));
}
