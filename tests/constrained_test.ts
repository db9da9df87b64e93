/**
 * Constrained decoding and logit_bias through the engine. On a random test model, every token of
 * a constrained generation (greedy and seeded sampling with penalties and logit_bias, batched
 * with an unconstrained request) is the one engine/grammar/sample_ref.ts picks from the float64
 * reference logits, the grammar state walked on the host along the engine's tokens; on the
 * trained default model, schema outputs at temperature 0.8 parse and validate for every seed. The
 * refusals: max_tokens below what the grammar needs, ignore_eos, unknown keys, bad logit_bias,
 * unsupported schema keywords.
 */
import assert from "node:assert/strict";
import { InvalidRequestError } from "../api/errors.ts";
import { type ConstraintSpec, sampling, type SamplingOptions } from "../api/types.ts";
import { Engine } from "../engine/engine.ts";
import { compileGrammar } from "../engine/grammar/grammar.ts";
import { advanceRef, maskRef, sampleGrammarRef } from "../engine/grammar/sample_ref.ts";
import { tokenBytesImage, vocabularyOf } from "../engine/grammar/vocab.ts";
import { loadModelFolder } from "../engine/model/folder.ts";
import { ReferenceModel } from "../engine/model/reference_forward.ts";
import { TextTokenizer } from "../engine/model/tokenizer.ts";
import { applyBiasRef } from "../kernels/constraint.ts";
import { sampleDistRef } from "../kernels/reference.ts";
import { philoxUniform } from "../gpu/philox.ts";
import { withTestModel } from "../scripts/make_test_model.ts";
import { CASES, JSON_OBJECT } from "./grammar_schemas.ts";
import { rng, testGpu } from "./util.ts";

const DEFAULT_MODEL = new URL("../models/strata-default", import.meta.url).pathname;

async function run(engine: Engine, req: Parameters<Engine["generate"]>[0]) {
  const gen = engine.generate(req);
  const tokens: number[] = [], logprobs: number[] = [];
  for await (const t of gen) {
    tokens.push(t.id);
    logprobs.push(t.logprob);
  }
  return { tokens, logprobs, result: await gen.result };
}

/** Whether `u` falls within `eps` of a cumulative boundary of `p` (the draw is then undecided). */
function knifeEdge(p: Float64Array, u: number, eps: number): boolean {
  let cum = 0;
  for (const x of p) {
    if (x === 0) continue;
    cum += x;
    if (Math.abs(cum - u) < eps) return true;
  }
  return false;
}

Deno.test("constrained decoding: every token is the reference's pick from the masked float64 logits", async () => {
  await testGpu();
  await withTestModel({
    arch: "llama",
    dtype: "f32",
    hidden: 128,
    heads: 4,
    kvHeads: 2,
    ffn: 192,
    layers: 2,
    seed: 5,
  }, async (dir) => {
    const folder = await loadModelFolder(dir);
    const tokenizer = TextTokenizer.load(folder);
    const V = folder.config.vocabSize;
    const vocab = vocabularyOf(folder.tokenizerJson, tokenizer, { size: V });
    const tokenImage = tokenBytesImage(vocab);
    const ref = await ReferenceModel.load(folder);
    const engine = await Engine.load(dir, { maxSlots: 4, contextLength: 256, maxChunk: 32 });
    const r = rng(3);
    const specs: ConstraintSpec[] = [JSON_OBJECT.spec, CASES[0].spec, CASES[CASES.length - 4].spec];
    const bias: [number, number][] = [[5, 4.5], [17, -100], [40, 2.25]];
    const settings: SamplingOptions[] = [
      sampling({ maxTokens: 60 }),
      sampling({ maxTokens: 60, temperature: 0.8, topP: 0.95, seed: 11n, logitBias: bias }),
      sampling({
        maxTokens: 48,
        temperature: 1.1,
        topK: 30,
        repetitionPenalty: 1.2,
        presencePenalty: 0.3,
        seed: 12n,
      }),
    ];
    let checked = 0, total = 0;
    for (let round = 0; round < 2; round++) {
      const jobs = specs.map(async (spec, i) => {
        const c = await engine.compileConstraint(spec);
        const s = settings[(i + round) % settings.length];
        const prompt = Array.from({ length: 3 + r.int(20) }, () => r.int(Math.min(V, 300)));
        return {
          spec,
          s,
          prompt,
          out: await run(engine, { promptIds: prompt, sampling: s, constraint: c }),
        };
      });
      // an unconstrained request in the same batches
      const free = run(engine, {
        promptIds: [1, 2, 3],
        sampling: sampling({ maxTokens: 50, stopAtEos: false }),
      });
      const done = await Promise.all(jobs);
      assert.equal((await free).tokens.length, 50);
      for (const { spec, s, prompt, out } of done) {
        const image = compileGrammar(vocab, spec).image;
        // Complete either way: at EOS, or (the budget rule) exactly at the last token allowed.
        const why = out.result.finishReason;
        assert.ok(why === "stop" || (why === "length" && out.tokens.length === s.maxTokens), why);
        const text = tokenizer.decode(out.tokens.filter((t) => !vocab.eosIds.includes(t)));
        const c = [JSON_OBJECT, ...CASES].find((c) => c.spec === spec)!;
        assert.deepEqual(c.check(text), [], `${c.name}: ${JSON.stringify(text)}`);
        const logits = ref.forward([...prompt, ...out.tokens]);
        const counts = new Uint32Array(V);
        for (const t of prompt) counts[t] = 0x80000000;
        let state = image[14];
        for (let i = 0; i < out.tokens.length; i++) {
          const tok = out.tokens[i];
          const row = applyBiasRef(logits[prompt.length - 1 + i], s.logitBias ?? []);
          const remaining = s.maxTokens - i;
          const mask = maskRef(image, state, remaining);
          assert.equal(mask[tok], 1, `${spec.type} step ${i}: token ${tok} is not allowed`);
          const opts = {
            ...s,
            seed: s.seed ?? 0n,
            position: prompt.length + i,
            counts: Uint32Array.from(counts),
            remaining,
          };
          const masked = row.map((x, k) => mask[k] ? x : -Infinity);
          let decisive: boolean;
          if (s.temperature === 0) {
            const sorted = [...masked].sort((a, b) => b - a);
            decisive = sorted[0] - sorted[1] > 0.02;
          } else {
            decisive = !knifeEdge(
              sampleDistRef(masked, opts),
              philoxUniform(opts.seed, opts.position),
              1e-3,
            );
          }
          total++;
          if (decisive) {
            checked++;
            const want = sampleGrammarRef(row, image, state, opts);
            assert.equal(tok, want.token, `${spec.type} T=${s.temperature} step ${i}`);
            assert.ok(Math.abs(out.logprobs[i] - want.logprob) < 1e-3, `logprob at step ${i}`);
          }
          if (vocab.eosIds.includes(tok)) break;
          state = advanceRef(image, tokenImage, state, tok);
          counts[tok] = (0x80000000 | ((counts[tok] & 0x3fffffff) + 1)) >>> 0;
        }
      }
    }
    console.log(`constrained tokens checked against the reference: ${checked}/${total}`);
    assert.ok(checked >= total * 0.8, `${checked} of ${total} steps decisive`);
  });
});

Deno.test("constrained decoding on the default model: schema-valid JSON at temperature 0.8, every seed", async () => {
  await testGpu();
  const engine = await Engine.load(DEFAULT_MODEL, { maxSlots: 16, contextLength: 512 });
  const cases = [JSON_OBJECT, CASES[0], CASES[1], CASES[2], CASES[3]];
  const prompt = engine.encodeChat([{
    role: "user",
    content: "Write a JSON record about a farmer who lives in a small town.",
  }]);
  const jobs: Promise<void>[] = [];
  let valid = 0;
  for (const c of cases) {
    const constraint = await engine.compileConstraint(c.spec);
    for (let seed = 0; seed < 4; seed++) {
      jobs.push((async () => {
        const s = sampling({ maxTokens: 160, temperature: 0.8, topP: 0.95, seed: BigInt(seed) });
        const out = await run(engine, { promptIds: prompt, sampling: s, constraint });
        const text = engine.decode(out.tokens.filter((t) => !engine.tokenizer.eosIds.includes(t)));
        assert.deepEqual(c.check(text), [], `${c.name} seed ${seed}: ${JSON.stringify(text)}`);
        valid++;
      })());
    }
  }
  await Promise.all(jobs);
  console.log(`default model: ${valid}/${jobs.length} constrained outputs valid`);
});

Deno.test("logit_bias: +100 forces a token, -100 bans the greedy one, 0 changes nothing", async () => {
  await testGpu();
  const engine = await Engine.load(DEFAULT_MODEL, { maxSlots: 4, contextLength: 256 });
  const prompt = engine.encode("The farmer walks to the market and");
  const greedy = (logitBias?: [number, number][]) =>
    run(engine, { promptIds: prompt, sampling: sampling({ maxTokens: 8, logitBias }) });
  const plain = await greedy();
  const first = plain.tokens[0];
  assert.deepEqual((await greedy([[first, 0]])).tokens, plain.tokens);
  const banned = await greedy([[first, -100]]);
  assert.notEqual(banned.tokens[0], first);
  assert.ok(!banned.tokens.includes(first), "a banned token never appears");
  const forced = await greedy([[42, 100]]);
  assert.deepEqual(forced.tokens, new Array(8).fill(42));
});

Deno.test("constrained decoding: the refusals name the field", async () => {
  await testGpu();
  const engine = await Engine.load(DEFAULT_MODEL, { maxSlots: 2, contextLength: 256 });
  const prompt = engine.encode("Hello");
  const c = await engine.compileConstraint(CASES[0].spec);
  assert.ok(c.minTokens > 1);
  const refuse = (req: Partial<Parameters<Engine["generate"]>[0]>, param: string, re: RegExp) =>
    assert.throws(
      () => engine.generate({ promptIds: prompt, sampling: sampling({ maxTokens: 50 }), ...req }),
      (e: unknown) => e instanceof InvalidRequestError && e.param === param && re.test(e.message),
    );
  refuse(
    { constraint: c, sampling: sampling({ maxTokens: c.minTokens - 1 }) },
    "max_tokens",
    new RegExp(`takes ${c.minTokens} tokens`),
  );
  refuse(
    { constraint: c, sampling: sampling({ maxTokens: 50, stopAtEos: false }) },
    "ignore_eos",
    /EOS/,
  );
  refuse({ constraint: { key: "nope", minTokens: 1 } }, "response_format", /compile it again/);
  const V = engine.config.vocabSize;
  refuse({ sampling: sampling({ maxTokens: 5, logitBias: [[V, 1]] }) }, "logit_bias", /outside/);
  refuse(
    { sampling: sampling({ maxTokens: 5, logitBias: [[3, 1], [3, 2]] }) },
    "logit_bias",
    /twice/,
  );
  refuse(
    { sampling: sampling({ maxTokens: 5, logitBias: [[3, 101]] }) },
    "logit_bias",
    /-100 to 100/,
  );
  await assert.rejects(
    engine.compileConstraint({
      type: "json_schema",
      schema: { type: "array", uniqueItems: true },
    }),
    (e: unknown) =>
      e instanceof InvalidRequestError && e.param === "response_format" &&
      /uniqueItems/.test(e.message),
  );
  // the engine still serves
  const ok = await run(engine, {
    promptIds: prompt,
    sampling: sampling({ maxTokens: 60 }),
    constraint: c,
  });
  assert.ok(ok.tokens.length > 0);
});

Deno.test("worker engine: constraints compile in a tokenizer worker; the tokens are the engine's", async () => {
  await testGpu();
  const { WorkerEngine } = await import("../engine/worker/host.ts");
  const worker = await WorkerEngine.load({ dir: DEFAULT_MODEL }, {
    maxSlots: 2,
    contextLength: 256,
  });
  const engine = await Engine.load(DEFAULT_MODEL, { maxSlots: 2, contextLength: 256 });
  try {
    const prompt = engine.encode("A record:");
    const s = sampling({ maxTokens: 80, temperature: 0.8, seed: 5n, logitBias: [[42, -3]] });
    const a = await worker.compileConstraint(CASES[1].spec);
    const b = await engine.compileConstraint(CASES[1].spec);
    assert.deepEqual(a, b);
    const gen = worker.generate({ promptIds: prompt, sampling: s, constraint: a });
    const viaWorker: number[] = [];
    for await (const t of gen) viaWorker.push(t.id);
    const here = await run(engine, { promptIds: prompt, sampling: s, constraint: b });
    assert.deepEqual(viaWorker, here.tokens);
    await assert.rejects(
      worker.compileConstraint({ type: "regex", pattern: "(?=a)b" }),
      (e: unknown) => e instanceof InvalidRequestError && /lookahead|\(\?=/.test(e.message),
    );
  } finally {
    await worker.close();
  }
});
