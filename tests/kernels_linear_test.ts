/**
 * The linear kernel families (embedding, rmsnorm, matmul, elementwise) against their float64
 * references on seeded random inputs at awkward sizes. Each matmul case names the kernel it
 * means to exercise and asserts the wrapper picked it. Shapes are chosen to share pipelines:
 * on llvmpipe every new pipeline costs a shader compile of up to a few seconds.
 */
import assert from "node:assert/strict";
import { createStorage, readF32 } from "../engine/gpu.ts";
import type { DType } from "../engine/dtype.ts";
import { run } from "../kernels/dispatch.ts";
import { embeddingDispatch } from "../kernels/embedding.ts";
import { rmsnormDispatch } from "../kernels/rmsnorm.ts";
import {
  matmulDispatch,
  type MatmulPath,
  matmulPath,
  type SmallTuning,
  uploadWeight,
} from "../kernels/matmul.ts";
import { addDispatch, siluMulDispatch } from "../kernels/elementwise.ts";
import {
  addRef,
  embeddingRef,
  matmulRef,
  rmsnormRef,
  siluMulRef,
  weightRef,
} from "../kernels/reference.ts";
import { assertClose, denseRows, rng, testGpu } from "./util.ts";

const DTYPES: DType[] = ["f32", "f16", "bf16"];

/** f32 values as a buffer, and the same values widened back (what the GPU sees). */
function f32Input(gpu: Awaited<ReturnType<typeof testGpu>>, values: ArrayLike<number>) {
  const f = Float32Array.from(values);
  return { buffer: createStorage(gpu, f.byteLength, f), values: Float64Array.from(f) };
}

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
  const yStride = c.accumulate ? n + 3 : n;
  const yOffset = c.accumulate ? 5 : 0;
  const yLen = yOffset + m * yStride;
  const y0 = f32Input(gpu, r.uniform(yLen));
  const d = matmulDispatch(gpu, { x: x.buffer, w, y: y0.buffer, bias: bias?.buffer }, {
    m,
    accumulate: c.accumulate,
    yStride,
    yOffset,
    small: c.small,
  });
  assert.equal(matmulPath(m, w), c.path, `${d.label} picked the wrong kernel`);
  await run(gpu, [d]);
  const got = await readF32(gpu, y0.buffer, yLen);
  const rows = { rows: m, cols: n, offset: yOffset, stride: yStride };
  const prior = denseRows(y0.values, rows);
  const gotDense = denseRows(got, rows);
  const want = matmulRef(x.values, weightRef(wValues, dtype), {
    m,
    n,
    k,
    bias: bias?.values,
    y: c.accumulate ? prior : undefined,
  });
  assertClose(`${d.label}${c.small ? ` ${JSON.stringify(c.small)}` : ""}`, gotDense, want);
  // Elements between the strided rows must be untouched.
  for (let i = 0; i < yLen; i++) {
    const j = (i - yOffset) % yStride;
    if (i < yOffset || j >= n) assert.equal(got[i], Math.fround(y0.values[i]), `y[${i}] clobbered`);
  }
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
  { m: 17, n: 37, k: 64, dtype: "bf16", path: "small" },
  { m: 31, n: 37, k: 64, dtype: "f16", path: "small" },
  { m: 32, n: 101, k: 256, dtype: "f16", path: "small", bias: true, accumulate: true },
  { m: 33, n: 37, k: 64, dtype: "f32", path: "small" },
  { m: 63, n: 37, k: 64, dtype: "f16", path: "small" },
  { m: 64, n: 33, k: 1032, dtype: "bf16", path: "small", bias: true },
  // small, launch shapes other than the default: a partial last row tile of several row
  // groups; more K lanes than units (idle lanes); one row per thread over several row tiles
  { m: 33, n: 101, k: 256, dtype: "f16", path: "small", small: { rm: 4, tm: 4, tn: 2, tk: 8 } },
  { m: 17, n: 37, k: 128, dtype: "bf16", path: "small", small: { rm: 8, tk: 64, unroll: 2 } },
  { m: 3, n: 37, k: 64, dtype: "f32", path: "small", small: { rm: 1, tm: 2, tn: 1, tk: 128 } },
  // K not a multiple of the unit: the naive kernel
  ...DTYPES.map((dtype): MatmulCase => ({ m: 3, n: 101, k: 129, dtype, path: "naive" })),
  { m: 1, n: 33, k: 37, dtype: "bf16", path: "naive", bias: true, accumulate: true },
  // prefill: the tiled kernel, M and N not multiples of the 64 x 64 tile
  ...DTYPES.map((dtype): MatmulCase => ({ m: 65, n: 33, k: 37, dtype, path: "tiled" })),
  { m: 70, n: 101, k: 256, dtype: "f16", path: "tiled", bias: true, accumulate: true },
  { m: 70, n: 1, k: 129, dtype: "bf16", path: "tiled" },
];

Deno.test("matmul: small, naive and tiled kernels, all dtypes, awkward shapes", async () => {
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
    const d = matmulDispatch(gpu, { x: x.buffer, w, y }, { m, path });
    assert.ok(d.label.includes(path));
    await run(gpu, [d]);
    assertClose(d.label, await readF32(gpu, y, m * n), want);
  }
});

Deno.test("matmul: refuses shapes it cannot serve, with the sizes in the message", async () => {
  const gpu = await testGpu();
  const w = uploadWeight(gpu, new Float64Array(33 * 37), { rows: 33, cols: 37, dtype: "f16" });
  const x = createStorage(gpu, 37 * 4);
  const y = createStorage(gpu, 33 * 4);
  const small = createStorage(gpu, 16);
  assert.throws(
    () => matmulDispatch(gpu, { x, w, y: small }, { m: 1 }),
    /y holds 16 bytes; needs 132/,
  );
  assert.throws(() => matmulDispatch(gpu, { x, w, y }, { m: 1, path: "small" }), /K % 8 == 0/);
  assert.throws(
    () => matmulDispatch(gpu, { x: small, w, y }, { m: 1 }),
    /x holds 16 bytes; needs 148/,
  );
  const w64 = uploadWeight(gpu, new Float64Array(33 * 64), { rows: 33, cols: 64, dtype: "f16" });
  const x64 = createStorage(gpu, 8 * 64 * 4);
  const y8 = createStorage(gpu, 8 * 33 * 4);
  const bad = (small: Partial<SmallTuning>) => () =>
    matmulDispatch(gpu, { x: x64, w: w64, y: y8 }, { m: 8, small });
  assert.throws(bad({ rm: 3 }), /rm must be 1, 2, 4 or 8; got 3/);
  assert.throws(bad({ rm: 8, tk: 4 }), /tk must be a power of two >= rm \(8\); got 4/);
  assert.throws(bad({ tn: 3 }), /tn and tm must be powers of two; got 3 and 1/);
  assert.throws(bad({ unroll: 4 }), /unroll must be 1 or 2; got 4/);
  assert.throws(bad({ tk: 256, tn: 8, tm: 1 }), /workgroup of 2048 threads/);
});
