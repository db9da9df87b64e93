/** The float64 reference forward pass: known answers, invariants, RoPE scaling, speed. */
import assert from "node:assert/strict";
import { ropeInvFreq } from "../engine/model/config.ts";
import { roundTrip } from "../gpu/dtype.ts";
import { loadModelFolder } from "../engine/model/folder.ts";
import {
  attention,
  greedyGenerate,
  logSoftmax,
  ReferenceModel,
  rmsnorm,
  rope,
} from "../engine/model/reference_forward.ts";
import { makeTestModel } from "../scripts/make_test_model.ts";
import { assertClose, rng } from "./util.ts";

const root = await Deno.makeTempDir({ prefix: "strata_reference_" });
globalThis.addEventListener("unload", () => Deno.removeSync(root, { recursive: true }));

async function model(name: string, options: Parameters<typeof makeTestModel>[1]) {
  await makeTestModel(`${root}/${name}`, options);
  return ReferenceModel.load(await loadModelFolder(`${root}/${name}`));
}

const qwen = await model("qwen2", { arch: "qwen2", dtype: "bf16", hidden: 64, ffn: 128 });

Deno.test("llama3 rope scaling matches hand-computed values", () => {
  const cfg = {
    headDim: 8,
    ropeTheta: 10000,
    ropeScaling: {
      type: "llama3" as const,
      factor: 8,
      lowFreqFactor: 1,
      highFreqFactor: 4,
      originalMaxPositions: 64,
    },
  };
  // inv = [1, 0.1, 0.01, 0.001]; wavelengths 2π·[1, 10, 100, 1000] against 64/4 = 16 and 64/1:
  // high (unchanged), medium (smooth = (64/(20π) − 1)/3), low (÷8), low (÷8).
  const want = [1, 0.013042256043820465, 0.00125, 0.000125];
  assertClose("llama3 inv_freq", ropeInvFreq(cfg), want, 0, 1e-14);
  assertClose(
    "plain inv_freq",
    ropeInvFreq({ ...cfg, ropeScaling: undefined }),
    [
      1,
      0.1,
      0.01,
      0.001,
    ],
    0,
    1e-14,
  );
});

Deno.test("rmsnorm and logSoftmax: hand-computed values", () => {
  const y = rmsnorm(Float64Array.of(1, -2, 2), Float64Array.of(1, 0.5, 2), 0);
  assertClose("rmsnorm", y, [1 / Math.sqrt(3), -1 / Math.sqrt(3), 4 / Math.sqrt(3)], 1e-15, 0);
  const l = logSoftmax([0, Math.log(3)]);
  assertClose("logSoftmax", l, [Math.log(0.25), Math.log(0.75)], 1e-15, 0);
});

Deno.test("rope: q·k depends only on the position difference", () => {
  const r = rng(3);
  const inv = ropeInvFreq({ headDim: 16, ropeTheta: 10000 });
  const q0 = r.uniform(16), k0 = r.uniform(16);
  const dot = (m: number, n: number) => {
    const q = q0.slice(), k = k0.slice();
    rope(q, { nHeads: 1, headDim: 16, pos: m, invFreq: inv });
    rope(k, { nHeads: 1, headDim: 16, pos: n, invFreq: inv });
    return q.reduce((s, x, i) => s + x * k[i], 0);
  };
  assertClose("relative", [dot(7, 3), dot(104, 100)], [dot(4, 0), dot(4, 0)], 1e-12, 0);
  assert.ok(Math.abs(dot(4, 0) - dot(5, 0)) > 1e-3);
});

Deno.test("attention: GQA maps query head h to kv head h / group", () => {
  const r = rng(5);
  const T = 5, D = 4;
  const q = Array.from({ length: T }, () => r.uniform(4 * D));
  const k = Array.from({ length: T }, () => r.uniform(2 * D));
  const v = Array.from({ length: T }, () => r.uniform(2 * D));
  // the same thing as multi-head attention with kv heads repeated [0, 0, 1, 1]
  const rep = (x: Float64Array) =>
    Float64Array.from([0, 0, 1, 1].flatMap((h) => [...x.subarray(h * D, (h + 1) * D)]));
  const gqa = attention(q, k, v, { nHeads: 4, nKvHeads: 2, headDim: D });
  const mha = attention(q, k.map(rep), v.map(rep), { nHeads: 4, nKvHeads: 4, headDim: D });
  for (let t = 0; t < T; t++) assertClose(`gqa t=${t}`, gqa[t], mha[t], 1e-15, 0);
  // position 0 attends only to itself: output = its own v
  assertClose("t=0", gqa[0], rep(v[0]), 1e-15, 0);
  // a window of 1 is the same as attending to oneself only
  const w1 = attention(q, k, v, {
    nHeads: 4,
    nKvHeads: 2,
    headDim: D,
    mask: { kind: "window", window: 1 },
  });
  for (let t = 0; t < T; t++) assertClose(`window t=${t}`, w1[t], rep(v[t]), 1e-15, 0);
  const wide = attention(q, k, v, {
    nHeads: 4,
    nKvHeads: 2,
    headDim: D,
    mask: { kind: "window", window: T },
  });
  assertClose("window T", wide.flatMap((x) => [...x]), gqa.flatMap((x) => [...x]), 0, 0);
});

Deno.test("zero layers: logits = lm_head · rmsnorm(embedding) (known answer)", () => {
  const cfg = qwen.config;
  // o_proj and down_proj zero: both residual branches add nothing
  const zeroLayers = qwen.weights.layers.map((l) => ({
    ...l,
    o: new Float64Array(l.o.length),
    down: new Float64Array(l.down.length),
  }));
  const m = new ReferenceModel(cfg, { ...qwen.weights, layers: zeroLayers });
  const tokens = [5, 300, 17];
  const logits = m.forward(tokens);
  const H = cfg.hiddenSize;
  for (const [t, id] of tokens.entries()) {
    const h = rmsnorm(
      qwen.weights.embed.slice(id * H, (id + 1) * H),
      qwen.weights.norm,
      cfg.rmsEps,
    );
    const want = new Float64Array(cfg.vocabSize);
    for (let v = 0; v < cfg.vocabSize; v++) {
      for (let i = 0; i < H; i++) want[v] += h[i] * qwen.weights.lmHead[v * H + i];
    }
    assertClose(`pos ${t}`, logits[t], want, 1e-12, 0);
  }
});

Deno.test("forward: finite, causal, weights are the stored dtype's values", () => {
  const r = rng(11);
  const tokens = Array.from({ length: 12 }, () => r.int(qwen.config.vocabSize));
  const logits = qwen.forward(tokens);
  assert.equal(logits.length, 12);
  for (const row of logits) {
    assert.equal(row.length, qwen.config.vocabSize);
    assert.ok(row.every(Number.isFinite));
  }
  // causal: position i is unaffected by tokens after it
  const changed = [...tokens.slice(0, 6), ...tokens.slice(6).map((t) => (t + 1) % 400)];
  const other = qwen.forward(changed);
  for (let i = 0; i < 6; i++) assert.deepEqual(other[i], logits[i]);
  assert.notDeepEqual(other[6], logits[6]);
  for (let i = 1; i <= 12; i += 5) {
    assert.deepEqual(qwen.forward(tokens.slice(0, i)).at(-1), logits[i - 1]);
  }
  assert.deepEqual(qwen.forward(tokens, { lastOnly: true }), [logits[11]]);
  // q/k/v biases are used
  assert.ok(qwen.weights.layers[0].qBias!.some((x) => x !== 0));
  const noBias = new ReferenceModel(qwen.config, {
    ...qwen.weights,
    layers: qwen.weights.layers.map((l) => ({ ...l, qBias: new Float64Array(l.qBias!.length) })),
  });
  assert.notDeepEqual(noBias.forward(tokens)[3], logits[3]);
  const w = qwen.weights.layers[1].gate;
  assert.deepEqual(roundTrip(w, "bf16"), w);
  assert.throws(() => qwen.forward([qwen.config.vocabSize]), /outside the vocabulary/);
});

Deno.test("tied embeddings: the LM head is the embedding", async () => {
  const tied = await model("tied", { tie: true, dtype: "f16" });
  assert.equal(tied.weights.lmHead, tied.weights.embed);
  assert.ok(tied.forward([1, 2, 3]).every((row) => row.every(Number.isFinite)));
});

Deno.test("greedyGenerate: argmax chain, logprobs, speed of 40 + 24 tokens", async () => {
  const m = await model("speed", {
    arch: "llama",
    hidden: 128,
    heads: 4,
    kvHeads: 1,
    ffn: 256,
    ropeScaling: "llama3",
  });
  const r = rng(2);
  const prompt = Array.from({ length: 40 }, () => r.int(m.config.vocabSize));
  const t0 = performance.now();
  const out = greedyGenerate(m, prompt, { maxTokens: 24 });
  const ms = performance.now() - t0;
  console.log(`reference: 40-token prompt + 24 greedy tokens in ${ms.toFixed(0)} ms`);
  assert.ok(ms < 5000, `too slow: ${ms} ms (about 0.7 s on an idle 2-core machine)`);
  assert.equal(out.tokens.length, 24);
  const logits = m.forward([...prompt, ...out.tokens]);
  const want: number[] = [];
  for (let i = 0; i < 24; i++) {
    const lp = logSoftmax(logits[prompt.length - 1 + i]);
    assert.equal(out.tokens[i], lp.indexOf(Math.max(...lp)));
    want.push(lp[out.tokens[i]]);
    assert.ok(out.logprobs[i] <= 0 && out.margins[i] >= 0);
  }
  assertClose("greedy logprobs", out.logprobs, want, 1e-12, 0);
  const short = greedyGenerate(m, prompt, 3);
  assert.deepEqual(short.tokens, out.tokens.slice(0, 3));
  const stopped = greedyGenerate(m, prompt, { maxTokens: 24, stopIds: [out.tokens[1]] });
  assert.deepEqual(stopped.tokens, out.tokens.slice(0, out.tokens.indexOf(out.tokens[1]) + 1));
});
