/**
 * Philox, logits statistics, top-k and GPU sampling against the float64 references.
 * Distribution tests draw 4096 samples (identical rows, positions 0..4095) and run a chi-square
 * goodness-of-fit test against `sampleDistRef` at significance 0.001 (critical value from the
 * Wilson-Hilferty approximation); bins with expected count < 5 are pooled. Everything is seeded,
 * so each run sees the same samples.
 */
import assert from "node:assert/strict";
import { createStorage, type Gpu, readU32 } from "../gpu/device.ts";
import { type Philox4, philox4x32, philoxUniform } from "../gpu/philox.ts";
import { run } from "../gpu/dispatch.ts";
import { logitsStatsDispatch, topKDispatch } from "../kernels/logits.ts";
import {
  packSampleParams,
  philoxDispatch,
  promptCounts,
  SAMPLE_PARAMS_BYTES,
  sampleDispatch,
  type SamplerSettings,
  updateCountsDispatch,
} from "../kernels/sample.ts";
import { logitsStatsRef, sampleDistRef, sampleRef, topKRef } from "../kernels/reference.ts";
import { assertClose, rng, testGpu } from "./util.ts";

const KAT: { counter: Philox4; key: [number, number]; want: Philox4 }[] = [
  { counter: [0, 0, 0, 0], key: [0, 0], want: [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8] },
  {
    counter: [0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff],
    key: [0xffffffff, 0xffffffff],
    want: [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd],
  },
  {
    counter: [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
    key: [0xa4093822, 0x299f31d0],
    want: [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1],
  },
];

const PLAIN: SamplerSettings = {
  temperature: 1,
  topK: 0,
  topP: 1,
  minP: 0,
  repetitionPenalty: 1,
  presencePenalty: 0,
  frequencyPenalty: 0,
};

/** Seeded logits as f32 values; `levels` > 0 quantises them to that many values (many ties). */
function makeLogits(seed: number, n: number, scale = 3, levels = 0): Float32Array {
  const r = rng(seed);
  const x = r.uniform(n, scale);
  if (levels > 0) x.forEach((v, i) => x[i] = Math.round(((v / scale + 1) / 2) * (levels - 1)));
  return Float32Array.from(x);
}

interface SampleRun {
  logits: Float32Array; // [rows, V]
  settings: (SamplerSettings & { seed: bigint })[]; // per row
  positions: number[];
  counts?: Uint32Array; // [rows, V]
  vocab: number;
  digitBits?: 2 | 4;
}

/** Samples every row on the GPU; returns tokens and logprobs. */
async function sampleGpu(gpu: Gpu, o: SampleRun) {
  const rows = o.positions.length, V = o.vocab;
  const params = new Uint8Array(rows * SAMPLE_PARAMS_BYTES);
  o.settings.forEach((s, r) => params.set(new Uint8Array(packSampleParams(s)), r * 48));
  const bufs = {
    logits: createStorage(gpu, rows * V * 4, o.logits),
    params: createStorage(gpu, params.byteLength, params),
    position: createStorage(gpu, rows * 4, Uint32Array.from(o.positions)),
    counts: createStorage(gpu, rows * V * 4, o.counts ?? new Uint32Array(rows * V)),
    out: createStorage(gpu, rows * 8),
  };
  await run(gpu, [sampleDispatch(gpu, bufs, { rows, vocab: V, digitBits: o.digitBits })]);
  const raw = await readU32(gpu, bufs.out, rows * 2);
  const f = new Float32Array(raw.buffer);
  const tokens = Array.from({ length: rows }, (_, r) => raw[2 * r]);
  const logprobs = Array.from({ length: rows }, (_, r) => f[2 * r + 1]);
  Object.values(bufs).forEach((b) => b.destroy());
  return { tokens, logprobs };
}

/** Upper 0.001 quantile of chi-square with `dof` degrees of freedom (Wilson-Hilferty). */
function chiSquareCritical(dof: number): number {
  const z = 3.0902, a = 2 / (9 * dof);
  return dof * (1 - a + z * Math.sqrt(a)) ** 3;
}

/** Draws 4096 samples of one row and checks them against the reference distribution. */
async function checkDistribution(
  label: string,
  o: { logits: Float32Array; settings: SamplerSettings; counts?: Uint32Array },
) {
  const gpu = await testGpu();
  const N = 4096, V = o.logits.length;
  const rows = new Float32Array(N * V);
  for (let r = 0; r < N; r++) rows.set(o.logits, r * V);
  const counts = o.counts ? new Uint32Array(N * V) : undefined;
  for (let r = 0; counts && r < N; r++) counts.set(o.counts!, r * V);
  const positions = Array.from({ length: N }, (_, r) => r);
  const settings = positions.map(() => ({ ...o.settings, seed: 0x5eed_1234_abcdn }));
  const { tokens } = await sampleGpu(gpu, { logits: rows, settings, positions, counts, vocab: V });
  const p = sampleDistRef(o.logits, { ...o.settings, counts: o.counts });
  const hist = new Float64Array(V);
  for (const t of tokens) hist[t]++;
  const outside = [...hist.keys()].filter((i) => hist[i] > 0 && p[i] === 0);
  assert.deepEqual(outside, [], `${label}: sampled tokens the filters remove: ${outside}`);
  let chi = 0, bins = 0, restObs = 0, restExp = 0;
  for (let i = 0; i < V; i++) {
    const e = p[i] * N;
    if (e === 0) continue;
    if (e < 5) [restObs, restExp] = [restObs + hist[i], restExp + e];
    else [chi, bins] = [chi + (hist[i] - e) ** 2 / e, bins + 1];
  }
  if (restExp > 0) [chi, bins] = [chi + (restObs - restExp) ** 2 / restExp, bins + 1];
  const support = [...p].filter((x) => x > 0).length;
  const dof = bins - 1;
  const crit = dof > 0 ? chiSquareCritical(dof) : 0;
  console.log(
    `${label}: support=${support} chi2=${chi.toFixed(2)} dof=${dof} crit(0.001)=${crit.toFixed(2)}`,
  );
  assert(dof === 0 ? chi < 1e-9 : chi < crit, `${label}: chi2 ${chi} >= ${crit} (dof ${dof})`);
}

Deno.test("philox4x32-10: Random123 known-answer vectors on the host", () => {
  for (const v of KAT) assert.deepEqual(philox4x32(v.counter, v.key), v.want);
  const u = philoxUniform(0n, 0);
  assert.deepEqual(u, (0x6627e8d5 >>> 8) / 2 ** 24);
});

Deno.test("philox4x32-10: the GPU gives the same words", async () => {
  const gpu = await testGpu();
  const r = rng(7);
  const word = () => Math.floor(r.next() * 2 ** 32) >>> 0;
  const vectors = [...KAT.map((v) => [...v.counter, ...v.key])];
  for (let i = 0; i < 61; i++) vectors.push(Array.from({ length: 6 }, word));
  const input = createStorage(gpu, vectors.length * 24, Uint32Array.from(vectors.flat()));
  const out = createStorage(gpu, vectors.length * 16);
  await run(gpu, [philoxDispatch(gpu, { input, out }, { count: vectors.length })]);
  const got = await readU32(gpu, out, vectors.length * 4);
  vectors.forEach((v, n) => {
    const want = philox4x32(v.slice(0, 4) as Philox4, [v[4], v[5]]);
    assert.deepEqual([...got.slice(4 * n, 4 * n + 4)], want, `vector ${n}`);
  });
  input.destroy();
  out.destroy();
});

Deno.test("logits stats: max, lse, argmax vs reference at V = 1, 7, 1000, 32003", async () => {
  const gpu = await testGpu();
  for (const [V, levels] of [[1, 0], [7, 3], [1000, 0], [1000, 5], [32003, 0]]) {
    const rows = 3;
    const x = makeLogits(V + levels, rows * V, 8, levels);
    const logits = createStorage(gpu, x.byteLength, x);
    const stats = createStorage(gpu, rows * 16);
    await run(gpu, [logitsStatsDispatch(gpu, { logits, stats }, { rows, vocab: V })]);
    const raw = await readU32(gpu, stats, rows * 4);
    const f = new Float32Array(raw.buffer);
    const want = logitsStatsRef(x, { rows, vocab: V });
    const pick = (j: number) => Array.from({ length: rows }, (_, r) => f[4 * r + j]);
    assertClose(`stats max V=${V}`, pick(0), want.max, 0, 0);
    assertClose(`stats lse V=${V} levels=${levels}`, pick(1), want.lse, 1e-5, 1e-5);
    assert.deepEqual([...Array(rows).keys()].map((r) => raw[4 * r + 2]), [...want.argmax]);
    logits.destroy();
    stats.destroy();
  }
});

Deno.test("top-k logprobs: ids and logprobs vs reference, ties to lower ids", async () => {
  const gpu = await testGpu();
  // [V, tie levels (0: none), k]
  const cases = [[7, 0, 10], [7, 2, 3], [1000, 0, 20], [1000, 6, 5], [32003, 0, 1], [32003, 4, 20]];
  for (const [V, levels, k] of cases) {
    const rows = 2;
    const x = makeLogits(31 * V + k, rows * V, 8, levels);
    const logits = createStorage(gpu, x.byteLength, x);
    const stats = createStorage(gpu, rows * 16);
    const out = createStorage(gpu, rows * k * 8);
    const shape = { rows, vocab: V, k };
    await run(gpu, [
      logitsStatsDispatch(gpu, { logits, stats }, shape),
      topKDispatch(gpu, { logits, stats, out }, shape),
    ]);
    const raw = await readU32(gpu, out, rows * k * 2);
    const f = new Float32Array(raw.buffer);
    const want = topKRef(x, shape);
    const ids = [...Array(rows * k).keys()].map((j) => raw[2 * j]);
    assert.deepEqual(ids, [...want.ids], `top-k ids V=${V} levels=${levels} k=${k}`);
    const lp = [...Array(rows * k).keys()].map((j) => f[2 * j + 1]);
    const finite = (a: number[]) => a.map((v) => (Number.isFinite(v) ? v : -1e30));
    assertClose(`top-k logprobs V=${V} k=${k}`, finite(lp), finite([...want.logprobs]), 1e-5);
    [logits, stats, out].forEach((b) => b.destroy());
  }
});

Deno.test("greedy: temperature 0 picks the argmax (ties: lowest id) with the raw logprob", async () => {
  const gpu = await testGpu();
  for (const [V, levels] of [[1, 0], [50, 4], [1000, 0], [32003, 0]]) {
    const rows = 5;
    const logits = makeLogits(V * 3 + levels, rows * V, 6, levels);
    const settings = [...Array(rows)].map((_, r) => ({
      ...PLAIN,
      temperature: 0,
      seed: BigInt(r),
    }));
    const positions = [...Array(rows).keys()];
    const got = await sampleGpu(gpu, { logits, settings, positions, vocab: V });
    const want = logitsStatsRef(logits, { rows, vocab: V });
    assert.deepEqual(got.tokens, [...want.argmax], `greedy V=${V}`);
    const lp = got.tokens.map((t, r) => logits[r * V + t] - want.lse[r]);
    assertClose(`greedy logprob V=${V}`, got.logprobs, lp, 1e-5);
  }
});

Deno.test("sampling distribution: temperature", async () => {
  const logits = makeLogits(11, 50, 2);
  await checkDistribution("T=0.7", { logits, settings: { ...PLAIN, temperature: 0.7 } });
  await checkDistribution("T=1.5", { logits, settings: { ...PLAIN, temperature: 1.5 } });
});

Deno.test("sampling distribution: top-k (with tied logits)", async () => {
  const ties = makeLogits(12, 50, 3, 6);
  await checkDistribution("top-k 7, ties", { logits: ties, settings: { ...PLAIN, topK: 7 } });
  const logits = makeLogits(13, 50, 2);
  const settings = { ...PLAIN, topK: 20, temperature: 1.2 };
  await checkDistribution("top-k 20, T=1.2", { logits, settings });
});

Deno.test("sampling distribution: top-p (with tied logits)", async () => {
  const logits = makeLogits(14, 50, 2);
  await checkDistribution("top-p 0.8", { logits, settings: { ...PLAIN, topP: 0.8 } });
  const ties = makeLogits(15, 50, 3, 5);
  const settings = { ...PLAIN, topP: 0.5, temperature: 0.9 };
  await checkDistribution("top-p 0.5, ties", { logits: ties, settings });
});

Deno.test("sampling distribution: min-p and everything together", async () => {
  const logits = makeLogits(16, 50, 2);
  await checkDistribution("min-p 0.2", { logits, settings: { ...PLAIN, minP: 0.2 } });
  const all = { ...PLAIN, temperature: 0.8, topK: 30, topP: 0.9, minP: 0.05 };
  await checkDistribution("T=0.8 top-k 30 top-p 0.9 min-p 0.05", { logits, settings: all });
});

/** Seeded counts: some prompt-only tokens, some generated 1-4 times. */
function makeCounts(seed: number, n: number): Uint32Array {
  const r = rng(seed);
  return Uint32Array.from({ length: n }, () => {
    const u = r.next();
    return u < 0.2 ? 0x80000000 : u < 0.4 ? (0x80000000 | (1 + r.int(4))) >>> 0 : 0;
  });
}

Deno.test("sampling distribution: penalties", async () => {
  const logits = makeLogits(17, 50, 2);
  const counts = makeCounts(18, 50);
  const settings = {
    ...PLAIN,
    repetitionPenalty: 1.3,
    presencePenalty: 0.5,
    frequencyPenalty: 0.25,
  };
  await checkDistribution("penalties", { logits, settings, counts });
});

/**
 * Whether u lies within `eps` of a boundary of the CDF of `p` (ids ascending): there f32 rounding
 * on the GPU may pick the neighbour. 2e-6 is ~30 f32 ulps of a cumulative probability near 1.
 */
function knifeEdge(p: Float64Array, u: number, eps = 2e-6): boolean {
  let cum = 0;
  for (const x of p) {
    if (x === 0) continue;
    cum += x;
    if (Math.abs(cum - u) < eps) return true;
  }
  return false;
}

/**
 * Samples `rows` random rows (random settings, counts, seeds, positions) on the GPU and checks each
 * token against sampleRef, skipping knife edges. `levels` > 0 quantises the logits (many ties),
 * and `topKs` can put the top-k cut inside a tie level.
 */
async function matchTokens(
  o: { V: number; rows: number; levels?: number; topKs?: number[]; digitBits?: 2 | 4 },
) {
  const gpu = await testGpu();
  const { V, rows } = o;
  const r = rng(V + rows);
  const logits = makeLogits(V + 1, rows * V, 4, o.levels ?? 0);
  const counts = makeCounts(V + 2, rows * V);
  const topKs = o.topKs ?? [0, 1, 5, 40];
  const settings = [...Array(rows)].map(() => ({
    temperature: [0, 0.6, 1, 1.7][r.int(4)],
    topK: topKs[r.int(topKs.length)],
    topP: [1, 0.95, 0.7][r.int(3)],
    minP: [0, 0.02, 0.1][r.int(3)],
    repetitionPenalty: [1, 1.1, 1.5][r.int(3)],
    presencePenalty: [0, 0.4, -0.3][r.int(3)],
    frequencyPenalty: [0, 0.3][r.int(2)],
    seed: BigInt(r.int(2 ** 31)) * 0x1_0000_0001n,
  }));
  const positions = settings.map(() => r.int(100000));
  const digitBits = o.digitBits;
  const got = await sampleGpu(gpu, { logits, settings, positions, counts, vocab: V, digitBits });
  let checked = 0;
  for (let i = 0; i < rows; i++) {
    const row = logits.subarray(i * V, (i + 1) * V);
    const c = counts.subarray(i * V, (i + 1) * V);
    const opts = { ...settings[i], position: positions[i], counts: c };
    if (knifeEdge(sampleDistRef(row, opts), philoxUniform(opts.seed, opts.position))) continue;
    checked++;
    const want = sampleRef(row, opts);
    const what = `V=${V} row ${i} ${JSON.stringify(opts, replacer)}`;
    assert.equal(got.tokens[i], want.token, what);
    assert(Math.abs(got.logprobs[i] - want.logprob) < 1e-4, `logprob ${what}`);
  }
  console.log(
    `token match V=${V} levels=${o.levels ?? 0} digitBits=${digitBits ?? "default"}: ` +
      `${checked}/${rows} rows checked, all equal ` +
      `(${rows - checked} on a knife edge)`,
  );
  assert(checked >= rows * 0.75);
}

Deno.test("sampling: GPU token == sampleRef token per (seed, position), small V", async () => {
  await matchTokens({ V: 1, rows: 16 });
  await matchTokens({ V: 7, rows: 64, levels: 3 });
  await matchTokens({ V: 50, rows: 256 });
  await matchTokens({ V: 50, rows: 256, levels: 4, topKs: [0, 3, 10, 20] });
});

Deno.test("sampling: GPU token == sampleRef token per (seed, position), V = 32003", async () => {
  await matchTokens({ V: 32003, rows: 24 });
  // ~6400 tokens per logit value: the top-k cut falls inside a tie level
  await matchTokens({ V: 32003, rows: 24, levels: 5, topKs: [0, 100, 5000, 9000] });
  // The radix-16 cut search that real GPUs run (CPU adapters default to radix 4).
  await matchTokens({ V: 32003, rows: 24, digitBits: 4 });
  await matchTokens({ V: 32003, rows: 24, levels: 5, topKs: [0, 100, 5000, 9000], digitBits: 4 });
});

function replacer(k: string, v: unknown) {
  return k === "counts" ? undefined : typeof v === "bigint" ? v.toString() : v;
}

Deno.test("sampling: same (seed, position) gives the same token whatever the batch", async () => {
  const gpu = await testGpu();
  const V = 50, n = 64;
  const logits = makeLogits(21, V, 2);
  const settings = { ...PLAIN, temperature: 1.1, topP: 0.9, seed: 99n };
  const positions = [...Array(n).keys()].map((i) => 1000 + 7 * i);
  const tile = (k: number) => {
    const x = new Float32Array(k * V);
    for (let r = 0; r < k; r++) x.set(logits, r * V);
    return x;
  };
  const a = await sampleGpu(gpu, {
    logits: tile(n),
    settings: positions.map(() => settings),
    positions,
    vocab: V,
  });
  // Reversed, interleaved with rows of another request.
  const order = [...positions].reverse().flatMap((p) => [p, p + 1]);
  const b = await sampleGpu(gpu, {
    logits: tile(order.length),
    settings: order.map((_, j) => (j % 2 ? { ...settings, seed: 5n, topK: 3 } : settings)),
    positions: order,
    vocab: V,
  });
  const fromB = positions.map((p) => b.tokens[order.indexOf(p)]);
  assert.deepEqual(fromB, a.tokens);
  const ref = positions.map((position) => sampleRef(logits, { ...settings, position }).token);
  assert.deepEqual(a.tokens, ref);
  assert(new Set(a.tokens).size > 5, "tokens should vary with position");
});

Deno.test("update counts: increments the sampled token and marks it seen", async () => {
  const gpu = await testGpu();
  const V = 10, rows = 3;
  const init = new Uint32Array(rows * V);
  init.set(promptCounts([2, 5], V), 0);
  init[V + 4] = 0x80000002;
  const counts = createStorage(gpu, init.byteLength, init);
  const out = createStorage(gpu, rows * 8, Uint32Array.from([5, 0, 4, 0, 0xffffffff, 0]));
  await run(gpu, [updateCountsDispatch(gpu, { counts, out }, { rows, vocab: V })]);
  const got = await readU32(gpu, counts, rows * V);
  const want = init.slice();
  want[5] = 0x80000001;
  want[V + 4] = 0x80000003;
  assert.deepEqual([...got], [...want]);
  assert.deepEqual(promptCounts([2, 5], V)[2], 0x80000000);
});

Deno.test("sampling, verification pass: row j samples as plain decoding would after its drafts", async () => {
  // R rows per sequence share its parameters and counts; row j counts the sequence's drafts
  // (rows 1..j's inputs) as generated, and draws at its own position.
  const gpu = await testGpu();
  const V = 50, S = 6, R = 5, rows = S * R;
  const r = rng(4242);
  const logits = makeLogits(77, rows * V, 4);
  const counts = makeCounts(78, S * V);
  const settings = [...Array(S)].map(() => ({
    temperature: [0, 0.7, 1.2][r.int(3)],
    topK: [0, 5, 40][r.int(3)],
    topP: [1, 0.9][r.int(2)],
    minP: [0, 0.05][r.int(2)],
    repetitionPenalty: [1, 1.3][r.int(2)],
    presencePenalty: [0, 0.5][r.int(2)],
    frequencyPenalty: [0, 0.4][r.int(2)],
    seed: BigInt(r.int(2 ** 31)) * 0x1_0000_0001n,
  }));
  // Drafts that repeat tokens (so a row counts one several times), and positions L + j + 1.
  const rowTok = Uint32Array.from({ length: rows }, () => r.int(6));
  const base = [...Array(S)].map(() => r.int(5000));
  const positions = Uint32Array.from({ length: rows }, (_, i) => base[(i / R) | 0] + (i % R) + 1);
  const params = new Uint8Array(S * SAMPLE_PARAMS_BYTES);
  settings.forEach((s, i) => params.set(new Uint8Array(packSampleParams(s)), i * 48));
  const bufs = {
    logits: createStorage(gpu, rows * V * 4, logits),
    params: createStorage(gpu, params.byteLength, params),
    position: createStorage(gpu, rows * 4, positions),
    counts: createStorage(gpu, S * V * 4, counts),
    out: createStorage(gpu, rows * 8),
    rowTok: createStorage(gpu, rows * 4, rowTok),
  };
  await run(gpu, [sampleDispatch(gpu, bufs, { rows, vocab: V, rowsPerSeq: R })]);
  const raw = await readU32(gpu, bufs.out, rows * 2);
  let checked = 0;
  for (let i = 0; i < rows; i++) {
    const s = (i / R) | 0, j = i % R;
    const c = counts.slice(s * V, (s + 1) * V);
    for (let t = 1; t <= j; t++) {
      const tok = rowTok[s * R + t];
      c[tok] = (0x80000000 | ((c[tok] & 0x3fffffff) + 1)) >>> 0;
    }
    const row = logits.subarray(i * V, (i + 1) * V);
    const opts = { ...settings[s], position: positions[i], counts: c };
    if (knifeEdge(sampleDistRef(row, opts), philoxUniform(opts.seed, opts.position))) continue;
    checked++;
    assert.equal(raw[2 * i], sampleRef(row, opts).token, `seq ${s} row ${j}`);
  }
  assert(checked >= rows * 0.75, `${checked} of ${rows} rows checked`);
  // The counts are the sequences' own, untouched (spec_end books what is accepted).
  assert.deepEqual([...await readU32(gpu, bufs.counts, S * V)], [...counts]);
});
