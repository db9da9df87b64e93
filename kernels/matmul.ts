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
 * Each kernel has two optional fusions that save dispatches in a decoder layer:
 *
 * - RMSNorm folded in (`normWeight`, `eps`): `y = (x / rms(x) ⊙ normWeight) · Wᵀ`. Every
 *   workgroup reduces Σx² of its rows of x itself (K floats per row: cheap next to W).
 * - SwiGLU (`swiglu`): W is the gate/up matrix interleaved by {@linkcode interleaveGateUp} and
 *   `y[m, f] = silu(gate[m, f]) · up[m, f]`.
 *
 * H200 (Vulkan, f16 W, one dependent dispatch ≈ 2.6 µs included): vec M = 1 at 1.4–2.0 TB/s
 * for 2048–2560 × 2048 and 2048 × 5632, ~3 TB/s for 32000 × 2048; tiled 13–17 TFLOP/s at
 * M = 512. Sweep: .gpu/linear/bench.ts (not committed: .gpu/ is ignored).
 */
import { createStorage, type Gpu, writeBuffer } from "../engine/gpu.ts";
import { BYTES, type DType, encode, WDTYPE } from "../engine/dtype.ts";
import { bindGroup, type Dispatch, grid, params, pipeline, uniform, wgsl } from "./dispatch.ts";

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

/**
 * Gate/up rows per block of the interleaved layout ({@linkcode interleaveGateUp}) that
 * `swiglu` matmuls read. 1: gate and up rows alternate, so the two rows of a pair are adjacent
 * (one contiguous read per pair in the `vec` kernel; a 64-row tile of the `tiled` kernel holds
 * 32 whole pairs). The kernels take any block size (`swigluBlock`).
 */
export const SWIGLU_BLOCK = 1;

/** Shape of {@linkcode interleaveGateUp}: each of gate and up is `[rows, cols]`. */
export interface InterleaveGateUpOptions {
  /** Rows of gate and of up (the intermediate size F). */
  rows: number;
  /** Columns (the hidden size K). */
  cols: number;
  dtype: DType;
  /** Rows per block (default {@linkcode SWIGLU_BLOCK}). */
  block?: number;
}

/**
 * Interleaves the raw bytes of `gate` and `up` (each `[F, K]` of `dtype`, row-major, as in
 * safetensors) into the `[2F, K]` layout of `swiglu` matmuls: block b holds gate rows
 * `[bB, bB + B)` followed by the same up rows, B = `block`; the last block is partial when
 * B does not divide F (`F mod B` gate rows, then as many up rows). With B = 1: gate 0, up 0,
 * gate 1, up 1, …. Apply it to a `[2F]` bias too (`cols: 1, dtype: "f32"`).
 *
 * @returns `2F·K` elements of `dtype`, padded with zeros to a multiple of 4 bytes.
 * @throws Error when an input holds fewer than `F·K` elements.
 * @example
 * const bytes = interleaveGateUp(gate, up, { rows: 5632, cols: 2048, dtype: "bf16" });
 * writeBuffer(gpu, buffer, 0, bytes);
 */
export function interleaveGateUp(
  gate: Uint8Array,
  up: Uint8Array,
  opts: InterleaveGateUpOptions,
): Uint8Array<ArrayBuffer> {
  const { rows, cols, dtype } = opts;
  const block = opts.block ?? SWIGLU_BLOCK;
  const rowBytes = cols * BYTES[dtype];
  const bytes = rows * rowBytes;
  if (gate.byteLength < bytes || up.byteLength < bytes) {
    throw new Error(
      `internal error: gate/up of [${rows}, ${cols}] ${dtype} need ${bytes} bytes each; ` +
        `got ${gate.byteLength} and ${up.byteLength}`,
    );
  }
  const out = new Uint8Array(Math.ceil((2 * bytes) / 4) * 4);
  for (let r0 = 0; r0 < rows; r0 += block) {
    const part = Math.min(block, rows - r0) * rowBytes; // bytes of this block's gate rows
    out.set(gate.subarray(r0 * rowBytes, r0 * rowBytes + part), 2 * r0 * rowBytes);
    out.set(up.subarray(r0 * rowBytes, r0 * rowBytes + part), 2 * r0 * rowBytes + part);
  }
  return out;
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
  /** `[N, K]`; with `swiglu`, `[2F, K]` gate/up rows laid out by {@linkcode interleaveGateUp}. */
  w: WeightBuffer;
  /** `f32`, row i of the result at element `yOffset + i * yStride` (N or F columns). */
  y: GPUBuffer;
  /** Optional `f32`, one per row of W (`[2F]` in W's interleaved row order with `swiglu`). */
  bias?: GPUBuffer;
  /** Optional `f32 [K]`: normalise each row of x first (RMSNorm with these weights; set `eps`). */
  normWeight?: GPUBuffer;
}

/** Shape of {@linkcode matmulDispatch}. */
export interface MatmulOptions {
  /** Rows of x (tokens). */
  m: number;
  /** Add the result into y instead of overwriting it (fuses the residual add). */
  accumulate?: boolean;
  /** RMSNorm epsilon (the model's `rms_norm_eps`); required with `normWeight`. */
  eps?: number;
  /** W is gate/up interleaved; y gets `silu(gate) · up`, F = W rows / 2 columns. */
  swiglu?: boolean;
  /** Block size of W's gate/up interleave (default {@linkcode SWIGLU_BLOCK}). */
  swigluBlock?: number;
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
 * N, K. With `normWeight`, x is RMS-normalised first; with `swiglu`, W holds interleaved gate/up
 * rows and `y[i, f] = silu(gate) · up`. Built once per shape; re-encode it every step.
 *
 * @throws Error when a buffer is too small, W exceeds the device's largest binding, or the
 *   fusion options do not fit (no `eps` with `normWeight`, odd W rows with `swiglu`).
 * @example
 * // o-projection with the residual add fused: h += attn · Woᵀ
 * const d = matmulDispatch(gpu, { x: attn, w: wo, y: h }, { m: 1, accumulate: true });
 * // the MLP's first half: act = silu(norm(x) · Wgᵀ) ⊙ (norm(x) · Wuᵀ)
 * const mlp = matmulDispatch(gpu, { x, w: gateUp, y: act, normWeight: mlpNorm }, {
 *   m: 1,
 *   eps: 1e-5,
 *   swiglu: true,
 * });
 */
export function matmulDispatch(gpu: Gpu, buffers: MatmulBuffers, opts: MatmulOptions): Dispatch {
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
  const bias = buffers.bias ?? dummy(gpu);
  const nw = normWeight ?? dummy(gpu);
  const eps = { f: opts.eps ?? 0 };
  const fusion = { NORM: normWeight ? 1 : 0, SWIGLU: swiglu ? 1 : 0 };
  const label = `matmul ${path} ${m}x${n}x${k} ${w.dtype}${buffers.bias ? " +bias" : ""}` +
    (normWeight ? " +norm" : "") + (swiglu ? " swiglu" : "") + (opts.accumulate ? " +=" : "");
  if (path === "vec") {
    const t = { ...vecTuning(m, w), ...opts.vec };
    if (swiglu && opts.vec?.rpw === undefined && t.rpw % 2) t.rpw *= 2; // whole gate/up pairs
    if (swiglu && t.rpw % 2) fail(label, `swiglu needs an even rows-per-workgroup; got ${t.rpw}`);
    const groups = grid(Math.ceil(n / (swiglu ? t.rpw / 2 : t.rpw)));
    const pipe = pipeline(gpu, "matmul_vec.wgsl", {
      prelude: wgsl("matmul_common.wgsl"),
      constants: {
        WDTYPE: WDTYPE[w.dtype],
        K: k,
        MROWS: m,
        TPR: t.tpr,
        RPW: t.rpw,
        UNROLL: t.unroll,
        ...fusion,
      },
    });
    const u = uniform(gpu, params([n, groups[0], yStride, yOffset, flags, eps, block]));
    // Exact sizes: the runtime arrays are vec4, and the buffers may be larger than the tensor.
    const xb = { buffer: x, size: m * k * 4 };
    const wb = { buffer: w.buffer, size: w.rows * k * BYTES[w.dtype] };
    const nwb = normWeight ? { buffer: normWeight, size: k * 4 } : nw;
    return {
      label,
      pipeline: pipe,
      bindGroup: bindGroup(gpu, pipe, [u, xb, wb, bias, nwb, y]),
      workgroups: groups,
    };
  }
  const tiled = path === "tiled";
  const cols = swiglu ? 2 * n : n; // columns of the product (gate and up both count)
  const count = tiled ? Math.ceil(m / 64) * Math.ceil(cols / 64) : m * Math.ceil(n / 64);
  const groups = grid(count);
  const t = { ...TILED_TUNING, ...opts.tiled };
  const pipe = pipeline(gpu, tiled ? "matmul.wgsl" : "matmul_naive.wgsl", {
    prelude: wgsl("matmul_common.wgsl"),
    constants: tiled
      ? {
        WDTYPE: WDTYPE[w.dtype],
        BK: t.bk,
        PAIRS: w.dtype !== "f32" && k % 2 === 0 ? 1 : 0,
        ...fusion,
      }
      : { WDTYPE: WDTYPE[w.dtype], ...fusion },
  });
  const u = uniform(gpu, params([m, n, k, groups[0], yStride, yOffset, flags, eps, block]));
  return {
    label,
    pipeline: pipe,
    bindGroup: bindGroup(gpu, pipe, [u, x, w.buffer, bias, nw, y]),
    workgroups: groups,
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

function fail(label: string, what: string): never {
  throw new Error(`internal error: ${label}: ${what}`);
}

function check(gpu: Gpu, buffers: MatmulBuffers, s: Shape): void {
  const { x, w, y, bias, normWeight } = buffers;
  const where = `matmul ${s.m}x${s.n}x${s.k} ${w.dtype}`;
  if (!(s.m >= 1 && s.n >= 1 && s.k >= 1)) fail(where, "m, N and K must be >= 1");
  if (s.path === "vec" && (s.m > VEC_MAX_M || s.k % vecWidth(w.dtype) !== 0)) {
    fail(where, `the vec kernel needs m <= ${VEC_MAX_M} and K % ${vecWidth(w.dtype)} == 0`);
  }
  if (s.swiglu && w.rows % 2 !== 0) fail(where, `swiglu needs gate/up rows; W has ${w.rows}`);
  if (s.swiglu && !(Number.isInteger(s.block) && s.block >= 1)) {
    fail(where, `swiglu block must be an integer >= 1; got ${s.block}`);
  }
  const wBytes = Math.ceil((w.rows * s.k * BYTES[w.dtype]) / 4) * 4;
  if (w.buffer.size < wBytes) fail(where, `W holds ${w.buffer.size} bytes; needs ${wBytes}`);
  if (wBytes > gpu.maxBinding) {
    fail(
      where,
      `W is ${wBytes} bytes, over the ${gpu.maxBinding}-byte binding limit; split it by rows`,
    );
  }
  if (x.size < s.m * s.k * 4) fail(where, `x holds ${x.size} bytes; needs ${s.m * s.k * 4}`);
  const yEnd = (s.yOffset + (s.m - 1) * s.yStride + s.n) * 4;
  if (s.yStride < s.n) fail(where, `yStride ${s.yStride} < N`);
  if (y.size < yEnd) fail(where, `y holds ${y.size} bytes; needs ${yEnd}`);
  if (bias && bias.size < w.rows * 4) {
    fail(where, `bias holds ${bias.size} bytes; needs ${w.rows * 4}`);
  }
  if (normWeight) {
    if (normWeight.size < s.k * 4) {
      fail(where, `normWeight holds ${normWeight.size} bytes; needs ${s.k * 4}`);
    }
    if (!(s.eps !== undefined && s.eps >= 0)) fail(where, "normWeight needs eps >= 0");
  }
}
