/**
 * Linear layers: `y[m, n] (+)= Σ_k x[m, k] W[n, k] (+ bias[n])` with W in the Hugging Face
 * `[out, in]` layout and any weight dtype, x and y f32. Three kernels, picked by shape:
 *
 * - `vec` (kernels/matmul_vec.wgsl): decode, M ≤ 8 and K a multiple of the vector width.
 *   Bandwidth bound: W read once in 16-byte loads, applied to every row of x. x is read from
 *   global memory (L1-cached): staging it in workgroup memory measured 0.3–0.9× on the H200.
 * - `tiled` (kernels/matmul.wgsl): prefill, M > 8. 64 × 64 output tiles, 4 × 4 per thread.
 * - `naive` (kernels/matmul_naive.wgsl): everything else (M ≤ 8 with an awkward K).
 *
 * H200 (Vulkan, f16 W, one dependent dispatch ≈ 2.6 µs included): vec M = 1 at 1.4–2.0 TB/s
 * for 2048–2560 × 2048 and 2048 × 5632, ~3 TB/s for 32000 × 2048; tiled 13–17 TFLOP/s at
 * M = 512. Sweep: .gpu/linear/bench.ts (not committed: .gpu/ is ignored).
 */
import { createStorage, type Gpu, writeBuffer } from "../engine/gpu.ts";
import { BYTES, type DType, encode, WDTYPE } from "../engine/dtype.ts";
import { bindGroup, type Dispatch, grid, params, pipeline, uniform } from "./dispatch.ts";

/** A weight tensor resident on the GPU: W[rows, cols] row-major, packed per docs/internals.md. */
export interface WeightBuffer {
  buffer: GPUBuffer;
  dtype: DType;
  rows: number;
  cols: number;
}

/** Shape and dtype of {@linkcode uploadWeight}. */
export interface UploadWeightOptions {
  rows: number;
  cols: number;
  dtype: DType;
}

/**
 * Encodes `values` (`[rows, cols]`, row-major) as `dtype` and uploads them into a new buffer
 * sized to a multiple of 16 bytes (what the vectorised kernels bind).
 *
 * @throws Error when `values` does not hold `rows * cols` numbers.
 * @example
 * const w = uploadWeight(gpu, values, { rows: 2048, cols: 2048, dtype: "bf16" });
 */
export function uploadWeight(
  gpu: Gpu,
  values: ArrayLike<number>,
  opts: UploadWeightOptions,
): WeightBuffer {
  const { rows, cols, dtype } = opts;
  if (values.length !== rows * cols) {
    throw new Error(`internal error: weight has ${values.length} values; [${rows}, ${cols}]?`);
  }
  const bytes = encode(values, dtype);
  const buffer = createStorage(gpu, bytes.byteLength, undefined, `weight ${rows}x${cols}`);
  writeBuffer(gpu, buffer, 0, bytes);
  return { buffer, dtype, rows, cols };
}

/** Which kernel computes a matmul; see the module doc. */
export type MatmulPath = "vec" | "tiled" | "naive";

/** Launch shape of the `vec` kernel (defaults come from {@linkcode vecTuning}). */
export interface VecTuning {
  /** Threads per row of W, splitting K (a power of two). */
  tpr: number;
  /** Rows of W per workgroup (the workgroup has tpr * rpw threads). */
  rpw: number;
  /** Units (16-byte loads) per thread per step: 1, 2 or 4. */
  unroll: number;
}

/** Launch shape of the `tiled` kernel (64 × 64 tiles of y, 4 × 4 per thread). */
export interface TiledTuning {
  /** K per step through workgroup memory (a multiple of 8). */
  bk: number;
}

/** Default `tiled` launch shape. */
export const TILED_TUNING: TiledTuning = { bk: 8 };

/** Buffers of {@linkcode matmulDispatch}. */
export interface MatmulBuffers {
  /** `f32 [m, K]`. */
  x: GPUBuffer;
  /** `[N, K]`. */
  w: WeightBuffer;
  /** `f32`, row i of the result at element `yOffset + i * yStride`. */
  y: GPUBuffer;
  /** Optional `f32 [N]`. */
  bias?: GPUBuffer;
}

/** Shape of {@linkcode matmulDispatch}. */
export interface MatmulOptions {
  /** Rows of x (tokens). */
  m: number;
  /** Add the result into y instead of overwriting it (fuses the residual add). */
  accumulate?: boolean;
  /** Elements between rows of y (default N). */
  yStride?: number;
  /** Element index of y[0, 0] (default 0). */
  yOffset?: number;
  /** Force a kernel (tests and benchmarks); default {@linkcode matmulPath}. */
  path?: MatmulPath;
  /** Override the `vec` launch shape (benchmarks). */
  vec?: Partial<VecTuning>;
  /** Override the `tiled` launch shape (benchmarks). */
  tiled?: Partial<TiledTuning>;
}

/** Largest M the `vec` kernel takes (its accumulators are unrolled per row). */
export const VEC_MAX_M = 8;

/** The kernel {@linkcode matmulDispatch} picks for `m` rows of x times `w`. */
export function matmulPath(m: number, w: WeightBuffer): MatmulPath {
  if (m > VEC_MAX_M) return "tiled";
  return w.cols % vecWidth(w.dtype) === 0 ? "vec" : "naive";
}

/** Weights per 16-byte load in the `vec` kernel. */
function vecWidth(dtype: DType): number {
  return dtype === "f32" ? 4 : 8;
}

/**
 * Default `vec` launch shape, from an H200 sweep (f16/bf16, K = 2048 and 5632): 64 threads per
 * row for the layer matrices, 16 for very tall W (the LM head: more rows than threads to fill)
 * and for several rows of x (more work per load). Workgroups of 64 threads measured the same as
 * 256 there and keep the reduction array small (llvmpipe compiles it slowly).
 */
export function vecTuning(m: number, w: WeightBuffer): VecTuning {
  const units = w.cols / vecWidth(w.dtype);
  const unroll = 4;
  let tpr = m > 4 ? 16 : m > 1 ? 32 : w.rows >= 16384 ? 16 : 64;
  while (tpr > 1 && tpr * unroll > units) tpr /= 2; // every thread gets at least one full step
  return { tpr, rpw: 64 / tpr, unroll };
}

const dummies = new WeakMap<GPUDevice, GPUBuffer>();

function dummy(gpu: Gpu): GPUBuffer {
  let d = dummies.get(gpu.device);
  if (!d) dummies.set(gpu.device, d = createStorage(gpu, 16, undefined, "matmul no bias"));
  return d;
}

/**
 * Builds `y[i, n] (+)= Σ_k x[i, k] w[n, k] (+ bias[n])` for `m` rows: math in f32, any M ≥ 1,
 * N, K. Built once per shape; re-encode it every step.
 *
 * @throws Error when a buffer is too small or W exceeds the device's largest binding.
 * @example
 * // o-projection with the residual add fused: h += attn · Woᵀ
 * const d = matmulDispatch(gpu, { x: attn, w: wo, y: h }, { m: 1, accumulate: true });
 */
export function matmulDispatch(gpu: Gpu, buffers: MatmulBuffers, opts: MatmulOptions): Dispatch {
  const { x, w, y } = buffers;
  const { m } = opts;
  const n = w.rows, k = w.cols;
  const yStride = opts.yStride ?? n;
  const yOffset = opts.yOffset ?? 0;
  const path = opts.path ?? matmulPath(m, w);
  check(gpu, buffers, { m, n, k, yStride, yOffset, path });

  const flags = (buffers.bias ? 1 : 0) | (opts.accumulate ? 2 : 0);
  const bias = buffers.bias ?? dummy(gpu);
  const label = `matmul ${path} ${m}x${n}x${k} ${w.dtype}${buffers.bias ? " +bias" : ""}` +
    (opts.accumulate ? " +=" : "");
  if (path === "vec") {
    const t = { ...vecTuning(m, w), ...opts.vec };
    const groups = grid(Math.ceil(n / t.rpw));
    const pipe = pipeline(gpu, "matmul_vec.wgsl", {
      constants: {
        WDTYPE: WDTYPE[w.dtype],
        K: k,
        MROWS: m,
        TPR: t.tpr,
        RPW: t.rpw,
        UNROLL: t.unroll,
      },
    });
    const u = uniform(gpu, params([n, groups[0], yStride, yOffset, flags]));
    // Exact sizes: the runtime arrays are vec4, and the buffers may be larger than the tensor.
    const xb = { buffer: x, size: m * k * 4 };
    const wb = { buffer: w.buffer, size: n * k * BYTES[w.dtype] };
    return {
      label,
      pipeline: pipe,
      bindGroup: bindGroup(gpu, pipe, [u, xb, wb, bias, y]),
      workgroups: groups,
    };
  }
  const tiled = path === "tiled";
  const count = tiled ? Math.ceil(m / 64) * Math.ceil(n / 64) : m * Math.ceil(n / 64);
  const groups = grid(count);
  const t = { ...TILED_TUNING, ...opts.tiled };
  const pipe = pipeline(gpu, tiled ? "matmul.wgsl" : "matmul_naive.wgsl", {
    constants: tiled
      ? {
        WDTYPE: WDTYPE[w.dtype],
        BK: t.bk,
        PAIRS: w.dtype !== "f32" && k % 2 === 0 ? 1 : 0,
      }
      : { WDTYPE: WDTYPE[w.dtype] },
  });
  const u = uniform(gpu, params([m, n, k, groups[0], yStride, yOffset, flags]));
  return {
    label,
    pipeline: pipe,
    bindGroup: bindGroup(gpu, pipe, [u, x, w.buffer, bias, y]),
    workgroups: groups,
  };
}

interface Shape {
  m: number;
  n: number;
  k: number;
  yStride: number;
  yOffset: number;
  path: MatmulPath;
}

function check(gpu: Gpu, buffers: MatmulBuffers, s: Shape): void {
  const { x, w, y, bias } = buffers;
  const fail = (what: string) => {
    throw new Error(`internal error: matmul ${s.m}x${s.n}x${s.k} ${w.dtype}: ${what}`);
  };
  if (!(s.m >= 1 && s.n >= 1 && s.k >= 1)) fail("m, N and K must be >= 1");
  if (s.path === "vec" && (s.m > VEC_MAX_M || s.k % vecWidth(w.dtype) !== 0)) {
    fail(`the vec kernel needs m <= ${VEC_MAX_M} and K % ${vecWidth(w.dtype)} == 0`);
  }
  const wBytes = Math.ceil((s.n * s.k * BYTES[w.dtype]) / 4) * 4;
  if (w.buffer.size < wBytes) fail(`W holds ${w.buffer.size} bytes; needs ${wBytes}`);
  if (wBytes > gpu.maxBinding) {
    fail(`W is ${wBytes} bytes, over the ${gpu.maxBinding}-byte binding limit; split it by rows`);
  }
  if (x.size < s.m * s.k * 4) fail(`x holds ${x.size} bytes; needs ${s.m * s.k * 4}`);
  const yEnd = (s.yOffset + (s.m - 1) * s.yStride + s.n) * 4;
  if (s.yStride < s.n) fail(`yStride ${s.yStride} < N`);
  if (y.size < yEnd) fail(`y holds ${y.size} bytes; needs ${yEnd}`);
  if (bias && bias.size < s.n * 4) fail(`bias holds ${bias.size} bytes; needs ${s.n * 4}`);
}
