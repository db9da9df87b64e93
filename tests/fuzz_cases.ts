/**
 * Malformed requests for tests/fuzz_test.ts, drawn from a seeded RNG: bad JSON, wrong types,
 * huge numbers, bad methods and paths, broken headers, truncated bodies, WebSocket handshake
 * garbage and raw bytes. Each case is the parts to write on one socket, in separate writes.
 */
import { head, jsonPost, type RawOptions } from "./raw_http.ts";
import { rng } from "./util.ts";

/** One malformed request. */
export interface FuzzCase {
  kind: string;
  parts: (string | Uint8Array)[];
  options: RawOptions;
}

type Rng = ReturnType<typeof rng>;

const PATHS = ["/v1/completions", "/v1/chat/completions"];
const ODD_VALUES: unknown[] = [
  null,
  true,
  false,
  0,
  -1,
  1.5,
  1e308,
  -1e308,
  2 ** 53,
  -(2 ** 63),
  "",
  "NaN",
  "x".repeat(5000),
  [],
  {},
  [[1]],
  [null],
  { "$gt": "" },
  "\u0000\ud800",
];
const HUGE = [1e300, -1e300, 2 ** 64, 1e9, -(2 ** 62), Number.MAX_SAFE_INTEGER + 2];
const NUMERIC = [
  "max_tokens",
  "temperature",
  "top_p",
  "top_k",
  "min_p",
  "n",
  "seed",
  "logprobs",
  "top_logprobs",
  "presence_penalty",
  "frequency_penalty",
  "repetition_penalty",
  "max_completion_tokens",
];
const FIELDS = [...NUMERIC, "prompt", "messages", "stop", "stream", "stream_options", "model"];
const METHODS = ["PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "FOO", "G ET", "POST /x", "get"];
const BAD_PATHS = [
  "/v1/completions/../../etc/passwd",
  "/v1/%zz",
  "/%00",
  "/" + "a".repeat(8000),
  "/v1/sessions/..%2F..%2Fx",
  "/v1/sessions/" + "%F0%9F%98%80".repeat(20),
  "/v1/sessions/" + "x".repeat(300),
  "//v1//completions",
  "/v1/models/%ff",
  "*",
  "http://evil.example/v1/models",
  "/v1/chat/ws?api_key=" + "%".repeat(10),
  "/static/../../main.ts",
];

function pick<T>(r: Rng, list: readonly T[]): T {
  return list[r.int(list.length)];
}

function bytes(r: Rng, n: number): Uint8Array {
  const b = new Uint8Array(n);
  for (let i = 0; i < n; i++) b[i] = r.int(256);
  return b;
}

function validBody(path: string): Record<string, unknown> {
  return path === PATHS[0]
    ? { prompt: "Once upon", max_tokens: 1 }
    : { messages: [{ role: "user", content: "Hi" }], max_tokens: 1 };
}

/** `count` cases from `seed`, every kind about equally often. */
export function fuzzCases(seed: number, count: number, key: string): FuzzCase[] {
  const r = rng(seed);
  const auth = { authorization: `Bearer ${key}`, connection: "close" };
  const kinds: ((r: Rng) => FuzzCase)[] = [
    (r) => {
      const path = pick(r, PATHS);
      const text = JSON.stringify(validBody(path));
      const cut = [
        text.slice(0, r.int(text.length)),
        text.replace(":", ""),
        "{".repeat(1 + r.int(50_000)),
        "[".repeat(50_000) + "]".repeat(50_000),
        `{"prompt": ${"[".repeat(20_000)}1${"]".repeat(20_000)}, "max_tokens": 1}`,
        '{"prompt": NaN}',
        '{"prompt": "a", "max_tokens": Infinity}',
        "\ufeff" + text,
        text + "garbage",
      ][r.int(9)];
      return { kind: "bad json", parts: jsonPost(path, cut, auth), options: {} };
    },
    (r) => {
      const path = pick(r, PATHS);
      const body = validBody(path);
      body[pick(r, FIELDS)] = pick(r, ODD_VALUES);
      if (r.next() < 0.5) body[pick(r, FIELDS)] = pick(r, ODD_VALUES);
      return { kind: "wrong type", parts: jsonPost(path, body, auth), options: {} };
    },
    (r) => {
      const path = pick(r, PATHS);
      const body = { ...validBody(path), [pick(r, NUMERIC)]: pick(r, HUGE) };
      return { kind: "huge number", parts: jsonPost(path, body, auth), options: {} };
    },
    (r) => {
      const path = pick(r, [...PATHS, "/v1/models", "/v1/sessions/x", "/health", "/"]);
      return { kind: "bad method", parts: [head(pick(r, METHODS), path, auth)], options: {} };
    },
    (r) => {
      const method = pick(r, ["GET", "POST", "DELETE"]);
      return { kind: "bad path", parts: [head(method, pick(r, BAD_PATHS), auth)], options: {} };
    },
    (r) => {
      const body = JSON.stringify(validBody(PATHS[0]));
      const line = `POST ${PATHS[0]} HTTP/1.1\r\nhost: 127.0.0.1\r\n` +
        `authorization: Bearer ${key}\r\nconnection: close\r\n`;
      const broken = [
        `content-type: application/json\r\ncontent-length: -1\r\n`,
        `content-type: application/json\r\ncontent-length: abc\r\n`,
        `content-type: application/json\r\ncontent-length: 5\r\ncontent-length: 9\r\n`,
        `content-type: application/json\r\ntransfer-encoding: chunked\r\n` +
        `content-length: ${body.length}\r\n`,
        `content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n${body}\r\n`,
        `this line has no colon\r\ncontent-length: ${body.length}\r\n`,
        `x-big: ${"v".repeat(100_000)}\r\ncontent-length: ${body.length}\r\n`,
        `bad name: 1\r\ncontent-length: ${body.length}\r\n`,
        `content-type: application/json\u0000\r\ncontent-length: ${body.length}\r\n`,
        `content-type: ${pick(r, ["", "json", "application/json;;", "*/*", "text/html"])}\r\n` +
        `content-length: ${body.length}\r\n`,
      ][r.int(10)];
      return { kind: "broken header", parts: [line + broken + "\r\n", body], options: {} };
    },
    (r) => {
      const path = pick(r, PATHS);
      const [h, b] = jsonPost(path, validBody(path), {
        ...auth,
        "content-length": 50 + r.int(5000),
      });
      return { kind: "truncated body", parts: [h, b], options: { halfClose: true } };
    },
    (r) => {
      const garbage = [
        bytes(r, 1 + r.int(4096)),
        "GET",
        "\r\n\r\n",
        "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + "x".repeat(r.int(100)),
        new Uint8Array([0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03]),
        "GET / HTTP/9.9\r\n\r\n",
        "GET /health HTTP/1.0\r\n\r\n",
      ][r.int(7)];
      return { kind: "raw garbage", parts: [garbage], options: { halfClose: true } };
    },
    (r) => {
      const headers: Record<string, string | number> = { ...auth, upgrade: "websocket" };
      if (r.next() < 0.7) headers.connection = pick(r, ["Upgrade", "close", "keep-alive", ""]);
      if (r.next() < 0.7) {
        headers["sec-websocket-key"] = pick(r, ["", "short", "dGhlIHNhbXBsZSBub25jZQ=="]);
      }
      if (r.next() < 0.7) headers["sec-websocket-version"] = pick(r, [13, 8, "x"]);
      if (r.next() < 0.3) headers.origin = pick(r, ["null", "https://evil.example", "::"]);
      return { kind: "bad handshake", parts: [head("GET", "/v1/chat/ws", headers)], options: {} };
    },
  ];
  return Array.from({ length: count }, (_, i) => kinds[i % kinds.length](r));
}
