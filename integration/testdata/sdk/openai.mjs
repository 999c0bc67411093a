// The official OpenAI client against a base URL (Caddy in front of an
// OpenAI-compatible upstream). Modes:
//
//	chat                non-streaming chat.completions.create
//	chat-stream         streaming, without stream_options
//	chat-stream-usage   streaming, with stream_options.include_usage
//	responses-stream    streaming responses.create
//
// Prints one JSON line: the text, the usage the client got, the number
// of chunks (events), and those with usage; or the error.
import OpenAI from "openai";
import { args, failure, report } from "./report.mjs";

const { baseURL, apiKey, mode } = args("OPENAI_BASE_URL", "OPENAI_API_KEY");
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 20000 });
const messages = [{ role: "user", content: "Hello" }];

async function run() {
  switch (mode) {
    case "chat": {
      const c = await client.chat.completions.create({ model: "gpt-4o", max_tokens: 2000, messages });
      return { text: c.choices[0].message.content, usage: c.usage ?? null, chunks: 1, usageChunks: c.usage ? 1 : 0 };
    }
    case "chat-stream":
    case "chat-stream-usage": {
      const stream = await client.chat.completions.create({
        model: "gpt-4o",
        messages,
        stream: true,
        ...(mode === "chat-stream-usage" ? { stream_options: { include_usage: true } } : {}),
      });
      let text = "", usage = null, chunks = 0, usageChunks = 0, finish = null;
      for await (const chunk of stream) {
        chunks++;
        text += chunk.choices[0]?.delta?.content ?? "";
        finish = chunk.choices[0]?.finish_reason ?? finish;
        if (chunk.usage) {
          usage = chunk.usage;
          usageChunks++;
        }
      }
      return { text, usage, chunks, usageChunks, finish };
    }
    case "responses-stream": {
      const stream = await client.responses.create({ model: "gpt-4.1", input: "Hello", stream: true });
      let text = "", usage = null, chunks = 0, usageChunks = 0, finish = null;
      for await (const event of stream) {
        chunks++;
        if (event.type === "response.output_text.done") text = event.text;
        if (event.type === "response.completed") {
          usage = event.response.usage;
          usageChunks++;
          finish = event.response.status;
        }
      }
      return { text, usage, chunks, usageChunks, finish };
    }
  }
  throw new Error(`unknown mode ${mode}`);
}

try {
  report(await run());
} catch (err) {
  report(failure(err, OpenAI.RateLimitError));
}
