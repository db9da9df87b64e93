/**
 * RMSNorm over rows, optionally gathering the rows to normalise. See kernels/rmsnorm.wgsl.
 */
import { createStorage, type Gpu } from "../gpu/device.ts";
import { bindGroup, type Dispatch, grid, params, uniform } from "../gpu/dispatch.ts";
import { pipeline } from "./pipeline.ts";

const WG = 256;

/** Buffers of {@linkcode rmsnormDispatch}. */
export interface RmsnormBuffers {
  /** `f32 [*, cols]` input rows. */
  x: GPUBuffer;
  /** `f32 [cols]` norm weights (always f32 on the GPU). */
  weight: GPUBuffer;
  /** `f32 [count, cols]`. */
  out: GPUBuffer;
  /** Optional `u32 [count]` gather: output row i normalises input row `rows[i]`. */
  rows?: GPUBuffer;
}

/** Shape of {@linkcode rmsnormDispatch}. */
export interface RmsnormOptions {
  /** Output rows. */
  count: number;
  cols: number;
  /** Added to the mean square before the square root (the model's `rms_norm_eps`). */
  eps: number;
}

const dummies = new WeakMap<GPUDevice, GPUBuffer>();

/**
 * Builds `out[i, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) * weight` for `count` rows, with
 * `r = rows[i]` when `rows` is given, else `r = i`.
 *
 * @example
 * // the last token of each sequence, ready for the LM head
 * const d = rmsnormDispatch(gpu, { x, weight, out, rows: lastTok }, { count: S, cols, eps });
 */
export function rmsnormDispatch(
  gpu: Gpu,
  buffers: RmsnormBuffers,
  opts: RmsnormOptions,
): Dispatch {
  const { count, cols, eps } = opts;
  if (!(count >= 1 && cols >= 1)) {
    throw new Error(`internal error: rmsnorm needs count, cols >= 1; got ${count}, ${cols}`);
  }
  const gather = buffers.rows !== undefined;
  let rows = buffers.rows;
  if (!rows) {
    // The binding exists in the layout either way; an unused 16-byte buffer fills it.
    rows = dummies.get(gpu.device);
    if (!rows) dummies.set(gpu.device, rows = createStorage(gpu, 16, undefined, "rmsnorm dummy"));
  }
  const groups = grid(count);
  const pipe = pipeline(gpu, "rmsnorm.wgsl", { constants: { WG, GATHER: gather ? 1 : 0 } });
  const u = uniform(gpu, params([count, cols, { f: eps }, groups[0]]));
  return {
    label: `rmsnorm ${count}x${cols}${gather ? " gather" : ""}`,
    pipeline: pipe,
    bindGroup: bindGroup(gpu, pipe, [u, buffers.x, buffers.weight, rows, buffers.out]),
    workgroups: groups,
  };
}
