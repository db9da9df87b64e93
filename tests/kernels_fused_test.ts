/**
 * The matmul fusions (RMSNorm folded into the projection; SwiGLU over interleaved gate/up rows)
 * against their float64 references on seeded random inputs, for every kernel (small, naive,
 * tiled) and dtype, at awkward sizes: M = 1 .. 70 across the small kernel's launch shapes; K odd
 * and K % 8 == 0; F odd and not divisible by the gate/up block. Each case names the kernel it means to exercise and asserts the wrapper
 * picked it. Shapes repeat so cases share pipelines (each costs a shader compile on llvmpipe).
 */
import assert from "node:assert/strict";
import { createStorage } from "../gpu/device.ts";
import { type DType, encode } from "../gpu/dtype.ts";
import { run } from "../gpu/dispatch.ts";
import { matmulDispatches, type MatmulPath, matmulPath } from "../kernels/matmul.ts";
import type { RowsTuning } from "../kernels/matmul_rows.ts";
import type { SmallTuning } from "../kernels/matmul_small.ts";
import {
  interleaveGateUp,
  SWIGLU_BLOCK,
  uploadWeight,
  type WeightBuffer,
} from "../kernels/weight.ts";
import { matmulNormRef, matmulRef, swigluRef, weightRef } from "../kernels/reference.ts";
import {
  assertClose,
  denseRows,
  f32Input,
  outputRows,
  readOutputRows,
  rng,
  testGpu,
} from "./util.ts";

type TestGpu = Awaited<ReturnType<typeof testGpu>>;

const DTYPES: DType[] = ["f32", "f16", "bf16"];
const EPS = 1e-5;

function concat(a: ArrayLike<number>, b: ArrayLike<number>): Float64Array {
  const out = new Float64Array(a.length + b.length);
  out.set(Array.from(a));
  out.set(Array.from(b), a.length);
  return out;
}

interface FusedCase {
  m: number;
  /** Columns of y: N, or F with swiglu. */
  n: number;
  k: number;
  dtype: DType;
  path: MatmulPath;
  norm?: boolean;
  swiglu?: boolean;
  /** Gate/up block of the interleave (default SWIGLU_BLOCK). */
  block?: number;
  bias?: boolean;
  /** Accumulate into y, written with a row stride and offset (a strided view). */
  accumulate?: boolean;
  /** A `small` launch shape other than the default. */
  small?: Partial<SmallTuning>;
  /** A `rows` launch shape other than the default. */
  rows?: Partial<RowsTuning>;
  /** False: the kernels' `// @unroll` loops compiled as loops. */
  unroll?: boolean;
}

/** W on the GPU (interleaved with swiglu), its reference values, and a matching bias. */
function weights(gpu: TestGpu, c: FusedCase, r: ReturnType<typeof rng>) {
  const { n, k, dtype } = c;
  if (!c.swiglu) {
    const values = r.uniform(n * k, 0.5);
    const w = uploadWeight(gpu, values, { rows: n, cols: k, dtype });
    const bias = c.bias ? f32Input(gpu, r.uniform(n)) : undefined;
    return { w, ref: weightRef(values, dtype), bias: bias?.buffer, biasRef: bias?.values };
  }
  const gate = r.uniform(n * k, 0.5), up = r.uniform(n * k, 0.5);
  const block = c.block ?? SWIGLU_BLOCK;
  const bytes = interleaveGateUp(encode(gate, dtype), encode(up, dtype), {
    rows: n,
    cols: k,
    dtype,
    block,
  });
  const w: WeightBuffer = {
    buffer: createStorage(gpu, bytes.byteLength, bytes),
    dtype,
    rows: 2 * n,
    cols: k,
  };
  const ref = concat(weightRef(gate, dtype), weightRef(up, dtype));
  if (!c.bias) return { w, ref };
  const gb = Float64Array.from(Float32Array.from(r.uniform(n)));
  const ub = Float64Array.from(Float32Array.from(r.uniform(n)));
  const b = interleaveGateUp(encode(gb, "f32"), encode(ub, "f32"), {
    rows: n,
    cols: 1,
    dtype: "f32",
    block,
  });
  return { w, ref, bias: createStorage(gpu, b.byteLength, b), biasRef: concat(gb, ub) };
}

async function checkFused(c: FusedCase, seed: number): Promise<void> {
  const gpu = await testGpu();
  const r = rng(seed);
  const { m, n, k } = c;
  const x = f32Input(gpu, r.uniform(m * k, 2));
  // Norm weights around 1, as in trained models, with some sign flips.
  const nw = f32Input(gpu, Float64Array.from(r.uniform(k), (v) => (v < -0.8 ? -1 : 1) + v / 2));
  const { w, ref, bias, biasRef } = weights(gpu, c, r);
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
    eps: c.norm ? EPS : undefined,
    swiglu: c.swiglu,
    swigluBlock: c.block,
    small: c.small,
    rows: c.rows,
    unroll: c.unroll,
  });
  assert.equal(matmulPath(m, w), c.path, `${ds[0].label} picked the wrong kernel`);
  await run(gpu, ds);
  const gotDense = await readOutputRows(gpu, y0);
  const y = c.accumulate ? denseRows(y0.values, y0.at) : undefined;
  const normWeight = c.norm ? nw.values : undefined;
  const want = c.swiglu
    ? swigluRef(x.values, ref, { m, f: n, k, bias: biasRef, normWeight, eps: EPS, y })
    : normWeight
    ? matmulNormRef(x.values, ref, { m, n, k, bias: biasRef, y, normWeight, eps: EPS })
    : matmulRef(x.values, ref, { m, n, k, bias: biasRef, y });
  const tuning = c.small ?? c.rows;
  const shape = tuning ? ` ${JSON.stringify(tuning)}` : "";
  const loops = c.unroll === false ? " plain loops" : "";
  assertClose(`${ds[0].label}${c.block ? ` B=${c.block}` : ""}${shape}${loops}`, gotDense, want);
}

const NORM_CASES: FusedCase[] = [
  // small: K % 8 == 0 (f32: % 4)
  ...DTYPES.map((dtype): FusedCase => ({ m: 1, n: 33, k: 64, dtype, path: "small", norm: true })),
  { m: 1, n: 33, k: 1032, dtype: "bf16", path: "small", norm: true }, // threads end unevenly
  { m: 3, n: 101, k: 256, dtype: "f16", path: "small", norm: true, bias: true, accumulate: true },
  { m: 8, n: 33, k: 64, dtype: "f32", path: "small", norm: true, bias: true },
  { m: 9, n: 37, k: 64, dtype: "f16", path: "small", norm: true },
  // the decode K: 256 threads share the sum of squares of each row
  { m: 16, n: 37, k: 2048, dtype: "f16", path: "small", norm: true, bias: true },
  // from 17 rows, products no wider than deep go to tiled, from 25 to rows (16-bit W)
  { m: 20, n: 33, k: 64, dtype: "bf16", path: "tiled", norm: true, accumulate: true },
  { m: 31, n: 33, k: 64, dtype: "bf16", path: "rows", norm: true, accumulate: true },
  { m: 64, n: 37, k: 64, dtype: "f32", path: "tiled", norm: true },
  {
    m: 5,
    n: 33,
    k: 64,
    dtype: "bf16",
    path: "small",
    norm: true,
    bias: true,
    accumulate: true,
    small: { rm: 2, tm: 4, tn: 2, tk: 4 }, // row groups past M
  },
  // naive: K odd
  // rows: 12 to 64 rows of x times a 16-bit W at least 4x wider than deep, 33 to 48 times one
  // wider than deep (QKV)
  { m: 40, n: 200, k: 64, dtype: "f16", path: "rows", norm: true, bias: true },
  {
    m: 47,
    n: 150,
    k: 72,
    dtype: "bf16",
    path: "rows",
    norm: true,
    rows: { r: 16, kl: 4, cg: 16, splits: 4 },
  },
  { m: 12, n: 300, k: 64, dtype: "f16", path: "rows", norm: true, bias: true },
  { m: 19, n: 600, k: 136, dtype: "bf16", path: "rows", norm: true, accumulate: true },
  {
    m: 32,
    n: 900,
    k: 200,
    dtype: "f16",
    path: "rows",
    norm: true,
    rows: { r: 16, kl: 4, cg: 8, splits: 3 },
  },
  {
    m: 33,
    n: 300,
    k: 136,
    dtype: "f16",
    path: "rows",
    norm: true,
    accumulate: true,
    rows: { r: 16, kl: 4, cg: 8, cw: 8, splits: 3 },
  },
  ...DTYPES.map((dtype): FusedCase => ({ m: 3, n: 101, k: 129, dtype, path: "naive", norm: true })),
  { m: 1, n: 33, k: 37, dtype: "bf16", path: "naive", norm: true, bias: true, accumulate: true },
  // tiled: M, N not multiples of the 64 x 64 tile (the other dtypes: the swiglu cases)
  { m: 65, n: 33, k: 37, dtype: "f32", path: "tiled", norm: true },
  { m: 70, n: 101, k: 256, dtype: "f16", path: "tiled", norm: true, bias: true, accumulate: true },
];

const SWIGLU_CASES: FusedCase[] = [
  // small
  ...DTYPES.map((dtype): FusedCase => ({
    m: 1,
    n: 37,
    k: 64,
    dtype,
    path: "small",
    swiglu: true,
    norm: true,
  })),
  { m: 2, n: 37, k: 256, dtype: "bf16", path: "small", swiglu: true, norm: true, accumulate: true },
  { m: 7, n: 21, k: 64, dtype: "f32", path: "small", swiglu: true, norm: true, bias: true },
  { m: 1, n: 37, k: 64, dtype: "f16", path: "small", swiglu: true, block: 4, bias: true },
  { m: 17, n: 37, k: 64, dtype: "f16", path: "small", swiglu: true, norm: true, block: 32 },
  {
    m: 21,
    n: 37,
    k: 64,
    dtype: "bf16",
    path: "small",
    swiglu: true,
    norm: true,
    bias: true,
    accumulate: true,
  },
  { m: 63, n: 21, k: 64, dtype: "f16", path: "tiled", swiglu: true, norm: true },
  // the decode shape: K = 2048, 128 threads per column group
  { m: 1, n: 37, k: 2048, dtype: "f16", path: "small", swiglu: true, norm: true, bias: true },
  {
    m: 16,
    n: 37,
    k: 128,
    dtype: "f16",
    path: "small",
    swiglu: true,
    norm: true,
    small: { rm: 8, tm: 2, tn: 4, tk: 16, unroll: 2 },
  },
  // rows (gate/up rows = 2F >= 4K)
  // gate/up's GPU shape at 33-64 rows: 16-row tiles (four, the last partial) of 8 columns per
  // thread, 2 K splits
  {
    m: 57,
    n: 300,
    k: 136,
    dtype: "f16",
    path: "rows",
    swiglu: true,
    norm: true,
    rows: { r: 16, kl: 4, cg: 16, cw: 8, splits: 2 },
  },
  // gate/up's GPU shape at 17-24 rows: 8-row tiles of 8 columns per thread, 2 K splits
  {
    m: 21,
    n: 300,
    k: 64,
    dtype: "f16",
    path: "rows",
    swiglu: true,
    norm: true,
    rows: { r: 8, kl: 4, cg: 16, cw: 8, splits: 2 },
  },
  {
    m: 29,
    n: 150,
    k: 72,
    dtype: "bf16",
    path: "rows",
    swiglu: true,
    norm: true,
    block: 4,
    bias: true,
    rows: { r: 16, kl: 4, cg: 16, cw: 8, splits: 2 },
  },
  { m: 12, n: 150, k: 64, dtype: "f16", path: "rows", swiglu: true, norm: true },
  {
    m: 21,
    n: 150,
    k: 72,
    dtype: "f16",
    path: "rows",
    swiglu: true,
    norm: true,
    rows: { r: 24, kl: 4, cg: 16, splits: 2 },
  },
  {
    m: 50,
    n: 160,
    k: 64,
    dtype: "f16",
    path: "rows",
    swiglu: true,
    norm: true,
    rows: { r: 32, kl: 4, cg: 32, splits: 2 },
  },
  {
    m: 32,
    n: 133,
    k: 64,
    dtype: "bf16",
    path: "rows",
    swiglu: true,
    norm: true,
    block: 4,
    bias: true,
    accumulate: true,
  },
  {
    m: 17,
    n: 130,
    k: 64,
    dtype: "f16",
    path: "rows",
    swiglu: true,
    norm: true,
    block: 32,
    rows: { r: 8, kl: 8, cg: 4, splits: 2 },
  },
  // naive
  ...DTYPES.map((dtype): FusedCase => ({
    m: 3,
    n: 37,
    k: 129,
    dtype,
    path: "naive",
    swiglu: true,
    norm: true,
  })),
  { m: 1, n: 37, k: 37, dtype: "f16", path: "naive", swiglu: true, block: 4, accumulate: true },
  // tiled
  ...DTYPES.map((dtype): FusedCase => ({
    m: 65,
    n: 37,
    k: 37,
    dtype,
    path: "tiled",
    swiglu: true,
    norm: true,
  })),
  {
    m: 70,
    n: 101,
    k: 256,
    dtype: "f16",
    path: "tiled",
    swiglu: true,
    norm: true,
    bias: true,
    accumulate: true,
  },
  { m: 70, n: 37, k: 37, dtype: "bf16", path: "tiled", swiglu: true, norm: true, block: 32 },
  // The marked loops compiled as loops, fused.
  { m: 5, n: 37, k: 64, dtype: "f16", path: "small", swiglu: true, norm: true, unroll: false },
];

Deno.test("matmul + rmsnorm: small, rows, naive and tiled kernels, all dtypes, bias and +=", async () => {
  let seed = 200;
  for (const c of NORM_CASES) await checkFused(c, seed++);
});

Deno.test("matmul swiglu: all kernels and dtypes, with norm, bias, += and partial blocks", async () => {
  let seed = 300;
  for (const c of SWIGLU_CASES) await checkFused(c, seed++);
});

Deno.test("interleaveGateUp: blocks of rows, a partial last block, odd 16-bit rows", () => {
  // bf16, F = 5, K = 3 (rows of 6 bytes, not word-aligned), block 2: g0 g1 u0 u1 g2 g3 u2 u3 g4 u4
  const rows = 5, cols = 3;
  const gate = Uint8Array.from({ length: rows * cols * 2 }, (_, i) => i);
  const up = Uint8Array.from({ length: rows * cols * 2 }, (_, i) => 100 + i);
  const out = interleaveGateUp(gate, up, { rows, cols, dtype: "bf16", block: 2 });
  assert.equal(out.byteLength, 60);
  const row = (src: Uint8Array, r: number) => Array.from(src.subarray(r * 6, r * 6 + 6));
  const want = [
    ...[0, 1].map((r) => row(gate, r)),
    ...[0, 1].map((r) => row(up, r)),
    ...[2, 3].map((r) => row(gate, r)),
    ...[2, 3].map((r) => row(up, r)),
    row(gate, 4),
    row(up, 4),
  ].flat();
  assert.deepEqual(Array.from(out), want);
  // Block 1 (the default) alternates rows; odd element counts are padded to 4 bytes.
  const one = interleaveGateUp(gate.subarray(0, 6), up.subarray(0, 6), {
    rows: 1,
    cols: 3,
    dtype: "f16",
  });
  assert.deepEqual(Array.from(one), [...row(gate, 0), ...row(up, 0)]);
  assert.throws(
    () => interleaveGateUp(gate, up.subarray(2), { rows, cols, dtype: "bf16" }),
    /need 30 bytes each; got 30 and 28/,
  );
});

Deno.test("matmul fusions: refuse what they cannot serve, with the sizes in the message", async () => {
  const gpu = await testGpu();
  const w = uploadWeight(gpu, new Float64Array(33 * 64), { rows: 33, cols: 64, dtype: "f16" });
  const x = createStorage(gpu, 64 * 4);
  const y = createStorage(gpu, 33 * 4);
  const nw = createStorage(gpu, 64 * 4);
  assert.throws(() => matmulDispatches(gpu, { x, w, y, normWeight: nw }, { m: 1 }), /needs eps/);
  assert.throws(
    () =>
      matmulDispatches(gpu, { x, w, y, normWeight: createStorage(gpu, 16) }, { m: 1, eps: EPS }),
    /normWeight holds 16 bytes; needs 256/,
  );
  assert.throws(() => matmulDispatches(gpu, { x, w, y }, { m: 1, swiglu: true }), /W has 33/);
  const gu = uploadWeight(gpu, new Float64Array(34 * 64), { rows: 34, cols: 64, dtype: "f16" });
  assert.throws(
    () =>
      matmulDispatches(gpu, { x, w: gu, y, bias: createStorage(gpu, 64) }, { m: 1, swiglu: true }),
    /bias holds 64 bytes; needs 136/,
  );
});
