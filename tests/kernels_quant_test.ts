/**
 * Quantized weights: the host layouts (kernels/quant.ts) against ggml's float64 dequantization,
 * e4m3 rounding, and every matmul path that reads a quantized W (small with W decoded in
 * registers and with x quantized per 16 k (`xq`), naive, tiled, q8) against the float64
 * reference of the quantized values, at awkward sizes, with the fusions the decoder uses (norm,
 * SwiGLU, bias, residual). The int8 path's reference takes x as the GPU quantized it (quant_x,
 * checked against quantActRef itself), so a near-tie rounded the other way on the GPU cannot fail
 * it; xq's x, rounded inside the kernel, is moved off near-ties instead (`unitTies`). Runs on
 * lavapipe and GL (`deno task test:gl`).
 */
import assert from "node:assert/strict";
import { createStorage, type Gpu, isCpuAdapter, readBuffer, readF32 } from "../gpu/device.ts";
import {
  type DType,
  e4m3Bits,
  e4m3Value,
  encode,
  type QuantFormat,
  type QuantType,
  roundTrip,
} from "../gpu/dtype.ts";
import { run } from "../gpu/dispatch.ts";
import { dequantizeRef } from "../engine/model/gguf_quant.ts";
import { quantize } from "../scripts/gguf_quantize.ts";
import { matmulDispatches, type MatmulPath, matmulPath } from "../kernels/matmul.ts";
import { type PackedQuant, packGguf, packRowScaled } from "../kernels/quant.ts";
import {
  decodeStats,
  quantXDispatch,
  STATS_WORDS,
  statsClearDispatch,
} from "../kernels/quant_x.ts";
import { quantizeWeightDispatch } from "../kernels/quant_weights.ts";
import {
  interleaveGateUp,
  uploadQuantWeight,
  uploadWeight,
  type WeightBuffer,
} from "../kernels/weight.ts";
import {
  matmulNormRef,
  matmulRef,
  quantActRef,
  quantWeightRef,
  rmsnormRef,
  swigluRef,
} from "../kernels/reference.ts";
import { quantUnitsRef, unitTies, X_UNIT } from "../kernels/reference_quant.ts";
import type { SmallTuning } from "../kernels/matmul_small.ts";
import type { TiledTuning } from "../kernels/matmul_tiled.ts";
import type { Q8Tuning } from "../kernels/matmul_q8.ts";
import {
  assertClose,
  denseRows,
  f32Input,
  outputRows,
  readOutputRows,
  rng,
  testGpu,
} from "./util.ts";

const GGUF: QuantType[] = ["q8_0", "q4_0", "q4_k", "q6_k"];

/** Random weights packed as `f`, and their float64 values as the GPU decodes them. */
function packed(f: QuantFormat, values: Float64Array, rows: number, cols: number): PackedQuant {
  if (f === "int8" || f === "e4m3") return packRowScaled(values, f, rows, cols);
  return packGguf(quantize(values, f, cols), f, rows, cols);
}

Deno.test("layouts: the GGUF types repacked hold exactly ggml's dequantized values", () => {
  const r = rng(1);
  for (const f of GGUF) {
    const rows = 3, cols = 512;
    const values = r.uniform(rows * cols, 2);
    // a block of zeros and a tiny one (subnormal f16 scales)
    values.fill(0, 0, 256);
    for (let i = 256; i < 512; i++) values[i] *= 1e-6;
    const bytes = quantize(values, f, cols);
    const want = dequantizeRef(bytes, f, rows * cols);
    const got = quantWeightRef(packGguf(bytes, f, rows, cols), f, rows, cols);
    assert.deepEqual(got, want, f);
  }
});

Deno.test("e4m3: every code round-trips, ties go to even, no subnormals, saturation at 448", () => {
  for (let c = 0; c < 256; c++) {
    const e = (c >> 3) & 15, m = c & 7;
    if ((e === 15 && m === 7) || (e === 0 && m !== 0)) continue; // NaN, subnormals: never made
    const v = e4m3Value(c);
    assert.equal(e4m3Bits(v) & (v === 0 ? 0x7f : 0xff), c & (v === 0 ? 0x7f : 0xff), `code ${c}`);
  }
  assert.equal(e4m3Value(0x7e), 448);
  assert.equal(e4m3Bits(1e9), 0x7e);
  assert.equal(e4m3Bits(-500), 0xfe);
  assert.equal(e4m3Bits(1.0625), 0x38); // 1 + 1/16: the tie goes to the even mantissa, 1
  assert.equal(e4m3Bits(1.1875), 0x3a); // 1 + 3/16 -> 1.25 (mantissa 2)
  assert.equal(e4m3Value(e4m3Bits(2 ** -6)), 2 ** -6); // the smallest normal
  assert.equal(e4m3Bits(2 ** -7), 0); // halfway to 2^-6: zero
  assert.equal(e4m3Value(e4m3Bits(0.7 * 2 ** -6)), 2 ** -6);
  assert.equal(e4m3Bits(0.3 * 2 ** -6), 0);
  // int8/e4m3 row scaling: a zero row stays zero; the largest value maps to the largest code
  // (the scale is absmax · fround(1/448) in f32, so values come back within its rounding)
  const p = packRowScaled(Float64Array.of(0, 0, 0, 0, 1, -2, 0.5, 0.25), "e4m3", 2, 4);
  const back = quantWeightRef(p, "e4m3", 2, 4);
  [0, 0, 0, 0, 1, -2, 0.5, 0.25].forEach((v, i) => assert.ok(Math.abs(back[i] - v) <= 1e-7 * 2));
  assert.equal(new Uint8Array(p.codes.buffer)[5], 0xfe); // -absmax: the largest code
});

Deno.test("quantize on the GPU: int8 and e4m3 from every float dtype, as packRowScaled does", async () => {
  const gpu = await testGpu();
  const r = rng(5);
  for (const dtype of ["f32", "f16", "bf16"] as DType[]) {
    for (const f of ["int8", "e4m3"] as const) {
      const rows = 7, cols = 300;
      const values = r.uniform(rows * cols, 3);
      values.fill(0, 0, cols); // a zero row: scale 0, codes 0
      for (let i = cols; i < 2 * cols; i++) values[i] *= 1e-4;
      const w = uploadWeight(gpu, values, { rows, cols, dtype });
      const { weight, dispatch } = quantizeWeightDispatch(gpu, w, f);
      await run(gpu, [dispatch]);
      const codes = new Uint8Array(await readBuffer(gpu, weight.buffer, rows * cols));
      const scales = new Uint32Array(await readBuffer(gpu, weight.scales!, rows * 4));
      const want = packRowScaled(roundTrip(values, dtype), f, rows, cols);
      assert.deepEqual(scales, want.scales, `${dtype} -> ${f} scales`);
      // Codes: equal, or one step apart where the GPU's 1 / s rounds otherwise (a near-tie).
      const wantCodes = new Uint8Array(want.codes.buffer);
      const value = (c: number) => (f === "int8" ? (c << 24) >> 24 : e4m3Value(c));
      let off = 0;
      for (let i = 0; i < rows * cols; i++) {
        if (codes[i] === wantCodes[i]) continue;
        off++;
        const step = Math.abs(value(codes[i]) - value(wantCodes[i]));
        assert.ok(step <= (f === "int8" ? 1 : Math.abs(value(wantCodes[i])) / 8), `${f} code ${i}`);
      }
      assert.ok(off <= (rows * cols) / 100, `${dtype} -> ${f}: ${off} codes differ`);
      console.log(`quantize ${dtype} -> ${f}: ${off} of ${rows * cols} codes one step apart`);
    }
  }
});

interface QuantCase {
  m: number;
  n: number;
  k: number;
  f: QuantFormat;
  path: MatmulPath;
  norm?: boolean;
  swiglu?: boolean;
  bias?: boolean;
  accumulate?: boolean;
  /** Force the path (the default would pick another). */
  force?: boolean;
  small?: Partial<SmallTuning>;
  tiled?: Partial<TiledTuning>;
  q8?: Partial<Q8Tuning>;
}

/**
 * x (as f32) with the elements whose `xq` code would be a near-tie moved by 1 % of their unit's
 * scale, so the GPU's f32 rounding and the float64 reference agree. The kernel rounds x ⊙ nw
 * with the norm (1 / rms scales a whole unit and leaves the codes).
 */
function offTies(x: Float64Array, m: number, k: number, nw?: Float64Array): Float64Array {
  const v = Float64Array.from(Float32Array.from(x));
  for (let pass = 0; pass < 4; pass++) {
    const seen = nw ? v.map((e, i) => Math.fround(e * nw[i % k])) : v;
    const ties = unitTies(seen, m, k);
    if (ties.length === 0) return v;
    const q = quantUnitsRef(seen, m, k);
    for (const i of ties) {
      const c = Math.abs(seen[i]) / q.scales[Math.floor(i / X_UNIT)];
      v[i] = Math.fround(v[i] * (1 + 0.01 / c));
    }
  }
  throw new Error("offTies: x still has near-ties");
}

/** The weight on the GPU (gate/up interleaved with swiglu) and its float64 values. */
function weight(gpu: Gpu, c: QuantCase, seed: number): { w: WeightBuffer; ref: Float64Array } {
  const r = rng(seed);
  const rows = c.swiglu ? 2 * c.n : c.n, k = c.k;
  const values = r.uniform(rows * k, 0.5);
  // one row of zeros, one of tiny values: scales of 0 and near f16's subnormals
  values.fill(0, 0, k);
  if (rows > 2) { for (let i = k; i < 2 * k; i++) values[i] *= 1e-5; }
  // Gate rows then up rows (as swigluRef reads them); the GPU gets them interleaved.
  const ref = quantWeightRef(packed(c.f, values, rows, k), c.f, rows, k);
  let order = values;
  if (c.swiglu) {
    order = new Float64Array(rows * k);
    for (let i = 0; i < c.n; i++) {
      order.set(values.subarray(i * k, (i + 1) * k), 2 * i * k);
      order.set(values.subarray((c.n + i) * k, (c.n + i + 1) * k), (2 * i + 1) * k);
    }
  }
  const p = packed(c.f, order, rows, k);
  return { w: uploadQuantWeight(gpu, p, { rows, cols: k, dtype: c.f }), ref };
}

/** x as the int8 path multiplies it: quant_x's codes and scales read back, as float64. */
async function quantizedX(
  gpu: Gpu,
  x: GPUBuffer,
  xv: Float64Array,
  c: QuantCase,
  nw?: { buffer: GPUBuffer; values: Float64Array },
): Promise<Float64Array> {
  const { m, k } = c, eps = 1e-5;
  const xq = createStorage(gpu, m * k), xscale = createStorage(gpu, m * 4);
  await run(gpu, [quantXDispatch(gpu, { x, normWeight: nw?.buffer, xq, xscale }, { m, k, eps })]);
  const codes = new Int8Array(await readBuffer(gpu, xq, m * k));
  const scales = await readF32(gpu, xscale, m);
  const normed = nw ? rmsnormRef(xv, nw.values, { cols: k, eps }) : xv;
  const want = quantActRef(normed, m, k);
  const out = new Float64Array(m * k);
  for (let i = 0; i < m; i++) {
    assert.ok(Math.abs(scales[i] - want.scales[i]) <= 1e-5 * want.scales[i], `x scale ${i}`);
    for (let j = 0; j < k; j++) {
      const d = Math.abs(codes[i * k + j] - want.codes[i * k + j]);
      assert.ok(d <= 1, `x code [${i}, ${j}]: ${codes[i * k + j]} vs ${want.codes[i * k + j]}`);
      out[i * k + j] = scales[i] * codes[i * k + j];
    }
  }
  return out;
}

async function checkQuant(c: QuantCase, seed: number): Promise<void> {
  const gpu = await testGpu();
  const r = rng(seed);
  const { m, n, k } = c, eps = 1e-5;
  const xRaw = r.uniform(m * k, 2);
  const nw = f32Input(gpu, Float64Array.from(r.uniform(k), (v) => 1 + v / 2));
  const x = f32Input(
    gpu,
    k % X_UNIT === 0 ? offTies(xRaw, m, k, c.norm ? nw.values : undefined) : xRaw,
  );
  const { w, ref } = weight(gpu, c, seed + 1);
  const biasRows = c.swiglu ? 2 * n : n;
  const biasValues = Float64Array.from(Float32Array.from(r.uniform(biasRows)));
  let bias: GPUBuffer | undefined;
  if (c.bias) {
    const b = c.swiglu
      ? interleaveGateUp(
        encode(biasValues.subarray(0, n), "f32"),
        encode(biasValues.subarray(n), "f32"),
        { rows: n, cols: 1, dtype: "f32" },
      )
      : encode(biasValues, "f32");
    bias = createStorage(gpu, b.byteLength, b);
  }
  const y0 = outputRows(gpu, r, m, n, !!c.accumulate);
  const ds = matmulDispatches(gpu, {
    x: x.buffer,
    w,
    y: y0.buffer,
    bias,
    normWeight: c.norm ? nw.buffer : undefined,
  }, {
    m,
    accumulate: c.accumulate,
    yStride: y0.at.stride,
    yOffset: y0.at.offset,
    eps,
    swiglu: c.swiglu,
    path: c.force ? c.path : undefined,
    small: c.small,
    tiled: c.tiled,
    q8: c.q8,
  });
  if (!c.force) assert.equal(matmulPath(m, w), c.path, `${ds[0].label}: the wrong kernel`);
  if (c.path === "tiled" && (c.f === "int8" || c.f === "e4m3")) {
    // 8 codes a slot, the row scales on the sums, where K allows
    assert.equal(ds[0].label.includes(" qrow"), k % 8 === 0, ds[0].label);
  }
  assert.ok(ds.some((d) => d.label.includes(` ${c.path} `)), ds.map((d) => d.label).join(", "));
  await run(gpu, ds);
  const got = await readOutputRows(gpu, y0);
  const y = c.accumulate ? denseRows(y0.values, y0.at) : undefined;
  const b = c.bias ? biasValues : undefined;
  let xv: ArrayLike<number> = x.values, normWeight = c.norm ? nw.values : undefined;
  if (c.path === "q8") {
    xv = await quantizedX(gpu, x.buffer, x.values, c, c.norm ? nw : undefined);
    normWeight = undefined; // folded into the quantization
  }
  if (ds.some((d) => d.label.endsWith(" xq"))) {
    // x rounded per unit of 16 k as the kernel rounds it, after the norm
    const normed = c.norm ? rmsnormRef(x.values, nw.values, { cols: k, eps }) : x.values;
    xv = quantUnitsRef(normed, m, k).values;
    normWeight = undefined;
  }
  const want = c.swiglu
    ? swigluRef(xv, ref, { m, f: n, k, bias: b, normWeight, eps, y })
    : normWeight
    ? matmulNormRef(xv, ref, { m, n, k, bias: b, y, normWeight, eps })
    : matmulRef(xv, ref, { m, n, k, bias: b, y });
  assertClose(`${ds.map((d) => d.label).join(" + ")}`, got, want);
}

const ALL: QuantFormat[] = ["int8", "e4m3", ...GGUF];

const CASES: QuantCase[] = [
  // small, every format: one row, odd N; several rows with the decoder's fusions
  ...ALL.map((f): QuantCase => ({ m: 1, n: 37, k: 512, f, path: "small" })),
  ...ALL.map((f): QuantCase => ({ m: 3, n: 33, k: 256, f, path: "small", norm: true, bias: true })),
  ...ALL.map((f): QuantCase => ({
    m: 9,
    n: 21,
    k: 256,
    f,
    path: "small",
    norm: true,
    swiglu: true,
    accumulate: true,
  })),
  { m: 16, n: 45, k: 288, f: "int8", path: "small", accumulate: true },
  // small, int8 decoded in registers (adapters without dot4I8Packed)
  { m: 1, n: 37, k: 512, f: "int8", path: "small", small: { xq: false } },
  {
    m: 9,
    n: 21,
    k: 256,
    f: "int8",
    path: "small",
    norm: true,
    swiglu: true,
    accumulate: true,
    small: { xq: false },
  },
  // small's xq for the GGUF types of signed 8-bit codes (group scales per unit)
  { m: 3, n: 33, k: 256, f: "q8_0", path: "small", norm: true, bias: true, small: { xq: true } },
  {
    m: 9,
    n: 21,
    k: 256,
    f: "q6_k",
    path: "small",
    norm: true,
    swiglu: true,
    accumulate: true,
    small: { xq: true },
  },
  // xq's chunks of x: of 8 units with 8 K lanes of 2-unit trips (part of a trip), of 32 (two
  // trips; 66 units: the last chunk short); 4 row groups of 4 rows
  {
    m: 5,
    n: 40,
    k: 1056,
    f: "int8",
    path: "small",
    norm: true,
    bias: true,
    small: { tk: 8, unroll: 2, xu: 8 },
  },
  { m: 7, n: 38, k: 1056, f: "int8", path: "small", swiglu: true, small: { tk: 8, xu: 32 } },
  {
    m: 13,
    n: 29,
    k: 320,
    f: "int8",
    path: "small",
    norm: true,
    accumulate: true,
    small: { rm: 4, tm: 4, tk: 8, tn: 2 },
  },
  { m: 5, n: 70, k: 1056, f: "q4_0", path: "small", norm: true },
  // naive: K not a multiple of small's 16-value units
  { m: 2, n: 13, k: 20, f: "int8", path: "naive", norm: true, bias: true },
  { m: 1, n: 9, k: 36, f: "e4m3", path: "naive", swiglu: true, accumulate: true },
  // tiled, every format (17+ rows; int8 only when forced): partial tiles, K not a multiple of bk
  ...ALL.filter((f) => f !== "int8").map((f): QuantCase => ({
    m: 19,
    n: 37,
    k: 256,
    f,
    path: "tiled",
    norm: true,
    bias: true,
  })),
  { m: 70, n: 33, k: 96, f: "int8", path: "tiled", force: true, swiglu: true, norm: true },
  // int8 and e4m3 staged 8 codes a slot, row scales on the sums: K not a multiple of the step
  // (200), and K % 8 != 0 (100: a word a slot with its scale instead)
  { m: 20, n: 19, k: 200, f: "e4m3", path: "tiled", bias: true, accumulate: true },
  { m: 18, n: 21, k: 100, f: "e4m3", path: "tiled", norm: true },
  {
    m: 33,
    n: 70,
    k: 512,
    f: "e4m3",
    path: "tiled",
    swiglu: true,
    accumulate: true,
    norm: true,
    tiled: { bm: 32, bn: 64, tm: 4, tn: 8, bk: 32, bufs: 2, splits: 3 },
  },
  {
    m: 33,
    n: 70,
    k: 512,
    f: "q4_k",
    path: "tiled",
    swiglu: true,
    accumulate: true,
    tiled: {
      bm: 32,
      bn: 64,
      tm: 4,
      tn: 4,
      bk: 16,
      bufs: 2,
      splits: 3,
    },
  },
  // q8: int8 x int8 from 17 rows, K a multiple of 16 (48: a partial last step of 32)
  { m: 17, n: 37, k: 64, f: "int8", path: "q8" },
  { m: 33, n: 70, k: 48, f: "int8", path: "q8", norm: true, bias: true, accumulate: true },
  { m: 65, n: 21, k: 272, f: "int8", path: "q8", norm: true, swiglu: true, bias: true },
  { m: 2, n: 40, k: 160, f: "int8", path: "q8", force: true, norm: true },
  // the GPU's q8 shapes: K split 3 ways (the last split shorter), 8 x 8 blocks, 32 x 128 tiles
  {
    m: 40,
    n: 45,
    k: 400,
    f: "int8",
    path: "q8",
    norm: true,
    swiglu: true,
    bias: true,
    q8: { bm: 32, bn: 128, tm: 4, tn: 8, bkw: 8, splits: 3 },
  },
  {
    m: 130,
    n: 131,
    k: 80,
    f: "int8",
    path: "q8",
    accumulate: true,
    q8: { bm: 64, bn: 128, tm: 8, tn: 8, bkw: 8, splits: 1 },
  },
  {
    m: 20,
    n: 70,
    k: 96,
    f: "int8",
    path: "q8",
    q8: { bm: 16, bn: 64, tm: 4, tn: 4, bkw: 4, splits: 2 },
  },
];

Deno.test("matmul, quantized W: small, naive, tiled and q8 against the quantized float64 reference", async () => {
  const gpu = await testGpu();
  let seed = 1000;
  for (const c of CASES) {
    // GL: forced GPU tiles compile for minutes (naga zero-fills workgroup arrays), and every
    // pipeline for seconds (cold: the CI's): lavapipe runs the forced launch shapes
    if ((c.tiled || c.q8 || c.small) && !gpu.hasF16 && isCpuAdapter(gpu)) continue;
    await checkQuant(c, seed++);
  }
});

Deno.test("quant_x statistics: extremes, row std, int8 error and the sampled product's error", async () => {
  const gpu = await testGpu();
  const r = rng(77);
  const eps = 1e-5, slots = 3;
  const stats = createStorage(gpu, slots * STATS_WORDS * 4);
  for (
    const c of [
      { m: 5, k: 64, norm: true, f: "int8" as const, writeQ: false },
      { m: 19, k: 96, norm: false, f: "q4_0" as const, writeQ: false },
      { m: 20, k: 48, norm: true, f: "int8" as const, writeQ: true },
      // the sample of small's xq: x rounded per 16 k
      { m: 6, k: 64, norm: true, f: "int8" as const, writeQ: false, unit: true },
    ]
  ) {
    const { m, k } = c;
    const xv = r.uniform(m * k, 3);
    xv[7] = 40; // an outlier: the int8 error of its row grows
    const x = f32Input(gpu, xv);
    const nw = f32Input(gpu, Float64Array.from(r.uniform(k), (v) => 1 + v / 2));
    const n = 40, w16 = r.uniform(n * k, 0.5);
    const p = packed(c.f, w16, n, k);
    const w = uploadQuantWeight(gpu, p, { rows: n, cols: k, dtype: c.f });
    const wq = quantWeightRef(p, c.f, n, k);
    const rows = [0, 13, 39];
    const s16 = f32Input(gpu, rows.flatMap((row) => [...w16.subarray(row * k, (row + 1) * k)]));
    const slot = c.f === "q4_0" ? 1 : c.writeQ ? 2 : 0;
    const every = 4;
    const xq = createStorage(gpu, m * k), xscale = createStorage(gpu, m * 4);
    await run(gpu, [
      statsClearDispatch(gpu, stats, slots),
      quantXDispatch(gpu, {
        x: x.buffer,
        normWeight: c.norm ? nw.buffer : undefined,
        xq: c.writeQ ? xq : undefined,
        xscale: c.writeQ ? xscale : undefined,
        stats: { buffer: stats, slot },
        sample: { w, s16: s16.buffer, rows },
      }, { m, k, eps, every, unitCodes: c.unit }),
    ]);
    const got = decodeStats(new Uint32Array(await readBuffer(gpu, stats)), slot);
    // The host's account of the same rows.
    const xn = c.norm ? rmsnormRef(x.values, nw.values, { cols: k, eps }) : x.values;
    const q = quantActRef(xn, m, k);
    const xu = quantUnitsRef(xn, m, k).values;
    let min = Infinity, max = -Infinity, minStd = Infinity, maxStd = 0, actErr = 0, sErr = 0;
    for (let i = 0; i < m; i++) {
      const row = xn.subarray(i * k, (i + 1) * k);
      const mean = row.reduce((a, b) => a + b, 0) / k;
      const sd = Math.sqrt(row.reduce((a, b) => a + b * b, 0) / k - mean * mean);
      min = Math.min(min, ...row);
      max = Math.max(max, ...row);
      minStd = Math.min(minStd, sd);
      maxStd = Math.max(maxStd, sd);
      let e2 = 0, s2 = 0;
      for (let j = 0; j < k; j++) {
        e2 += (row[j] - q.values[i * k + j]) ** 2;
        s2 += row[j] ** 2;
      }
      actErr = Math.max(actErr, Math.sqrt(e2 / s2));
      if (i % every !== 0) continue;
      let de = 0, d16 = 0;
      for (const wr of rows) {
        let y16 = 0, yq = 0;
        for (let j = 0; j < k; j++) {
          y16 += row[j] * w16[wr * k + j];
          const xin = c.writeQ ? q.values[i * k + j] : c.unit ? xu[i * k + j] : row[j];
          yq += xin * wq[wr * k + j];
        }
        de += (yq - y16) ** 2;
        d16 += y16 ** 2;
      }
      sErr = Math.max(sErr, Math.sqrt(de / d16));
    }
    const close = (a: number, b: number, what: string, tol = 1e-4) =>
      assert.ok(Math.abs(a - b) <= tol * Math.max(1, Math.abs(b)), `${what}: ${a} vs ${b}`);
    close(got.min, min, "min");
    close(got.max, max, "max");
    close(got.minStd, minStd, "min std");
    close(got.maxStd, maxStd, "max std");
    close(got.actErr, actErr, "int8 error", 1e-3);
    close(got.sampleErr, sErr, "sample error", 1e-3);
    assert.ok(got.sampleErr > 0 && got.actErr > 0.005, `${JSON.stringify(got)}`);
    assert.equal(got.rows, m);
    assert.equal(got.nonfinite, 0);
    console.log(`quant_x stats ${m}x${k} ${c.f}: ${JSON.stringify(got)}`);
  }
  // A row with an infinity counts as not finite.
  const bad = f32Input(
    gpu,
    Float64Array.from({ length: 2 * 16 }, (_, i) => (i === 20 ? Infinity : 1)),
  );
  await run(gpu, [
    statsClearDispatch(gpu, stats, slots),
    quantXDispatch(gpu, { x: bad.buffer, stats: { buffer: stats, slot: 0 } }, { m: 2, k: 16 }),
  ]);
  const s = decodeStats(new Uint32Array(await readBuffer(gpu, stats)), 0);
  assert.equal(s.rows, 2);
  assert.equal(s.nonfinite, 1);
});

Deno.test("matmul, quantized W: refuses what a path cannot serve, saying what it needs", async () => {
  const gpu = await testGpu();
  const r = rng(9);
  const int8 = uploadQuantWeight(gpu, packRowScaled(r.uniform(33 * 64), "int8", 33, 64), {
    rows: 33,
    cols: 64,
    dtype: "int8",
  });
  const e4m3 = { ...int8, dtype: "e4m3" as const };
  const x = createStorage(gpu, 40 * 64 * 4), y = createStorage(gpu, 40 * 33 * 4);
  const mm = (w: WeightBuffer, m: number, path?: MatmulPath) => () =>
    matmulDispatches(gpu, { x, w, y }, { m, path });
  assert.throws(mm(int8, 40, "rows"), /the rows kernel needs 16-bit W and K % 8 == 0/);
  assert.throws(mm(e4m3, 40, "q8"), /the q8 kernel needs int8 W and K % 16 == 0/);
  assert.throws(
    () => matmulDispatches(gpu, { x, w: e4m3, y }, { m: 1, small: { xq: true } }),
    /small xq needs W of 8-bit integer codes \(int8, q8_0, q6_k\); W is e4m3/,
  );
  assert.throws(mm({ ...int8, scales: undefined }, 1), /the scales hold 0 bytes; need 132/);
  assert.throws(
    mm({ ...int8, dtype: "q4_k", cols: 64 }, 1),
    /q4_k rows must be a multiple of 256 values/,
  );
  assert.throws(
    () => packRowScaled(r.uniform(12), "int8", 2, 6),
    /W \[2, 6\] cannot be held as int8: its rows must be a multiple of 4 values/,
  );
  const parts = { ...int8, parts: [{ w: int8 }] };
  assert.throws(
    () => matmulDispatches(gpu, { x, w: parts, y }, { m: 1, swiglu: true }),
    /swiglu W cannot be made of parts/,
  );
  assert.throws(
    () => quantizeWeightDispatch(gpu, int8, "e4m3"),
    /quantize 33x64: W is already int8/,
  );
});
