/**
 * Speculation over HTTP (`app.request()`, a real engine that speculates): a request may opt out
 * with `"speculation": false`; usage reports accepted and rejected drafts in OpenAI's
 * predicted-output fields; `/v1/speculation` reads and switches the mode; `/health` and
 * `/metrics` show it. An engine started with speculation off refuses to turn it on.
 */
import assert from "node:assert/strict";
import { Engine } from "../engine/engine.ts";
import { createApp } from "../routes/app.ts";
import { makeTestModel } from "../scripts/make_test_model.ts";
import { expectError } from "./routes_cases.ts";

const dir = await Deno.makeTempDir({ prefix: "strata_routes_spec_" });
globalThis.addEventListener("unload", () => Deno.removeSync(dir, { recursive: true }));
await makeTestModel(dir, { arch: "llama", dtype: "f32", hidden: 64, heads: 2, kvHeads: 1 });
const JSON_TYPE = { "content-type": "application/json" };
// A prompt that repeats itself, so the history drafts.
const PROMPT = Array.from({ length: 30 }, (_, i) => 3 + (i % 6));

function request(app: ReturnType<typeof createApp>, method: string, path: string, body?: unknown) {
  return app.request(path, {
    method,
    headers: JSON_TYPE,
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
}

Deno.test("speculation routes: usage, opting out, the switch, health and metrics", async () => {
  const engine = await Engine.load(dir, { contextLength: 128, maxSlots: 2, speculate: "on" });
  const app = createApp(engine);
  const complete = async (extra: object) => {
    const r = await request(app, "POST", "/v1/completions", {
      prompt: PROMPT,
      max_tokens: 24,
      temperature: 0,
      ...extra,
    });
    const j = await r.json();
    assert.equal(r.status, 200, JSON.stringify(j));
    return j;
  };
  const spec = await complete({});
  const d = spec.usage.completion_tokens_details;
  const stats = engine.speculationStats();
  assert.ok(stats.steps > 0, JSON.stringify(stats));
  assert.deepEqual(d, {
    accepted_prediction_tokens: stats.accepted,
    rejected_prediction_tokens: stats.drafted - stats.accepted,
  });
  // Opting out: the same text, no drafts.
  const plain = await complete({ speculation: false });
  assert.equal(plain.choices[0].text, spec.choices[0].text);
  assert.deepEqual(plain.usage.completion_tokens_details, {
    accepted_prediction_tokens: 0,
    rejected_prediction_tokens: 0,
  });
  assert.equal(engine.speculationStats().steps, stats.steps, "no verification step for it");
  // State and switch.
  const got = await (await request(app, "GET", "/v1/speculation")).json();
  assert.equal(got.mode, "on");
  assert.equal(got.steps, stats.steps);
  const health = await (await request(app, "GET", "/health")).json();
  assert.equal(health.speculation.mode, "on");
  assert.ok(health.speculation.acceptance === null || health.speculation.acceptance >= 0);
  const metrics = await (await request(app, "GET", "/metrics")).text();
  assert.match(metrics, new RegExp(`strata_speculation_steps_total ${stats.steps}\\b`));
  assert.match(metrics, /strata_speculation_mode\{mode="on"\} 1/);
  const off = await request(app, "PUT", "/v1/speculation", { mode: "off" });
  assert.equal((await off.json()).mode, "off");
  await complete({});
  assert.equal(engine.speculationStats().steps, stats.steps, "off: plain steps only");
  await expectError(
    await request(app, "PUT", "/v1/speculation", { mode: "always" }),
    400,
    "mode",
  );
  await expectError(
    await request(app, "PUT", "/v1/speculation", { mode: "auto", depth: 3 }),
    400,
    "depth",
    "unknown_parameter",
  );
  assert.equal(
    (await (await request(app, "PUT", "/v1/speculation", { mode: "auto" })).json()).mode,
    "auto",
  );
});

Deno.test("speculation routes: an engine started off cannot be switched on", async () => {
  const engine = await Engine.load(dir, { contextLength: 128, maxSlots: 1 });
  const app = createApp(engine);
  assert.equal((await (await request(app, "GET", "/v1/speculation")).json()).mode, "off");
  const msg = await expectError(
    await request(app, "PUT", "/v1/speculation", { mode: "auto" }),
    400,
    "mode",
  );
  assert.match(msg, /started with --speculate off/);
});
