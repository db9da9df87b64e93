/**
 * A raw HTTP/1.1 client over a TCP socket, for requests no well-behaved client sends: a head
 * and a body in separate writes, bodies shorter than their Content-Length, half-closed
 * sockets, garbage. Used by tests/hardening_test.ts and tests/fuzz_test.ts.
 */

/** What came back on the socket. */
export interface RawResponse {
  /** The status of the first response, or null when none arrived. */
  status: number | null;
  /** Its headers, names in lower case. */
  headers: Record<string, string>;
  /** Its body (everything after the head that arrived). */
  body: string;
  /** Every byte that arrived, as text. */
  raw: string;
  /** The server closed the connection before `timeoutMs`. */
  closed: boolean;
}

/** Options of {@linkcode rawRequest}. */
export interface RawOptions {
  /** Pause between the parts (ms; default 0). */
  gapMs?: number;
  /** Half-close (shut down writing) after the last part. */
  halfClose?: boolean;
  /** Give up reading after this (ms; default 5000). */
  timeoutMs?: number;
  /** Return once the first response's head and Content-Length body are in (default true). */
  untilResponse?: boolean;
}

const enc = new TextEncoder();

/** Parses the first response of `raw` (status, headers, body), as far as it arrived. */
export function parseResponse(raw: string): Omit<RawResponse, "closed" | "raw"> {
  const m = raw.match(/^HTTP\/1\.[01] (\d{3})[^\r\n]*\r\n/);
  if (!m) return { status: null, headers: {}, body: "" };
  const end = raw.indexOf("\r\n\r\n");
  const head = end < 0 ? raw : raw.slice(0, end);
  const headers: Record<string, string> = {};
  for (const line of head.split("\r\n").slice(1)) {
    const i = line.indexOf(":");
    if (i > 0) headers[line.slice(0, i).trim().toLowerCase()] = line.slice(i + 1).trim();
  }
  return { status: Number(m[1]), headers, body: end < 0 ? "" : raw.slice(end + 4) };
}

function complete(raw: string): boolean {
  const r = parseResponse(raw);
  if (r.status === null || !raw.includes("\r\n\r\n")) return false;
  const length = Number(r.headers["content-length"] ?? NaN);
  return Number.isFinite(length) && enc.encode(r.body).length >= length;
}

/**
 * Writes `parts` to a new connection to `127.0.0.1:port` (each in a write of its own), then
 * reads until the first response is complete, the server closes, or `timeoutMs` passes; the
 * socket is closed before returning.
 */
export async function rawRequest(
  port: number,
  parts: (string | Uint8Array)[],
  options: RawOptions = {},
): Promise<RawResponse> {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port });
  let raw = "", closed = false;
  const decoder = new TextDecoder();
  const reading = (async () => {
    const buf = new Uint8Array(16384);
    while (true) {
      const n = await conn.read(buf).catch(() => null);
      if (n === null) {
        closed = true;
        return;
      }
      raw += decoder.decode(buf.subarray(0, n), { stream: true });
      if ((options.untilResponse ?? true) && complete(raw)) return;
    }
  })();
  try {
    for (let i = 0; i < parts.length; i++) {
      if (i > 0 && options.gapMs) await new Promise((r) => setTimeout(r, options.gapMs));
      const p = parts[i];
      await conn.write(typeof p === "string" ? enc.encode(p) : p).catch(() => {});
    }
    if (options.halfClose) await conn.closeWrite().catch(() => {});
    let timer: ReturnType<typeof setTimeout> | undefined;
    await Promise.race([
      reading,
      new Promise((r) => (timer = setTimeout(r, options.timeoutMs ?? 5000))),
    ]);
    clearTimeout(timer);
  } finally {
    try {
      conn.close();
    } catch { /* closed */ }
  }
  await reading;
  return { ...parseResponse(raw), raw, closed };
}

/** A request head (`Host: 127.0.0.1` unless `headers` has one) with a JSON Content-Type. */
export function head(
  method: string,
  path: string,
  headers: Record<string, string | number> = {},
): string {
  const all: Record<string, string | number> = { host: "127.0.0.1", ...headers };
  const lines = Object.entries(all).map(([k, v]) => `${k}: ${v}\r\n`).join("");
  return `${method} ${path} HTTP/1.1\r\n${lines}\r\n`;
}

/** The head and body of a JSON POST, as two parts (write them apart or together). */
export function jsonPost(
  path: string,
  body: unknown,
  headers: Record<string, string | number> = {},
): [string, string] {
  const text = typeof body === "string" ? body : JSON.stringify(body);
  const h = {
    "content-type": "application/json",
    "content-length": enc.encode(text).length,
    ...headers,
  };
  return [head("POST", path, h), text];
}
