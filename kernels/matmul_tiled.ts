/**
 * The `tiled` matmul (kernels/matmul.wgsl): classic SGEMM register blocking for prefill chunks
 * and the decode batches `small` and `rows` do not serve. A workgroup owns a bm × bn tile of y (up
 * to 128 × 128), a thread a tm × tn block of it (up to 8 × 8: 64 multiply-adds per 4 vec4 reads
 * of workgroup memory; 4 × 4 is bound by workgroup-memory bandwidth at about half the FMA peak),
 * K in steps of bk staged through workgroup memory with the next step's 16-byte global loads in
 * flight in registers. Up to 256 rows K may be split over workgroups (partial sums in a scratch
 * buffer; kernels/matmul.ts adds the `reduce`). Launch shape from {@linkcode tiledTuning}; the
 * sweeps behind its tables: docs/kernels.md, "tiled".
 */
import { type Gpu, isCpuAdapter } from "../gpu/device.ts";
import { isFloatFormat, type WeightFormat } from "../gpu/dtype.ts";
import { type Dispatch, grid } from "../gpu/dispatch.ts";
import { elementBytes } from "./weight.ts";
import { codeBits } from "./quant.ts";
import {
  at,
  ceil16,
  checkWorkgroup,
  dummy,
  fail,
  type MatmulLaunch,
  matmulPipeline,
  matmulUniform,
  scratch,
  type SplitDispatch,
  splitK,
} from "./matmul_common.ts";

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

/** Rows up to which `tiled` uses its decode-batch tiles (see {@linkcode tiledTuning}). */
const DECODE_TILE_M = 64;

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
 * (a guess from the GPU's shape; the sweeps found it best or close).
 */
const TILED_THREADS = 16384;
/** Workgroups a `tiled` launch aims for: about one per SM. */
const TILED_GROUPS = 128;

/**
 * `tiled` launch shape on CPU adapters, whatever the shape: 4.3 KB of workgroup memory.
 * llvmpipe through GL compiles the larger shapes for seconds to minutes each (see
 * kernels/matmul.wgsl), and lavapipe allows only 32 KiB.
 */
const TILED_CPU: TiledTuning = { bm: 64, bn: 64, tm: 4, tn: 4, bk: 8, bufs: 1, splits: 1 };

/** Workgroups a split launch aims for (about 3 per SM of an H200); see {@linkcode tiledTuning}. */
const SPLIT_GROUPS = 384;
/**
 * Rows of x up to which a launch may split K. Each split writes and the reduce reads M × N
 * partial sums, which measured slower than unsplit at 384 and 512 rows.
 */
const SPLIT_MAX_M = 256;
/** K steps a split walks at least. */
const SPLIT_MIN_STEPS = 4;

const pow2round = (v: number) => 2 ** Math.max(0, Math.round(Math.log2(v)));

/**
 * Default `tiled` launch shape for `m` rows of x into `cols` product columns, `k` deep. CPU
 * adapters get {@linkcode TILED_CPU}. On GPUs, measured special cases come first (H200,
 * TinyLlama f16; docs/kernels.md, "tiled"):
 *
 * - M ≤ 64 (the products of decode batches that go to `tiled`, see `matmulPath`): 32 × 64
 *   tiles of 4 × 4 for QKV and gate/up; 32 × 128 tiles of 4 × 8 for the LM head (more than 8×
 *   wider than deep) and the products without a norm (o, down), K split the power of two
 *   nearest 256 / tiles ways. From 33 rows (two row tiles) QKV is split by its column tiles
 *   alone and gate/up 4 ways.
 * - A normed product without SwiGLU (QKV): the same 32 × 64 tiles of 4 × 4 up to 256 rows;
 *   above, 64 × 128 tiles of 8 × 8, K steps of 8, 4 splits.
 * - SwiGLU (gate/up) up to 256 rows: 64 × 128 tiles of 8 × 8, K steps of 8; above 384 rows the
 *   same in 2 splits (at 384 the general rule's 128 × 128 tiles stay ahead).
 *
 * Otherwise the first of {@linkcode TILED_SHAPES} whose launch has at least
 * {@linkcode TILED_THREADS} threads in {@linkcode TILED_GROUPS} workgroups, else the last (the
 * most threads); K steps of 16 (8 for 128 × 128 tiles), two buffers (one where two do not
 * fit). E.g. TinyLlama at M = 256: o and down 64 × 64 of 8 × 4; at M = 512: o and down
 * 64 × 128 of 8 × 8, gate/up 128 × 128.
 *
 * Then, unless a special case set it, K is split when M ≤ {@linkcode SPLIT_MAX_M}: into the
 * power of two nearest to {@linkcode SPLIT_GROUPS} / tiles, each split at least
 * {@linkcode SPLIT_MIN_STEPS} steps: few-row launches have too few tiles to fill the GPU.
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

/**
 * Whether W of `f`, `k` deep, is staged 8 codes per slot with its row scales applied to the
 * finished sums (matmul_tiled_quant.wgsl `QROW`): int8 and e4m3 with K % 8 == 0.
 */
function rowScaled(f: WeightFormat, k: number): boolean {
  return (f === "int8" || f === "e4m3") && k % 8 === 0;
}

/** Elements of W per staged slot: 16 bytes of floats, 8 codes (QROW) or one word of codes. */
function slotWidth(f: WeightFormat, k: number): number {
  if (isFloatFormat(f)) return 16 / elementBytes(f);
  return rowScaled(f, k) ? 8 : 32 / codeBits(f);
}

function checkTiled(gpu: Gpu, label: string, t: TiledTuning, slot: number): void {
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
  const wLoads = Math.ceil((t.bn * t.bk) / slot / threads);
  if (xLoads > 4 || wLoads > 4) {
    fail(
      label,
      `tiled ${t.bm}x${t.bn}, bk ${t.bk} needs ${xLoads} loads of x and ${wLoads} of W per ` +
        `thread and step; at most 4 each (a smaller bk, tm or tn)`,
    );
  }
  checkWorkgroup(gpu, label, "tiled", threads, tiledBytes(t));
}

/**
 * The `tiled` dispatch of `launch`, its shape {@linkcode tiledTuning}'s with `tuning` over it,
 * and, when it splits K, what the reduce finishes from.
 */
export function tiledDispatch(
  gpu: Gpu,
  launch: MatmulLaunch,
  tuning: Partial<TiledTuning> = {},
): { dispatch: Dispatch; split?: SplitDispatch } {
  const { label, x, w, y, bias, normWeight, nw, m, k, cols, swiglu } = launch;
  const t = { ...tiledTuning(gpu, { m, cols, k, norm: !!normWeight, swiglu }), ...tuning };
  checkTiled(gpu, label, t, slotWidth(w.dtype, k));
  const { kspan, splits } = splitK(gpu, { m, cols, k, step: t.bk, splits: t.splits });
  const tiles = Math.ceil(m / t.bm) * Math.ceil(cols / t.bn);
  const groups = grid(tiles * splits);
  const pipe = matmulPipeline(gpu, "matmul.wgsl", launch, {
    extra: "matmul_tiled_quant.wgsl",
    constants: {
      BM: t.bm,
      BN: t.bn,
      TM: t.tm,
      TN: t.tn,
      BK: t.bk,
      BUFS: t.bufs,
      ALIGNED: k % t.bk === 0 ? 1 : 0,
      SPLIT: splits > 1 ? 1 : 0,
      QROW: rowScaled(w.dtype, k) ? 1 : 0,
    },
  });
  const u = matmulUniform(gpu, launch, { groupsX: groups[0], kspan, splits });
  // x, W and nw are bound as arrays of 16-byte vectors: whole vectors, rounded up.
  const xb = { buffer: x, size: ceil16(m * k * 4) };
  const wb = { buffer: w.buffer, size: ceil16(w.rows * k * elementBytes(w.dtype)) };
  const nwb = normWeight ? { buffer: normWeight, size: ceil16(k * 4) } : { buffer: nw };
  const shape = `${t.bm}x${t.bn}/${t.tm}x${t.tn}` + (splits > 1 ? ` split ${splits}` : "") +
    (rowScaled(w.dtype, k) ? " qrow" : "");
  const part = scratch(gpu, splits > 1 ? splits * m * (cols + 1) * 4 : 16); // bound either way
  const dispatch: Dispatch = {
    label: `${label} ${shape}`,
    pipeline: pipe,
    bindGroup: gpu.device.createBindGroup({
      layout: pipe.getBindGroupLayout(0),
      entries: [{ buffer: u }, xb, wb, { buffer: bias }, nwb, { buffer: y }, { buffer: part }]
        .map((resource, binding) => ({ binding, resource }))
        .concat([at(7, w.scales ?? dummy(gpu))]),
    }),
    workgroups: groups,
  };
  return splits > 1 ? { dispatch, split: { u, part } } : { dispatch };
}
