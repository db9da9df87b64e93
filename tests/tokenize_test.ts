/**
 * `POST /v1/tokenize`, `POST /v1/detokenize` and `GET /v1/models/:id` on the default model
 * (models/strata-default), with the engine in a worker as `main.ts serve` runs it: route tests
 * through `app.request()`, then the real server driven by the official `openai` client.
 */
import assert from "node:assert/strict";
import OpenAI from "openai";
import { WorkerEngine } from "../engine/worker/host.ts";
import { createApp } from "../routes/app.ts";
import { expectError } from "./routes_cases.ts";

const MODEL_DIR = new URL("../models/strata-default", import.meta.url).pathname;
const KEY = "sk-tokenize";
const engine = await WorkerEngine.load({ dir: MODEL_DIR }, { maxSlots: 1 });
globalThis.addEventListener("unload", () => engine.close());
const app = createApp(engine, { apiKey: KEY, maxBodyBytes: 4096 });
const AUTH = { authorization: `Bearer ${KEY}`, "content-type": "application/json" };
/** Tokens the default model's tokenizer knows: 8192 (models/strata-default/tokenizer.json). */
const VOCAB = 8192;

function post(path: string, body: unknown, headers: Record<string, string> = AUTH) {
  const text = typeof body === "string" ? body : JSON.stringify(body);
  return app.request(path, { method: "POST", headers, body: text });
}

Deno.test("tokenize: text to the engine's ids, and back with detokenize", async () => {
  for (const content of ["Hello world", "", "  two  spaces, ünïcödé and 🦊\n"]) {
    const res = await post("/v1/tokenize", { content });
    const body = await res.json();
    assert.equal(res.status, 200, JSON.stringify(body));
    assert.deepEqual(body, { tokens: engine.encode(content) });
    const back = await (await post("/v1/detokenize", { tokens: body.tokens })).json();
    assert.deepEqual(back, { content: engine.decode(body.tokens) });
  }
  // The default tokenizer adds its BOS, and detokenize shows it: special tokens are kept.
  const hello = await (await post("/v1/tokenize", { content: "Hello world" })).json();
  const text = await (await post("/v1/detokenize", { tokens: hello.tokens })).json();
  assert.equal(text.content, "<s>Hello world");
  // add_special_tokens: true is what tokenize does anyway; model may name the served model.
  const same = await post("/v1/tokenize", {
    content: "Hello world",
    add_special_tokens: true,
    model: engine.modelId,
  });
  assert.deepEqual(await same.json(), hello);
  assert.deepEqual(await (await post("/v1/detokenize", { tokens: [] })).json(), { content: "" });
  // The tokens are the prompt a completion of the same text runs on.
  const done = await (await post("/v1/completions", {
    prompt: "Hello world",
    max_tokens: 1,
  })).json();
  assert.equal(done.usage.prompt_tokens, hello.tokens.length, JSON.stringify(done));
  // The last id of the vocabulary is one.
  const last = await post("/v1/detokenize", { tokens: [VOCAB - 1] });
  assert.equal(last.status, 200);
  assert.deepEqual(await last.json(), { content: engine.decode([VOCAB - 1]) });
});

Deno.test("tokenize and detokenize: bad requests get a 400 naming the field", async () => {
  const T = "/v1/tokenize", D = "/v1/detokenize";
  const cases: [string, unknown, string, string, RegExp][] = [
    [T, {}, "content", "invalid_value", /content is required/],
    [T, { content: 5 }, "content", "invalid_value", /content must be a string; got 5/],
    [T, { content: ["a"] }, "content", "invalid_value", /got \["a"\]/],
    [
      T,
      { content: "a", add_special_tokens: false },
      "add_special_tokens",
      "invalid_value",
      /not supported/,
    ],
    [
      T,
      { content: "a", add_special_tokens: "no" },
      "add_special_tokens",
      "invalid_value",
      /true or false/,
    ],
    [
      T,
      { prompt: "a" },
      "prompt",
      "unknown_parameter",
      /unknown field "prompt"; \/v1\/tokenize takes "content"/,
    ],
    [T, { content: "a", with_pieces: true }, "with_pieces", "unknown_parameter", /"with_pieces"/],
    [D, {}, "tokens", "invalid_value", /tokens must be a list of token ids/],
    [D, { tokens: "1,2" }, "tokens", "invalid_value", /got "1,2"/],
    [D, { tokens: [1, -1] }, "tokens", "invalid_value", /tokens\[1\] must be a token id .* got -1/],
    [D, { tokens: [1.5] }, "tokens", "invalid_value", /tokens\[0\] must be a token id/],
    [D, { tokens: ["3"] }, "tokens", "invalid_value", /got "3"/],
    [
      D,
      { tokens: [0, 1, VOCAB] },
      "tokens",
      "invalid_value",
      /tokens\[2\] is 8192, which is not in the vocabulary/,
    ],
    [D, { tokens: [999999] }, "tokens", "invalid_value", /tokens\[0\] is 999999/],
    [
      D,
      { tokens: [1], content: "x" },
      "content",
      "unknown_parameter",
      /\/v1\/detokenize takes "tokens", "model"/,
    ],
  ];
  for (const [path, body, param, code, message] of cases) {
    const text = await expectError(await post(path, body), 400, param, code);
    assert.match(text, message, `${path} ${JSON.stringify(body)}`);
  }
  for (const path of [T, D]) {
    await expectError(await post(path, "{"), 400, null, "invalid_json");
    await expectError(await post(path, "[1]"), 400, null, "invalid_json");
    // Unknown fields come first: tokenize takes no "tokens", detokenize no "content".
    const both = await post(path, { content: "a", tokens: [1], model: "llama-70b" });
    await expectError(both, 400, path === T ? "tokens" : "content", "unknown_parameter");
    const wrongModel = path === T ? { content: "a", model: "llama-70b" } : {
      tokens: [1],
      model: "llama-70b",
    };
    await expectError(await post(path, wrongModel), 404, "model", "model_not_found");
    const get = await app.request(path, { headers: AUTH });
    await expectError(get, 405, null, "method_not_allowed");
    assert.equal(get.headers.get("allow"), "POST");
    // The same key and body limit as every /v1 route.
    const anonymous = await post(path, { content: "a" }, { "content-type": "application/json" });
    await expectError(anonymous, 401, null, "invalid_api_key");
    const big = await post(path, { content: "x".repeat(5000) });
    await expectError(big, 413, null, "request_too_large");
  }
});

Deno.test("the openai client: tokenize, detokenize, models.retrieve, typed errors", async () => {
  const server = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen() {} },
    createApp(engine, { apiKey: KEY }).fetch,
  );
  try {
    const client = new OpenAI({
      apiKey: KEY,
      baseURL: `http://127.0.0.1:${server.addr.port}/v1`,
      maxRetries: 0,
    });
    const { tokens } = await client.post<{ tokens: number[] }>("/tokenize", {
      body: { content: "The fox" },
    });
    assert.deepEqual(tokens, engine.encode("The fox"));
    const { content } = await client.post<{ content: string }>("/detokenize", {
      body: { tokens },
    });
    assert.equal(content, "<s>The fox");

    const bad = await client.post("/detokenize", { body: { tokens: [VOCAB] } }).catch((e) => e);
    assert.ok(bad instanceof OpenAI.BadRequestError, String(bad));
    assert.equal(bad.param, "tokens");
    assert.match(bad.message, /tokens\[0\] is 8192, which is not in the vocabulary/);

    const model = await client.models.retrieve(engine.modelId);
    assert.deepEqual({ ...model, created: 0 }, {
      id: engine.modelId,
      object: "model",
      created: 0,
      owned_by: "strata",
      context_length: engine.contextLength,
    });
    assert.ok(Number.isInteger(model.created) && model.created > 1.7e9, String(model.created));
    // The client escapes the slash of "org/name"; the 404 names the id as sent.
    const missing = await client.models.retrieve("org/other-model").catch((e) => e);
    assert.ok(missing instanceof OpenAI.NotFoundError, String(missing));
    assert.equal(missing.code, "model_not_found");
    assert.equal(missing.param, "model");
    assert.match(missing.message, /the model "org\/other-model" does not exist/);
  } finally {
    await server.shutdown();
  }
});
