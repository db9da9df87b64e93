/**
 * Linear layers: `y[m, n] (+)= Σ_k x[m, k] W[n, k] (+ bias[n])` with W in the Hugging Face
 * `[out, in]` layout and any weight dtype, x and y f32. Four kernels, picked by M and W's shape:
 *
 * - `small` (kernels/matmul_small.wgsl): decode batches, 1 ≤ M ≤ 16 for products no wider than
 *   deep, up to 21 rows for those wider (below 12 for those `rows` takes), any M when forced
 *   (`path`), K a multiple of 8 (16-bit W) or 4 (f32 W).
 *   Register-blocked: a thread holds 4 rows of W × rm rows of x (rm ≤ 8), so each 16-byte load
 *   of W is applied to rm rows of x from registers and each load of x to 4 rows of W. Many
 *   small tiles, K split over the threads of a workgroup and reduced in workgroup memory;
 *   launch shape from {@linkcode smallTuning}.
 * - `rows` (kernels/matmul_rows.wgsl): decode batches of 12–64 rows against 16-bit W at least
 *   4 times wider than deep (gate/up, the LM head), and of 25–48 rows against any other 16-bit W
 *   (QKV, o, down). A thread holds all rows of an 8-, 16-, 24- or 32-row tile for 4 or 8
 *   columns: each 16-byte load of W (from global memory, never staged) is widened once and
 *   applied to every row, whose x comes from workgroup memory as a broadcast. Always two
 *   dispatches (K splits, then the `tiled` kernel's `reduce`); launch shape from
 *   {@linkcode rowsTuning}.
 * - `tiled` (kernels/matmul.wgsl): where `rows` does not serve over 48 rows (prefill chunks;
 *   QKV, o and down at 49–64 rows), f32 W, and below `rows`' range: QKV (wider than deep) from
 *   22 rows (`WIDE_TILED_M`), o and down from 17 (`DEEP_TILED_M`). Classic SGEMM register
 *   blocking: a workgroup owns a bm × bn tile of y (up to 128 × 128), a thread a tm × tn block
 *   of it (up to 8 × 8: 64 multiply-adds per 4 vec4 reads of workgroup memory), K in steps of
 *   bk staged through workgroup memory with the next step's 16-byte global loads in flight in
 *   registers. Up to 256 rows K may be split over workgroups (partial sums in a scratch
 *   buffer, then a second dispatch, `reduce`, adds them and applies the epilogue), so
 *   {@linkcode matmulDispatches} returns one or two dispatches; launch shape from
 *   {@linkcode tiledTuning}.
 * - `naive` (kernels/matmul_naive.wgsl): the plain statement of the contract; serves M ≤ 64
 *   with an awkward K.
 *
 * Each kernel has two optional fusions that save dispatches in a decoder layer:
 *
 * - RMSNorm folded in (`normWeight`, `eps`): `y = (x / rms(x) ⊙ normWeight) · Wᵀ`. Every
 *   workgroup reduces Σx² of its rows of x itself (`small`: all its threads, once).
 * - SwiGLU (`swiglu`): W is the gate/up matrix interleaved by {@linkcode interleaveGateUp} and
 *   `y[m, f] = silu(gate[m, f]) · up[m, f]`.
 *
 * Why `small` exists (H200 through Vulkan, TinyLlama shapes, f16 W, measured on the kernels it
 * replaced, with a 4.35 TB/s read ceiling): the `vec` kernel (one row of W per group of
 * threads, x from L1) reached 0.68 TB/s for qkv with the norm folded in at M = 1 (each
 * 64-thread workgroup re-reduced Σx² over K for a single row of W) and 1.4–2.1 TB/s without;
 * at M = 8 it was 4× slower than at M = 1, bound by loads of x (two per row of x per unit of
 * W); the tiled kernel took 295–801 µs per projection at M = 32 (32–176 workgroups for 132 SMs,
 * each walking K with two barriers per 8-wide step).
 *
 * Why `tiled` is register-blocked (same GPU): its previous form (64 × 64 tiles, 4 × 4 per
 * thread, 8-wide K steps, loads element by element with a per-element f16 unpack, two
 * barriers per step) reached 11–17 TFLOP/s (about 11 in a 256-token prefill chunk of
 * TinyLlama, where the matmuls took 52 of 68 ms) against an f32 FMA peak of about 60; 4 × 4
 * per thread is bound by workgroup-memory bandwidth at about half of peak. The present form
 * reaches 17–35 TFLOP/s (see {@linkcode tiledTuning}): a 256-token chunk's matmuls take 23 ms
 * instead of 52. Sweep its launch shapes with `scripts/sweep_kernels.ts --m 256 --variants
 * '[{}, {"tiled": {"bm": 128, "bn": 128, "tm": 8, "tn": 8}}]'` (M ≤ 64 with `"path": "tiled"`:
 * there `small` stays ahead for every projection but gate/up at M = 64 and the LM head, whose
 * few-row tiles leave most of the GPU idle for N ≤ 2560).
 *
 * `small` on the same GPU (scripts/sweep_kernels.ts, 22 layers' weights per pass, warm clocks),
 * µs per call for qkv / o / gate-up / down / LM head: M = 1: 8.4 / 7.3 / 17.6 / 12.3 / 39.5
 * (1.2 / 1.2 / 2.6 / 1.9 / 3.3 TB/s); M = 8: 17.2 / 14.5 / 40.6 / 21.6 / 83.8; M = 32: 30.4 / 23.5
 * / 105 / 45.8 / 284 (with the rm rule of {@linkcode smallTuning}). The small matrices stay far
 * below the ceiling at M = 1: a call that reads 8 MB lasts about as long as launch and drain.
 */
import { createStorage, type Gpu, isCpuAdapter, writeBuffer } from "../gpu/device.ts";
import { BYTES, type DType, encode, WDTYPE } from "../gpu/dtype.ts";
import { bindGroup, type Dispatch, grid, params, uniform } from "../gpu/dispatch.ts";
import { pipeline, wgsl } from "./pipeline.ts";

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
 * `swiglu` matmuls read. 1: gate and up rows alternate, so the rows of W behind a run of
 * product columns (gate, up, gate, up, …) are adjacent: a `small` thread's 4 columns are 4
 * consecutive rows, a `tiled` tile's bn columns bn. The kernels take any block size
 * (`swigluBlock`).
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
export type MatmulPath = "small" | "rows" | "tiled" | "naive";

/**
 * Launch shape of the `small` kernel (defaults from {@linkcode smallTuning}). A workgroup has
 * `tk · tn · tm` threads and owns a tile of `rm · tm` rows of x by `4 · tn` product columns.
 */
export interface SmallTuning {
  /** Rows of x per thread (4 × rm accumulators): 1, 2, 4 or 8. */
  rm: number;
  /** Row groups per workgroup (a power of two); they share W through L1. */
  tm: number;
  /** Column groups of 4 per workgroup (a power of two); they share x through L1. */
  tn: number;
  /** Threads splitting K, unit by unit (a power of two ≥ rm). */
  tk: number;
  /** Units (16-byte loads of W) per column per loop iteration: 1, 2 or 4. */
  unroll: number;
  /**
   * Adjacent threads along a row of W (`KL`): 8 (a warp's load covers one 128-byte line of
   * each of its rows) or 16 (two lines); at most `tk` take effect.
   */
  kl: number;
}

/**
 * Launch shape of the `tiled` kernel (defaults from {@linkcode tiledTuning}). A workgroup has
 * `(bm / tm) · (bn / tn)` threads and owns a `bm × bn` tile of the product; each thread a
 * `tm × tn` block of it.
 */
export interface TiledTuning {
  /** Tile rows (rows of x): 16, 32, 64 or 128. */
  bm: number;
  /** Tile columns (product columns; gate and up both count with swiglu): 16, 32, 64 or 128. */
  bn: number;
  /** Rows per thread: 4 or 8. */
  tm: number;
  /** Columns per thread: 4 or 8. */
  tn: number;
  /** K per step through workgroup memory: 8, 16 or 32. */
  bk: number;
  /** Workgroup buffers per tile: 2 (one barrier per step) or 1 (two, half the memory). */
  bufs: number;
  /**
   * K splits (1: none). With more, each workgroup walks a slice of K (whole steps of bk)
   * and writes its partial products to a scratch buffer; a second dispatch adds the slices
   * up and applies the epilogue. For few-row products, where the tiles alone do not fill the
   * GPU.
   */
  splits: number;
}

/** Buffers of {@linkcode matmulDispatches}. */
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
  /** Block size of W's gate/up interleave (default {@linkcode SWIGLU_BLOCK}). */
  swigluBlock?: number;
  /** Elements between rows of y (default N). */
  yStride?: number;
  /** Element index of y[0, 0] (default 0). */
  yOffset?: number;
  /** Force a kernel (tests and benchmarks); default {@linkcode matmulPath}. */
  path?: MatmulPath;
  /** Override the `small` launch shape (benchmarks). */
  small?: Partial<SmallTuning>;
  /**
   * Override the `tiled` launch shape (benchmarks), merged over {@linkcode tiledTuning}'s
   * choice, e.g. `{ bm: 128, bn: 128, tm: 8, tn: 8 }`.
   */
  tiled?: Partial<TiledTuning>;
  /** Override the `rows` launch shape (benchmarks, tests), merged over {@linkcode rowsTuning}'s. */
  rows?: Partial<RowsTuning>;
}

/** Rows up to which `tiled` uses its decode-batch tiles (see {@linkcode tiledTuning}). */
const DECODE_TILE_M = 64;

/**
 * Rows of x from which products wider than deep (W has more rows than columns: QKV, gate/up,
 * the LM head) go to `tiled` even within `small`'s range. H200, TinyLlama f16, µs per call,
 * `small` vs `tiled` (K split as {@linkcode tiledTuning} says): at M = 24, QKV 28.8 vs 27.5,
 * gate/up 102 vs 75.7, LM head 203 vs 180; at M = 16 `small` is ahead (19.0 vs 27.3, 58.3 vs
 * 75.2, 151 vs 178); at M = 32: 30.2 vs 27.3, 105 vs 75.7, 283 vs 168. QKV again, 2026-12-01
 * (`scripts/sweep_kernels.ts --m 12,14,16,17,18,20,22,24,...`): M = 17 / 18 / 20 25.4 / 26.1 /
 * 26.7 vs 27.1–27.2, M = 22 29.0 vs 27.3.
 */
const WIDE_TILED_M = 22;

/**
 * Rows of x from which products no wider than deep (o, down) go to `tiled`: `small` takes a step
 * up after 16 rows (its third block of 8 rows) that `tiled`'s 32-row tiles do not. H200,
 * TinyLlama f16, µs per call, `small` vs `tiled`, same sweep: o at M = 16 16.9 vs 20.6, M = 17 /
 * 20 / 24 25.2 / 25.3 / 25.7 vs 20.8 / 21.0 / 20.7, M = 28 / 32 21.6 / 21.7 vs 21.1 / 21.9; down
 * at M = 16 26.8 vs 37.7, M = 17 / 20 / 24 44.6 / 43.9 / 44.8 vs 38.0 / 38.1 / 38.1, M = 28 /
 * 32 39.5 / 39.9 vs 38.4 / 38.6; earlier, at M = 33 / 48 / 64 (`tiled` in 8 splits, see
 * {@linkcode tiledTuning}): o 33.6 / 34.7 / 32.6 vs 29.1 / 28.9 / 29.3, down 64.2 / 67.4 / 70.0
 * vs 62.7 / 62.5 / 62.8 (`small` steps up again at 56: 39.2, 75.0). In the engine's step the
 * gain is larger than these calls say: batch 32 4.87 → 4.50 ms per step in one pass, the bench
 * +9–13 % at batches 17–32 (BENCHMARKS.md, a1e3973). Measured with 16-bit W only; f32 W follows
 * the same rule.
 */
const DEEP_TILED_M = 17;

/**
 * Rows of x for which products at least {@linkcode ROWS_WIDE} times wider than deep (gate/up,
 * the LM head) with 16-bit W and K % 8 == 0 go to `rows`. H200, TinyLlama f16, µs per call with
 * norm (and SwiGLU) folded, its `reduce` included (scripts/sweep_kernels.ts, 22 layers' weights
 * per pass), against what served them before (`small` up to 23 rows, then `tiled`): gate/up at
 * M = 16 39.8 (`small` 57.9), M = 32 67.9 (`tiled` 75.9); the LM head at M = 16 105 (149), M =
 * 32 162 (168). At M = 8 the sweep had `rows` ahead too (gate/up 29.7 against 33.6), but in the
 * engine's step the batch-8 step took 2 510 µs against 2 442 (the bench's profile, one pass), so
 * `rows` starts at 12 rows, about where the sweep's lines cross. The bench, alternating builds in
 * one session (tok/s, without → with `rows`): batch 8 3 208–3 210 → 3 204–3 208, 12 3 456–3 463 →
 * 3 619–3 624, 16 4 479–4 481 → 4 767–4 770, 32 6 365–6 366 → 6 436–6 447; in another, rows up to
 * 16 → up to 32: batch 20 3 596–3 598 → 3 982, 24 4 582–4 583 → 4 525–4 533 (the one loss), 28
 * 5 393–5 400 → 5 480–5 485, 32 6 366–6 374 → 6 474–6 484.
 * QKV, o and down (1.25 and fewer times wider than deep, or deeper) were as fast or faster in
 * `small` and `tiled` up to 32 rows. From 33 to 64 rows (the tunings at {@linkcode rowsTuning}),
 * against `tiled` in two row tiles, 2026-12-01: gate/up 89.3 / 89.3 / 114 / 115 µs at M = 40 /
 * 48 / 56 / 64 (`tiled` 130–134), the LM head 230 / 233 / 290 / 292 (322–325). With QKV's rule
 * below, the bench (two alternations, tok/s, up to 32 rows → up to 64): batch 40 5 456–5 467 →
 * 6 445–6 458, 48 6 509–6 517 → 7 720–7 738, 56 7 419–7 427 → 7 873–7 880, 64 8 390–8 401 → 8
 * 887–8 893; batches 1, 8 and 32 unchanged (BENCHMARKS.md).
 */
const ROWS_MIN_M = 12;
const ROWS_MAX_M = 64;
/**
 * Rows of x for which the products under {@linkcode ROWS_WIDE} times wider than deep (QKV, o,
 * down) go to `rows` too (tunings at {@linkcode rowsTuning}). QKV first, at 33–48 rows in 16-row
 * tiles split 4 ways: at M = 40 / 48 29.2 / 29.7 µs against `tiled`'s 38.9 / 39.2 (at 56 and 64
 * 38.0 / 38.2 against 39.3 / 39.8). o and down followed once `rows` split K 8 ways, 2026-12-01:
 * at M = 40–48 o 24.1 and down 46.5 µs in two 24-row tiles against `tiled`'s 29.1–29.2 and
 * 62.6–62.8; at M = 32 QKV 25.7, o 19.7, down 36.9 in two 16-row tiles against 27.5, 22.0, 38.5.
 * The bench (two alternations, tok/s, `small` / `tiled` → `rows` for the three): batch 28 6 137
 * → 6 167–6 178, 32 6 933 → 6 963–6 993, 40 6 405–6 406 → 6 835–6 861, 48 7 652–7 675 → 8 198–8
 * 223. At 17–24 rows the sweep had `rows` ahead too (a 24-row tile: QKV 24.2–24.7 against
 * 25.7–27.3, o 17.2–17.6 against 21.0, down 30.1–30.6 against 38.0–38.3), but the bench lost
 * (batch 17 4 302 → 4 200–4 213, 20 4 980 → 4 900–4 907, 24 unchanged), so they start at 25.
 * `tiled` in one 64 × 128 tile of 8 × 8 for o and down (8 splits: 27.4–27.6, 56.1–56.3 at 40–64
 * rows) read −0.7 % at batches 40 and 48 in the bench, +0.7 % at 56 and 64: not kept.
 */
const ROWS_NARROW_MIN_M = 25;
const ROWS_NARROW_MAX_M = 48;
/** How much wider than deep (rows of W per column) a product must be for `rows`. */
const ROWS_WIDE = 4;

/**
 * Launch shape of the `rows` kernel (kernels/matmul_rows.wgsl): a workgroup of `kl · cg`
 * threads owns `r` rows of x by `cw · cg` product columns; `kl` threads split each 8 `kl`-wide
 * stage of K; `splits` workgroups split K (the `reduce` dispatch adds them up).
 */
export interface RowsTuning {
  /** Threads along K per column group: 4 or 8. */
  kl: number;
  /** Column groups (`cw` product columns each) per workgroup: at least `r / 2`. */
  cg: number;
  /** Product columns per thread: 4 (default) or 8 (each x read from workgroup memory serves 8). */
  cw?: number;
  /** Rows of x per tile: 8, 16, 24 or 32. */
  r: number;
  /** K splits (≥ 1). */
  splits: number;
}

/** {@linkcode rowsTuning}'s shape on CPU adapters: 16 threads, little workgroup memory. */
const ROWS_CPU: RowsTuning = { kl: 4, cg: 4, r: 8, splits: 1 };

/**
 * Default `rows` launch shape for `m` rows of x into `cols` product columns, `k` deep. H200,
 * TinyLlama f16 (scripts/sweep_kernels.ts with norm and SwiGLU folded, µs per call with the
 * reduce):
 *
 * - M ≤ 8 (only when forced: see `ROWS_MIN_M`): 8 rows, 8 lanes × 8 column groups, 2 splits:
 *   gate/up 29.7, LM head 73.2 (16-row tiles: 38.7 and 98.3).
 * - M ≤ 16: 16 rows, 4 lanes × 16 column groups, 4 splits: gate/up 39.8, LM head 105 (8-row
 *   tiles: 48.3–51.7 and 119–129; 32-row tiles 74.4 and 185).
 * - M ≤ 24: gate/up in 8-row tiles of 8 columns per thread (`cw` 8), 4 × 16, 2 splits:
 *   47.4–47.9 µs at M = 20–24 (one 24-row tile of 4 columns per thread in 4 splits, before:
 *   53.6–54.6; of 8 columns: 109–110, apparently spilling its 192 accumulators; 2 splits
 *   60.7–61.3, 1 split 69.6–70.3; two 16-row tiles before that: 66.9–67.2); the LM head in one
 *   24-row tile, 4 × 32, unsplit: 122.6–124.1 (2 splits 126.4–129.0; 8-row tiles of 8 columns
 *   141–144; a 32-row tile before: 155.6–158.9).
 * - M ≤ 32: gate/up in tiles of 16 rows, 4 × 16, 2 splits: 67.9 (4 splits 71.1, 32-row tiles
 *   77.3, 8-row tiles 79.3–88.7); the LM head (over 8 times wider than deep) in tiles of 32 rows,
 *   4 × 32, 2 splits: 162 (16-row tiles 185–186). With 8 columns per thread the sweep read
 *   gate/up 63.5–64.0 (16-row tiles, 4 splits) and the LM head 150.5–151.8 (16 rows, 2 splits)
 *   at M = 28–32, but the bench lost 1.3 % at batches 28 and 32 with both, so not here.
 * - M ≤ 48, three 16-row tiles of 8 columns per thread, 4 × 16 (× 32 for the LM head): gate/up
 *   in 2 splits 71.6–72.0 at M = 33–48 (unsplit 81.1–82.1; 4 columns per thread unsplit, before:
 *   88.3–89.3, 2 splits 91.1, 4 92.8, 32-row tiles 113–140; two 24-row tiles 90.7–91.4 at M =
 *   36–48, and in the bench, with QKV and the LM head in them too, batches 40 and 48 lost 6 %),
 *   the LM head unsplit 208–212.5 (2 splits 211–215.5; 4 columns 228–232, 32-row tiles 289–299);
 *   QKV 4 splits 29.7 (2: 34.4, 1: 58.8; 8 columns 29.1, o and down 2× slower with them).
 * - M ≤ 64: as at M ≤ 48, in four 16-row tiles: gate/up 107.5–108.2 at M = 56–64 (unsplit
 *   128.8–128.9, 4 splits 113.6–114.3; 32-row tiles of 4 columns, before: 2 splits 114 at M = 56,
 *   unsplit 141; 16-row tiles of 4 columns 123–127), the LM head 262.9–264.9 (4 splits 303–312;
 *   before: 32-row tiles of 4 columns, unsplit 290, 2 splits 302, 16-row tiles 299–318). The
 *   bench: batches 56 and 64 +2.2–2.3 %.
 * - QKV, o and down (under 4 times wider than deep; `rows` from 25 rows, see
 *   `ROWS_NARROW_MIN_M`) in 8 K splits: two 16-row tiles at M ≤ 32 (QKV 25.7, o 19.7, down
 *   36.9; one 32-row tile 31.3, 22.4, 41.7; one 24-row tile at M ≤ 24, only when forced: 24.2–24.7,
 *   17.2–17.6, 30.1–30.6, where 16 splits took 27.7–29.0, 19.1–19.5, 30.4–31.1), and at M ≤ 48
 *   QKV in three 16-row tiles split 4 (29.4–29.7; 8 splits 32.9–33.0), o and down in two 24-row
 *   tiles (24.1, 46.5; three 16-row tiles 24.3–24.5, 48.8–49.0).
 *
 * 16 lanes were slower everywhere (a probe of the kernel without the fusions, not kept).
 */
export function rowsTuning(gpu: Gpu, opts: { m: number; cols: number; k: number }): RowsTuning {
  if (isCpuAdapter(gpu)) return ROWS_CPU;
  if (opts.m <= 8) return { kl: 8, cg: 8, r: 8, splits: 2 };
  if (opts.m <= 16) return { kl: 4, cg: 16, r: 16, splits: 4 };
  const head = opts.cols > 8 * opts.k;
  if (opts.cols < ROWS_WIDE * opts.k) { // QKV, o, down
    if (opts.m <= 24) return { kl: 4, cg: 16, r: 24, splits: 8 };
    if (opts.m <= 32) return { kl: 4, cg: 16, r: 16, splits: 8 };
    if (opts.m <= 48) {
      const qkv = opts.cols > opts.k;
      return qkv ? { kl: 4, cg: 16, r: 16, splits: 4 } : { kl: 4, cg: 16, r: 24, splits: 8 };
    }
  }
  if (opts.m <= 24) {
    return head ? { kl: 4, cg: 32, r: 24, splits: 1 } : { kl: 4, cg: 16, r: 8, cw: 8, splits: 2 };
  }
  if (opts.m <= 32) {
    return head ? { kl: 4, cg: 32, r: 32, splits: 2 } : { kl: 4, cg: 16, r: 16, splits: 2 };
  }
  if (opts.m <= 64) {
    return head
      ? { kl: 4, cg: 32, r: 16, cw: 8, splits: 1 }
      : { kl: 4, cg: 16, r: 16, cw: 8, splits: 2 };
  }
  return { kl: 4, cg: 32, r: 32, splits: head ? 1 : 2 }; // over 64 rows: only when forced
}

/** The kernel {@linkcode matmulDispatches} picks for `m` rows of x times `w`. */
export function matmulPath(m: number, w: WeightBuffer): MatmulPath {
  if (w.dtype !== "f32" && w.cols % 8 === 0) {
    if (m >= ROWS_MIN_M && m <= ROWS_MAX_M && w.rows >= ROWS_WIDE * w.cols) return "rows";
    if (m >= ROWS_NARROW_MIN_M && m <= ROWS_NARROW_MAX_M) return "rows";
  }
  if (m >= (w.rows > w.cols ? WIDE_TILED_M : DEEP_TILED_M)) return "tiled";
  return w.cols % unitWidth(w.dtype) === 0 ? "small" : "naive";
}

/** Weights per 16-byte load of W ("unit") in the `small` kernel. */
function unitWidth(dtype: DType): number {
  return dtype === "f32" ? 4 : 8;
}

/**
 * Threads a `small` launch aims for: the H200 has 132 SMs, and a thread of an estimated ~100
 * registers leaves room for ~512 resident per SM (64K registers). For small M that is also the memory parallelism:
 * 65536 threads × 4 loads of 16 bytes = 4 MB in flight ≈ 4 TB/s × 1 µs of DRAM latency.
 */
const SMALL_THREADS = 65536;
/** Threads per `small` workgroup: one vec4 of workgroup memory each (llvmpipe GL: ≤ 256). */
const SMALL_GROUP = 256;

const pow2ceil = (v: number) => 2 ** Math.max(0, Math.ceil(Math.log2(v)));
const pow2floor = (v: number) => 2 ** Math.max(0, Math.floor(Math.log2(v)));

/** Shape of {@linkcode smallTuning}. */
export interface SmallTuningOptions {
  /** Rows of x. */
  m: number;
  /** Columns of the product: N, or 2F with swiglu (gate and up both count). */
  cols: number;
  /** SwiGLU (gate/up) product. */
  swiglu?: boolean;
}

/**
 * Default `small` launch shape for `m` rows of x times `w` (its K and dtype) into `cols`
 * product columns, from first principles (tune on the GPU with the `small` option):
 *
 * - rm: up to 8 rows of x per thread (4 × 8 accumulators; more spills registers), 4 when the
 *   product is wider than W is deep (measured; see the end of this function). Each unit of
 *   W feeds 4·rm (16-bit: 8·rm) multiply-adds per 16-byte load.
 * - tk: a launch has ≈ ⌈m / rm⌉ · cols / 4 · tk threads whatever the tile, so tk is what
 *   brings it to {@linkcode smallThreads} (at least rm; at most K's units / unroll, so every
 *   lane has a full iteration).
 * - tm, tn: with tk fixed, a workgroup of 256 threads has a fixed tile area; its shape sets the
 *   L2 → SM traffic per multiply-add, 4 bytes of x / (4·tn) + bytes of W / (rm·tm), minimised
 *   (ties go to the smaller tm). E.g. TinyLlama, f16, M = 32: o (N = 2048) tk 32 and 8 × 32
 *   tiles (tm 1, tn 8): 256 workgroups; gate/up (2F = 11264) tk 8 and 16 × 64 tiles (tm 2,
 *   tn 16): 352 workgroups. M = 1: o tk 128, tn 2 (256 workgroups); LM head tk 16, tn 16.
 * - unroll: two units per column in flight (and per loop trip, which costs ~30 ns on an H200)
 *   for rm ≤ 4 and for rm = 8 when it stays 8; one when rm = 8 is narrowed to 4, which measured
 *   slower with two (H200, TinyLlama f16, M = 32, µs: qkv 30 → 40, LM head 283 → 324; o 23.5 →
 *   21.8 and down 45.4 → 39.9 with two at rm = 8; unroll 4 was no better anywhere).
 * - kl: 16 threads along each row of W for gate/up, 8 otherwise. H200, TinyLlama f16, µs,
 *   8 vs 16: gate/up 17.8 → 16.9 at M = 1, 18.9 → 18.2 at 2, 35.7 → 33.7 at 8; QKV, o and down
 *   within 0.3 either way from 1 to 32 rows; the LM head slower from M = 4 (62.7 → 65.8, 82.4 →
 *   86.1 at 8), though faster at 2 (51.8 → 46.9).
 */
export function smallTuning(w: WeightBuffer, opts: SmallTuningOptions): SmallTuning {
  const { m, cols } = opts;
  const rm = Math.min(8, pow2ceil(m));
  const unroll = rm <= 4 ? 2 : 1;
  const rowTiles = Math.ceil(m / rm);
  const units = w.cols / unitWidth(w.dtype);
  const most = Math.min(SMALL_GROUP, pow2floor(Math.max(1, units / unroll)));
  const threads = smallThreads(m, w.cols, cols);
  const tk = Math.max(rm, Math.min(most, pow2ceil((4 * threads) / (cols * rowTiles))));
  const colGroups = pow2ceil(Math.ceil(cols / 4));
  let best = { tm: 1, tn: 1, cost: Infinity };
  for (let tm = 1; tm <= pow2ceil(rowTiles) && tk * tm <= SMALL_GROUP; tm *= 2) {
    const tn = Math.max(1, Math.min(SMALL_GROUP / (tk * tm), colGroups));
    const cost = 4 / (4 * tn) + BYTES[w.dtype] / (rm * tm);
    if (cost < best.cost * (1 - 1e-9)) best = { tm, tn, cost };
  }
  // Wider than deep (QKV, gate/up, LM head): 4 rows of x per thread, the rest as sized for 8.
  // H200, TinyLlama f16, warm clocks (scripts/sweep_kernels.ts): at M = 32, qkv 44 → 30 µs,
  // gate/up 140 → 105 µs, LM head 313 → 284 µs; o and down (N ≤ K) were faster with 8
  // (24 vs 28 µs, 46 vs 57 µs), as were all five at M = 1.
  const narrow = rm === 8 && cols > w.cols ? 4 : rm;
  const kl = opts.swiglu ? 16 : 8;
  return { rm: narrow, tm: best.tm, tn: best.tn, tk, unroll: narrow === 8 ? 2 : unroll, kl };
}

/**
 * Threads a `small` launch aims for: {@linkcode SMALL_THREADS}, with two measured exceptions
 * (H200, TinyLlama f16, µs per call, scripts/sweep_kernels.ts, against ½ and 2× as many):
 *
 * - twice as many for a single row times a deep W (K > N: down at M = 1, 12.3 → 10.6): its few
 *   columns give few column groups, and more K lanes keep more loads in flight;
 * - half as many from 8 rows for products wider than deep by at most 8× (QKV and gate/up, which
 *   go to `tiled` from 24 rows): M = 8, 17.1 → 13.9 and 40.3 → 35.8; M = 16, 21.5 → 18.9 and
 *   65.0 → 57.9. The LM head (16× wider) was slower with half (82.7 → 106 at M = 8), as were QKV
 *   and gate/up at M = 4 taken together (15.1 → 12.4 but 22.4 → 26.7).
 */
function smallThreads(m: number, k: number, cols: number): number {
  if (m === 1 && k > cols) return 2 * SMALL_THREADS;
  if (m >= 8 && cols > k && cols <= 8 * k) return SMALL_THREADS / 2;
  return SMALL_THREADS;
}

/** Shape of {@linkcode tiledTuning}. */
export interface TiledTuningOptions {
  /** Rows of x. */
  m: number;
  /** Columns of the product: N, or 2F with swiglu (gate and up both count). */
  cols: number;
  /** Columns of W (the depth K). */
  k: number;
  /** RMSNorm folded in. */
  norm?: boolean;
  /** SwiGLU (gate/up) product. */
  swiglu?: boolean;
}

/**
 * `tiled` candidates, most work per thread and per byte staged first: 8 × 8 per thread does 64
 * multiply-adds per 4 vec4 read from workgroup memory, 8 × 4 32 per 3, 4 × 4 16 per 2; a
 * 64 × 128 tile stages 4·64 + 2·128 bytes of x and f16 W per k for 8192 multiply-adds, a
 * 128 × 128 tile 768 bytes for 16384.
 */
const TILED_SHAPES: Pick<TiledTuning, "bm" | "bn" | "tm" | "tn">[] = [
  { bm: 128, bn: 128, tm: 8, tn: 8 }, // 256 threads
  { bm: 64, bn: 128, tm: 8, tn: 8 }, // 128
  { bm: 64, bn: 64, tm: 8, tn: 8 }, // 64
  { bm: 64, bn: 64, tm: 8, tn: 4 }, // 128
  { bm: 64, bn: 64, tm: 4, tn: 4 }, // 256
  { bm: 32, bn: 64, tm: 4, tn: 4 }, // 128
];

/**
 * Threads a `tiled` launch aims for: one warp per SM sub-partition (4 per SM) on 128 of the
 * H200's 132 SMs; fewer leave sub-partitions with no warp to issue from. An 8 × 8 thread's 64
 * independent accumulators hide latency within its warp, where a 4 × 4 thread needs more warps
 * beside it, so larger blocks per thread come first while the launch still fills the GPU
 * (a guess from the GPU's shape; the sweep in {@linkcode tiledTuning} found it best or close).
 */
const TILED_THREADS = 16384;
/** Workgroups a `tiled` launch aims for: about one per SM. */
const TILED_GROUPS = 128;

/**
 * `tiled` launch shape on CPU adapters, whatever the shape: 4.3 KB of workgroup memory, as
 * the kernel's earlier 64 × 64 form had. llvmpipe through GL compiles the larger shapes for
 * seconds to minutes each (see kernels/matmul.wgsl), and lavapipe allows only 32 KiB.
 */
const TILED_CPU: TiledTuning = { bm: 64, bn: 64, tm: 4, tn: 4, bk: 8, bufs: 1, splits: 1 };

/**
 * Default `tiled` launch shape for `m` rows of x into `cols` product columns, `k` deep. CPU
 * adapters get {@linkcode TILED_CPU}. On GPUs, measured special cases come first (H200,
 * TinyLlama f16, µs per call):
 *
 * - M ≤ 64 (the products of decode batches that go to `tiled`, see `matmulPath`): 32 × 64
 *   tiles of 4 × 4 for QKV and gate/up; 32 × 128 tiles of 4 × 8 for the LM head (more than 8×
 *   wider than deep) and the products without a norm (o, down), K split the power of two
 *   nearest 256 / tiles ways. At M = 32 / 64: LM head 168 / 325 (unsplit; 181 / 346 in 2
 *   splits) against 219 / 367 in 32 × 64 (32 × 128 of 8 × 8: 213 / 405; K steps of 8 or 32
 *   slower); at M = 33 / 48 / 64, o 29.1 / 28.9 / 29.3 and down 62.7 / 62.5 / 62.8 in 8 splits
 *   (16: 33.1 / 34.2 / 33.9 and 66.2 / 66.3 / 66.7) against `small`'s 33.6 / 34.7 / 32.6 and
 *   64.2 / 67.4 / 70.0; QKV and gate/up were slower in 32 × 128 (31.0 / 49.1 and 89.1 / 159
 *   against 27.6 / 43.0 and 76.2 / 136 at M = 32 / 64). From 33 rows (two row tiles) QKV is
 *   split by its column tiles alone (8 ways, as at 32 rows: 39.0 / 39.2 / 39.6 µs at M = 33 /
 *   48 / 64 against 42.4 / 42.6 / 43.1 in the 4 the general rule gives) and gate/up 4 ways
 *   (129 / 131 / 134 against 134 / 136 / 136 unsplit; 2: 137–141, 8: 134–143).
 * - A normed product without SwiGLU (QKV): the same 32 × 64 tiles of 4 × 4 up to 256 rows (M = 256: 135 against 160 with the general rule's choice); above, 64 × 128
 *   tiles of 8 × 8, K steps of 8, 4 splits (M = 384 / 512: 151 / 182 against 197 / 266 in
 *   32 × 64 tiles and 169 / 270 unsplit).
 * - SwiGLU (gate/up) up to 256 rows: 64 × 128 tiles of 8 × 8, K steps of 8 (384 against 492 at
 *   M = 256); above 384 rows the same in 2 splits (M = 512: 727 against 832 in the general
 *   rule's 128 × 128 tiles, 767 unsplit; at 384 the 128 × 128 tiles stay ahead, 515 vs 533).
 *
 * Otherwise the first of {@linkcode TILED_SHAPES} whose launch has at least
 * {@linkcode TILED_THREADS} threads in {@linkcode TILED_GROUPS} workgroups, else the last (the
 * most threads); K steps of 16 (8 for 128 × 128 tiles), two buffers (one where two do not
 * fit). E.g. TinyLlama at M = 256: o and down 64 × 64 of 8 × 4; at M = 512: o and down
 * 64 × 128 of 8 × 8, gate/up 128 × 128.
 *
 * Then, unless a special case set it, K is split when M ≤ {@linkcode SPLIT_MAX_M}: into the
 * power of two nearest to {@linkcode SPLIT_GROUPS} / tiles, each split at least
 * {@linkcode SPLIT_MIN_STEPS} steps. Few-row launches have too few tiles to fill the GPU. H200, TinyLlama f16, µs, split against
 * unsplit (scripts/sweep_kernels.ts): M = 32: QKV (8 splits) 27.3 vs 80.7 (`small`: 30.2),
 * gate/up (2) 75.7 vs 99.8; M = 64: QKV (4) 42.8 vs 78.3 (`small`: 57.6); M = 128: QKV 75.8 vs
 * 101, o 57.0 vs 79.2, gate/up 207 vs 268, down 148 vs 227; M = 256: o 81.2 vs 91.0, down 202
 * vs 251. K steps of 8 or 32 instead of 16 were slower at M = 32–64 (gate/up 110 and 116).
 *
 * Measured on the H200 (scripts/sweep_kernels.ts, TinyLlama f16, TFLOP/s of f32 FMA; the
 * best of 6–8 shapes tried unless noted): M = 256: qkv 19.9, o 23.6, gate/up 30.7, down 23.5,
 * LM head 34.5; M = 512: qkv 22.8, o 29.9, gate/up 31.8, down 31.6, LM head 35.0 (31.0 with K
 * steps of 16). The previous 64 × 64 / 4 × 4 kernel reached 11–17. What bounds it: with no
 * global loads, no staging stores and no barrier (an ablation, wrong results) gate/up at
 * M = 512 took 592 instead of 834 µs, 40 TFLOP/s: the workgroup-memory reads and multiply-adds
 * alone reach about 60 % of the f32 peak.
 */
export function tiledTuning(gpu: Gpu, opts: TiledTuningOptions): TiledTuning {
  if (isCpuAdapter(gpu)) return TILED_CPU;
  const t = tiledShape(gpu, opts);
  const steps = Math.ceil(opts.k / t.bk);
  const most = Math.max(1, Math.floor(steps / SPLIT_MIN_STEPS));
  if (t.splits > 0) return { ...t, splits: Math.min(t.splits, most) };
  if (opts.m > SPLIT_MAX_M) return { ...t, splits: 1 };
  const tiles = Math.ceil(opts.m / t.bm) * Math.ceil(opts.cols / t.bn);
  return { ...t, splits: Math.min(pow2round(SPLIT_GROUPS / tiles), most) };
}

/** Workgroups a split launch aims for (about 3 per SM of an H200); see {@linkcode tiledTuning}. */
const SPLIT_GROUPS = 384;
/**
 * Rows of x up to which a launch may split K. Each split writes and the reduce reads M × N
 * partial sums: at M = 384 and 512 the splits measured slower (gate/up 514 → 570 µs at 384, o
 * 144 → 157 and down 374 → 388 at 512).
 */
const SPLIT_MAX_M = 256;
/** K steps a split walks at least. */
const SPLIT_MIN_STEPS = 4;

const pow2round = (v: number) => 2 ** Math.max(0, Math.round(Math.log2(v)));

/** {@linkcode tiledTuning}'s tile on GPUs; `splits` 0 leaves the K split to the rule. */
function tiledShape(gpu: Gpu, opts: TiledTuningOptions): TiledTuning {
  const { m, cols } = opts;
  const wide = { bm: 64, bn: 128, tm: 8, tn: 8, bk: 8, bufs: 2 };
  // Decode batches: 32-row tiles; 128 columns of 4 x 8 for the LM head (over 8x wider than
  // deep) and the products without a norm (o, down), 64 of 4 x 4 for QKV and gate/up.
  if (m <= DECODE_TILE_M && (!opts.norm || cols > 8 * opts.k)) {
    const tiles = Math.ceil(m / 32) * Math.ceil(cols / 128);
    return { bm: 32, bn: 128, tm: 4, tn: 8, bk: 16, bufs: 2, splits: pow2round(256 / tiles) };
  }
  if (m <= DECODE_TILE_M || (opts.norm && !opts.swiglu && m <= SPLIT_MAX_M)) {
    // Two row tiles (33-64 rows): split as for one, by the column tiles (gate/up: 4 ways).
    const two = m > 32 && m <= DECODE_TILE_M;
    const splits = two ? (opts.swiglu ? 4 : pow2round(SPLIT_GROUPS / Math.ceil(cols / 64))) : 0;
    return { bm: 32, bn: 64, tm: 4, tn: 4, bk: 16, bufs: 2, splits };
  }
  if (opts.norm && !opts.swiglu) return { ...wide, splits: 4 };
  if (opts.swiglu && m <= SPLIT_MAX_M) return { ...wide, splits: 0 };
  if (opts.swiglu && m > 384) return { ...wide, splits: 2 }; // 384 measured: see the doc above
  const launch = (s: (typeof TILED_SHAPES)[number]) => {
    const groups = Math.ceil(m / s.bm) * Math.ceil(cols / s.bn);
    return { groups, threads: groups * (s.bm / s.tm) * (s.bn / s.tn) };
  };
  const fits = TILED_SHAPES.find((s) => {
    const l = launch(s);
    return l.threads >= TILED_THREADS && l.groups >= TILED_GROUPS;
  });
  const shape = fits ?? TILED_SHAPES[TILED_SHAPES.length - 1];
  const t = { ...shape, bk: shape.bm === 128 && shape.bn === 128 ? 8 : 16, bufs: 2, splits: 0 };
  return tiledBytes(t) <= gpu.maxWorkgroupStorage ? t : { ...t, bufs: 1 };
}

/** Workgroup memory of a `tiled` launch: the staged x and W tiles, k-rows padded by 4 floats. */
function tiledBytes(t: TiledTuning): number {
  return t.bufs * t.bk * (t.bm + 4 + t.bn + 4) * 4;
}

const dummies = new WeakMap<GPUDevice, GPUBuffer>();

function dummy(gpu: Gpu): GPUBuffer {
  let d = dummies.get(gpu.device);
  if (!d) dummies.set(gpu.device, d = createStorage(gpu, 16, undefined, "matmul no bias"));
  return d;
}

const scratches = new WeakMap<GPUDevice, GPUBuffer>();

/**
 * The split-K partial sums' buffer, one per device, grown to `bytes` when a launch needs more
 * (launches built earlier keep the smaller one). Sharing is safe: every launch writes it before
 * its reduce reads it, and dispatches that use the same buffer read-write run in order.
 */
function scratch(gpu: Gpu, bytes: number): GPUBuffer {
  let b = scratches.get(gpu.device);
  if (!b || b.size < bytes) {
    scratches.set(gpu.device, b = createStorage(gpu, bytes, undefined, "matmul split-K"));
  }
  return b;
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
 * encode(pass, [...o, ...mlp]); // one dispatch each here; two when a tiled launch splits K
 */
export function matmulDispatches(
  gpu: Gpu,
  buffers: MatmulBuffers,
  opts: MatmulOptions,
): Dispatch[] {
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
  const cols = swiglu ? 2 * n : n; // columns of the product (gate and up both count)
  if (path === "small") {
    const t = { ...smallTuning(w, { m, cols, swiglu }), ...opts.small };
    checkSmall(gpu, label, t);
    const groups = grid(Math.ceil(m / (t.rm * t.tm)) * Math.ceil(cols / (4 * t.tn)));
    const pipe = pipeline(gpu, "matmul_small.wgsl", {
      prelude: wgsl("matmul_common.wgsl"),
      constants: {
        WDTYPE: WDTYPE[w.dtype],
        K: k,
        RM: t.rm,
        TM: t.tm,
        TN: t.tn,
        TK: t.tk,
        UNROLL: t.unroll,
        KL: t.kl,
        ...fusion,
      },
    });
    const u = uniform(gpu, params([m, n, groups[0], yStride, yOffset, flags, eps, block]));
    // Exact sizes: the runtime arrays are vec4, and the buffers may be larger than the tensor.
    const xb = { buffer: x, size: m * k * 4 };
    const wb = { buffer: w.buffer, size: w.rows * k * BYTES[w.dtype] };
    const nwb = normWeight ? { buffer: normWeight, size: k * 4 } : nw;
    return [{
      label,
      pipeline: pipe,
      bindGroup: bindGroup(gpu, pipe, [u, xb, wb, bias, nwb, y]),
      workgroups: groups,
    }];
  }
  if (path === "rows") {
    const t = { ...rowsTuning(gpu, { m, cols, k }), ...opts.rows };
    checkRows(gpu, label, t);
    const { kspan, splits } = splitK(gpu, { m, cols, k, step: 8 * t.kl, splits: t.splits });
    const cw = t.cw ?? 4;
    const groups = grid(Math.ceil(m / t.r) * Math.ceil(cols / (cw * t.cg)) * splits);
    const constants = { WDTYPE: WDTYPE[w.dtype], KL: t.kl, CG: t.cg, R: t.r, CW: cw, ...fusion };
    const prelude = wgsl("matmul_common.wgsl");
    const pipe = pipeline(gpu, "matmul_rows.wgsl", { prelude, constants });
    // The same Params as matmul.wgsl: its `reduce` finishes from the same uniform.
    const u = uniform(
      gpu,
      params([m, n, k, groups[0], yStride, yOffset, flags, eps, block, kspan, splits]),
    );
    const part = scratch(gpu, splits * m * (cols + 1) * 4);
    const shape = `${t.r} rows ${t.kl}x${t.cg}` + (cw === 8 ? "x8" : "") +
      (splits > 1 ? ` split ${splits}` : "");
    const entries = [
      at(0, u),
      { binding: 1, resource: { buffer: x, size: ceil16(m * k * 4) } },
      { binding: 2, resource: { buffer: w.buffer, size: ceil16(w.rows * k * BYTES[w.dtype]) } },
      // nw is bound either way (the layout counts it when NORM is off).
      {
        binding: 4,
        resource: normWeight ? { buffer: normWeight, size: ceil16(k * 4) } : { buffer: nw },
      },
      at(6, part),
    ];
    return [
      {
        label: `${label} ${shape}`,
        pipeline: pipe,
        bindGroup: gpu.device.createBindGroup({ layout: pipe.getBindGroupLayout(0), entries }),
        workgroups: groups,
      },
      reduceDispatch(gpu, `${label} ${shape} reduce`, {
        wdtype: w.dtype,
        fusion,
        u,
        bias,
        y,
        part,
        m,
        n,
      }),
    ];
  }
  if (path === "tiled") {
    const t = {
      ...tiledTuning(gpu, { m, cols, k, norm: !!normWeight, swiglu: !!opts.swiglu }),
      ...opts.tiled,
    };
    checkTiled(gpu, label, t, w.dtype);
    const { kspan, splits } = splitK(gpu, { m, cols, k, step: t.bk, splits: t.splits });
    const tiles = Math.ceil(m / t.bm) * Math.ceil(cols / t.bn);
    const groups = grid(tiles * splits);
    const constants = {
      WDTYPE: WDTYPE[w.dtype],
      BM: t.bm,
      BN: t.bn,
      TM: t.tm,
      TN: t.tn,
      BK: t.bk,
      BUFS: t.bufs,
      ALIGNED: k % t.bk === 0 ? 1 : 0,
      SPLIT: splits > 1 ? 1 : 0,
      ...fusion,
    };
    const prelude = wgsl("matmul_common.wgsl");
    const pipe = pipeline(gpu, "matmul.wgsl", { prelude, constants });
    const u = uniform(
      gpu,
      params([m, n, k, groups[0], yStride, yOffset, flags, eps, block, kspan, splits]),
    );
    // x, W and nw are bound as arrays of 16-byte vectors: whole vectors, rounded up.
    const xb = { buffer: x, size: ceil16(m * k * 4) };
    const wb = { buffer: w.buffer, size: ceil16(w.rows * k * BYTES[w.dtype]) };
    const nwb = normWeight ? { buffer: normWeight, size: ceil16(k * 4) } : nw;
    const shape = `${t.bm}x${t.bn}/${t.tm}x${t.tn}` + (splits > 1 ? ` split ${splits}` : "");
    const part = scratch(gpu, splits > 1 ? splits * m * (cols + 1) * 4 : 16); // bound either way
    const main: Dispatch = {
      label: `${label} ${shape}`,
      pipeline: pipe,
      bindGroup: bindGroup(gpu, pipe, [u, xb, wb, bias, nwb, y, part]),
      workgroups: groups,
    };
    if (splits === 1) return [main];
    const finish = { wdtype: w.dtype, fusion, u, bias, y, part, m, n };
    return [main, reduceDispatch(gpu, `${label} ${shape} reduce`, finish)];
  }
  const groups = grid(m * Math.ceil(n / 64));
  const pipe = pipeline(gpu, "matmul_naive.wgsl", {
    prelude: wgsl("matmul_common.wgsl"),
    constants: { WDTYPE: WDTYPE[w.dtype], ...fusion },
  });
  const u = uniform(gpu, params([m, n, k, groups[0], yStride, yOffset, flags, eps, block]));
  return [{
    label,
    pipeline: pipe,
    bindGroup: bindGroup(gpu, pipe, [u, x, w.buffer, bias, nw, y]),
    workgroups: groups,
  }];
}

const ceil16 = (bytes: number) => Math.ceil(bytes / 16) * 16;

/**
 * K per split (`kspan`, whole steps of `step`) and the split count for a launch that asks for
 * `splits`: the last split may be shorter, none is empty, and the partial sums
 * (`splits · m · (cols + 1)` floats) must fit one binding.
 */
function splitK(
  gpu: Gpu,
  o: { m: number; cols: number; k: number; step: number; splits: number },
): { kspan: number; splits: number } {
  const steps = Math.ceil(o.k / o.step);
  const fit = Math.floor(gpu.maxBinding / (o.m * (o.cols + 1) * 4));
  const kspan = Math.ceil(steps / Math.max(1, Math.min(o.splits, steps, fit))) * o.step;
  return { kspan, splits: Math.ceil(o.k / kspan) };
}

/**
 * matmul.wgsl's `reduce`: adds the K splits' partial sums in `part` and applies the epilogue,
 * one thread per output, from the main dispatch's uniform `u`. It reads no tile constant, so one
 * pipeline per dtype and fusion serves the `tiled` and `rows` launches of every shape.
 */
function reduceDispatch(
  gpu: Gpu,
  label: string,
  o: {
    wdtype: DType;
    fusion: Record<string, number>;
    u: GPUBuffer;
    bias: GPUBuffer;
    y: GPUBuffer;
    part: GPUBuffer;
    m: number;
    n: number;
  },
): Dispatch {
  const reduce = pipeline(gpu, "matmul.wgsl", {
    prelude: wgsl("matmul_common.wgsl"),
    constants: { WDTYPE: WDTYPE[o.wdtype], SPLIT: 1, ...o.fusion },
    entryPoint: "reduce",
  });
  return {
    label,
    pipeline: reduce,
    bindGroup: gpu.device.createBindGroup({
      layout: reduce.getBindGroupLayout(0),
      entries: [at(0, o.u), at(3, o.bias), at(5, o.y), at(6, o.part)], // what `reduce` uses
    }),
    workgroups: grid(Math.ceil((o.m * o.n) / 256)),
  };
}

/** A bind group entry: `buffer`, whole, at `binding`. */
const at = (binding: number, buffer: GPUBuffer) => ({ binding, resource: { buffer } });

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
  if (s.path === "small" && s.k % unitWidth(w.dtype) !== 0) {
    fail(where, `the small kernel needs K % ${unitWidth(w.dtype)} == 0`);
  }
  if (s.path === "rows" && (w.dtype === "f32" || s.k % 8 !== 0)) {
    fail(where, "the rows kernel needs 16-bit W and K % 8 == 0");
  }
  if (s.swiglu && w.rows % 2 !== 0) fail(where, `swiglu needs gate/up rows; W has ${w.rows}`);
  if (s.swiglu && !(Number.isInteger(s.block) && s.block >= 1)) {
    fail(where, `swiglu block must be an integer >= 1; got ${s.block}`);
  }
  // The tiled kernel reads x, W and nw as 16-byte vectors: it needs the last one whole.
  const whole = (bytes: number) =>
    s.path === "tiled" || s.path === "rows" ? ceil16(bytes) : Math.ceil(bytes / 4) * 4;
  const wBytes = whole(w.rows * s.k * BYTES[w.dtype]);
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

const isPow2 = (v: number) => Number.isInteger(v) && v >= 1 && (v & (v - 1)) === 0;

function checkSmall(gpu: Gpu, label: string, t: SmallTuning): void {
  const threads = t.tk * t.tn * t.tm;
  const bytes = threads * 16 + t.rm * t.tm * 4; // the reduction array and the 1 / rms factors
  if (![1, 2, 4, 8].includes(t.rm)) fail(label, `small rm must be 1, 2, 4 or 8; got ${t.rm}`);
  if (!isPow2(t.tk) || t.tk < t.rm) {
    fail(label, `small tk must be a power of two >= rm (${t.rm}); got ${t.tk}`);
  }
  if (!isPow2(t.tn) || !isPow2(t.tm)) {
    fail(label, `small tn and tm must be powers of two; got ${t.tn} and ${t.tm}`);
  }
  if (![1, 2, 4].includes(t.unroll)) fail(label, `small unroll must be 1, 2 or 4; got ${t.unroll}`);
  if (t.kl !== 8 && t.kl !== 16) fail(label, `small kl must be 8 or 16; got ${t.kl}`);
  checkWorkgroup(gpu, label, "small", threads, bytes);
}

function checkTiled(gpu: Gpu, label: string, t: TiledTuning, dtype: DType): void {
  const sizes = [16, 32, 64, 128];
  if (!sizes.includes(t.bm) || !sizes.includes(t.bn)) {
    fail(label, `tiled bm and bn must be 16, 32, 64 or 128; got ${t.bm} and ${t.bn}`);
  }
  if (![4, 8].includes(t.tm) || ![4, 8].includes(t.tn)) {
    fail(label, `tiled tm and tn must be 4 or 8; got ${t.tm} and ${t.tn}`);
  }
  if (![8, 16, 32].includes(t.bk)) fail(label, `tiled bk must be 8, 16 or 32; got ${t.bk}`);
  if (t.bufs !== 1 && t.bufs !== 2) fail(label, `tiled bufs must be 1 or 2; got ${t.bufs}`);
  if (!(Number.isInteger(t.splits) && t.splits >= 1)) {
    fail(label, `tiled splits must be an integer >= 1; got ${t.splits}`);
  }
  const threads = (t.bm / t.tm) * (t.bn / t.tn);
  // 16-byte loads per thread and step: the kernel keeps at most 4 of x and 4 of W in flight.
  const xLoads = Math.ceil((t.bm * t.bk) / 4 / threads);
  const wLoads = Math.ceil((t.bn * t.bk) / (16 / BYTES[dtype]) / threads);
  if (xLoads > 4 || wLoads > 4) {
    fail(
      label,
      `tiled ${t.bm}x${t.bn}, bk ${t.bk} needs ${xLoads} loads of x and ${wLoads} of W per ` +
        `thread and step; at most 4 each (a smaller bk, tm or tn)`,
    );
  }
  checkWorkgroup(gpu, label, "tiled", threads, tiledBytes(t));
}

function checkRows(gpu: Gpu, label: string, t: RowsTuning): void {
  if (![4, 8].includes(t.kl)) fail(label, `rows kl must be 4 or 8; got ${t.kl}`);
  if (![4, 8].includes(t.cw ?? 4)) fail(label, `rows cw must be 4 or 8; got ${t.cw}`);
  if (![8, 16, 24, 32].includes(t.r)) {
    fail(label, `rows r must be 8, 16, 24 or 32; got ${t.r}`);
  }
  // A stage's x tile (r rows x 8 kl k) is staged by the kl cg threads, at most 4 vec4 each.
  if (!(isPow2(t.cg) && t.cg >= t.r / 2)) {
    fail(label, `rows cg must be a power of two >= r / 2; got ${t.cg}`);
  }
  if (!(Number.isInteger(t.splits) && t.splits >= 1)) {
    fail(label, `rows splits must be an integer >= 1; got ${t.splits}`);
  }
  const ls = 8 * (t.r / 4 + 1) + 1;
  checkWorkgroup(gpu, label, "rows", t.kl * t.cg, Math.max(2 * t.kl * ls, 4 * t.cg * t.kl) * 16);
}

/** Fails when a `kernel` workgroup of `threads` threads and `bytes` of memory is over the device's. */
function checkWorkgroup(
  gpu: Gpu,
  label: string,
  kernel: string,
  threads: number,
  bytes: number,
): void {
  const L = gpu.device.limits;
  const most = Math.min(L.maxComputeInvocationsPerWorkgroup, L.maxComputeWorkgroupSizeX);
  if (threads > most || bytes > gpu.maxWorkgroupStorage) {
    fail(
      label,
      `${kernel} workgroup of ${threads} threads and ${bytes} bytes is over the device's ` +
        `${most} threads / ${gpu.maxWorkgroupStorage} bytes`,
    );
  }
}
