/**
 * The server under attack, on real sockets: the real engine (a small random test model, in a
 * worker as `main.ts serve` runs it) behind the real listener (routes/listen.ts), and `main.ts
 * serve` itself in a child process under a 256-descriptor limit. Malformed handshakes, short and
 * slow bodies get 4xx in the OpenAI error shape and log nothing; cross-site requests (text/plain
 * bodies, foreign WebSocket origins, foreign Host names) are refused; tenants cannot reach each
 * other's sessions or prefix cache; a client that goes away cancels its generation whatever
 * shape its request had; idle sockets by the hundred cannot end the process.
 */
import assert from "node:assert/strict";
import OpenAI from "openai";
import { WorkerEngine } from "../engine/worker/host.ts";
import { createApp } from "../routes/app.ts";
import { LOOPBACK_HOSTS } from "../routes/guard.ts";
import { listen } from "../routes/listen.ts";
import { makeTestModel } from "../scripts/make_test_model.ts";
import { head, jsonPost, rawRequest } from "./raw_http.ts";

const ALICE = "sk-alice", BOB = "sk-bob";
const CORS_ORIGIN = "https://chat.example";
const dir = await Deno.makeTempDir({ prefix: "strata_hardening_" });
globalThis.addEventListener("unload", () => Deno.removeSync(dir, { recursive: true }));
await makeTestModel(dir, { maxPositions: 1024 });
// One slot: a second generation waits in the queue (the queued-disconnect test needs that).
const engine = await WorkerEngine.load({ dir }, { contextLength: 1024, maxSlots: 1 });
const server = listen(
  createApp(engine, {
    apiKeys: [ALICE, BOB],
    allowedHosts: LOOPBACK_HOSTS,
    corsOrigins: [CORS_ORIGIN],
    bodyTimeoutMs: 1000,
  }).fetch,
  { hostname: "127.0.0.1", port: 0, log: () => {} },
);
const port = server.addr.port;
const base = `http://127.0.0.1:${port}`;
const client = (key: string) => new OpenAI({ apiKey: key, baseURL: `${base}/v1`, maxRetries: 0 });
const alice = client(ALICE), bob = client(BOB);
const auth = (key: string) => ({ authorization: `Bearer ${key}` });
/** A greedy generation of the test model that runs for seconds (it reaches EOS past 1400). */
const LONG = { prompt: "Once upon a time", max_tokens: 600, temperature: 0 };

/** Runs `fn` and returns what it logged with console.error. */
async function logged(fn: () => Promise<void>): Promise<string[]> {
  const lines: string[] = [];
  const original = console.error;
  console.error = (...args: unknown[]) => lines.push(args.map(String).join(" "));
  try {
    await fn();
  } finally {
    console.error = original;
  }
  return lines;
}

/** Asserts a raw response is an OpenAI-shaped error with `status` and `code`. */
function assertError(r: { status: number | null; body: string }, status: number, code: string) {
  assert.equal(r.status, status, r.body);
  const body = JSON.parse(r.body);
  assert.deepEqual(Object.keys(body.error).sort(), ["code", "message", "param", "type"]);
  assert.equal(body.error.code, code, body.error.message);
}

async function until(what: string, cond: () => boolean | Promise<boolean>, ms = 10_000) {
  const end = Date.now() + ms;
  while (!(await cond())) {
    assert.ok(Date.now() < end, what);
    await new Promise((r) => setTimeout(r, 25));
  }
}

/** Generations that ended cancelled, from /metrics. */
async function cancelled(): Promise<number> {
  const text = await (await fetch(`${base}/metrics`)).text();
  return Number(
    text.match(/^strata_generations_total\{finish_reason="cancelled"\} (\d+)$/m)?.[1] ?? 0,
  );
}

const load = () => engine.occupancy();

Deno.test("malformed handshakes, short and slow bodies: 4xx in the error shape, nothing logged", async () => {
  const lines = await logged(async () => {
    const ws = await rawRequest(port, [
      head("GET", "/v1/chat/ws", {
        ...auth(ALICE),
        upgrade: "websocket",
        connection: "close",
        "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
        "sec-websocket-version": 13,
      }),
    ]);
    assertError(ws, 400, "invalid_handshake");
    const [h, body] = jsonPost("/v1/completions", { prompt: "a" }, {
      ...auth(ALICE),
      "content-length": 100,
    });
    const short = await rawRequest(port, [h, body], { gapMs: 20, halfClose: true });
    assertError(short, 400, "incomplete_body");
    const slow = await rawRequest(port, [h, body.slice(0, 5)], { timeoutMs: 5000 });
    assertError(slow, 408, "request_timeout");
  });
  assert.deepEqual(lines, []);
  assert.equal(
    (await alice.completions.create({ model: engine.modelId, prompt: "a", max_tokens: 1 }))
      .choices.length,
    1,
  );
});

Deno.test("a text/plain POST is refused with 415 and generates nothing", async () => {
  const before = load();
  const res = await fetch(`${base}/v1/completions`, {
    method: "POST",
    headers: { ...auth(ALICE), "content-type": "text/plain" },
    body: JSON.stringify({ prompt: "a web page sent this" }),
  });
  assertError({ status: res.status, body: await res.text() }, 415, "unsupported_media_type");
  assert.deepEqual(load(), before);
});

Deno.test("WebSocket origins: foreign refused; own, --cors and none connect", async () => {
  const open = (origin?: string) =>
    new Promise<boolean>((resolve) => {
      const headers = { ...auth(ALICE), ...(origin ? { origin } : {}) };
      const ws = new WebSocket(`ws://127.0.0.1:${port}/v1/chat/ws`, { headers });
      ws.onopen = () => {
        ws.onclose = () => resolve(true);
        ws.close();
      };
      ws.onerror = () => resolve(false);
    });
  assert.equal(await open("https://evil.example"), false);
  assert.equal(await open(`http://127.0.0.1:${port}`), true);
  assert.equal(await open(CORS_ORIGIN), true);
  assert.equal(await open(), true);
  const refused = await rawRequest(port, [
    head("GET", "/v1/chat/ws", {
      ...auth(ALICE),
      origin: "https://evil.example",
      upgrade: "websocket",
      connection: "Upgrade",
      "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
      "sec-websocket-version": 13,
    }),
  ]);
  assertError(refused, 403, "origin_not_allowed");
});

Deno.test("a Host not on the allow-list is refused with 421 (DNS rebinding)", async () => {
  const evil = await rawRequest(port, [head("GET", "/health", { host: `evil.example:${port}` })]);
  assertError(evil, 421, "host_not_allowed");
  const page = await rawRequest(port, [head("GET", "/v1/models", { host: "rebind.example" })]);
  assertError(page, 421, "host_not_allowed");
  for (const host of [`localhost:${port}`, `127.0.0.1:${port}`, `[::1]:${port}`]) {
    assert.equal((await rawRequest(port, [head("GET", "/health", { host })])).status, 200, host);
  }
});

Deno.test("tenants: a key cannot read, overwrite or delete another key's session", async () => {
  const model = engine.modelId;
  const messages = [{ role: "user" as const, content: "Remember the word marmalade." }];
  const turn = (c: OpenAI, extra: Record<string, unknown> = {}) =>
    c.chat.completions.create({ model, messages, max_tokens: 3, temperature: 0, ...extra });
  await turn(alice, { session_id: "conv" });
  const get = (key: string, id = "conv") =>
    fetch(`${base}/v1/sessions/${id}`, { headers: auth(key) });
  const mine = await (await get(ALICE)).json();
  assert.equal(mine.id, "conv");
  assert.ok(mine.tokens > 0, JSON.stringify(mine));

  const peek = await get(BOB);
  assertError({ status: peek.status, body: await peek.text() }, 404, "session_not_found");
  const del = await fetch(`${base}/v1/sessions/conv`, { method: "DELETE", headers: auth(BOB) });
  assertError({ status: del.status, body: await del.text() }, 404, "session_not_found");
  // Bob's "conv" is a session of his own, and leaves Alice's alone.
  await turn(bob, { session_id: "conv", max_tokens: 5 });
  const his = await (await get(BOB)).json();
  assert.ok(his.tokens > mine.tokens, `Bob's session: ${JSON.stringify(his)}`);
  assert.deepEqual(await (await get(ALICE)).json(), mine);
  // Alice's id as the engine keys it cannot be spelled in a path.
  const spelled = await get(BOB, encodeURIComponent(`x/conv`));
  assert.equal(spelled.status, 400, await spelled.text());
  // Bob over the WebSocket: his session again.
  const ws = new WebSocket(`ws://127.0.0.1:${port}/v1/chat/ws?api_key=${BOB}`);
  await new Promise((r) => (ws.onopen = r));
  const done = new Promise<Record<string, unknown>>((resolve) => {
    ws.onmessage = (e) => {
      const m = JSON.parse(e.data);
      if (m.type === "done" || m.type === "error") resolve(m);
    };
  });
  ws.send(JSON.stringify({ type: "start", id: "w", messages, max_tokens: 2, session_id: "conv" }));
  assert.equal((await done).type, "done");
  ws.close();
  assert.deepEqual(await (await get(ALICE)).json(), mine);
  const gone = await fetch(`${base}/v1/sessions/conv`, { method: "DELETE", headers: auth(ALICE) });
  assert.equal(gone.status, 200);
  assert.equal((await get(BOB)).status, 200, "deleting Alice's session deleted Bob's");
});

Deno.test("tenants: cached_tokens never reveals another key's prompt (prefix cache)", async () => {
  const prompt = "In a quiet village by the sea there lived an old fisherman and his cat, " +
    "who every morning walked together to the harbour to count the boats.";
  const run = async (c: OpenAI) =>
    (await c.completions.create({ model: engine.modelId, prompt, max_tokens: 1 })).usage!
      .prompt_tokens_details?.cached_tokens;
  assert.ok(engine.encode(prompt).length >= 32, "the prompt must fill whole KV blocks");
  await run(alice);
  const again = await run(alice);
  assert.ok(again! >= 16, `the prefix cache did not work for one tenant (cached ${again})`);
  const other = await run(bob);
  assert.equal(
    other,
    0,
    `Bob's request reused ${other} tokens of KV that Alice's prompt left: the prefix cache ` +
      "is shared between tenants (needs the engine to scope its block hashes by " +
      "GenerateRequest.tenant)",
  );
});

/** Sends a long generation's head and body in two writes, waits until `started`, closes. */
async function splitAndLeave(started: () => boolean, stream = false): Promise<void> {
  const [h, body] = jsonPost("/v1/completions", { ...LONG, stream }, auth(ALICE));
  const conn = await Deno.connect({ hostname: "127.0.0.1", port });
  await conn.write(new TextEncoder().encode(h));
  await new Promise((r) => setTimeout(r, 50));
  await conn.write(new TextEncoder().encode(body));
  await until("the generation never started", started);
  conn.close();
}

Deno.test("disconnect cancels: head and body in separate writes, non-streamed and streamed", async () => {
  for (const stream of [false, true]) {
    await until("engine busy before the test", () => load().running + load().queued === 0);
    const before = await cancelled();
    await splitAndLeave(() => load().running === 1, stream);
    // The generation would run for seconds; cancelled, it ends at once.
    await until("the generation ran on after its client left", () => load().running === 0, 5000);
    assert.equal(await cancelled(), before + 1);
  }
});

Deno.test("disconnect cancels a request still waiting in the queue", async () => {
  await until("engine busy before the test", () => load().running + load().queued === 0);
  const abort = new AbortController();
  const stream = await alice.completions.create(
    { model: engine.modelId, ...LONG, stream: true },
    { signal: abort.signal },
  );
  const reading = (async () => {
    try {
      for await (const _ of stream) { /* keep the slot busy */ }
    } catch { /* aborted below */ }
  })();
  await until("the first generation never started", () => load().running === 1);
  const before = await cancelled();
  await splitAndLeave(() => load().queued === 1);
  await until("the queued request stayed after its client left", () => load().queued === 0, 5000);
  assert.equal(load().running, 1, "the running generation must go on");
  assert.equal(await cancelled(), before + 1);
  abort.abort();
  await reading;
  await until("the first generation was not cancelled", () => load().running === 0, 5000);
});

Deno.test("300 idle sockets under a 256-descriptor limit cannot end the process", async () => {
  const main = new URL("../main.ts", import.meta.url).pathname;
  const child = new Deno.Command("sh", {
    args: [
      "-c",
      'ulimit -n 256 && exec "$0" run -A "$1" serve --model "$2" --port 0 --header-timeout 60',
      Deno.execPath(),
      main,
      dir,
    ],
    stdout: "null",
    stderr: "piped",
  }).spawn();
  const stderr = child.stderr.pipeThrough(new TextDecoderStream()).getReader();
  let log = "";
  const logging = (async () => {
    while (true) {
      const { value, done } = await stderr.read();
      if (done) return;
      log += value;
    }
  })();
  let exited = false;
  child.status.then(() => (exited = true));
  const sockets: Deno.Conn[] = [];
  try {
    await until(`the server never started:\n${log}`, () => /at http:\/\//.test(log), 60_000);
    const url = log.match(/at (http:\/\/[^\s]+)\//)![1];
    const childPort = Number(new URL(url).port);
    for (let i = 0; i < 300; i++) {
      sockets.push(await Deno.connect({ hostname: "127.0.0.1", port: childPort }));
    }
    await until("the descriptors never ran out", () => /out of file descriptors/.test(log));
    // The flood still waits in the kernel's queue: the server accepts it, closes the sockets
    // idle longest to stay within its descriptors, and answers the newcomers.
    await until("the server stopped answering", async () => {
      const r = await fetch(`${url}/health`).catch(() => undefined);
      await r?.body?.cancel();
      return r?.status === 200;
    }, 15_000);
    const res = await fetch(`${url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: "Once", max_tokens: 2 }),
    });
    assert.equal(res.status, 200, await res.clone().text());
    assert.equal((await res.json()).choices.length, 1);
    assert.equal(exited, false, `the server exited:\n${log}`);
    assert.doesNotMatch(log, /panicked|Uncaught|error: /);
  } finally {
    for (const s of sockets) {
      try {
        s.close();
      } catch { /* closed by the server */ }
    }
    if (!exited) child.kill("SIGTERM");
    await child.status;
    await logging;
  }
});

Deno.test("server shuts down", async () => {
  await server.shutdown();
  await engine.close();
});
