/**
 * The linear kernel families (embedding, rmsnorm, matmul, elementwise) against their float64
 * references on seeded random inputs at awkward sizes. Each matmul case names the kernel it
 * means to exercise and asserts the wrapper picked it. Shapes are chosen to share pipelines:
 * on llvmpipe every new pipeline costs a shader compile of up to a few seconds.
 */
import assert from "node:assert/strict";
import { createStorage, type Gpu, isCpuAdapter, readF32 } from "../gpu/device.ts";
import { type DType, encode } from "../gpu/dtype.ts";
import { run } from "../gpu/dispatch.ts";
import { embeddingDispatch } from "../kernels/embedding.ts";
import { rmsnormDispatch } from "../kernels/rmsnorm.ts";
import { matmulDispatches, type MatmulPath, matmulPath } from "../kernels/matmul.ts";
import { type RowsTuning, rowsTuning } from "../kernels/matmul_rows.ts";
import { type SmallTuning, smallTuning } from "../kernels/matmul_small.ts";
import { type TiledTuning, tiledTuning } from "../kernels/matmul_tiled.ts";
import { interleaveGateUp, uploadWeight, type WeightBuffer } from "../kernels/weight.ts";
import { addDispatch, siluMulDispatch } from "../kernels/elementwise.ts";
import {
  addRef,
  embeddingRef,
  matmulNormRef,
  matmulRef,
  rmsnormRef,
  siluMulRef,
  swigluRef,
  weightRef,
} from "../kernels/reference.ts";
import {
  assertClose,
  denseRows,
  f32Input,
  outputRows,
  readOutputRows,
  rng,
  testGpu,
} from "./util.ts";

const DTYPES: DType[] = ["f32", "f16", "bf16"];

Deno.test("embedding: every dtype, odd width, repeated and last ids", async () => {
  const gpu = await testGpu();
  const r = rng(1);
  const vocab = 50, cols = 37;
  const ids = [0, 49, 7, 7, 23];
  for (const dtype of DTYPES) {
    const values = r.uniform(vocab * cols);
    const table = uploadWeight(gpu, values, { rows: vocab, cols, dtype });
    const tokens = createStorage(gpu, ids.length * 4, Uint32Array.from(ids));
    const out = createStorage(gpu, ids.length * cols * 4);
    await run(gpu, [embeddingDispatch(gpu, { table, tokens, out }, { count: ids.length })]);
    const want = embeddingRef(weightRef(values, dtype), ids, { cols });
    // A lookup is exact: the table values are representable in f32.
    assertClose(`embedding ${dtype}`, await readF32(gpu, out, ids.length * cols), want, 0, 0);
  }
});

Deno.test("rmsnorm: plain rows and the gather path", async () => {
  const gpu = await testGpu();
  const r = rng(2);
  for (const cols of [37, 1000]) {
    const x = f32Input(gpu, r.uniform(5 * cols, 3));
    const w = f32Input(gpu, r.uniform(cols, 2));
    const eps = 1e-5;
    const out = createStorage(gpu, 5 * cols * 4);
    await run(gpu, [rmsnormDispatch(gpu, { x: x.buffer, weight: w.buffer, out }, {
      count: 5,
      cols,
      eps,
    })]);
    const want = rmsnormRef(x.values, w.values, { cols, eps });
    assertClose(`rmsnorm 5x${cols}`, await readF32(gpu, out, 5 * cols), want);

    const rows = [4, 0, 4];
    const rowsBuf = createStorage(gpu, 12, Uint32Array.from(rows));
    const gathered = createStorage(gpu, 3 * cols * 4);
    await run(gpu, [
      rmsnormDispatch(gpu, { x: x.buffer, weight: w.buffer, out: gathered, rows: rowsBuf }, {
        count: 3,
        cols,
        eps,
      }),
    ]);
    const wantG = rmsnormRef(x.values, w.values, { cols, eps, rows });
    assertClose(`rmsnorm gather [4,0,4]x${cols}`, await readF32(gpu, gathered, 3 * cols), wantG);
  }
});

Deno.test("elementwise: silu_mul and add", async () => {
  const gpu = await testGpu();
  const r = rng(3);
  const m = 3, f = 37;
  // Wide range: exp(-g) overflows for g << 0 and silu must still come out right.
  const gu = f32Input(gpu, r.uniform(m * 2 * f, 30));
  const out = createStorage(gpu, m * f * 4);
  await run(gpu, [siluMulDispatch(gpu, { gateUp: gu.buffer, out }, { m, f })]);
  assertClose("silu_mul 3x37", await readF32(gpu, out, m * f), siluMulRef(gu.values, { m, f }));

  const n = 1001;
  const a = f32Input(gpu, r.uniform(n)), b = f32Input(gpu, r.uniform(n));
  const sum = createStorage(gpu, n * 4);
  await run(gpu, [addDispatch(gpu, { a: a.buffer, b: b.buffer, out: sum }, { n })]);
  assertClose("add 1001", await readF32(gpu, sum, n), addRef(a.values, b.values));
});

interface MatmulCase {
  m: number;
  n: number;
  k: number;
  dtype: DType;
  path: MatmulPath;
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

async function checkMatmul(c: MatmulCase, seed: number): Promise<void> {
  const gpu = await testGpu();
  const r = rng(seed);
  const { m, n, k, dtype } = c;
  const x = f32Input(gpu, r.uniform(m * k));
  const wValues = r.uniform(n * k, 0.5);
  const w = uploadWeight(gpu, wValues, { rows: n, cols: k, dtype });
  const bias = c.bias ? f32Input(gpu, r.uniform(n)) : undefined;
  // Accumulating cases write into a wider y at an offset, so stride and offset get tested too.
  const y0 = outputRows(gpu, r, m, n, !!c.accumulate);
  const ds = matmulDispatches(gpu, { x: x.buffer, w, y: y0.buffer, bias: bias?.buffer }, {
    m,
    accumulate: c.accumulate,
    yStride: y0.at.stride,
    yOffset: y0.at.offset,
    small: c.small,
    rows: c.rows,
    unroll: c.unroll,
  });
  assert.equal(matmulPath(m, w), c.path, `${ds[0].label} picked the wrong kernel`);
  await run(gpu, ds);
  const gotDense = await readOutputRows(gpu, y0); // elements between the rows untouched
  const want = matmulRef(x.values, weightRef(wValues, dtype), {
    m,
    n,
    k,
    bias: bias?.values,
    y: c.accumulate ? denseRows(y0.values, y0.at) : undefined,
  });
  const shape = c.small ?? c.rows;
  const loops = c.unroll === false ? " plain loops" : "";
  assertClose(`${ds[0].label}${shape ? ` ${JSON.stringify(shape)}` : ""}${loops}`, gotDense, want);
}

const MATMUL_CASES: MatmulCase[] = [
  // small, M = 1..64 with K % 8 == 0 (f32: % 4), N odd. The default launch shape depends on M
  // (rows per thread 1, 2, 4, 8; row groups), N and K, so these cover its variants.
  ...DTYPES.map((dtype): MatmulCase => ({ m: 1, n: 33, k: 64, dtype, path: "small" })),
  { m: 1, n: 1, k: 64, dtype: "f16", path: "small" },
  // 129 units of 8 halves: threads end on different iterations
  { m: 1, n: 33, k: 1032, dtype: "f16", path: "small" },
  { m: 1, n: 101, k: 256, dtype: "f16", path: "small", bias: true, accumulate: true },
  { m: 2, n: 37, k: 64, dtype: "bf16", path: "small" },
  { m: 3, n: 101, k: 256, dtype: "bf16", path: "small" },
  { m: 3, n: 33, k: 36, dtype: "f32", path: "small", accumulate: true },
  { m: 7, n: 37, k: 64, dtype: "f16", path: "small", bias: true },
  { m: 8, n: 33, k: 64, dtype: "f32", path: "small", bias: true },
  { m: 9, n: 37, k: 64, dtype: "f16", path: "small", accumulate: true },
  { m: 16, n: 37, k: 64, dtype: "bf16", path: "small" },
  // 17 to 24 rows: tiled for products no wider than deep (o, down); from 25 to 48 rows rows,
  // with f32 W tiled
  { m: 17, n: 37, k: 64, dtype: "bf16", path: "tiled" },
  { m: 24, n: 37, k: 64, dtype: "f16", path: "tiled" },
  { m: 31, n: 37, k: 64, dtype: "f32", path: "tiled" },
  { m: 25, n: 37, k: 64, dtype: "f16", path: "rows" },
  { m: 32, n: 101, k: 256, dtype: "f16", path: "rows", bias: true, accumulate: true },
  { m: 40, n: 64, k: 264, dtype: "bf16", path: "rows", accumulate: true },
  // 33 to 64 rows with f32 W, and 49 to 64 rows: tiled, in its decode-batch tiles (32 rows) and K
  // splits
  { m: 33, n: 37, k: 64, dtype: "f32", path: "tiled" },
  { m: 63, n: 37, k: 64, dtype: "f16", path: "tiled" },
  { m: 64, n: 33, k: 1032, dtype: "bf16", path: "tiled", bias: true },
  // a product wider than deep (QKV): tiled from 22 rows of x, small below
  { m: 22, n: 200, k: 64, dtype: "f16", path: "tiled", bias: true },
  { m: 21, n: 200, k: 64, dtype: "f16", path: "small" },
  { m: 17, n: 101, k: 64, dtype: "bf16", path: "small", bias: true, accumulate: true },
  // at least 4x wider than deep (gate/up, the LM head), 16-bit W: rows from 12 to 64 rows of x
  { m: 11, n: 300, k: 64, dtype: "f16", path: "small" },
  { m: 12, n: 300, k: 64, dtype: "f16", path: "rows", bias: true },
  { m: 13, n: 301, k: 72, dtype: "bf16", path: "rows", accumulate: true }, // partial groups
  { m: 32, n: 600, k: 136, dtype: "f16", path: "rows" }, // a partial last stage of K
  { m: 64, n: 600, k: 64, dtype: "f16", path: "rows", bias: true },
  { m: 65, n: 600, k: 64, dtype: "f16", path: "tiled" },
  { m: 32, n: 600, k: 64, dtype: "f32", path: "tiled" },
  // wider than deep but under 4x (QKV): rows from 25 to 48 rows of x
  { m: 33, n: 200, k: 64, dtype: "f16", path: "rows", bias: true },
  { m: 48, n: 200, k: 72, dtype: "bf16", path: "rows", accumulate: true },
  { m: 49, n: 200, k: 64, dtype: "f16", path: "tiled" },
  // rows, launch shapes other than the default: several row tiles and K splits (the last
  // shorter), 8 lanes, the GPU's shapes
  { m: 20, n: 900, k: 200, dtype: "f16", path: "rows", rows: { r: 8, kl: 4, cg: 4, splits: 3 } },
  { m: 14, n: 520, k: 128, dtype: "bf16", path: "rows", rows: { r: 16, kl: 8, cg: 8, splits: 2 } },
  { m: 31, n: 300, k: 64, dtype: "f16", path: "rows", rows: { r: 32, kl: 4, cg: 16, splits: 1 } },
  { m: 45, n: 600, k: 136, dtype: "f16", path: "rows", rows: { r: 16, kl: 4, cg: 16, splits: 4 } },
  { m: 61, n: 900, k: 200, dtype: "bf16", path: "rows", rows: { r: 32, kl: 4, cg: 32, splits: 2 } },
  // 24-row tiles: one partial tile, and two tiles with 8 lanes (K 200: the second split shorter)
  { m: 23, n: 600, k: 136, dtype: "f16", path: "rows", rows: { r: 24, kl: 4, cg: 16, splits: 2 } },
  { m: 41, n: 300, k: 200, dtype: "bf16", path: "rows", rows: { r: 24, kl: 8, cg: 16, splits: 2 } },
  // o and down's GPU shape at 33-48 rows, deeper than wide: K 1032 in 8 asked splits (7 run, the
  // last shorter)
  { m: 40, n: 64, k: 1032, dtype: "f16", path: "rows", rows: { r: 24, kl: 4, cg: 16, splits: 8 } },
  // 8 columns per thread: partial column tiles, 8-row and 24-row tiles, 8 lanes, K splits
  {
    m: 20,
    n: 900,
    k: 200,
    dtype: "f16",
    path: "rows",
    rows: { r: 8, kl: 4, cg: 4, cw: 8, splits: 3 },
  },
  {
    m: 45,
    n: 300,
    k: 136,
    dtype: "bf16",
    path: "rows",
    bias: true,
    rows: { r: 24, kl: 8, cg: 16, cw: 8, splits: 2 },
  },
  {
    m: 31,
    n: 70,
    k: 64,
    dtype: "f16",
    path: "rows",
    accumulate: true,
    rows: { r: 32, kl: 4, cg: 16, cw: 8, splits: 1 },
  },
  // small, launch shapes other than the default: a partial last row tile of several row
  // groups; more K lanes than units (idle lanes); one row per thread over several row tiles
  { m: 21, n: 301, k: 256, dtype: "f16", path: "small", small: { rm: 4, tm: 4, tn: 2, tk: 8 } },
  { m: 16, n: 37, k: 128, dtype: "bf16", path: "small", small: { rm: 8, tk: 64, unroll: 2 } },
  { m: 3, n: 37, k: 64, dtype: "f32", path: "small", small: { rm: 1, tm: 2, tn: 1, tk: 128 } },
  // four units per loop trip: K lanes with a partial last trip (25 units over 4 lanes x 4)
  { m: 5, n: 37, k: 200, dtype: "f16", path: "small", small: { rm: 2, tk: 4, unroll: 4 } },
  { m: 9, n: 33, k: 256, dtype: "bf16", path: "small", small: { rm: 8, tk: 8, unroll: 4 } },
  // 16 adjacent K lanes: with more lanes beyond them (tk 64), and with fewer lanes than that (8)
  { m: 3, n: 37, k: 1024, dtype: "f16", path: "small", small: { rm: 2, tk: 64, kl: 16 } },
  { m: 2, n: 37, k: 512, dtype: "f32", path: "small", small: { rm: 1, tk: 8, kl: 16 } },
  // K not a multiple of the unit: the naive kernel
  ...DTYPES.map((dtype): MatmulCase => ({ m: 3, n: 101, k: 129, dtype, path: "naive" })),
  { m: 1, n: 33, k: 37, dtype: "bf16", path: "naive", bias: true, accumulate: true },
  // prefill: the tiled kernel, M and N not multiples of the 64 x 64 tile
  ...DTYPES.map((dtype): MatmulCase => ({ m: 65, n: 33, k: 37, dtype, path: "tiled" })),
  { m: 70, n: 101, k: 256, dtype: "f16", path: "tiled", bias: true, accumulate: true },
  { m: 70, n: 1, k: 129, dtype: "bf16", path: "tiled" },
  // The marked loops compiled as loops (what the GPU sweep measures against their expansion):
  // every row count per thread, and four units per trip.
  { m: 8, n: 37, k: 64, dtype: "f16", path: "small", unroll: false },
  { m: 3, n: 33, k: 36, dtype: "f32", path: "small", accumulate: true, unroll: false },
  {
    m: 9,
    n: 33,
    k: 256,
    dtype: "bf16",
    path: "small",
    small: { rm: 8, tk: 8, unroll: 4 },
    unroll: false,
  },
];

Deno.test("matmul: small, rows, naive and tiled kernels, all dtypes, awkward shapes", async () => {
  let seed = 100;
  for (const c of MATMUL_CASES) await checkMatmul(c, seed++);
});

Deno.test("matmul: forced paths agree with the reference where the default would differ", async () => {
  // The naive kernel is the plain statement of the contract; the tiled one must also serve
  // M = 1, and the small one any M.
  const gpu = await testGpu();
  const r = rng(7);
  const n = 33, k = 64;
  for (const [m, path] of [[1, "naive"], [1, "tiled"], [70, "small"]] as [number, MatmulPath][]) {
    const x = f32Input(gpu, r.uniform(m * k));
    const wValues = r.uniform(n * k, 0.5);
    const w = uploadWeight(gpu, wValues, { rows: n, cols: k, dtype: "f16" });
    const want = matmulRef(x.values, weightRef(wValues, "f16"), { m, n, k });
    const y = createStorage(gpu, m * n * 4);
    const ds = matmulDispatches(gpu, { x: x.buffer, w, y }, { m, path });
    assert.ok(ds[0].label.includes(path));
    await run(gpu, ds);
    assertClose(ds[0].label, await readF32(gpu, y, m * n), want);
  }
});

Deno.test("matmul: path and launch-shape rules (decode batches, K splits, prefill chunks, small lanes)", () => {
  // The GPU rules, on a stand-in for the H200 (no device needed: the choice is arithmetic).
  const h200 = { adapterName: "NVIDIA H200", maxWorkgroupStorage: 49152 } as Gpu;
  const weight = (rows: number, cols: number): WeightBuffer => ({
    buffer: {} as GPUBuffer,
    dtype: "f16",
    rows,
    cols,
  });
  // TinyLlama: QKV 2560 x 2048 and gate/up 11264 x 2048 are wider than deep; o and down not.
  // From 22 rows the wider ones go to tiled, from 17 the others (until rows takes them).
  assert.equal(matmulPath(22, weight(2560, 2048)), "tiled");
  assert.equal(matmulPath(21, weight(2560, 2048)), "small");
  assert.equal(matmulPath(16, weight(2048, 5632)), "small");
  assert.equal(matmulPath(17, weight(2048, 5632)), "tiled");
  assert.equal(matmulPath(16, weight(2048, 2048)), "small");
  assert.equal(matmulPath(17, weight(2048, 2048)), "tiled");
  // gate/up (5.5x wider) and the LM head (15.6x): rows from 12 to 64 rows of x, 16-bit W only
  assert.equal(matmulPath(11, weight(11264, 2048)), "small");
  assert.equal(matmulPath(12, weight(11264, 2048)), "rows");
  assert.equal(matmulPath(32, weight(32000, 2048)), "rows");
  assert.equal(matmulPath(33, weight(11264, 2048)), "rows");
  assert.equal(matmulPath(64, weight(32000, 2048)), "rows");
  assert.equal(matmulPath(65, weight(11264, 2048)), "tiled");
  assert.equal(matmulPath(16, { ...weight(11264, 2048), dtype: "f32" }), "small");
  // QKV, o and down: rows from 25 to 48 rows of x, 16-bit W only
  assert.equal(matmulPath(24, weight(2560, 2048)), "tiled");
  assert.equal(matmulPath(24, weight(2048, 5632)), "tiled");
  assert.equal(matmulPath(25, weight(2560, 2048)), "rows");
  assert.equal(matmulPath(25, weight(2048, 2048)), "rows");
  assert.equal(matmulPath(48, weight(2560, 2048)), "rows");
  assert.equal(matmulPath(48, weight(2048, 5632)), "rows");
  assert.equal(matmulPath(49, weight(2560, 2048)), "tiled");
  assert.equal(matmulPath(49, weight(2048, 2048)), "tiled");
  assert.equal(matmulPath(40, { ...weight(2560, 2048), dtype: "f32" }), "tiled");
  assert.deepEqual(rowsTuning(h200, { m: 8, cols: 11264, k: 2048 }), {
    kl: 8,
    cg: 8,
    r: 8,
    splits: 2,
  });
  // rows per tile / K splits, and "x8" where a thread holds 8 product columns
  const shape = (t: RowsTuning) => `${t.r}/${t.splits}` + (t.cw === 8 ? "x8" : "");
  // 17 to 24 rows: gate/up in 8-row tiles of 8 columns per thread, 2 K splits; the LM head in
  // one 24-row tile, unsplit
  assert.equal(shape(rowsTuning(h200, { m: 17, cols: 11264, k: 2048 })), "8/2x8");
  assert.equal(shape(rowsTuning(h200, { m: 24, cols: 11264, k: 2048 })), "8/2x8");
  assert.equal(shape(rowsTuning(h200, { m: 24, cols: 32000, k: 2048 })), "24/1");
  // 25 to 32 rows: 4 columns per thread (8 measured slower in the bench)
  assert.equal(shape(rowsTuning(h200, { m: 25, cols: 11264, k: 2048 })), "16/2");
  assert.equal(shape(rowsTuning(h200, { m: 32, cols: 11264, k: 2048 })), "16/2");
  assert.equal(shape(rowsTuning(h200, { m: 32, cols: 32000, k: 2048 })), "32/2");
  // 33 to 64 rows: 16-row tiles of 8 columns per thread (gate/up in 2 K splits)
  assert.equal(shape(rowsTuning(h200, { m: 33, cols: 11264, k: 2048 })), "16/2x8");
  assert.equal(shape(rowsTuning(h200, { m: 48, cols: 11264, k: 2048 })), "16/2x8");
  assert.equal(shape(rowsTuning(h200, { m: 48, cols: 32000, k: 2048 })), "16/1x8");
  // QKV, o, down: 8 K splits (two 16-row tiles up to 32 rows, two 24-row ones for o and down
  // up to 48), QKV at 33-48 in three 16-row tiles split 4
  assert.equal(shape(rowsTuning(h200, { m: 28, cols: 2560, k: 2048 })), "16/8");
  assert.equal(shape(rowsTuning(h200, { m: 32, cols: 2048, k: 5632 })), "16/8");
  assert.equal(shape(rowsTuning(h200, { m: 40, cols: 2560, k: 2048 })), "16/4");
  assert.equal(shape(rowsTuning(h200, { m: 40, cols: 2048, k: 2048 })), "24/8");
  assert.equal(shape(rowsTuning(h200, { m: 48, cols: 2048, k: 5632 })), "24/8");
  assert.equal(shape(rowsTuning(h200, { m: 49, cols: 11264, k: 2048 })), "16/2x8");
  assert.equal(shape(rowsTuning(h200, { m: 64, cols: 11264, k: 2048 })), "16/2x8");
  assert.equal(shape(rowsTuning(h200, { m: 64, cols: 32000, k: 2048 })), "16/1x8");
  // past 64 rows (only when forced): 32-row tiles of 4 columns
  assert.equal(shape(rowsTuning(h200, { m: 65, cols: 11264, k: 2048 })), "32/2");
  const splits = (m: number, cols: number, k: number, norm = false, swiglu = false) =>
    tiledTuning(h200, { m, cols, k, norm, swiglu }).splits;
  // 40 tiles of 32 x 64 for QKV at M = 32: 8 splits of 16 steps; gate/up's 176 tiles: 2; QKV's
  // 160 tiles at M = 128: 2.
  assert.equal(splits(32, 2560, 2048, true), 8);
  assert.equal(splits(32, 11264, 2048, true, true), 2);
  assert.equal(splits(128, 2560, 2048, true), 2);
  assert.equal(splits(128, 2048, 5632), 4);
  // Enough tiles, too short a K, or past SPLIT_MAX_M rows: no split.
  assert.equal(splits(64, 32000, 2048, true), 1);
  assert.equal(splits(32, 2560, 48, true), 1);
  assert.equal(splits(512, 2048, 2048), 1);
  // Prefill chunks past 256 rows: QKV and gate/up in 64 x 128 tiles, K in 4 and 2 splits.
  const tile = (m: number, cols: number, norm: boolean, swiglu: boolean) => {
    const t = tiledTuning(h200, { m, cols, k: 2048, norm, swiglu });
    return `${t.bm}x${t.bn}/${t.tm}x${t.tn} bk ${t.bk} split ${t.splits}`;
  };
  assert.equal(tile(512, 2560, true, false), "64x128/8x8 bk 8 split 4");
  assert.equal(tile(512, 11264, true, true), "64x128/8x8 bk 8 split 2");
  assert.equal(tile(384, 11264, true, true), "128x128/8x8 bk 8 split 1");
  // Decode batches: 32 x 128 tiles of 4 x 8 for o, down and the LM head (K split ~256 / tiles
  // ways: 250 tiles, 32 tiles), 32 x 64 for QKV.
  assert.equal(tile(32, 32000, true, false), "32x128/4x8 bk 16 split 1");
  assert.equal(tile(64, 2048, false, false), "32x128/4x8 bk 16 split 8");
  assert.equal(tile(32, 2560, true, false), "32x64/4x4 bk 16 split 8");
  // Two row tiles (33-64 rows): QKV still 8 splits (by its column tiles), gate/up 4.
  assert.equal(tile(48, 2560, true, false), "32x64/4x4 bk 16 split 8");
  assert.equal(tile(64, 11264, true, true), "32x64/4x4 bk 16 split 4");
  // small's K lanes: twice the threads for a deep W at one row (down: 256 lanes, not 128), half
  // from 8 rows for products up to 8x wider than deep (gate/up: 16, not 32), none for the LM head.
  assert.equal(smallTuning(weight(2048, 5632), { m: 1, cols: 2048 }).tk, 256);
  assert.equal(smallTuning(weight(2048, 2048), { m: 1, cols: 2048 }).tk, 128);
  assert.equal(smallTuning(weight(11264, 2048), { m: 8, cols: 11264 }).tk, 16);
  assert.equal(smallTuning(weight(11264, 2048), { m: 4, cols: 11264 }).tk, 32);
  assert.equal(smallTuning(weight(32000, 2048), { m: 8, cols: 32000 }).tk, 16);
  // 16 adjacent K lanes for gate/up, 8 for the rest.
  assert.equal(smallTuning(weight(11264, 2048), { m: 1, cols: 11264, swiglu: true }).kl, 16);
  assert.equal(smallTuning(weight(32000, 2048), { m: 1, cols: 32000 }).kl, 8);
  // CPU adapters keep their one small shape, unsplit.
  assert.equal(
    tiledTuning({ ...h200, adapterName: "llvmpipe" }, { m: 32, cols: 64, k: 4096 }).splits,
    1,
  );
});

/** A `tiled` launch shape forced on an awkward shape, with the fusions the engine uses. */
interface TiledCase {
  m: number;
  /** Columns of y: N, or F with swiglu. */
  n: number;
  k: number;
  dtype: DType;
  tiled: TiledTuning;
  norm?: boolean;
  swiglu?: boolean;
  /** Gate/up block of the interleave (swiglu). */
  block?: number;
  bias?: boolean;
  /** Accumulate into y, written with a row stride and offset (a strided view). */
  accumulate?: boolean;
}

/** W on the GPU (gate/up interleaved with swiglu), its float64 values, and a bias to match. */
function tiledWeights(gpu: Awaited<ReturnType<typeof testGpu>>, c: TiledCase, seed: number) {
  const r = rng(seed);
  const { n, k, dtype } = c;
  const rows = c.swiglu ? 2 * n : n;
  // Gate rows then up rows, as in the checkpoint (and as swigluRef reads them).
  const values = r.uniform(rows * k, 0.5);
  const biasValues = Float64Array.from(Float32Array.from(r.uniform(rows)));
  if (!c.swiglu) {
    const w = uploadWeight(gpu, values, { rows, cols: k, dtype });
    return { w, ref: weightRef(values, dtype), bias: f32Input(gpu, biasValues) };
  }
  const half = n * k;
  const opts = { rows: n, cols: k, dtype, block: c.block };
  const bytes = interleaveGateUp(
    encode(values.subarray(0, half), dtype),
    encode(values.subarray(half), dtype),
    opts,
  );
  const w: WeightBuffer = {
    buffer: createStorage(gpu, bytes.byteLength, bytes),
    dtype,
    rows,
    cols: k,
  };
  const biasOpts = { ...opts, cols: 1, dtype: "f32" as const };
  const gate = encode(biasValues.subarray(0, n), "f32"), up = encode(biasValues.subarray(n), "f32");
  const b = interleaveGateUp(gate, up, biasOpts);
  const bias = { buffer: createStorage(gpu, b.byteLength, b), values: biasValues };
  return { w, ref: weightRef(values, dtype), bias };
}

async function checkTiled(c: TiledCase, seed: number): Promise<void> {
  const gpu = await testGpu();
  const r = rng(seed);
  const { m, n, k } = c;
  const eps = 1e-5;
  const x = f32Input(gpu, r.uniform(m * k, 2));
  const nw = f32Input(gpu, Float64Array.from(r.uniform(k), (v) => 1 + v / 2));
  const { w, ref, bias } = tiledWeights(gpu, c, seed + 1);
  const y0 = outputRows(gpu, r, m, n, !!c.accumulate);
  const ds = matmulDispatches(gpu, {
    x: x.buffer,
    w,
    y: y0.buffer,
    bias: c.bias ? bias.buffer : undefined,
    normWeight: c.norm ? nw.buffer : undefined,
  }, {
    m,
    accumulate: c.accumulate,
    yStride: y0.at.stride,
    yOffset: y0.at.offset,
    eps: c.norm ? eps : undefined,
    swiglu: c.swiglu,
    swigluBlock: c.block,
    path: "tiled",
    tiled: c.tiled,
  });
  const t = c.tiled;
  const splits = Math.ceil(k / (Math.ceil(Math.ceil(k / t.bk) / t.splits) * t.bk));
  const shape = `${t.bm}x${t.bn}/${t.tm}x${t.tn}` + (splits > 1 ? ` split ${splits}` : "");
  assert.ok(ds[0].label.endsWith(shape), `${ds[0].label}: not the forced tile (${shape})`);
  assert.equal(ds.length, splits > 1 ? 2 : 1);
  await run(gpu, ds);
  const got = await readOutputRows(gpu, y0);
  const y = c.accumulate ? denseRows(y0.values, y0.at) : undefined;
  const b = c.bias ? bias.values : undefined;
  const normWeight = c.norm ? nw.values : undefined;
  const want = c.swiglu
    ? swigluRef(x.values, ref, { m, f: n, k, bias: b, normWeight, eps, y })
    : normWeight
    ? matmulNormRef(x.values, ref, { m, n, k, bias: b, y, normWeight, eps })
    : matmulRef(x.values, ref, { m, n, k, bias: b, y });
  assertClose(`${ds[0].label} bk ${t.bk} bufs ${t.bufs}`, got, want);
}

/** A `tiled` launch shape: K steps of 16, two buffers and no K split unless given. */
function tile(
  bm: number,
  bn: number,
  tm: number,
  tn: number,
  bk = 16,
  bufs = 2,
  splits = 1,
): TiledTuning {
  return { bm, bn, tm, tn, bk, bufs, splits };
}

// The launch shapes the GPU heuristic picks (tiledTuning) and a few more, each at an M and N
// that leave partial tiles, K both a multiple of bk (vector loads) and odd (element loads,
// 16-bit rows not word-aligned). 128 x 128 with one buffer: lavapipe allows 32 KiB of
// workgroup memory, two need 33 KiB.
const TILED_CASES: TiledCase[] = [
  {
    m: 130,
    n: 131,
    k: 64,
    dtype: "f16",
    tiled: tile(128, 128, 8, 8, 16, 1),
    norm: true,
    bias: true,
    accumulate: true,
  },
  {
    m: 129,
    n: 70,
    k: 37,
    dtype: "bf16",
    tiled: tile(128, 128, 8, 8, 16, 1),
    swiglu: true,
    norm: true,
    block: 3,
  },
  { m: 70, n: 133, k: 48, dtype: "f32", tiled: tile(64, 128, 8, 8), bias: true },
  {
    m: 65,
    n: 67,
    k: 48,
    dtype: "f16",
    tiled: tile(64, 128, 8, 8),
    swiglu: true,
    bias: true,
    accumulate: true,
  },
  { m: 100, n: 37, k: 37, dtype: "bf16", tiled: tile(64, 64, 8, 8), norm: true },
  {
    m: 77,
    n: 101,
    k: 256,
    dtype: "f16",
    tiled: tile(64, 64, 8, 4),
    swiglu: true,
    norm: true,
    block: 32,
  },
  { m: 33, n: 70, k: 37, dtype: "f32", tiled: tile(32, 64, 4, 4), norm: true, accumulate: true },
  // M <= 64 (a decode batch) with a short tile, K steps of 8; K steps of 32
  { m: 40, n: 130, k: 72, dtype: "f16", tiled: tile(32, 128, 8, 8, 8), norm: true, bias: true },
  { m: 70, n: 45, k: 96, dtype: "f16", tiled: tile(64, 64, 4, 8, 32, 1), accumulate: true },
  // decode batches' tile for o, down and the LM head: 32 x 128 of 4 x 8, K split 3 ways
  {
    m: 45,
    n: 260,
    k: 200,
    dtype: "bf16",
    tiled: tile(32, 128, 4, 8, 16, 2, 3),
    norm: true,
    accumulate: true,
  },
  // the GPU defaults of the engine's projections: gate/up at 512 and at <= 256 rows, QKV
  {
    m: 140,
    n: 150,
    k: 64,
    dtype: "f16",
    tiled: tile(128, 128, 8, 8, 8),
    swiglu: true,
    norm: true,
    block: 1,
  },
  { m: 90, n: 70, k: 72, dtype: "f16", tiled: tile(64, 128, 8, 8, 8), swiglu: true, norm: true },
  { m: 300, n: 99, k: 64, dtype: "f16", tiled: tile(32, 64, 4, 4), norm: true, bias: true },
  // K split over workgroups (decode batches): 13 steps in 3 splits of 5, 5, 3 with the norm's
  // partial sums; SwiGLU over 4 splits; odd K (element loads) in 5 splits, the last of 13 k;
  // more splits asked than there are steps (3).
  {
    m: 33,
    n: 70,
    k: 200,
    dtype: "f16",
    tiled: tile(32, 64, 4, 4, 16, 2, 3),
    norm: true,
    bias: true,
    accumulate: true,
  },
  {
    m: 40,
    n: 45,
    k: 136,
    dtype: "f16",
    tiled: tile(32, 64, 4, 4, 8, 2, 4),
    swiglu: true,
    norm: true,
    bias: true,
    block: 1,
  },
  { m: 20, n: 37, k: 77, dtype: "bf16", tiled: tile(32, 64, 8, 8, 8, 2, 5), accumulate: true },
  { m: 3, n: 21, k: 48, dtype: "f32", tiled: tile(16, 32, 4, 4, 16, 2, 64), norm: true },
];

Deno.test("matmul tiled: forced launch shapes, partial tiles, odd K, fusions", async () => {
  const gpu = await testGpu();
  if (!gpu.hasF16 && isCpuAdapter(gpu)) {
    // llvmpipe through GL compiles these for minutes (naga zero-fills workgroup arrays with one
    // constructor term per element); lavapipe covers them. The engine's CPU shape runs above.
    console.log("skipped on GL: compile time");
    return;
  }
  let seed = 400;
  for (const c of TILED_CASES) await checkTiled(c, seed++);
});

Deno.test("matmul tiled: fewer K splits when their partial sums would pass one binding", async () => {
  const real = await testGpu();
  if (!real.hasF16 && isCpuAdapter(real)) return console.log("skipped on GL: compile time");
  // 64 rows x 38 columns (37 and the row's sum of squares) x 4 bytes = 9 728 bytes per split:
  // a binding limit of 19 556 bytes holds two of the four asked for.
  const gpu = { ...real, maxBinding: 2 * 64 * 38 * 4 + 100 };
  const c: TiledCase = { m: 64, n: 37, k: 64, dtype: "f16", tiled: tile(32, 64, 4, 4, 16, 2, 4) };
  const r = rng(990);
  const x = f32Input(gpu, r.uniform(c.m * c.k, 2));
  const { w, ref } = tiledWeights(gpu, c, 991);
  const y0 = outputRows(gpu, r, c.m, c.n, false);
  const ds = matmulDispatches(gpu, { x: x.buffer, w, y: y0.buffer }, {
    m: c.m,
    yStride: y0.at.stride,
    yOffset: y0.at.offset,
    path: "tiled",
    tiled: c.tiled,
  });
  assert.ok(ds[0].label.endsWith("32x64/4x4 split 2"), ds[0].label);
  await run(gpu, ds);
  const want = matmulRef(x.values, ref, { m: c.m, n: c.n, k: c.k });
  assertClose(ds[0].label, await readOutputRows(gpu, y0), want);
});

Deno.test("matmul: refuses shapes it cannot serve, with the sizes in the message", async () => {
  const gpu = await testGpu();
  const w = uploadWeight(gpu, new Float64Array(33 * 37), { rows: 33, cols: 37, dtype: "f16" });
  const x = createStorage(gpu, 37 * 4);
  const y = createStorage(gpu, 33 * 4);
  const small = createStorage(gpu, 16);
  assert.throws(
    () => matmulDispatches(gpu, { x, w, y: small }, { m: 1 }),
    /y holds 16 bytes; needs 132/,
  );
  assert.throws(() => matmulDispatches(gpu, { x, w, y }, { m: 1, path: "small" }), /K % 8 == 0/);
  assert.throws(
    () => matmulDispatches(gpu, { x: small, w, y }, { m: 1 }),
    /x holds 16 bytes; needs 148/,
  );
  const w64 = uploadWeight(gpu, new Float64Array(33 * 64), { rows: 33, cols: 64, dtype: "f16" });
  const x64 = createStorage(gpu, 8 * 64 * 4);
  const y8 = createStorage(gpu, 8 * 33 * 4);
  const bad = (small: Partial<SmallTuning>) => () =>
    matmulDispatches(gpu, { x: x64, w: w64, y: y8 }, { m: 8, small });
  assert.throws(bad({ rm: 3 }), /rm must be 1, 2, 4 or 8; got 3/);
  assert.throws(bad({ rm: 8, tk: 4 }), /tk must be a power of two >= rm \(8\); got 4/);
  assert.throws(bad({ tn: 3 }), /tn and tm must be powers of two; got 3 and 1/);
  assert.throws(bad({ unroll: 3 }), /unroll must be 1, 2 or 4; got 3/);
  assert.throws(bad({ kl: 32 }), /kl must be 8 or 16; got 32/);
  assert.throws(bad({ tk: 256, tn: 8, tm: 1 }), /workgroup of 2048 threads/);
  // tiled reads x as whole 16-byte vectors: 37 floats need 160 bytes, not 148
  const x148 = gpu.device.createBuffer({ size: 148, usage: GPUBufferUsage.STORAGE });
  assert.throws(
    () => matmulDispatches(gpu, { x: x148, w, y }, { m: 1, path: "tiled" }),
    /x holds 148 bytes; needs 160/,
  );
  // rows: 16-bit W, K % 8 == 0, and a launch shape it can stage
  const w300 = uploadWeight(gpu, new Float64Array(300 * 64), { rows: 300, cols: 64, dtype: "f16" });
  const y300 = createStorage(gpu, 8 * 300 * 4);
  assert.throws(
    () => matmulDispatches(gpu, { x, w, y }, { m: 1, path: "rows" }),
    /rows kernel needs 16-bit W and K % 8 == 0/,
  );
  const badRows = (rows: Partial<RowsTuning>) => () =>
    matmulDispatches(gpu, { x: x64, w: w300, y: y300 }, { m: 8, path: "rows", rows });
  assert.throws(badRows({ kl: 2 }), /rows kl must be 4 or 8; got 2/);
  assert.throws(badRows({ cw: 6 }), /rows cw must be 4 or 8; got 6/);
  assert.throws(badRows({ r: 12 }), /rows r must be 8, 16, 24 or 32; got 12/);
  assert.throws(badRows({ r: 32, cg: 8 }), /rows cg must be a power of two >= r \/ 2; got 8/);
  assert.throws(badRows({ splits: 0 }), /rows splits must be an integer >= 1; got 0/);
  const badTiled = (tiled: Partial<TiledTuning>) => () =>
    matmulDispatches(gpu, { x: x64, w: w64, y: y8 }, { m: 8, path: "tiled", tiled });
  assert.throws(badTiled({ bm: 48 }), /tiled bm and bn must be 16, 32, 64 or 128; got 48 and/);
  assert.throws(badTiled({ tm: 2 }), /tiled tm and tn must be 4 or 8; got 2 and/);
  assert.throws(badTiled({ bk: 12 }), /tiled bk must be 8, 16 or 32; got 12/);
  assert.throws(badTiled({ bufs: 3 }), /tiled bufs must be 1 or 2; got 3/);
  assert.throws(badTiled({ splits: 0 }), /tiled splits must be an integer >= 1; got 0/);
  assert.throws(badTiled({ splits: NaN }), /tiled splits must be an integer >= 1; got NaN/);
  assert.throws(
    badTiled({ bm: 16, bn: 16, tm: 8, tn: 8, bk: 32 }),
    /needs 32 loads of x and 16 of W per thread and step; at most 4 each/,
  );
  assert.throws(
    badTiled({ bm: 128, bn: 128, tm: 8, tn: 8, bk: 32, bufs: 2 }),
    /tiled workgroup of 256 threads and 67584 bytes is over/,
  );
});
