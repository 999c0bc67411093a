// What a script prints: one JSON line of what the client saw.

// report prints seen as one JSON line.
export function report(seen) {
  process.stdout.write(JSON.stringify(seen) + "\n");
}

// failure is what the client saw of a failed request: the status, the
// class the SDK threw (RateLimitError for a 429) and the headers a client
// acts on.
export function failure(err, rateLimitError) {
  const h = err.headers;
  const header = (name) => (h && typeof h.get === "function" ? h.get(name) : h?.[name]) ?? null;
  return {
    error: {
      status: err.status ?? null,
      class: err.constructor?.name ?? String(err),
      rateLimit: err instanceof rateLimitError,
      message: String(err.message ?? err),
      retryAfter: header("retry-after"),
      remaining: header("x-ratelimit-remaining"),
    },
  };
}

// args are the base URL and the API key, from argv or else the
// environment variables named, and the mode.
export function args(urlEnv, keyEnv) {
  const [baseURL = process.env[urlEnv], apiKey = process.env[keyEnv], mode] = process.argv.slice(2);
  if (!baseURL || !apiKey || !mode) {
    process.stderr.write(`usage: node ${process.argv[1]} <base URL> <API key> <mode> (or ${urlEnv}, ${keyEnv})\n`);
    process.exit(2);
  }
  return { baseURL, apiKey, mode };
}
