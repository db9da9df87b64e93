/**
 * Cross-checks of verification passes against the plain path, in a real engine
 * (`EngineOptions.speculation`): checked every submission, the distances read back with the
 * tokens are far below the 2% tolerance and the tokens, logprobs and fingerprints are bit for
 * bit those of an engine that never checks (the plain path's KV write is overwritten before any
 * row reads it), with an f32 and an f16 cache. With a tolerance of 0 every check fails: the
 * failing sequences stop speculating, the breaker turns speculation off for the engine with its
 * reason in /health and /metrics, the tokens stay those of plain decoding, and it stays off until
 * `PUT /v1/speculation` switches it on again.
 */
import assert from "node:assert/strict";
import { sampling, type SamplingOptions } from "../api/types.ts";
import { Engine, type EngineOptions } from "../engine/engine.ts";
import { createApp } from "../routes/app.ts";
import { type TestModelOptions, withTestModel } from "../scripts/make_test_model.ts";
import { testGpu } from "./util.ts";

const MODEL: TestModelOptions = {
  arch: "qwen2",
  dtype: "f32",
  hidden: 96,
  heads: 4,
  kvHeads: 2,
  ffn: 128,
  layers: 2,
};
const PROMPTS = [
  Array.from({ length: 30 }, (_, i) => 3 + (i % 7)),
  Array.from({ length: 21 }, (_, i) => 5 + ((i * 11) % 17)),
];
const SETTINGS: SamplingOptions[] = [
  sampling({ maxTokens: 24, stopAtEos: false }),
  sampling({ maxTokens: 24, stopAtEos: false, temperature: 0.9, topK: 30, seed: 4n }),
];

async function run(engine: Engine, promptIds: number[], s: SamplingOptions) {
  const gen = engine.generate({ promptIds, sampling: s });
  const ids: number[] = [], logprobs: number[] = [];
  for await (const t of gen) {
    ids.push(t.id);
    logprobs.push(t.logprob);
  }
  return { ids, logprobs, result: await gen.result };
}

/** Every prompt and setting, two at a time (a batch of two), on `engine`. */
async function all(engine: Engine) {
  const out = [];
  for (const p of PROMPTS) out.push(...await Promise.all(SETTINGS.map((s) => run(engine, p, s))));
  return out;
}

Deno.test("speculation checks: checked passes agree with the plain path and change nothing", async () => {
  await testGpu();
  await withTestModel(MODEL, async (dir) => {
    for (const kvDtype of ["f32", "f16"] as const) {
      const opts: EngineOptions = { maxSlots: 2, contextLength: 128, speculate: "on", kvDtype };
      const unchecked = await Engine.load(dir, { ...opts, speculation: { checkEvery: 0 } });
      const checked = await Engine.load(dir, { ...opts, speculation: { checkEvery: 1 } });
      const plain = await Engine.load(dir, { maxSlots: 2, contextLength: 128, kvDtype });
      const [a, b, c] = [await all(unchecked), await all(checked), await all(plain)];
      b.forEach((got, i) => {
        assert.deepEqual(got.ids, a[i].ids, `${kvDtype} ${i}: tokens`);
        assert.deepEqual(got.logprobs, a[i].logprobs, `${kvDtype} ${i}: logprobs, bit for bit`);
        assert.deepEqual(got.result.fingerprints, a[i].result.fingerprints, `${kvDtype} ${i}`);
        assert.deepEqual(got.ids, c[i].ids, `${kvDtype} ${i}: plain decoding's tokens`);
        const sp = got.result.speculation!;
        assert.ok(sp.checks! > 0 && sp.failures === 0, JSON.stringify(sp));
      });
      const stats = checked.speculationStats();
      console.log(`${kvDtype}: ${JSON.stringify(stats)}`);
      assert.ok(stats.checks! >= 4, "every submission of each sequence checked");
      assert.equal(stats.failures, 0);
      assert.ok(stats.maxDistance! < 1e-3, `largest distance ${stats.maxDistance}`);
      assert.equal(unchecked.speculationStats().checks, 0);
    }
  });
});

Deno.test("speculation checks: failures trip the breaker, which holds until switched on", async () => {
  await testGpu();
  await withTestModel(MODEL, async (dir) => {
    const plain = await Engine.load(dir, { maxSlots: 2, contextLength: 128 });
    const engine = await Engine.load(dir, {
      maxSlots: 2,
      contextLength: 128,
      speculate: "on",
      speculation: { checkEvery: 1, checkTolerance: 0 },
    });
    const app = createApp(engine);
    const want = await all(plain), got = await all(engine);
    got.forEach((g, i) => assert.deepEqual(g.ids, want[i].ids, `request ${i}: tokens`));
    // The first batch's checks failed (its first submission's, and the one encoded before that
    // was read back): its sequences stopped, and the engine.
    const first = got[0].result.speculation!;
    assert.ok(first.checks! >= 1 && first.failures === first.checks, JSON.stringify(first));
    const stats = engine.speculationStats();
    assert.equal(stats.tripped, true);
    assert.equal(stats.failures, stats.checks);
    assert.ok(stats.checks! <= 4, `no check after the breaker: ${stats.checks}`);
    for (const g of got.slice(2)) assert.equal(g.result.speculation, undefined, "plain after");
    const health = await (await app.request("/health")).json();
    assert.equal(health.speculation.tripped, true);
    assert.match(
      health.speculation.paused_because,
      /verification failed \d of the last \d cross-checks/,
    );
    assert.equal(health.speculation.check_failures, stats.failures);
    const metrics = await (await app.request("/metrics")).text();
    assert.match(metrics, /strata_speculation_tripped 1\b/);
    assert.match(
      metrics,
      new RegExp(`strata_speculation_checks_total\\{result="failed"\\} ${stats.failures}\\b`),
    );
    // Switched on again: it speculates (and, still failing, trips again).
    const put = await app.request("/v1/speculation", {
      method: "PUT",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ mode: "auto" }),
    });
    assert.equal(put.status, 200);
    const reset = await put.json();
    assert.deepEqual([reset.tripped, reset.paused_because], [false, null]);
    const again = await all(engine);
    again.forEach((g, i) => assert.deepEqual(g.ids, want[i].ids, `again ${i}: tokens`));
    assert.ok(engine.speculationStats().checks! > stats.checks!, "checked again");
    assert.equal(engine.speculationStats().tripped, true);
  });
});
