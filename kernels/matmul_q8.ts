/**
 * The `q8` matmul (kernels/matmul_q8.wgsl): int8 W (one scale per row) times x quantized to int8
 * per row by kernels/quant_x.wgsl, through `dot4I8Packed` with exact i32 sums, for prefill chunks
 * and decode batches past `small`'s rows. Two or three dispatches: quant_x (the RMSNorm folded in
 * there), the matmul, and the reduce when K is split. Launch shapes from {@linkcode q8Tuning},
 * first principles from `tiled`'s measured shapes (docs/kernels.md, "q8"); sweep them with
 * `scripts/sweep_kernels.ts --quantize int8 --variants '[{}, {"q8": {"bm": 64}}]'`.
 */
import { createStorage, type Gpu, isCpuAdapter } from "../gpu/device.ts";
import { type Dispatch, grid } from "../gpu/dispatch.ts";
import {
  at,
  checkWorkgroup,
  fail,
  type MatmulLaunch,
  matmulPipeline,
  matmulUniform,
  scratch,
  type SplitDispatch,
  splitK,
} from "./matmul_common.ts";
import { type Measure, quantXDispatch } from "./quant_x.ts";

/** Launch shape of the `q8` kernel: a workgroup of `(bm / tm) · (bn / tn)` threads. */
export interface Q8Tuning {
  /** Tile rows: 16, 32, 64 or 128. */
  bm: number;
  /** Tile columns: 16, 32, 64 or 128. */
  bn: number;
  /** Rows and columns per thread: 4 or 8. */
  tm: number;
  tn: number;
  /** k-words (4 k) per step: 4 or 8. */
  bkw: number;
  /** K splits (1: none; then the reduce adds them). */
  splits: number;
}

/** Whether the adapter's WGSL has `dot4I8Packed` (Deno 2.9.6: lavapipe, GL and the H200 do). */
export function hasDot4(): boolean {
  // Deno's types do not declare it yet; the runtime has it (scripts/ probes printed it).
  const g = navigator.gpu as GPU & { wgslLanguageFeatures?: ReadonlySet<string> };
  return g.wgslLanguageFeatures?.has("packed_4x8_integer_dot_product") ?? false;
}

/** CPU adapters: 64 threads and 1.2 KB of workgroup memory (GL compiles larger ones slowly). */
const Q8_CPU: Q8Tuning = { bm: 32, bn: 32, tm: 4, tn: 4, bkw: 4, splits: 1 };

const pow2round = (v: number) => 2 ** Math.max(0, Math.round(Math.log2(v)));

/**
 * Default `q8` launch shape for `m` rows into `cols` product columns, `k` deep. On GPUs, as
 * `tiled` measured best in f32 (kernels/matmul_tiled.ts): up to 64 rows 32 × 128 tiles of 4 × 8
 * with K split about 256 / tiles ways; up to 256 rows 64 × 128 tiles of 8 × 8 split about
 * 384 / tiles ways; above, unsplit 128 × 128 tiles of 8 × 8 (64 × 128 when those give fewer
 * than 128 tiles). K steps of 32 (8 words): a step's x and W slots are one 16-byte load per
 * thread of a 128 × 128 tile. Each split walks at least 4 steps.
 */
export function q8Tuning(gpu: Gpu, o: { m: number; cols: number; k: number }): Q8Tuning {
  if (isCpuAdapter(gpu)) return Q8_CPU;
  const tiles = (bm: number, bn: number) => Math.ceil(o.m / bm) * Math.ceil(o.cols / bn);
  const most = Math.max(1, Math.floor(Math.ceil(o.k / 32) / 4));
  const split = (aim: number, n: number) => Math.min(most, pow2round(aim / n));
  if (o.m <= 64) {
    return { bm: 32, bn: 128, tm: 4, tn: 8, bkw: 8, splits: split(256, tiles(32, 128)) };
  }
  if (o.m <= 256) {
    return { bm: 64, bn: 128, tm: 8, tn: 8, bkw: 8, splits: split(384, tiles(64, 128)) };
  }
  const bm = tiles(128, 128) >= 128 ? 128 : 64;
  return { bm, bn: 128, tm: 8, tn: 8, bkw: 8, splits: 1 };
}

function q8Bytes(t: Q8Tuning): number {
  return 2 * t.bkw * (t.bm + 4 + t.bn + 4) * 4;
}

function checkQ8(gpu: Gpu, label: string, t: Q8Tuning): void {
  const sizes = [16, 32, 64, 128];
  if (!sizes.includes(t.bm) || !sizes.includes(t.bn)) {
    fail(label, `q8 bm and bn must be 16, 32, 64 or 128; got ${t.bm} and ${t.bn}`);
  }
  if (![4, 8].includes(t.tm) || ![4, 8].includes(t.tn)) {
    fail(label, `q8 tm and tn must be 4 or 8; got ${t.tm} and ${t.tn}`);
  }
  if (![4, 8].includes(t.bkw)) fail(label, `q8 bkw must be 4 or 8; got ${t.bkw}`);
  if (!(Number.isInteger(t.splits) && t.splits >= 1)) {
    fail(label, `q8 splits must be an integer >= 1; got ${t.splits}`);
  }
  const threads = (t.bm / t.tm) * (t.bn / t.tn);
  const loads = Math.ceil((Math.max(t.bm, t.bn) * t.bkw) / 4 / threads);
  if (loads > 4) {
    fail(
      label,
      `q8 ${t.bm}x${t.bn}, bkw ${t.bkw} needs ${loads} loads per thread and step; at most 4`,
    );
  }
  checkWorkgroup(gpu, label, "q8", threads, q8Bytes(t));
}

const codes = new WeakMap<GPUDevice, { xq: GPUBuffer; xscale: GPUBuffer }>();

/**
 * The quantized x every `q8` launch of a device shares, grown to `m` rows of `k` (launches built
 * earlier keep the smaller pair): each launch's quant_x writes it right before its matmul reads
 * it, in order, like the split-K scratch.
 */
function xCodes(gpu: Gpu, m: number, k: number): { xq: GPUBuffer; xscale: GPUBuffer } {
  let c = codes.get(gpu.device);
  if (!c || c.xq.size < m * k || c.xscale.size < m * 4) {
    const rows = Math.max(m, c ? c.xscale.size / 4 : 0);
    const bytes = Math.max(m * k, c?.xq.size ?? 0);
    c = {
      xq: createStorage(gpu, bytes, undefined, "q8 x codes"),
      xscale: createStorage(gpu, rows * 4, undefined, "q8 x scales"),
    };
    codes.set(gpu.device, c);
  }
  return c;
}

/**
 * The dispatches of a `q8` launch: quant_x (the norm folded in, the monitor's `measure` when
 * given), the matmul, and (split) what the reduce finishes from.
 */
export function q8Dispatches(
  gpu: Gpu,
  launch: MatmulLaunch,
  o: { tuning?: Partial<Q8Tuning>; measure?: Measure },
): { quant: Dispatch; dispatch: Dispatch; split?: SplitDispatch } {
  const { label, x, w, y, bias, m, k, cols } = launch;
  if (w.dtype !== "int8" || !w.scales || k % 16 !== 0) {
    fail(label, "the q8 kernel needs int8 W and K % 16 == 0");
  }
  const t = { ...q8Tuning(gpu, { m, cols, k }), ...o.tuning };
  checkQ8(gpu, label, t);
  const { xq, xscale } = xCodes(gpu, m, k);
  const quant = quantXDispatch(gpu, {
    x,
    normWeight: launch.normWeight,
    xq,
    xscale,
    ...o.measure,
  }, { m, k, eps: launch.params.eps });
  const { kspan, splits } = splitK(gpu, { m, cols, k, step: 4 * t.bkw, splits: t.splits });
  const groups = grid(Math.ceil(m / t.bm) * Math.ceil(cols / t.bn) * splits);
  const pipe = matmulPipeline(gpu, "matmul_q8.wgsl", launch, {
    constants: { BM: t.bm, BN: t.bn, TM: t.tm, TN: t.tn, BKW: t.bkw, SPLIT: splits > 1 ? 1 : 0 },
  });
  const u = matmulUniform(gpu, launch, { groupsX: groups[0], kspan, splits });
  const part = scratch(gpu, splits > 1 ? splits * m * (cols + 1) * 4 : 16);
  const shape = `${t.bm}x${t.bn}/${t.tm}x${t.tn}` + (splits > 1 ? ` split ${splits}` : "");
  const dispatch: Dispatch = {
    label: `${label} ${shape}`,
    pipeline: pipe,
    bindGroup: gpu.device.createBindGroup({
      layout: pipe.getBindGroupLayout(0),
      entries: [
        at(0, u),
        at(1, xq),
        at(2, w.buffer),
        at(3, bias),
        at(5, y),
        at(6, part),
        at(7, w.scales),
        at(8, xscale),
      ],
    }),
    workgroups: groups,
  };
  return splits > 1 ? { quant, dispatch, split: { u, part } } : { quant, dispatch };
}
