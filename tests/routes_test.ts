/**
 * The HTTP routes through `app.request()` (no sockets) against the real engine on a small random
 * test model: ~60 malformed requests and their OpenAI-shaped errors, auth, 404/405, admission,
 * models, health, metrics, SSE, sessions, CORS and the static page.
 */
import assert from "node:assert/strict";
import { Engine } from "../engine/engine.ts";
import { createApp, type ServerOptions } from "../routes/app.ts";
import { makeTestModel } from "../scripts/make_test_model.ts";
import { badRequests, C, CHAT, expectError, MSG, sseData } from "./routes_cases.ts";

const CONTEXT = 128;
const KEY = "sk-test-key";
const dir = await Deno.makeTempDir({ prefix: "strata_routes_" });
globalThis.addEventListener("unload", () => Deno.removeSync(dir, { recursive: true }));
await makeTestModel(dir, {});
const engine = await Engine.load(dir, { contextLength: CONTEXT, maxSlots: 4, maxQueued: 16 });
const app = createApp(engine, { apiKey: KEY, maxBodyBytes: 8192 });
const JSON_TYPE = { "content-type": "application/json" };
const AUTH = { authorization: `Bearer ${KEY}`, ...JSON_TYPE };
const MODEL = engine.modelId;

function post(path: string, body: unknown, headers: Record<string, string> = AUTH) {
  const text = typeof body === "string" ? body : JSON.stringify(body);
  return app.request(path, { method: "POST", headers, body: text });
}

const BAD = badRequests(CONTEXT);

Deno.test(`malformed requests: ${BAD.length} cases get OpenAI errors naming the param`, async () => {
  for (const [name, path, body, status, param, code, includes] of BAD) {
    const message = await expectError(await post(path, body), status, param, code).catch((e) => {
      throw new Error(`${name}: ${e.message}`);
    });
    if (includes) {
      assert.ok(message.includes(includes), `${name}: "${message}" lacks "${includes}"`);
    }
  }
});

Deno.test("oversized body: 413, by Content-Length and by streamed size", async () => {
  const big = JSON.stringify({ prompt: "x".repeat(10000) });
  await expectError(await post(C, big), 413, null, "request_too_large");
  const chunks = new ReadableStream({
    start(c) {
      for (let i = 0; i < 10; i++) c.enqueue(new TextEncoder().encode("x".repeat(1000)));
      c.close();
    },
  });
  const res = await app.request(C, { method: "POST", headers: AUTH, body: chunks });
  await expectError(res, 413, null, "request_too_large");
});

Deno.test("after all that, a correct completion still works", async () => {
  const res = await post(C, { model: MODEL, prompt: "Once upon a time", max_tokens: 4, seed: 1 });
  assert.equal(res.status, 200);
  const body = await res.json();
  assert.match(body.id, /^cmpl-/);
  assert.equal(body.object, "text_completion");
  assert.equal(body.model, MODEL);
  assert.match(body.system_fingerprint, /^fp_/);
  assert.equal(typeof body.created, "number");
  assert.equal(body.choices.length, 1);
  assert.ok(["stop", "length"].includes(body.choices[0].finish_reason));
  const u = body.usage;
  assert.equal(u.prompt_tokens, engine.encode("Once upon a time").length);
  assert.ok(u.completion_tokens >= 1 && u.completion_tokens <= 4);
  assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
});

Deno.test("completions: prompts × n choices, token-id prompts, logprobs, echo", async () => {
  const ids = engine.encode("Hi there");
  const res = await post(C, {
    prompt: [ids, [ids[0], ids[1]]],
    n: 2,
    max_tokens: 3,
    logprobs: 2,
    temperature: 0.8,
    seed: 7,
    stop: ["\n\n\n"],
  });
  const body = await res.json();
  assert.equal(res.status, 200, JSON.stringify(body));
  assert.deepEqual(body.choices.map((c: { index: number }) => c.index), [0, 1, 2, 3]);
  for (const choice of body.choices) {
    const lp = choice.logprobs;
    const n = lp.tokens.length;
    assert.ok(n >= 1 && n <= 3);
    assert.equal(lp.token_logprobs.length, n);
    assert.equal(lp.text_offset.length, n);
    assert.equal(lp.text_offset[0], 0);
    assert.ok(lp.token_logprobs.every((x: number) => x <= 0));
    for (const top of lp.top_logprobs) assert.equal(Object.keys(top).length <= 2, true);
  }
  assert.equal(body.usage.prompt_tokens, ids.length + 2);

  const echo = await (await post(C, { prompt: "Echo me", echo: true, max_tokens: 2 })).json();
  assert.ok(echo.choices[0].text.startsWith("Echo me"), echo.choices[0].text);
});

Deno.test("chat: message, logprobs shape, developer role, text parts", async () => {
  const res = await post(CHAT, {
    messages: [
      { role: "developer", content: "Be brief." },
      { role: "user", content: [{ type: "text", text: "Hello" }] },
    ],
    max_completion_tokens: 3,
    logprobs: true,
    top_logprobs: 2,
  });
  const body = await res.json();
  assert.equal(res.status, 200, JSON.stringify(body));
  assert.match(body.id, /^chatcmpl-/);
  assert.equal(body.object, "chat.completion");
  const choice = body.choices[0];
  assert.equal(choice.message.role, "assistant");
  assert.equal(typeof choice.message.content, "string");
  const content = choice.logprobs.content;
  assert.ok(content.length >= 1 && content.length <= 3);
  for (const t of content) {
    assert.equal(typeof t.token, "string");
    assert.deepEqual(t.bytes, [...new TextEncoder().encode(t.token)]);
    assert.ok(t.top_logprobs.length <= 2);
  }
});

Deno.test("SSE: completion and chat streams end with [DONE] and match the non-stream text", async () => {
  const req = { prompt: "Stream this", max_tokens: 5, temperature: 0.7, seed: 3 };
  const whole = await (await post(C, req)).json();
  const res = await post(C, { ...req, stream: true, stream_options: { include_usage: true } });
  assert.equal(res.status, 200);
  assert.match(res.headers.get("content-type") ?? "", /^text\/event-stream/);
  const events = sseData(await res.text());
  assert.equal(events.at(-1), "[DONE]");
  const chunks = events.slice(0, -1).map((e) => JSON.parse(e));
  const usage = chunks.at(-1);
  assert.deepEqual(usage.choices, []);
  // Equal but for cached_tokens, which depends on the prefix cache.
  const counts = (u: Record<string, unknown>) => ({ ...u, prompt_tokens_details: undefined });
  assert.deepEqual(counts(usage.usage), counts(whole.usage));
  const body = chunks.slice(0, -1);
  assert.ok(body.every((c) => c.object === "text_completion" && c.usage === null));
  assert.equal(body.map((c) => c.choices[0].text).join(""), whole.choices[0].text);
  assert.equal(body.at(-1).choices[0].finish_reason, whole.choices[0].finish_reason);

  const chat = await post(CHAT, { messages: MSG, max_tokens: 4, stream: true, seed: 1 });
  const parts = sseData(await chat.text());
  assert.equal(parts.at(-1), "[DONE]");
  const cc = parts.slice(0, -1).map((e) => JSON.parse(e));
  assert.ok(cc.every((c) => c.object === "chat.completion.chunk" && !("usage" in c)));
  assert.deepEqual(cc[0].choices[0].delta, { role: "assistant", content: "" });
  assert.ok(["stop", "length"].includes(cc.at(-1).choices[0].finish_reason));
  assert.deepEqual(cc.at(-1).choices[0].delta, {});
});

Deno.test("auth: missing, wrong or non-bearer key is 401; health and metrics are open", async () => {
  const body = JSON.stringify({ prompt: "a" });
  const cases: Record<string, string>[] = [
    {},
    { authorization: "Bearer wrong" },
    { authorization: `Basic ${KEY}` },
    { authorization: `Bearer ${KEY}x` },
  ];
  for (const headers of cases) {
    const res = await app.request(C, { method: "POST", headers, body });
    await expectError(res, 401, null, "invalid_api_key");
    assert.match(res.headers.get("www-authenticate") ?? "", /^Bearer/);
  }
  await expectError(await app.request(`/v1/models?api_key=${KEY}`), 401, null, "invalid_api_key");
  assert.equal((await app.request("/v1/models", { headers: AUTH })).status, 200);
  assert.equal((await app.request("/health")).status, 200);
  assert.equal((await app.request("/metrics")).status, 200);
});

Deno.test("unknown routes are 404 and wrong methods 405, in the error shape", async () => {
  await expectError(await app.request("/nope"), 404, null, "not_found");
  await expectError(await app.request("/v1/nope", { headers: AUTH }), 404, null, "not_found");
  const get = await app.request(C, { headers: AUTH });
  await expectError(get, 405, null, "method_not_allowed");
  assert.equal(get.headers.get("allow"), "POST");
  await expectError(await app.request(CHAT, { method: "PUT", headers: AUTH }), 405, null);
  await expectError(await app.request("/v1/chat/ws", { headers: AUTH }), 426, null);
});

Deno.test("models: list and retrieve, 404 for others", async () => {
  const list = await (await app.request("/v1/models", { headers: AUTH })).json();
  assert.equal(list.object, "list");
  assert.equal(list.data.length, 1);
  assert.deepEqual(
    { ...list.data[0], created: 0 },
    { id: MODEL, object: "model", created: 0, owned_by: "strata", context_length: CONTEXT },
  );
  const one = await (await app.request(`/v1/models/${MODEL}`, { headers: AUTH })).json();
  assert.deepEqual(one, list.data[0]);
  const other = await app.request("/v1/models/org/other-model", { headers: AUTH });
  await expectError(other, 404, "model", "model_not_found");
});

Deno.test("health: status, model, adapter, load and KV", async () => {
  const h = await (await app.request("/health")).json();
  assert.equal(h.status, "ok");
  assert.equal(h.model, MODEL);
  assert.equal(h.adapter, engine.adapterName);
  assert.equal(h.context_length, CONTEXT);
  assert.equal(h.load.max_running, 4);
  assert.equal(h.load.max_queued, 16);
  assert.equal(typeof h.kv.gpu.total, "number");
  assert.equal(h.kv.block_tokens, 16);
  assert.equal(h.kv.dtype, "f32");
});

Deno.test("metrics: Prometheus text with request, token, latency, load and KV metrics", async () => {
  await post(C, { prompt: "count me", max_tokens: 2 });
  await post(C, { prompt: "a", max_tokens: 0 });
  const res = await app.request("/metrics");
  assert.match(res.headers.get("content-type") ?? "", /^text\/plain; version=0\.0\.4/);
  const text = await res.text();
  const sample = /^[a-z_]+(\{([a-z_]+="[^"]*",?)*\})? (-?[0-9.e+-]+|\+Inf|NaN)$/;
  for (const line of text.trimEnd().split("\n")) {
    assert.ok(line.startsWith("# HELP ") || line.startsWith("# TYPE ") || sample.test(line), line);
  }
  const value = (series: string) => {
    const line = text.split("\n").find((l) => l.startsWith(series + " "));
    assert.ok(line, `no series ${series}`);
    return Number(line.slice(series.length + 1));
  };
  assert.ok(
    value('strata_http_requests_total{route="/v1/completions",method="POST",status="200"}') >= 1,
  );
  assert.ok(
    value('strata_http_requests_total{route="/v1/completions",method="POST",status="400"}') >= 1,
  );
  assert.ok(value("strata_prompt_tokens_total") >= 1);
  assert.ok(value("strata_generation_tokens_total") >= 1);
  assert.ok(value("strata_time_to_first_token_seconds_count") >= 1);
  assert.equal(
    value('strata_time_to_first_token_seconds_bucket{le="+Inf"}'),
    value("strata_time_to_first_token_seconds_count"),
  );
  assert.ok(text.includes("# TYPE strata_inter_token_latency_seconds histogram"));
  assert.equal(value("strata_requests_max_running"), 4);
  assert.equal(value("strata_requests_running"), engine.occupancy().running);
  assert.equal(value("strata_requests_queued"), engine.occupancy().queued);
  assert.equal(value("strata_kv_gpu_blocks_capacity"), engine.kvStats().gpu.total);
  assert.equal(value('strata_kv_blocks{tier="gpu"}'), engine.kvStats().gpu.used);
  assert.ok(text.includes("# TYPE strata_snapshot_blocks_total counter"));
  assert.equal(value('strata_snapshot_blocks_total{source="gpu"}'), 0, "no store, no snapshots");
});

Deno.test("sessions: body field or header; GET shows tokens; DELETE forgets", async () => {
  const turn1 = await post(CHAT, { messages: MSG, max_tokens: 3, session_id: "conv-1" });
  assert.equal(turn1.status, 200);
  const reply = (await turn1.json()).choices[0].message.content;
  const info = await (await app.request("/v1/sessions/conv-1", { headers: AUTH })).json();
  assert.equal(info.id, "conv-1");
  assert.equal(info.object, "session");
  assert.ok(info.tokens >= engine.encodeChat(MSG).length, JSON.stringify(info));
  const messages = [...MSG, { role: "assistant", content: reply }, {
    role: "user",
    content: "More",
  }];
  const turn2 = await post(CHAT, { messages, max_tokens: 2 }, {
    ...AUTH,
    "x-session-id": "conv-1",
  });
  const second = await turn2.json();
  assert.equal(turn2.status, 200, JSON.stringify(second));
  assert.ok(second.usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify(second.usage));
  const del = await app.request("/v1/sessions/conv-1", { method: "DELETE", headers: AUTH });
  assert.deepEqual(await del.json(), { id: "conv-1", object: "session.deleted", deleted: true });
  const gone = await app.request("/v1/sessions/conv-1", { headers: AUTH });
  await expectError(gone, 404, "id", "session_not_found");
  const again = await app.request("/v1/sessions/conv-1", { method: "DELETE", headers: AUTH });
  await expectError(again, 404, "id", "session_not_found");
});

Deno.test("admission: full queue is 429 with Retry-After; shutting down is 503", async () => {
  const full = createApp(engine, { maxQueued: 0, retryAfterSeconds: 3 });
  const res = await full.request(C, {
    method: "POST",
    headers: JSON_TYPE,
    body: '{"prompt": "a"}',
  });
  const message = await expectError(res, 429, null, "queue_full");
  assert.equal(res.headers.get("retry-after"), "3");
  assert.ok(message.includes("retry after 3 s"), message);

  const shutdown = new AbortController();
  const closing = createApp(engine, { shutdown: shutdown.signal });
  shutdown.abort();
  const chat = await closing.request(CHAT, {
    method: "POST",
    headers: JSON_TYPE,
    body: JSON.stringify({ messages: MSG }),
  });
  await expectError(chat, 503, null, "shutting_down");
  const health = await closing.request("/health");
  assert.equal(health.status, 503);
  assert.equal((await health.json()).status, "shutting_down");
});

Deno.test("CORS: off by default; configured origins get headers and preflight", async () => {
  const origin = "https://chat.example";
  const plain = await app.request("/health", { headers: { origin } });
  assert.equal(plain.headers.get("access-control-allow-origin"), null);
  const withCors = createApp(engine, { corsOrigins: [origin], apiKey: KEY });
  const pre = await withCors.request(C, {
    method: "OPTIONS",
    headers: {
      origin,
      "access-control-request-method": "POST",
      "access-control-request-headers": "authorization, content-type",
    },
  });
  assert.equal(pre.status, 204);
  assert.equal(pre.headers.get("access-control-allow-origin"), origin);
  const other = await withCors.request("/health", { headers: { origin: "https://evil.example" } });
  assert.equal(other.headers.get("access-control-allow-origin"), null);
});

Deno.test("static page: served from staticDir, 404 when absent, no path escapes", async () => {
  const root = await Deno.makeTempDir({ prefix: "strata_static_" });
  try {
    await Deno.writeTextFile(`${root}/index.html`, "<!doctype html><title>strata</title>");
    await Deno.writeTextFile(`${root}/app.js`, "console.log(1);");
    const site = createApp(engine, { staticDir: root, apiKey: KEY } satisfies ServerOptions);
    const index = await site.request("/");
    assert.equal(index.status, 200);
    assert.match(index.headers.get("content-type") ?? "", /^text\/html/);
    assert.equal(await index.text(), "<!doctype html><title>strata</title>");
    const js = await site.request("/app.js");
    assert.match(js.headers.get("content-type") ?? "", /javascript/);
    await js.body?.cancel();
    await expectError(await site.request("/style.css"), 404, null, "not_found");
    await expectError(await site.request("/../etc/passwd"), 404, null, "not_found");
    await expectError(await site.request("/%2e%2e/etc/passwd"), 404, null, "not_found");
    const none = createApp(engine, { staticDir: `${root}/missing` });
    await expectError(await none.request("/"), 404, null, "not_found");
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});
