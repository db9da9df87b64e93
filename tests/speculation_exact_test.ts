/**
 * Speculation never changes a token, whatever the seed, the depth or the batch around it, and its
 * rollback never corrupts a later step:
 *
 * - Many seeds at every depth k (1, 3, 7 drafts), with the batch's membership changing under it
 *   (more requests than slots, so some join mid-way; requests arriving while others decode;
 *   opted-out requests beside speculating ones): every output equals plain decoding's alone.
 * - Rollback: rejected drafts write K and V at positions that later tokens overwrite. After long
 *   generations with hundreds of rejected rows (drafts of 7 on a random model), every token's
 *   logprob equals the float64 reference forward over the final sequence, which never saw a draft.
 */
import assert from "node:assert/strict";
import { sampling, type SamplingOptions } from "../api/types.ts";
import { Engine } from "../engine/engine.ts";
import { loadModelFolder } from "../engine/model/folder.ts";
import { logSoftmax, ReferenceModel } from "../engine/model/reference_forward.ts";
import { type TestModelOptions, withTestModel } from "../scripts/make_test_model.ts";
import { rng, testGpu } from "./util.ts";

const MODEL: TestModelOptions = {
  arch: "llama",
  dtype: "f32",
  hidden: 64,
  heads: 4,
  kvHeads: 1,
  ffn: 96,
  layers: 2,
  tie: true,
};

async function run(engine: Engine, promptIds: number[], s: SamplingOptions, opt = {}) {
  const gen = engine.generate({ promptIds, sampling: s, ...opt });
  const ids: number[] = [], logprobs: number[] = [];
  for await (const t of gen) {
    ids.push(t.id);
    logprobs.push(t.logprob);
  }
  return { ids, logprobs, result: await gen.result };
}

/** Seeded requests: repetitive and random prompts, every sampler option, greedy among them. */
function requests(vocab: number, n: number) {
  const r = rng(77);
  return Array.from({ length: n }, (_, i) => {
    const phrase = Array.from({ length: 3 + r.int(6) }, () => 1 + r.int(vocab - 1));
    const promptIds = i % 3 === 2
      ? Array.from({ length: 5 + r.int(20) }, () => 1 + r.int(vocab - 1))
      : [...phrase, ...phrase, ...phrase].slice(0, 8 + r.int(16));
    const seed = BigInt(1000 + i);
    const base = { maxTokens: 16 + r.int(16), stopAtEos: false, seed };
    const s = [
      sampling({ ...base, seed: undefined }),
      sampling({ ...base, temperature: 1, topP: 0.9 }),
      sampling({ ...base, temperature: 0.7, topK: 20, minP: 0.02 }),
      sampling({ ...base, temperature: 0.9, repetitionPenalty: 1.3, frequencyPenalty: 0.4 }),
    ][i % 4];
    return { promptIds, s, optOut: i % 5 === 4 };
  });
}

Deno.test("speculation: plain decoding's tokens for many seeds, every depth, changing batches", async () => {
  await testGpu();
  await withTestModel(MODEL, async (dir) => {
    const ctx = { contextLength: 128 };
    const plain = await Engine.load(dir, { ...ctx, maxSlots: 1 });
    const reqs = requests(plain.config.vocabSize, 12);
    const want: Awaited<ReturnType<typeof run>>[] = [];
    for (const q of reqs) want.push(await run(plain, q.promptIds, q.s));
    let verified = 0;
    for (const drafts of [1, 3, 7]) {
      const spec = await Engine.load(dir, { ...ctx, maxSlots: 4, speculate: "on", drafts });
      const label = (how: string, i: number) => `k=${drafts} ${how} request ${i}`;
      const check = (how: string) => (got: Awaited<ReturnType<typeof run>>, i: number) => {
        assert.deepEqual(got.ids, want[i].ids, `${label(how, i)}: tokens`);
        got.logprobs.forEach((lp, j) => {
          assert.ok(Math.abs(lp - want[i].logprobs[j]) < 1e-4, `${label(how, i)}: logprob ${j}`);
        });
        if (reqs[i].optOut) assert.equal(got.result.speculation, undefined);
        verified += got.result.speculation?.steps ?? 0;
      };
      // Twelve at once on four slots: the batch shrinks and refills as they finish.
      const opt = (i: number) => reqs[i].optOut ? { speculation: false } : {};
      (await Promise.all(reqs.map((q, i) => run(spec, q.promptIds, q.s, opt(i)))))
        .forEach(check("at once"));
      // Arriving one by one while the others decode.
      const staggered = [];
      for (const [i, q] of reqs.entries()) {
        staggered.push(run(spec, q.promptIds, q.s, opt(i)));
        await new Promise((res) => setTimeout(res, 15 * (i % 3)));
      }
      (await Promise.all(staggered)).forEach(check("staggered"));
    }
    console.log(`${verified} verification steps`);
    assert.ok(verified > 100);
  });
});

Deno.test("speculation: rejected drafts' KV never reaches a later step (float64 reference)", async () => {
  await testGpu();
  await withTestModel(MODEL, async (dir) => {
    const spec = await Engine.load(dir, {
      contextLength: 256,
      maxSlots: 2,
      speculate: "on",
      drafts: 7,
    });
    const ref = await ReferenceModel.load(await loadModelFolder(dir));
    const V = spec.config.vocabSize, r = rng(3);
    const prompts = [
      Array.from({ length: 24 }, (_, i) => 2 + (i % 5)),
      Array.from({ length: 17 }, () => 1 + r.int(V - 1)),
    ];
    // Penalties and high temperatures keep a random model out of loops, so drafts fail often.
    const base = { maxTokens: 90, stopAtEos: false };
    const s = [
      sampling({ ...base, repetitionPenalty: 1.6, frequencyPenalty: 0.5 }),
      sampling({ ...base, temperature: 1.6, presencePenalty: 0.5, seed: 5n }),
    ];
    const outs = await Promise.all(prompts.map((p, i) => run(spec, p, s[i])));
    let rejected = 0, worst = 0;
    outs.forEach((o, i) => {
      const sp = o.result.speculation!;
      rejected += sp.drafted - sp.accepted;
      const seq = [...prompts[i], ...o.ids];
      const logits = ref.forward(seq.slice(0, -1));
      o.ids.forEach((t, j) => {
        const lp = logSoftmax(logits[prompts[i].length - 1 + j])[t];
        const d = Math.abs(lp - o.logprobs[j]);
        worst = Math.max(worst, d);
        assert.ok(d < 2e-4, `sequence ${i} token ${j}: logprob ${o.logprobs[j]} vs ${lp}`);
      });
    });
    console.log(`${rejected} rejected drafts; max |Δ logprob| against float64 ${worst}`);
    assert.ok(rejected > 100, `only ${rejected} drafts were rejected`);
  });
});
