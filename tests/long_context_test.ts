/**
 * Masks and RoPE scaling end to end: a Mistral model whose window is shorter than its prompts
 * against the float64 reference well past the window (prefill chunks crossing it, a batch of
 * mixed lengths decoding together); the blocks behind the window going back to the pool; the
 * sinks + window streaming option; linear, yarn and dynamic rope scaling; the refusals.
 */
import assert from "node:assert/strict";
import { Engine, type EngineOptions } from "../engine/engine.ts";
import { sampling } from "../api/types.ts";
import { loadModelFolder } from "../engine/model/folder.ts";
import { logSoftmax, ReferenceModel, topMargin } from "../engine/model/reference_forward.ts";
import type { AttentionMask } from "../kernels/attention_mask.ts";
import { type TestModelOptions, withTestModel } from "../scripts/make_test_model.ts";
import { rng, testGpu } from "./util.ts";

const greedy = (maxTokens: number) => sampling({ maxTokens, stopAtEos: false });

/**
 * Generates greedily from every prompt at once (one batch of mixed lengths), then checks each
 * token against the reference's argmax (where its margin is over 0.05) and each logprob within
 * 0.05, teacher-forced along the engine's tokens. Returns the decisive steps compared.
 */
async function matchReference(
  engine: Engine,
  ref: ReferenceModel,
  prompts: number[][],
  o: { tokens: number; mask?: AttentionMask; label: string },
): Promise<number> {
  const runs = prompts.map(async (promptIds) => {
    const gen = engine.generate({ promptIds, sampling: greedy(o.tokens) });
    const tokens: number[] = [], logprobs: number[] = [];
    for await (const t of gen) {
      tokens.push(t.id);
      logprobs.push(t.logprob);
    }
    return { tokens, logprobs };
  });
  let compared = 0, worst = 0;
  for (const [p, got] of (await Promise.all(runs)).entries()) {
    const len = prompts[p].length;
    assert.equal(got.tokens.length, o.tokens);
    const logits = ref.forward([...prompts[p], ...got.tokens], { mask: o.mask });
    got.tokens.forEach((id, i) => {
      const row = logits[len - 1 + i], lp = logSoftmax(row);
      if (topMargin(row) > 0.05) {
        assert.equal(id, lp.indexOf(Math.max(...lp)), `${o.label}: prompt ${len}, step ${i}`);
        compared++;
      }
      const d = Math.abs(got.logprobs[i] - lp[id]);
      worst = Math.max(worst, d);
      assert.ok(d <= 0.05, `${o.label}: prompt ${len}, step ${i}: |Δ logprob| = ${d}`);
    });
  }
  console.log(`${o.label}: ${compared} argmax checks, max |Δ logprob| ${worst}`);
  return compared;
}

const MISTRAL: TestModelOptions = {
  arch: "mistral",
  dtype: "f16",
  hidden: 64,
  heads: 4,
  kvHeads: 2,
  ffn: 128,
  layers: 2,
  slidingWindow: 37,
  maxPositions: 512,
  seed: 5,
};

async function withEngine(
  model: TestModelOptions,
  options: EngineOptions,
  fn: (engine: Engine, ref: ReferenceModel) => Promise<void>,
) {
  await testGpu();
  await withTestModel(model, async (dir) => {
    const engine = await Engine.load(dir, options);
    await fn(engine, await ReferenceModel.load(await loadModelFolder(dir)));
  });
}

const prompt = (r: ReturnType<typeof rng>, n: number) =>
  Array.from({ length: n }, () => r.int(300));

Deno.test("Mistral with a window of 37 matches the reference well past it", async () => {
  await withEngine(MISTRAL, { maxSlots: 4, contextLength: 256, maxChunk: 32 }, async (e, ref) => {
    assert.equal(e.contextLength, 256, "the context is no longer capped at the window");
    assert.deepEqual(ref.config.slidingWindow, 37);
    const r = rng(21);
    // 1 token, one inside the window, prompts of 2-5 chunks crossing it, decoding 40 past it.
    const prompts = [1, 30, 70, 150].map((n) => prompt(r, n));
    const compared = await matchReference(e, ref, prompts, { tokens: 40, label: "window 37" });
    assert.ok(compared >= 80, `too few decisive steps (${compared})`);
    // The reference with full attention parts from the engine: the window really applies.
    const long = prompts[3];
    const causal = ref.forward(long, { lastOnly: true, mask: { kind: "causal" } })[0];
    const windowed = ref.forward(long, { lastOnly: true })[0];
    assert.ok(Math.max(...causal.map((x, i) => Math.abs(x - windowed[i]))) > 0.1);
  });
});

Deno.test("a sequence gives the blocks behind its window back; a session keeps them", async () => {
  await withEngine(MISTRAL, { maxSlots: 2, contextLength: 512, maxChunk: 64 }, async (e) => {
    const r = rng(22);
    const ids = prompt(r, 300);
    // Reserved: (300 + 20) / 16 = 20 blocks. Behind the window of the last prompt token (keys
    // 263.. visible from 299): blocks 0..15 (keys 0..255) are dead after the prefill.
    const usedAt = async (sessionId?: string) => {
      const used: number[] = [];
      const gen = e.generate(
        { promptIds: ids, sampling: greedy(20), sessionId },
        () => used.push(e.kvStats().gpu.used),
      );
      await gen.result;
      return used;
    };
    const free = await usedAt();
    assert.equal(free[0], 20 - 16, `blocks held at the first token: ${free}`);
    // Once the queries still to come sit at 308 or later (window from 272), block 16 (keys
    // 256..271) is dead too, and no more before the end.
    assert.equal(Math.min(...free), 20 - 17, `blocks held: ${free}`);
    assert.ok(free.every((n, i) => i === 0 || n <= free[i - 1]), `never grows: ${free}`);
    assert.equal(e.kvStats().gpu.used, 0, "all back at the end");
    const kept = await usedAt("s");
    assert.ok(kept.every((n) => n === 20), `a session's blocks stay: ${kept}`);
  });
});

const LLAMA: TestModelOptions = {
  arch: "llama",
  dtype: "f16",
  hidden: 64,
  heads: 4,
  kvHeads: 2,
  ffn: 128,
  layers: 2,
  maxPositions: 512,
  seed: 9,
};

Deno.test("streaming: sinks + window matches the reference's mask; bad values refused", async () => {
  const attentionSinks = { sinks: 4, window: 20 };
  const opts = { maxSlots: 2, contextLength: 256, maxChunk: 32, attentionSinks };
  await withEngine(LLAMA, opts, async (e, ref) => {
    const r = rng(23);
    const mask: AttentionMask = { kind: "sinks", ...attentionSinks };
    const compared = await matchReference(e, ref, [prompt(r, 90), prompt(r, 9)], {
      tokens: 30,
      mask,
      label: "sinks 4 + window 20",
    });
    assert.ok(compared >= 30, `too few decisive steps (${compared})`);
  });
  await withTestModel(LLAMA, async (dir) => {
    await assert.rejects(
      Engine.load(dir, { attentionSinks: { sinks: 0, window: 20 } }),
      /attentionSinks: sinks must be an integer >= 1; got 0/,
    );
    await assert.rejects(
      Engine.load(dir, { attentionSinks: { sinks: 4, window: 2.5 } }),
      /attentionSinks: window must be an integer >= 1; got 2.5/,
    );
  });
  await withTestModel(MISTRAL, async (dir) => {
    await assert.rejects(
      Engine.load(dir, { attentionSinks: { sinks: 4, window: 64 } }),
      /attentionSinks: window 64 is wider than the model's sliding_window \(37\)/,
    );
  });
});

for (const scaling of ["linear", "yarn"] as const) {
  Deno.test(`rope scaling ${scaling} matches the reference`, async () => {
    const model = { ...LLAMA, ropeScaling: scaling };
    const opts = { maxSlots: 2, contextLength: 512, maxChunk: 64 };
    await withEngine(model, opts, async (e, ref) => {
      assert.equal(ref.config.ropeScaling?.type, scaling);
      const r = rng(24);
      const n = await matchReference(e, ref, [prompt(r, 200), prompt(r, 3)], {
        tokens: 24,
        label: scaling,
      });
      assert.ok(n >= 24, `too few decisive steps (${n})`);
    });
  });
}

Deno.test("rope scaling dynamic: exact up to max_position_embeddings, refused past it", async () => {
  const model = { ...LLAMA, ropeScaling: "dynamic" as const, maxPositions: 128 };
  await withEngine(model, { maxSlots: 1, contextLength: 128, maxChunk: 32 }, async (e, ref) => {
    const r = rng(25);
    await matchReference(e, ref, [prompt(r, 100)], { tokens: 28, label: "dynamic" });
  });
  await withTestModel(model, async (dir) => {
    await assert.rejects(
      Engine.load(dir, { contextLength: 256 }),
      /--context-length 256 is past max_position_embeddings \(128\) of a model with 'dynamic' rope_scaling/,
    );
  });
});
