/**
 * What the matmul kernels share beside kernels/matmul_common.wgsl: the one `Params` layout and its
 * packer, the launch every kernel family builds from, the pipeline with the common source
 * prepended, the split-K arithmetic and scratch, and the launch-shape checks.
 */
import { createStorage, type Gpu } from "../gpu/device.ts";
import { params, uniform } from "../gpu/dispatch.ts";
import { pipeline, wgsl } from "./pipeline.ts";
import type { WeightBuffer } from "./weight.ts";

/** matmul_common.wgsl's `Params`, field for field (strides and offsets in elements). */
export interface MatmulParams {
  /** Rows of x. */
  m: number;
  /** Columns of y (F with SwiGLU). */
  n: number;
  /** Columns of x and W. */
  k: number;
  /** Workgroups along x (the grid may be split over x and y). */
  groupsX: number;
  yStride: number;
  yOffset: number;
  /** Bit 0: add the bias; bit 1: add into y. */
  flags: number;
  /** RMSNorm epsilon. */
  eps: number;
  /** Gate/up rows per block of the interleaved W. */
  block: number;
  /** K per split (≥ K when unsplit). */
  kspan: number;
  /** K splits (1 when unsplit). */
  splits: number;
}

/** The WGSL struct's fields in order: (WGSL name, field of {@linkcode MatmulParams}, type). */
export const MATMUL_PARAMS_LAYOUT: readonly [string, keyof MatmulParams, "u32" | "f32"][] = [
  ["m", "m", "u32"],
  ["n", "n", "u32"],
  ["k", "k", "u32"],
  ["groups_x", "groupsX", "u32"],
  ["y_stride", "yStride", "u32"],
  ["y_offset", "yOffset", "u32"],
  ["flags", "flags", "u32"],
  ["eps", "eps", "f32"],
  ["block", "block", "u32"],
  ["kspan", "kspan", "u32"],
  ["splits", "splits", "u32"],
];

/** The bytes of a `Params` uniform, in {@linkcode MATMUL_PARAMS_LAYOUT}'s order. */
export function packMatmulParams(p: MatmulParams): ArrayBuffer {
  return params(
    MATMUL_PARAMS_LAYOUT.map(([, key, type]) => type === "f32" ? { f: p[key] } : p[key]),
  );
}

/**
 * One matmul as every kernel family receives it, checked by kernels/matmul.ts: the buffers (a
 * dummy for a missing bias or norm), the sizes, and what does not depend on the launch shape.
 */
export interface MatmulLaunch {
  /** e.g. `matmul small 1x2048x2048 f16 +norm`; a family adds its shape. */
  label: string;
  x: GPUBuffer;
  w: WeightBuffer;
  y: GPUBuffer;
  bias: GPUBuffer;
  /** The norm weights, or undefined without the RMSNorm fusion. */
  normWeight?: GPUBuffer;
  /** `normWeight`, or the dummy (bound either way). */
  nw: GPUBuffer;
  m: number;
  n: number;
  k: number;
  /** Columns of the product: N, or 2F with SwiGLU (gate and up both count). */
  cols: number;
  swiglu: boolean;
  /** `Params` but for the launch's own fields. */
  params: Omit<MatmulParams, "groupsX" | "kspan" | "splits">;
  /** WDTYPE, NORM and SWIGLU. */
  constants: Record<string, number>;
  /** Expand the kernels' `// @unroll` loops (default true). */
  unroll?: boolean;
}

/** The `Params` uniform of `launch` with its grid's x count and K split. */
export function matmulUniform(
  gpu: Gpu,
  launch: MatmulLaunch,
  own: { groupsX: number; kspan?: number; splits?: number },
): GPUBuffer {
  const { kspan = launch.k, splits = 1 } = own;
  return uniform(gpu, packMatmulParams({ ...launch.params, groupsX: own.groupsX, kspan, splits }));
}

/**
 * The pipeline of `file` (matmul_common.wgsl and quant_common.wgsl prepended, then `extra`) for
 * `launch` with these constants.
 */
export function matmulPipeline(
  gpu: Gpu,
  file: string,
  launch: MatmulLaunch,
  opts: { constants?: Record<string, number>; entryPoint?: string; extra?: string } = {},
): GPUComputePipeline {
  const extra = opts.extra ? "\n" + wgsl(opts.extra) : "";
  return pipeline(gpu, file, {
    prelude: wgsl("matmul_common.wgsl") + "\n" + wgsl("quant_common.wgsl") + extra,
    constants: { ...launch.constants, ...opts.constants },
    entryPoint: opts.entryPoint,
    unroll: launch.unroll,
  });
}

/** A `tiled` or `rows` launch whose K splits the reduce (kernels/matmul.ts) adds up. */
export interface SplitDispatch {
  /** The uniform of the main dispatch, which the reduce reads too. */
  u: GPUBuffer;
  /** The partial sums, `splits · m · (cols + 1)` floats. */
  part: GPUBuffer;
}

/**
 * K per split (`kspan`, whole steps of `step`) and the split count for a launch that asks for
 * `splits`: the last split may be shorter, none is empty, and the partial sums
 * (`splits · m · (cols + 1)` floats) must fit one binding.
 */
export function splitK(
  gpu: Gpu,
  o: { m: number; cols: number; k: number; step: number; splits: number },
): { kspan: number; splits: number } {
  const steps = Math.ceil(o.k / o.step);
  const fit = Math.floor(gpu.maxBinding / (o.m * (o.cols + 1) * 4));
  const kspan = Math.ceil(steps / Math.max(1, Math.min(o.splits, steps, fit))) * o.step;
  return { kspan, splits: Math.ceil(o.k / kspan) };
}

const scratches = new WeakMap<GPUDevice, GPUBuffer>();

/**
 * The split-K partial sums' buffer, one per device, grown to `bytes` when a launch needs more
 * (launches built earlier keep the smaller one). Sharing is safe: every launch writes it before
 * its reduce reads it, and dispatches that use the same buffer read-write run in order.
 */
export function scratch(gpu: Gpu, bytes: number): GPUBuffer {
  let b = scratches.get(gpu.device);
  if (!b || b.size < bytes) {
    scratches.set(gpu.device, b = createStorage(gpu, bytes, undefined, "matmul split-K"));
  }
  return b;
}

const dummies = new WeakMap<GPUDevice, GPUBuffer>();

/** A 16-byte buffer bound where a launch has no bias or norm weights. */
export function dummy(gpu: Gpu): GPUBuffer {
  let d = dummies.get(gpu.device);
  if (!d) dummies.set(gpu.device, d = createStorage(gpu, 16, undefined, "matmul no bias"));
  return d;
}

/** `bytes` rounded up to whole 16-byte vectors (what the vectorised kernels bind). */
export const ceil16 = (bytes: number) => Math.ceil(bytes / 16) * 16;

/** A bind group entry: `buffer`, whole, at `binding`. */
export const at = (binding: number, buffer: GPUBuffer) => ({ binding, resource: { buffer } });

export const isPow2 = (v: number) => Number.isInteger(v) && v >= 1 && (v & (v - 1)) === 0;

/** Throws the "internal error" of a matmul that cannot be built. */
export function fail(label: string, what: string): never {
  throw new Error(`internal error: ${label}: ${what}`);
}

/** Fails when a `kernel` workgroup of `threads` threads and `bytes` of memory is over the device's. */
export function checkWorkgroup(
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
