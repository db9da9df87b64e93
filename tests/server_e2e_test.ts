/**
 * End to end: the real server (routes/listen.ts on a random port) with the real engine on a small
 * random test model, in a worker thread as `main.ts serve` runs it (engine/worker/host.ts),
 * driven by the official `openai` client and Deno's WebSocket: completions and chat, streaming or
 * not, n > 1, logprobs, seeds, stop strings, typed client errors, the WebSocket protocol (stream,
 * cancel, two conversations, bad messages), client disconnects, and 16 concurrent streams that
 * must equal the same requests run one at a time.
 */
import assert from "node:assert/strict";
import OpenAI from "openai";
import { WorkerEngine } from "../engine/worker/host.ts";
import { createApp } from "../routes/app.ts";
import { listen } from "../routes/listen.ts";
import { makeTestModel } from "../scripts/make_test_model.ts";

const KEY = "sk-e2e";
const dir = await Deno.makeTempDir({ prefix: "strata_e2e_" });
globalThis.addEventListener("unload", () => Deno.removeSync(dir, { recursive: true }));
await makeTestModel(dir, {});
const engine = await WorkerEngine.load({ dir }, {
  contextLength: 256,
  maxSlots: 16,
  maxQueued: 64,
});
const MODEL = engine.modelId;
// As `main.ts serve` serves it: through the listener, which pipes every connection (streams
// and WebSockets included) to Deno.serve on a loopback port.
const server = listen(createApp(engine, { apiKey: KEY }).fetch, {
  hostname: "127.0.0.1",
  port: 0,
});
const origin = `127.0.0.1:${server.addr.port}`;
const client = new OpenAI({ apiKey: KEY, baseURL: `http://${origin}/v1`, maxRetries: 0 });
const USER = [{ role: "user" as const, content: "Tell me a story about a fox." }];

/** Waits until the engine has nothing running or queued (cancels freed their slots). */
async function idle(ms = 5000): Promise<void> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    const l = engine.occupancy();
    if (l.running === 0 && l.queued === 0) return;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`engine still busy after ${ms} ms: ${JSON.stringify(engine.occupancy())}`);
}

/** Usage without `prompt_tokens_details`: cached tokens depend on what ran before. */
function tokenCounts(usage: OpenAI.CompletionUsage | undefined) {
  assert.ok(usage, "no usage");
  const { prompt_tokens, completion_tokens, total_tokens } = usage;
  return { prompt_tokens, completion_tokens, total_tokens };
}

async function streamChat(body: Omit<OpenAI.ChatCompletionCreateParamsStreaming, "stream">) {
  const stream = await client.chat.completions.create({ ...body, stream: true });
  let text = "", finish: string | null = null;
  for await (const chunk of stream) {
    text += chunk.choices[0]?.delta.content ?? "";
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  return { text, finish };
}

Deno.test("openai client: completions with n > 1 and logprobs", async () => {
  const res = await client.completions.create({
    model: MODEL,
    prompt: ["Once upon a time", "The fox"],
    max_tokens: 6,
    n: 2,
    logprobs: 2,
    seed: 11,
  });
  assert.equal(res.choices.length, 4);
  assert.deepEqual(res.choices.map((c) => c.index), [0, 1, 2, 3]);
  for (const c of res.choices) {
    const lp = c.logprobs!;
    assert.ok(lp.tokens!.length >= 1 && lp.tokens!.length <= 6);
    assert.equal(lp.token_logprobs!.length, lp.tokens!.length);
    assert.ok(lp.top_logprobs!.every((t) => Object.keys(t).length <= 2));
  }
  const completion = res.choices.reduce((s, c) => s + c.logprobs!.tokens!.length, 0);
  assert.equal(res.usage!.completion_tokens, completion);
  // n > 1 with one seed: choice j uses seed + j, so the choices are not copies of each other.
  const texts = new Set(res.choices.map((c) => c.text));
  assert.ok(texts.size >= 2, JSON.stringify([...texts]));
});

Deno.test("openai client: chat, streamed and not, agree for a seed; usage chunk", async () => {
  const body = { model: MODEL, messages: USER, max_tokens: 10, seed: 5, temperature: 0.9 };
  const whole = await client.chat.completions.create(body);
  const streamed = await streamChat(body);
  assert.equal(streamed.text, whole.choices[0].message.content);
  assert.equal(streamed.finish, whole.choices[0].finish_reason);
  const stream = await client.chat.completions.create({
    ...body,
    stream: true,
    stream_options: { include_usage: true },
  });
  let usage;
  for await (const chunk of stream) if (chunk.usage) usage = chunk.usage;
  assert.deepEqual(tokenCounts(usage), tokenCounts(whole.usage));
});

Deno.test("openai client: chat logprobs", async () => {
  const res = await client.chat.completions.create({
    model: MODEL,
    messages: USER,
    max_tokens: 4,
    logprobs: true,
    top_logprobs: 3,
  });
  const content = res.choices[0].logprobs!.content!;
  assert.ok(content.length >= 1);
  for (const t of content) {
    assert.ok(t.logprob <= 0);
    assert.ok(t.top_logprobs.length <= 3);
    assert.ok(t.top_logprobs.every((a) => a.logprob <= 0));
  }
});

Deno.test("seeds: the same seed repeats, different seeds differ", async () => {
  const run = async (seed: number) =>
    (await client.completions.create({ model: MODEL, prompt: "A", max_tokens: 8, seed }))
      .choices[0].text;
  assert.equal(await run(42), await run(42));
  const outs = new Set(await Promise.all([1, 2, 3, 4, 5].map(run)));
  assert.ok(outs.size >= 2, JSON.stringify([...outs]));
});

Deno.test("stop strings: output is cut before the first match, finish_reason stop", async () => {
  const req = { model: MODEL, prompt: "The fox", max_tokens: 16, temperature: 0 };
  const full = (await client.completions.create(req)).choices[0].text;
  assert.ok(
    full.length >= 4,
    `greedy output too short to pick a stop string: ${JSON.stringify(full)}`,
  );
  const mid = Math.floor(full.length / 2);
  const stop = full.slice(mid, mid + 2);
  const cut = await client.completions.create({ ...req, stop: [stop, "\u0000never"] });
  assert.equal(cut.choices[0].text, full.slice(0, full.indexOf(stop)));
  assert.equal(cut.choices[0].finish_reason, "stop");
});

Deno.test("errors surface as the client's typed errors", async () => {
  const bad = await client.completions.create({ model: MODEL, prompt: "a", max_tokens: 0 })
    .catch((e) => e);
  assert.ok(bad instanceof OpenAI.BadRequestError, String(bad));
  assert.equal(bad.status, 400);
  assert.equal(bad.param, "max_tokens");
  assert.equal(bad.code, "invalid_value");
  assert.match(bad.message, /max_tokens must be an integer >= 1; got 0/);

  const missing = await client.chat.completions.create({ model: "gpt-9", messages: USER })
    .catch((e) => e);
  assert.ok(missing instanceof OpenAI.NotFoundError, String(missing));
  assert.equal(missing.code, "model_not_found");

  const tooLong = await client.chat.completions.create({
    model: MODEL,
    messages: [{ role: "user", content: "fox ".repeat(400) }],
  }).catch((e) => e);
  assert.ok(tooLong instanceof OpenAI.BadRequestError, String(tooLong));
  assert.equal(tooLong.code, "context_length_exceeded");

  const stranger = new OpenAI({ apiKey: "wrong", baseURL: `http://${origin}/v1`, maxRetries: 0 });
  const denied = await stranger.models.list().catch((e) => e);
  assert.ok(denied instanceof OpenAI.AuthenticationError, String(denied));

  const busy = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen() {} },
    createApp(engine, { maxQueued: 0 }).fetch,
  );
  try {
    const c = new OpenAI({
      apiKey: "x",
      baseURL: `http://127.0.0.1:${busy.addr.port}/v1`,
      maxRetries: 0,
    });
    const limited = await c.completions.create({ model: MODEL, prompt: "a" }).catch((e) => e);
    assert.ok(limited instanceof OpenAI.RateLimitError, String(limited));
    assert.equal(limited.headers.get("retry-after"), "1");
  } finally {
    await busy.shutdown();
  }
});

Deno.test("models: the client lists and retrieves the model", async () => {
  const models = [];
  for await (const m of client.models.list()) models.push(m);
  assert.deepEqual(models.map((m) => m.id), [MODEL]);
  assert.equal((await client.models.retrieve(MODEL)).owned_by, "strata");
});

Deno.test("a client that disconnects mid-stream frees its sequences", async () => {
  await idle();
  const abort = new AbortController();
  const stream = await client.chat.completions.create(
    { model: MODEL, messages: USER, max_tokens: 200, n: 3, stream: true },
    { signal: abort.signal },
  );
  for await (const chunk of stream) if (chunk.choices[0]?.delta.content) break;
  abort.abort();
  await idle();
});

// ---- WebSocket ----

type WsMessage = Record<string, unknown> & { type: string; id?: string };

/** A socket with a message queue: `next(pred)` waits for the next matching message. */
async function openSocket(query = "") {
  const ws = new WebSocket(`ws://${origin}/v1/chat/ws${query}`, {
    headers: query ? {} : { authorization: `Bearer ${KEY}` },
  });
  const seen: WsMessage[] = [];
  let waiters: (() => void)[] = [];
  ws.onmessage = (e) => {
    seen.push(JSON.parse(e.data));
    const wake = waiters;
    waiters = [];
    wake.forEach((w) => w());
  };
  const closed = new Promise((r) => ws.addEventListener("close", r));
  await new Promise((resolve, reject) => {
    ws.onopen = resolve;
    ws.onerror = () => reject(new Error("WebSocket failed to open"));
  });
  const next = async (pred: (m: WsMessage) => boolean): Promise<WsMessage> => {
    while (true) {
      const i = seen.findIndex(pred);
      if (i >= 0) return seen.splice(i, 1)[0];
      await new Promise<void>((r) => waiters.push(r));
    }
  };
  const send = (m: unknown) => ws.send(typeof m === "string" ? m : JSON.stringify(m));
  /** Deltas of conversation `id` until its done message. */
  const finish = async (id: string) => {
    let text = "", tokens = 0;
    while (true) {
      const m = await next((m) => m.id === id);
      if (m.type === "delta") {
        text += m.text as string;
        tokens++;
        continue;
      }
      return { text, tokens, end: m };
    }
  };
  return { ws, send, next, finish, closed, seen };
}

Deno.test("websocket: deltas then done, matching the HTTP answer", async () => {
  const s = await openSocket();
  try {
    const body = { messages: USER, max_tokens: 12, seed: 9, temperature: 0.8 };
    s.send({ type: "start", id: "a", ...body });
    const { text, tokens, end } = await s.finish("a");
    assert.equal(end.type, "done", JSON.stringify(end));
    const http = await client.chat.completions.create({ model: MODEL, ...body });
    assert.equal(text, http.choices[0].message.content);
    assert.equal(end.finish_reason, http.choices[0].finish_reason);
    const usage = end.usage as OpenAI.CompletionUsage;
    assert.equal(usage.completion_tokens, tokens);
    assert.deepEqual(tokenCounts(usage), tokenCounts(http.usage));
    const t = end.timings as Record<string, number>;
    assert.ok(t.ttft_ms > 0 && t.tokens_per_second > 0 && t.total_ms >= t.ttft_ms);
    assert.equal(end.seed, "9");
  } finally {
    s.ws.close();
    await s.closed;
  }
});

Deno.test("websocket: two conversations at once, one cancelled", async () => {
  const s = await openSocket(`?api_key=${KEY}`);
  try {
    s.send({ type: "start", id: "long", messages: USER, max_tokens: 200, temperature: 0 });
    s.send({ type: "start", id: "short", messages: USER, max_tokens: 6, seed: 2 });
    await s.next((m) => m.id === "long" && m.type === "delta");
    s.send({ type: "start", id: "long", messages: USER });
    const dup = await s.next((m) => m.id === "long" && m.type === "error");
    assert.equal((dup.error as { code: string }).code, "duplicate_id");
    s.send({ type: "cancel", id: "long" });
    const [long, short] = await Promise.all([s.finish("long"), s.finish("short")]);
    assert.equal(long.end.type, "done");
    assert.equal(long.end.finish_reason, "cancelled");
    assert.ok(long.tokens < 200);
    const alone = await client.chat.completions.create({
      model: MODEL,
      messages: USER,
      max_tokens: 6,
      seed: 2,
    });
    assert.equal(short.text, alone.choices[0].message.content);
    await idle();
  } finally {
    s.ws.close();
    await s.closed;
  }
});

Deno.test("websocket: bad messages get errors and the socket stays open", async () => {
  const s = await openSocket();
  try {
    s.send("not json");
    assert.equal(
      ((await s.next((m) => m.type === "error")).error as { code: string }).code,
      "invalid_json",
    );
    s.send({ type: "launch" });
    assert.equal(
      ((await s.next((m) => m.type === "error")).error as { param: string }).param,
      "type",
    );
    s.send({ type: "start", messages: USER });
    assert.equal(
      ((await s.next((m) => m.type === "error")).error as { param: string }).param,
      "id",
    );
    s.send({ type: "start", id: "z", messages: [] });
    const z = await s.next((m) => m.type === "error");
    assert.equal(z.id, "z");
    assert.equal((z.error as { param: string }).param, "messages");
    s.send({ type: "start", id: "t", messages: USER, temperature: 5 });
    assert.equal(
      ((await s.next((m) => m.id === "t")).error as { param: string }).param,
      "temperature",
    );
    s.send({ type: "cancel", id: "nobody" });
    const nobody = await s.next((m) => m.id === "nobody");
    assert.equal((nobody.error as { code: string }).code, "conversation_not_found");
    s.send({ type: "ping" });
    assert.equal((await s.next(() => true)).type, "pong");
    s.send({ type: "start", id: "ok", messages: USER, max_tokens: 2 });
    assert.equal((await s.finish("ok")).end.type, "done");
  } finally {
    s.ws.close();
    await s.closed;
  }
});

Deno.test("websocket: closing the socket cancels its conversations; no key, no socket", async () => {
  await idle();
  const s = await openSocket();
  s.send({ type: "start", id: "a", messages: USER, max_tokens: 200 });
  s.send({ type: "start", id: "b", messages: USER, max_tokens: 200 });
  await s.next((m) => m.type === "delta");
  s.ws.close();
  await s.closed;
  await idle();
  await assert.rejects(openSocket("?api_key=wrong"), /failed to open/);
});

Deno.test("16 concurrent streams equal the same requests run one at a time", async () => {
  const requests = Array.from({ length: 16 }, (_, i) => ({
    model: MODEL,
    messages: [{ role: "user" as const, content: `Story number ${i}:` }],
    max_tokens: 12,
    temperature: i % 4 === 0 ? 0 : 0.8,
    seed: 100 + i,
  }));
  const alone = [];
  for (const r of requests) alone.push(await streamChat(r));
  let peak = 0;
  const watch = setInterval(() => (peak = Math.max(peak, engine.occupancy().running)), 2);
  const together = await Promise.all(requests.map(streamChat)).finally(() => clearInterval(watch));
  assert.ok(peak > 1, `the streams never ran together (peak batch ${peak})`);
  assert.deepEqual(together, alone);
});

Deno.test("server shuts down", async () => {
  await server.shutdown();
  await engine.close();
});
