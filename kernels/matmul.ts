/**
 * Linear layers: `y[m, n] (+)= Σ_k x[m, k] W[n, k] (+ bias[n])` with W in the Hugging Face
 * `[out, in]` layout and any weight dtype (kernels/weight.ts), x and y f32. The contract and the
 * choice of kernel live here; each kernel family has its module (tuning tables, checks, launch):
 *
 * - `small` (kernels/matmul_small.ts): decode batches, 1 ≤ M ≤ 16 for products no wider than
 *   deep, up to 21 rows for those wider (below 12 for those `rows` takes), any M when forced
 *   (`path`), K a multiple of 8 (16-bit W) or 4 (f32 W). Register-blocked, K split over the
 *   threads of a workgroup.
 * - `rows` (kernels/matmul_rows.ts): decode batches of 12–64 rows against 16-bit W at least 4
 *   times wider than deep (gate/up, the LM head), and of 25–48 rows against any other 16-bit W
 *   (QKV, o, down). Always two dispatches (K splits, then the reduce).
 * - `tiled` (kernels/matmul_tiled.ts): where `rows` does not serve over 48 rows (prefill
 *   chunks; QKV, o and down at 49–64 rows), f32 W, and below `rows`' range: QKV (wider than
 *   deep) from 22 rows (`WIDE_TILED_M`), o and down from 17 (`DEEP_TILED_M`). Register-blocked
 *   SGEMM tiles; up to 256 rows K may be split (then two dispatches).
 * - `naive` (kernels/matmul_naive.ts): the plain statement of the contract; serves M ≤ 64 with
 *   an awkward K.
 * - `q8` (kernels/matmul_q8.ts): int8 W from 17 rows: x quantized to int8 per row first
 *   (kernels/quant_x.ts, the norm folded in there), `dot4I8Packed` with i32 sums.
 *
 * Quantized W (kernels/quant.ts: int8, e4m3, the GGUF types) runs in `small` up to 16 rows
 * (the bytes are what bounds decode; int8 with x quantized per 16 k in the workgroup and
 * `dot4I8Packed` where the adapter has it, the other formats decoded in registers), then in `q8`
 * (int8, where the adapter has `dot4I8Packed`) or `tiled` (every format: decoded as it is
 * staged), and in `naive` where K does not fit `small`'s units.
 *
 * Each kernel has two optional fusions that save dispatches in a decoder layer:
 *
 * - RMSNorm folded in (`normWeight`, `eps`): `y = (x / rms(x) ⊙ normWeight) · Wᵀ`. Every
 *   workgroup reduces Σx² of its rows of x itself (`small`: all its threads, once).
 * - SwiGLU (`swiglu`): W is the gate/up matrix interleaved by `interleaveGateUp`
 *   (kernels/weight.ts) and `y[m, f] = silu(gate[m, f]) · up[m, f]`.
 *
 * The crossovers between kernels were measured on the H200 per call and in the bench:
 * docs/kernels.md, "Matmul: which kernel". Compare kernels and launch shapes with
 * `scripts/sweep_kernels.ts --m 1,8,32 --variants '[{}, {"path": "tiled"}]'`.
 */
import type { Gpu } from "../gpu/device.ts";
import { isFloatFormat, WDTYPE } from "../gpu/dtype.ts";
import { type Dispatch, grid } from "../gpu/dispatch.ts";
import { elementBytes, SWIGLU_BLOCK, type WeightBuffer } from "./weight.ts";
import { hasDot4, q8Dispatches, type Q8Tuning } from "./matmul_q8.ts";
import { type Measure, quantXDispatch } from "./quant_x.ts";
import { rowMultiple, scaleWords } from "./quant.ts";
import {
  at,
  ceil16,
  dummy,
  fail,
  type MatmulLaunch,
  matmulPipeline,
  type SplitDispatch,
} from "./matmul_common.ts";
import { smallDispatch, smallShape, type SmallTuning, unitWidth } from "./matmul_small.ts";
import { ROWS_WIDE, rowsDispatch, type RowsTuning } from "./matmul_rows.ts";
import { tiledDispatch, type TiledTuning } from "./matmul_tiled.ts";
import { naiveDispatch } from "./matmul_naive.ts";

/** Which kernel computes a matmul; see the module doc. */
export type MatmulPath = "small" | "rows" | "tiled" | "naive" | "q8";

/** Buffers of {@linkcode matmulDispatches}. */
export interface MatmulBuffers {
  /** `f32 [m, K]`. */
  x: GPUBuffer;
  /** `[N, K]`; with `swiglu`, `[2F, K]` gate/up rows laid out by `interleaveGateUp` (kernels/weight.ts). */
  w: WeightBuffer;
  /** `f32`, row i of the result at element `yOffset + i * yStride` (N or F columns). */
  y: GPUBuffer;
  /** Optional `f32`, one per row of W (`[2F]` in W's interleaved row order with `swiglu`). */
  bias?: GPUBuffer;
  /** Optional `f32 [K]`: normalise each row of x first (RMSNorm with these weights; set `eps`). */
  normWeight?: GPUBuffer;
  /**
   * The precision monitor's measurement of this product's input (kernels/quant_x.ts): folded
   * into `q8`'s quantization of x, or one more dispatch before the others.
   */
  measure?: Measure;
}

/** Shape of {@linkcode matmulDispatches}. */
export interface MatmulOptions {
  /** Rows of x (tokens). */
  m: number;
  /** Add the result into y instead of overwriting it (fuses the residual add). */
  accumulate?: boolean;
  /** RMSNorm epsilon (the model's `rms_norm_eps`); required with `normWeight`. */
  eps?: number;
  /** W is gate/up interleaved; y gets `silu(gate) · up`, F = W rows / 2 columns. */
  swiglu?: boolean;
  /** Block size of W's gate/up interleave (default `SWIGLU_BLOCK`, kernels/weight.ts). */
  swigluBlock?: number;
  /** Elements between rows of y (default N). */
  yStride?: number;
  /** Element index of y[0, 0] (default 0). */
  yOffset?: number;
  /** Force a kernel (tests and benchmarks); default {@linkcode matmulPath}. */
  path?: MatmulPath;
  /**
   * Override the `small` launch shape (benchmarks), merged over `smallTuning`'s, e.g.
   * `{ xq: false }` for int8 W decoded in registers against f32 x.
   */
  small?: Partial<SmallTuning>;
  /**
   * Override the `tiled` launch shape (benchmarks), merged over `tiledTuning`'s choice, e.g.
   * `{ bm: 128, bn: 128, tm: 8, tn: 8 }`.
   */
  tiled?: Partial<TiledTuning>;
  /** Override the `rows` launch shape (benchmarks, tests), merged over `rowsTuning`'s. */
  rows?: Partial<RowsTuning>;
  /** Override the `q8` launch shape (benchmarks, tests), merged over `q8Tuning`'s. */
  q8?: Partial<Q8Tuning>;
  /** Expand the kernels' `// @unroll` loops (default true; false to measure the plain loops). */
  unroll?: boolean;
}

/**
 * Rows of x from which products wider than deep (W has more rows than columns: QKV, gate/up,
 * the LM head) go to `tiled` even within `small`'s range (measured crossover at 21–22 rows).
 */
const WIDE_TILED_M = 22;

/**
 * Rows of x from which products no wider than deep (o, down) go to `tiled`: `small` takes a step
 * up after 16 rows (its third block of 8 rows) that `tiled`'s 32-row tiles do not. Measured with
 * 16-bit W only; f32 W follows the same rule.
 */
const DEEP_TILED_M = 17;

/**
 * Rows of x for which products at least {@linkcode ROWS_WIDE} times wider than deep (gate/up,
 * the LM head) with 16-bit W and K % 8 == 0 go to `rows`: from 12 rows, where the bench (not only
 * the per-call sweep, which had `rows` ahead from 8) gained, to 64.
 */
const ROWS_MIN_M = 12;
const ROWS_MAX_M = 64;
/**
 * Rows of x for which the products under {@linkcode ROWS_WIDE} times wider than deep (QKV, o,
 * down) go to `rows` too: from 25 rows (at 17–24 the sweep had `rows` ahead but the bench lost)
 * to 48.
 */
const ROWS_NARROW_MIN_M = 25;
const ROWS_NARROW_MAX_M = 48;

/**
 * Rows of x up to which quantized W runs in `small` (the bytes bound decode, and `small` reads
 * each byte once); from there `q8` (int8) or `tiled`.
 */
const QUANT_SMALL_MAX_M = 16;

/**
 * The kernel {@linkcode matmulDispatches} picks for `m` rows of x times `w` (`dot4`: whether the
 * adapter has `dot4I8Packed`; default: whether this Deno's WebGPU does).
 */
export function matmulPath(m: number, w: WeightBuffer, dot4 = hasDot4()): MatmulPath {
  if (!isFloatFormat(w.dtype)) {
    if (m > QUANT_SMALL_MAX_M) {
      return w.dtype === "int8" && dot4 && w.cols % 16 === 0 ? "q8" : "tiled";
    }
    return w.cols % unitWidth(w.dtype) === 0 ? "small" : "naive";
  }
  if (w.dtype !== "f32" && w.cols % 8 === 0) {
    if (m >= ROWS_MIN_M && m <= ROWS_MAX_M && w.rows >= ROWS_WIDE * w.cols) return "rows";
    if (m >= ROWS_NARROW_MIN_M && m <= ROWS_NARROW_MAX_M) return "rows";
  }
  if (m >= (w.rows > w.cols ? WIDE_TILED_M : DEEP_TILED_M)) return "tiled";
  return w.cols % unitWidth(w.dtype) === 0 ? "small" : "naive";
}

/**
 * Builds `y[i, n] (+)= Σ_k x[i, k] w[n, k] (+ bias[n])` for `m` rows: math in f32, any M ≥ 1,
 * N, K. With `normWeight`, x is RMS-normalised first; with `swiglu`, W holds interleaved gate/up
 * rows and `y[i, f] = silu(gate) · up`. Built once per shape; re-encode it every step.
 *
 * @throws Error when a buffer is too small, W exceeds the device's largest binding, the
 *   fusion options do not fit (no `eps` with `normWeight`, odd W rows with `swiglu`), or a
 *   `small` launch shape is invalid or over the device's workgroup limits.
 * @example
 * // o-projection with the residual add fused: h += attn · Woᵀ
 * const o = matmulDispatches(gpu, { x: attn, w: wo, y: h }, { m: 1, accumulate: true });
 * // the MLP's first half: act = silu(norm(x) · Wgᵀ) ⊙ (norm(x) · Wuᵀ)
 * const mlp = matmulDispatches(gpu, { x, w: gateUp, y: act, normWeight: mlpNorm }, {
 *   m: 1,
 *   eps: 1e-5,
 *   swiglu: true,
 * });
 * encode(pass, [...o, ...mlp]); // one dispatch each here; two when a launch splits K
 */
export function matmulDispatches(
  gpu: Gpu,
  buffers: MatmulBuffers,
  opts: MatmulOptions,
): Dispatch[] {
  if (buffers.w.parts) return partsDispatches(gpu, buffers, opts);
  const { x, w, y, normWeight } = buffers;
  const { m } = opts;
  const swiglu = opts.swiglu ?? false;
  const n = swiglu ? w.rows / 2 : w.rows, k = w.cols;
  const yStride = opts.yStride ?? n;
  const yOffset = opts.yOffset ?? 0;
  const path = opts.path ?? matmulPath(m, w);
  const block = opts.swigluBlock ?? SWIGLU_BLOCK;
  check(gpu, buffers, { m, n, k, yStride, yOffset, path, swiglu, block, eps: opts.eps });

  const flags = (buffers.bias ? 1 : 0) | (opts.accumulate ? 2 : 0);
  // q8 folds the norm into its quantization of x: the matmul and its reduce see normed x.
  const norm = normWeight !== undefined && path !== "q8";
  const label = `matmul ${path} ${m}x${n}x${k} ${w.dtype}${buffers.bias ? " +bias" : ""}` +
    (normWeight ? " +norm" : "") + (swiglu ? " swiglu" : "") + (opts.accumulate ? " +=" : "");
  const launch: MatmulLaunch = {
    label,
    x,
    w,
    y,
    bias: buffers.bias ?? dummy(gpu),
    normWeight,
    nw: normWeight ?? dummy(gpu),
    m,
    n,
    k,
    cols: swiglu ? 2 * n : n,
    swiglu,
    params: { m, n, k, yStride, yOffset, flags, eps: opts.eps ?? 0, block },
    constants: { WDTYPE: WDTYPE[w.dtype], NORM: norm ? 1 : 0, SWIGLU: swiglu ? 1 : 0 },
    unroll: opts.unroll,
  };
  const { measure } = buffers;
  if (path === "q8") {
    const q = q8Dispatches(gpu, launch, { tuning: opts.q8, measure });
    const tail = q.split ? [reduceDispatch(gpu, launch, q.dispatch.label, q.split)] : [];
    return [q.quant, q.dispatch, ...tail];
  }
  const small = path === "small" ? smallShape(gpu, launch, opts.small) : undefined;
  // The monitor's measurement, before the product, of the input as the product sees it (small's
  // xq: x rounded to int8 per 16 k).
  const measured = measure
    ? [quantXDispatch(gpu, { x, normWeight, ...measure }, {
      m,
      k,
      eps: opts.eps,
      unitCodes: small?.xq,
    })]
    : [];
  if (small) return [...measured, smallDispatch(gpu, launch, small)];
  if (path === "naive") return [...measured, naiveDispatch(gpu, launch)];
  const { dispatch, split } = path === "rows"
    ? rowsDispatch(gpu, launch, opts.rows)
    : tiledDispatch(gpu, launch, opts.tiled);
  const reduce = split ? [reduceDispatch(gpu, launch, dispatch.label, split)] : [];
  return [...measured, dispatch, ...reduce];
}

/** A W made of row blocks (`WeightBuffer.parts`): one matmul per block, into its columns of y. */
function partsDispatches(gpu: Gpu, b: MatmulBuffers, opts: MatmulOptions): Dispatch[] {
  const parts = b.w.parts!, rows = parts.reduce((n, p) => n + p.w.rows, 0);
  const where = `matmul ${opts.m}x${rows}x${b.w.cols} in ${parts.length} parts`;
  if (opts.swiglu) fail(where, "swiglu W cannot be made of parts");
  if (rows !== b.w.rows) fail(where, `the parts have ${rows} rows; W has ${b.w.rows}`);
  if (b.bias && parts.some((p) => !p.bias)) fail(where, "with a bias, every part needs its own");
  let r0 = 0;
  return parts.flatMap((p, i) => {
    const d = matmulDispatches(gpu, {
      ...b,
      w: p.w,
      bias: b.bias ? p.bias : undefined,
      measure: i === 0 ? b.measure : undefined,
    }, { ...opts, yStride: opts.yStride ?? rows, yOffset: (opts.yOffset ?? 0) + r0 });
    r0 += p.w.rows;
    return d;
  });
}

/**
 * kernels/matmul_reduce.wgsl: adds the K splits' partial sums and applies the epilogue, one
 * thread per output, from the main dispatch's uniform. It reads no tile constant, so one
 * pipeline per dtype and fusion serves the `tiled` and `rows` launches of every shape.
 */
function reduceDispatch(
  gpu: Gpu,
  launch: MatmulLaunch,
  main: string,
  split: SplitDispatch,
): Dispatch {
  const reduce = matmulPipeline(gpu, "matmul_reduce.wgsl", launch, { entryPoint: "reduce" });
  return {
    label: `${main} reduce`,
    pipeline: reduce,
    bindGroup: gpu.device.createBindGroup({
      layout: reduce.getBindGroupLayout(0),
      // what `reduce` uses
      entries: [at(0, split.u), at(3, launch.bias), at(5, launch.y), at(6, split.part)],
    }),
    workgroups: grid(Math.ceil((launch.m * launch.n) / 256)),
  };
}

interface Shape {
  m: number;
  /** Columns of y. */
  n: number;
  k: number;
  yStride: number;
  yOffset: number;
  path: MatmulPath;
  swiglu: boolean;
  block: number;
  eps?: number;
}

function check(gpu: Gpu, buffers: MatmulBuffers, s: Shape): void {
  const { x, w, y, bias, normWeight } = buffers;
  const where = `matmul ${s.m}x${s.n}x${s.k} ${w.dtype}`;
  if (!(s.m >= 1 && s.n >= 1 && s.k >= 1)) fail(where, "m, N and K must be >= 1");
  if (s.path === "small" && s.k % unitWidth(w.dtype) !== 0) {
    fail(where, `the small kernel needs K % ${unitWidth(w.dtype)} == 0`);
  }
  if (s.path === "rows" && (!isFloatFormat(w.dtype) || w.dtype === "f32" || s.k % 8 !== 0)) {
    fail(where, "the rows kernel needs 16-bit W and K % 8 == 0");
  }
  if (!isFloatFormat(w.dtype)) {
    const need = 4 * scaleWords(w.dtype, w.rows, s.k);
    if (s.k % rowMultiple(w.dtype) !== 0) {
      fail(where, `${w.dtype} rows must be a multiple of ${rowMultiple(w.dtype)} values`);
    }
    if (!w.scales || w.scales.size < need) {
      fail(where, `the scales hold ${w.scales?.size ?? 0} bytes; need ${need}`);
    }
  }
  if (s.swiglu && w.rows % 2 !== 0) fail(where, `swiglu needs gate/up rows; W has ${w.rows}`);
  if (s.swiglu && !(Number.isInteger(s.block) && s.block >= 1)) {
    fail(where, `swiglu block must be an integer >= 1; got ${s.block}`);
  }
  // The tiled kernel reads x, W and nw as 16-byte vectors: it needs the last one whole.
  const whole = (bytes: number) =>
    s.path === "tiled" || s.path === "rows" ? ceil16(bytes) : Math.ceil(bytes / 4) * 4;
  const wBytes = whole(w.rows * s.k * elementBytes(w.dtype));
  if (w.buffer.size < wBytes) fail(where, `W holds ${w.buffer.size} bytes; needs ${wBytes}`);
  if (wBytes > gpu.maxBinding) {
    fail(
      where,
      `W is ${wBytes} bytes, over the ${gpu.maxBinding}-byte binding limit; split it by rows`,
    );
  }
  const xBytes = whole(s.m * s.k * 4);
  if (x.size < xBytes) fail(where, `x holds ${x.size} bytes; needs ${xBytes}`);
  const yEnd = (s.yOffset + (s.m - 1) * s.yStride + s.n) * 4;
  if (s.yStride < s.n) fail(where, `yStride ${s.yStride} < N`);
  if (y.size < yEnd) fail(where, `y holds ${y.size} bytes; needs ${yEnd}`);
  if (bias && bias.size < w.rows * 4) {
    fail(where, `bias holds ${bias.size} bytes; needs ${w.rows * 4}`);
  }
  if (normWeight) {
    if (normWeight.size < whole(s.k * 4)) {
      fail(where, `normWeight holds ${normWeight.size} bytes; needs ${whole(s.k * 4)}`);
    }
    if (!(s.eps !== undefined && s.eps >= 0)) fail(where, "normWeight needs eps >= 0");
  }
}
