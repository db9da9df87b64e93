/**
 * Speculative decoding changes how many tokens a step yields, never which tokens: for models
 * with GQA, MQA, tied embeddings and biases, greedy and seeded sampling with every sampler
 * option (top-k/p, min-p, penalties), alone and in batches, with 1 to 16 steps per submission,
 * an engine that verifies drafts gives exactly the tokens (and logprobs) of one that does not.
 * On the trained default model, repetitive text gets drafts accepted, and free text drafts from
 * the n-gram pool of the model's guesses that are accepted.
 */
import assert from "node:assert/strict";
import { sampling, type SamplingOptions } from "../api/types.ts";
import { Engine } from "../engine/engine.ts";
import { type TestModelOptions, withTestModel } from "../scripts/make_test_model.ts";
import { rng, testGpu } from "./util.ts";

const MODELS: [string, TestModelOptions][] = [
  ["llama f32 MQA tied", {
    arch: "llama",
    dtype: "f32",
    hidden: 128,
    heads: 2,
    kvHeads: 1,
    ffn: 160,
    layers: 2,
    tie: true,
  }],
  ["qwen2 bf16 GQA biases", {
    arch: "qwen2",
    dtype: "bf16",
    hidden: 128,
    heads: 4,
    kvHeads: 2,
    ffn: 192,
    layers: 2,
  }],
];

/** Settings each prompt runs with: greedy, and sampling with every option, seeded. */
function settings(seed: number): SamplingOptions[] {
  const base = { maxTokens: 40, stopAtEos: false };
  return [
    sampling(base),
    sampling({ ...base, temperature: 0.9, topP: 0.95, topK: 40, seed: BigInt(seed) }),
    sampling({ ...base, temperature: 0.7, minP: 0.05, seed: BigInt(seed + 1) }),
    sampling({
      ...base,
      temperature: 0.8,
      repetitionPenalty: 1.2,
      presencePenalty: 0.3,
      frequencyPenalty: 0.2,
      seed: BigInt(seed + 2),
    }),
    sampling({ ...base, repetitionPenalty: 1.3, frequencyPenalty: 0.5 }),
  ];
}

/** Prompts that repeat themselves (so the history drafts) and one that does not. */
function prompts(vocab: number, seed: number): number[][] {
  const r = rng(seed);
  const phrase = Array.from({ length: 7 }, () => 1 + r.int(vocab - 1));
  return [
    [...phrase, ...phrase, ...phrase, ...phrase.slice(0, 3)],
    Array.from({ length: 30 }, (_, i) => 1 + ((i * 5) % 11)),
    Array.from({ length: 19 }, () => 1 + r.int(vocab - 1)),
  ];
}

async function run(engine: Engine, promptIds: number[], s: SamplingOptions) {
  const gen = engine.generate({ promptIds, sampling: s });
  const ids: number[] = [], logprobs: number[] = [];
  for await (const t of gen) {
    ids.push(t.id);
    logprobs.push(t.logprob);
  }
  return { ids, logprobs, result: await gen.result };
}

function same(label: string, a: Awaited<ReturnType<typeof run>>, b: typeof a) {
  assert.deepEqual(b.ids, a.ids, `${label}: tokens`);
  a.logprobs.forEach((lp, i) => {
    const d = Math.abs(lp - b.logprobs[i]);
    assert.ok(d < 1e-3, `${label}: logprob ${i} differs by ${d}`);
  });
  assert.equal(b.result.finishReason, a.result.finishReason, `${label}: finish`);
}

for (const [name, model] of MODELS) {
  Deno.test(`speculation: the tokens of plain decoding, ${name}`, async () => {
    await testGpu();
    await withTestModel(model, async (dir) => {
      const opts = { maxSlots: 4, contextLength: 256 };
      const plain = await Engine.load(dir, opts);
      const spec = await Engine.load(dir, { ...opts, speculate: "on" });
      const vocab = plain.config.vocabSize;
      let verified = 0, accepted = 0, cases = 0;
      for (const [p, promptIds] of prompts(vocab, 11).entries()) {
        for (const [k, s] of settings(100 + p).entries()) {
          const a = await run(plain, promptIds, s), b = await run(spec, promptIds, s);
          same(`${name} prompt ${p} settings ${k}`, a, b);
          verified += b.result.speculation?.steps ?? 0;
          accepted += b.result.speculation?.accepted ?? 0;
          cases++;
        }
      }
      // All at once: a batch mixes sequences that draft with ones that do not.
      const jobs = prompts(vocab, 12).flatMap((promptIds, p) =>
        settings(200 + p).map((s) => ({ promptIds, s }))
      ).slice(0, 8);
      const alone: Awaited<ReturnType<typeof run>>[] = [];
      for (const j of jobs) alone.push(await run(plain, j.promptIds, j.s));
      const together = await Promise.all(jobs.map((j) => run(spec, j.promptIds, j.s)));
      together.forEach((b, i) => same(`${name} batch member ${i}`, alone[i], b));
      console.log(
        `${name}: ${cases} cases, ${verified} verification steps, ${accepted} drafts accepted`,
      );
      assert.ok(verified > 0, "no step was a verification pass");
    });
  });
}

Deno.test("speculation: steps per submission and a request that opts out change nothing", async () => {
  await testGpu();
  await withTestModel(MODELS[0][1], async (dir) => {
    const plain = await Engine.load(dir, { maxSlots: 2, contextLength: 256 });
    const vocab = plain.config.vocabSize;
    const [promptIds] = prompts(vocab, 21);
    const s = settings(300)[1];
    const want = await run(plain, promptIds, s);
    for (const maxSteps of [1, 4, 16]) {
      const spec = await Engine.load(dir, {
        maxSlots: 2,
        contextLength: 256,
        speculate: "on",
        maxSteps,
      });
      same(`maxSteps ${maxSteps}`, want, await run(spec, promptIds, s));
      const off = await spec.generate({ promptIds, sampling: s, speculation: false }).result;
      assert.equal(off.speculation, undefined, "a request that opts out is never verified");
    }
  });
});

Deno.test("speculation: the default model accepts drafts on repetitive text, and the pool's", async () => {
  await testGpu();
  const dir = new URL("../models/strata-default", import.meta.url).pathname;
  // A small KV pool: the default's (512 MiB of f32 blocks) is zeroed at load on a CPU adapter.
  const opts = { maxSlots: 2, kvBlocks: 160 };
  const plain = await Engine.load(dir, opts);
  const spec = await Engine.load(dir, { ...opts, speculate: "on" });
  // Free text: the model's own guesses draft where its short history has nothing to copy
  // (bench --speculate compares with lookup alone: its "lookup" column).
  const free = plain.encode("Once upon a time, in a land far away, there lived");
  const want = await run(plain, free, sampling({ maxTokens: 40 }));
  const pooled = await run(spec, free, sampling({ maxTokens: 40 }));
  same("free text", want, pooled);
  const p = pooled.result.speculation!;
  console.log(`free text: ${JSON.stringify(p)}`);
  assert.ok(p.pooledAccepted! > 0, "no draft of the pool was accepted");
  const text = "And the LORD spake unto Moses, saying, Speak unto the children of Israel. " +
    "And the LORD spake unto Moses, saying,";
  const promptIds = plain.encode(text);
  for (const s of [sampling({ maxTokens: 48 }), { ...settings(9)[1], maxTokens: 24 }]) {
    const a = await run(plain, promptIds, s), b = await run(spec, promptIds, s);
    same("default model", a, b);
    const sp = b.result.speculation!;
    console.log(`default model T=${s.temperature}: ${JSON.stringify(sp)}`);
    if (s.temperature === 0) {
      assert.ok(sp.accepted > 0, `no draft accepted: ${JSON.stringify(sp)}`);
      assert.ok(sp.steps < a.ids.length, "verification steps gave more than a token each");
    }
  }
});
