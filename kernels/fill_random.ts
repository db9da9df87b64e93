/**
 * Fills a buffer with bounded random weights on the GPU (kernels/fill_random.wgsl), so the bench
 * can build a 2 GB model in milliseconds without writing files or streaming bytes from the host.
 */
import type { Gpu } from "../gpu/device.ts";
import { BYTES, type DType, WDTYPE } from "../gpu/dtype.ts";
import { bindGroup, type Dispatch, grid, params, uniform } from "../gpu/dispatch.ts";
import { pipeline } from "./pipeline.ts";

const WG = 256;

/** What {@linkcode fillRandomDispatch} writes. */
export interface FillRandomOptions {
  /** Elements in the tensor (16-bit tensors: an odd count gets a zero padding half). */
  count: number;
  dtype: DType;
  /** Values are uniform in [center - scale, center + scale). */
  scale: number;
  /** Default 0. */
  center?: number;
  /** Different seeds give unrelated values (default 0). */
  seed?: number;
}

/** The most a value may reach: keeps f16 (max 65504) far from Inf. */
const MAX_ABS = 1024;

/**
 * Builds a dispatch that writes `count` random values of `dtype` at the start of `buffer`.
 *
 * @throws Error when the buffer is too small or |center| + |scale| exceeds 1024.
 * @example
 * const d = fillRandomDispatch(gpu, w.buffer, { count: rows * cols, dtype: "f16", scale: 0.02 });
 * await run(gpu, [d]);
 */
export function fillRandomDispatch(
  gpu: Gpu,
  buffer: GPUBuffer,
  opts: FillRandomOptions,
): Dispatch {
  const { count, dtype, scale } = opts;
  const center = opts.center ?? 0;
  const words = Math.ceil((count * BYTES[dtype]) / 4);
  if (!(count >= 1) || buffer.size < words * 4) {
    throw new Error(
      `internal error: fill_random of ${count} ${dtype} needs ${words * 4} bytes; ` +
        `buffer has ${buffer.size}`,
    );
  }
  if (!(Math.abs(center) + Math.abs(scale) <= MAX_ABS)) {
    throw new Error(`internal error: fill_random values must stay within ±${MAX_ABS}`);
  }
  const groups = grid(Math.ceil(words / WG));
  const pipe = pipeline(gpu, "fill_random.wgsl", { constants: { WG, WDTYPE: WDTYPE[dtype] } });
  const u = uniform(
    gpu,
    params([words, count, (opts.seed ?? 0) >>> 0, groups[0], { f: scale }, { f: center }]),
  );
  return {
    label: `fill_random ${count} ${dtype}`,
    pipeline: pipe,
    bindGroup: bindGroup(gpu, pipe, [u, { buffer, size: words * 4 }]),
    workgroups: groups,
  };
}
