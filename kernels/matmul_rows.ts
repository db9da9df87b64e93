/**
 * The `rows` matmul (kernels/matmul_rows.wgsl): decode batches against 16-bit W, a thread holding
 * all rows of an 8-, 16-, 24- or 32-row tile for 4 or 8 product columns, so each 16-byte load of
 * W (from global memory, never staged) is widened once and applied to every row, whose x comes
 * from workgroup memory as a broadcast. Always two dispatches: K splits here, then the reduce
 * (kernels/matmul.ts). Launch shapes from {@linkcode rowsTuning}'s table; the sweeps and bench
 * runs that chose them: docs/kernels.md, "rows".
 */
import { type Gpu, isCpuAdapter } from "../gpu/device.ts";
import { elementBytes } from "./weight.ts";
import { type Dispatch, grid } from "../gpu/dispatch.ts";
import {
  at,
  ceil16,
  checkWorkgroup,
  fail,
  isPow2,
  type MatmulLaunch,
  matmulPipeline,
  matmulUniform,
  scratch,
  type SplitDispatch,
  splitK,
} from "./matmul_common.ts";

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

/**
 * How much wider than deep (rows of W per column) a product must be for `rows` at 12–64 rows;
 * narrower ones (QKV, o, down) only at 25–48 (kernels/matmul.ts, `matmulPath`).
 */
export const ROWS_WIDE = 4;

/** {@linkcode rowsTuning}'s shape on CPU adapters: 16 threads, little workgroup memory. */
const ROWS_CPU: RowsTuning = { kl: 4, cg: 4, r: 8, splits: 1 };

/**
 * The products a row of {@linkcode ROWS_TUNINGS} serves: `head` more than 8 times wider than
 * deep (the LM head), `rest` all others; among those, `narrow` under {@linkcode ROWS_WIDE} times
 * wider than deep, either `qkv` (wider than deep) or `deep` (o, down); `any` all.
 */
type RowsProduct = "any" | "head" | "rest" | "narrow" | "qkv" | "deep";

function productKinds(cols: number, k: number): RowsProduct[] {
  if (cols > 8 * k) return ["any", "head"];
  if (cols >= ROWS_WIDE * k) return ["any", "rest"]; // gate/up
  return ["any", "rest", "narrow", cols > k ? "qkv" : "deep"];
}

/**
 * The H200's `rows` launch shapes (TinyLlama f16, measured per call and in the bench): the first
 * row whose product kind matches and whose `maxM` is at least M. Shapes at M ≤ 8 and, for
 * narrow products, at M ≤ 24 only serve forced launches (`matmulPath` starts `rows` later).
 */
const ROWS_TUNINGS: { for: RowsProduct; maxM: number; t: RowsTuning }[] = [
  { for: "any", maxM: 8, t: { kl: 8, cg: 8, r: 8, splits: 2 } },
  { for: "any", maxM: 16, t: { kl: 4, cg: 16, r: 16, splits: 4 } },
  // QKV, o and down in 8 K splits; at 33–48 rows QKV in 16-row tiles split 4, o and down in
  // 24-row tiles.
  { for: "narrow", maxM: 24, t: { kl: 4, cg: 16, r: 24, splits: 8 } },
  { for: "narrow", maxM: 32, t: { kl: 4, cg: 16, r: 16, splits: 8 } },
  { for: "qkv", maxM: 48, t: { kl: 4, cg: 16, r: 16, splits: 4 } },
  { for: "deep", maxM: 48, t: { kl: 4, cg: 16, r: 24, splits: 8 } },
  // The LM head in one 24-row tile; gate/up (and, past 48 rows, QKV, o, down) in 8-row tiles
  // of 8 columns per thread.
  { for: "head", maxM: 24, t: { kl: 4, cg: 32, r: 24, splits: 1 } },
  { for: "rest", maxM: 24, t: { kl: 4, cg: 16, r: 8, cw: 8, splits: 2 } },
  { for: "head", maxM: 32, t: { kl: 4, cg: 32, r: 32, splits: 2 } },
  { for: "rest", maxM: 32, t: { kl: 4, cg: 16, r: 16, splits: 2 } },
  // 33–64 rows: 16-row tiles of 8 columns per thread.
  { for: "head", maxM: 64, t: { kl: 4, cg: 32, r: 16, cw: 8, splits: 1 } },
  { for: "rest", maxM: 64, t: { kl: 4, cg: 16, r: 16, cw: 8, splits: 2 } },
  // Over 64 rows: only when forced.
  { for: "head", maxM: Infinity, t: { kl: 4, cg: 32, r: 32, splits: 1 } },
  { for: "rest", maxM: Infinity, t: { kl: 4, cg: 32, r: 32, splits: 2 } },
];

/**
 * Default `rows` launch shape for `m` rows of x into `cols` product columns, `k` deep: on GPUs
 * the first match in the table above, on CPU adapters a 16-thread shape.
 */
export function rowsTuning(gpu: Gpu, opts: { m: number; cols: number; k: number }): RowsTuning {
  if (isCpuAdapter(gpu)) return ROWS_CPU;
  const kinds = productKinds(opts.cols, opts.k);
  const row = ROWS_TUNINGS.find((e) => kinds.includes(e.for) && opts.m <= e.maxM)!;
  return { ...row.t };
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

/**
 * The `rows` dispatch of `launch` (K splits into the scratch; the reduce finishes), its shape
 * {@linkcode rowsTuning}'s with `tuning` over it.
 */
export function rowsDispatch(
  gpu: Gpu,
  launch: MatmulLaunch,
  tuning: Partial<RowsTuning> = {},
): { dispatch: Dispatch; split: SplitDispatch } {
  const { label, x, w, normWeight, nw, m, k, cols } = launch;
  const t = { ...rowsTuning(gpu, { m, cols, k }), ...tuning };
  checkRows(gpu, label, t);
  const { kspan, splits } = splitK(gpu, { m, cols, k, step: 8 * t.kl, splits: t.splits });
  const cw = t.cw ?? 4;
  const groups = grid(Math.ceil(m / t.r) * Math.ceil(cols / (cw * t.cg)) * splits);
  const pipe = matmulPipeline(gpu, "matmul_rows.wgsl", launch, {
    constants: { KL: t.kl, CG: t.cg, R: t.r, CW: cw },
  });
  // The reduce finishes from the same uniform.
  const u = matmulUniform(gpu, launch, { groupsX: groups[0], kspan, splits });
  const part = scratch(gpu, splits * m * (cols + 1) * 4);
  const shape = `${t.r} rows ${t.kl}x${t.cg}` + (cw === 8 ? "x8" : "") +
    (splits > 1 ? ` split ${splits}` : "");
  const entries = [
    at(0, u),
    { binding: 1, resource: { buffer: x, size: ceil16(m * k * 4) } },
    {
      binding: 2,
      resource: { buffer: w.buffer, size: ceil16(w.rows * k * elementBytes(w.dtype)) },
    },
    // nw is bound either way (the layout counts it when NORM is off).
    {
      binding: 4,
      resource: normWeight ? { buffer: normWeight, size: ceil16(k * 4) } : { buffer: nw },
    },
    at(6, part),
  ];
  return {
    dispatch: {
      label: `${label} ${shape}`,
      pipeline: pipe,
      bindGroup: gpu.device.createBindGroup({ layout: pipe.getBindGroupLayout(0), entries }),
      workgroups: groups,
    },
    split: { u, part },
  };
}
