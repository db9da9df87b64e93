/**
 * Reading request bodies with limits: at most `maxBytes`, all of it within `timeoutMs`, and a
 * body cut short (the client closed before its Content-Length arrived) answered with a 400.
 * Before this, a slow body held its request forever and a short one was a 500 with a stack
 * trace in the log.
 */
import type { MiddlewareHandler } from "hono";
import { ApiError } from "./errors.ts";

/** Options of {@linkcode bodyReader}. */
export interface BodyLimits {
  /** Largest body in bytes (413 `request_too_large` past it). */
  maxBytes: number;
  /** Time from the request head to the body's last byte (408 `request_timeout` past it; ms). */
  timeoutMs: number;
}

function tooLarge(max: number): ApiError {
  return new ApiError(413, `the request body is over ${max} bytes; send a smaller one`, {
    code: "request_too_large",
  });
}

/**
 * Reads `stream` whole, within the limits.
 *
 * @throws {ApiError} 413 `request_too_large`, 408 `request_timeout`, or 400 `incomplete_body`
 *   when the stream fails (the connection closed part way)
 */
export async function readAll(
  stream: ReadableStream<Uint8Array>,
  limits: BodyLimits,
): Promise<Uint8Array<ArrayBuffer>> {
  const reader = stream.getReader();
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    reader.cancel().catch(() => {});
  }, limits.timeoutMs);
  const parts: Uint8Array[] = [];
  let size = 0;
  try {
    while (true) {
      let chunk: ReadableStreamReadResult<Uint8Array>;
      try {
        chunk = await reader.read();
      } catch (e) {
        if (timedOut) break;
        throw new ApiError(
          400,
          `the request body ended early (${size} bytes read: ${(e as Error).message}); ` +
            "send the whole body, as long as its Content-Length says",
          { code: "incomplete_body" },
        );
      }
      if (chunk.done) break;
      size += chunk.value.length;
      if (size > limits.maxBytes) {
        reader.cancel().catch(() => {});
        throw tooLarge(limits.maxBytes);
      }
      parts.push(chunk.value);
    }
  } finally {
    clearTimeout(timer);
  }
  if (timedOut) {
    throw new ApiError(
      408,
      `the request body did not arrive within ${limits.timeoutMs / 1000} s; send it at once`,
      { code: "request_timeout", headers: { Connection: "close" } },
    );
  }
  const body = new Uint8Array(size);
  let off = 0;
  for (const p of parts) {
    body.set(p, off);
    off += p.length;
  }
  return body;
}

/**
 * Middleware that reads the request body within the limits and hands the routes a request with
 * the body in memory (so `c.req.text()` cannot hang or fail). A declared Content-Length over
 * the limit is refused before anything is read.
 */
export function bodyReader(limits: BodyLimits): MiddlewareHandler {
  return async (c, next) => {
    const raw = c.req.raw;
    if (raw.body === null) return await next();
    const declared = Number(raw.headers.get("content-length") ?? NaN);
    if (declared > limits.maxBytes) {
      raw.body.cancel().catch(() => {});
      throw tooLarge(limits.maxBytes);
    }
    const body = await readAll(raw.body, limits);
    c.req.raw = new Request(raw, { body });
    await next();
  };
}
