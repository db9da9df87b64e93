/**
 * Float64 references of what the quantized kernels do to x (kernels/reference.ts holds the
 * weights' references and `quantActRef`, x per row for `q8`): x rounded to int8 per unit of 16 k,
 * as `small`'s `xq` (kernels/matmul_small.wgsl) and the monitor's sample of it
 * (kernels/quant_x.wgsl, `unitCodes`) round it.
 */
import { roundEven } from "./quant.ts";

/** k per unit of x with its own scale (one 16-byte load of 8-bit W codes). */
export const X_UNIT = 16;

/** {@linkcode quantUnitsRef}'s result. */
export interface QuantUnitsRef {
  /** `[m, k]` int8 codes. */
  codes: Int8Array;
  /** `[m, k / 16]` scales: x ≈ scale · code over each unit. */
  scales: Float64Array;
  /** `[m, k]` what the kernel multiplies: scale · code. */
  values: Float64Array;
}

/**
 * `x` (`[m, k]`, normed already when the kernel folds the norm; k a multiple of 16) rounded to
 * int8 per unit of 16 k: scale = absmax / 127 (as the GPU computes it in f32), code =
 * round(x / scale) half to even. The GPU rounds x / scale in f32, so at a near-tie
 * ({@linkcode unitTies}) its code may be the other neighbour.
 *
 * @example
 * const xq = quantUnitsRef(Float64Array.of(...row), 1, row.length).values;
 */
export function quantUnitsRef(x: ArrayLike<number>, m: number, k: number): QuantUnitsRef {
  if (k % X_UNIT !== 0) throw new Error(`quantUnitsRef: k must be a multiple of 16; got ${k}`);
  const codes = new Int8Array(m * k), values = new Float64Array(m * k);
  const scales = new Float64Array((m * k) / X_UNIT);
  for (let u = 0; u < scales.length; u++) {
    const at = u * X_UNIT;
    let amax = 0;
    for (let j = 0; j < X_UNIT; j++) amax = Math.max(amax, Math.abs(x[at + j]));
    const s = Math.fround(Math.fround(amax) * Math.fround(1 / 127));
    scales[u] = s;
    for (let j = 0; j < X_UNIT; j++) {
      const c = s > 0 ? Math.max(-127, Math.min(127, roundEven(x[at + j] / s))) : 0;
      codes[at + j] = c;
      values[at + j] = s * c;
    }
  }
  return { codes, scales, values };
}

/**
 * Indices of `x` (`[m, k]`, as the kernel sees it before its unit scale) whose code is a near-tie:
 * `|x / scale|` within `margin` of a half, where f32 rounding on the GPU may pick either
 * neighbour. Tests move such inputs off the tie so the reference is exact.
 */
export function unitTies(x: ArrayLike<number>, m: number, k: number, margin = 1e-3): number[] {
  const q = quantUnitsRef(x, m, k), out: number[] = [];
  for (let i = 0; i < m * k; i++) {
    const s = q.scales[Math.floor(i / X_UNIT)];
    if (!(s > 0)) continue;
    const v = Math.abs(x[i] / s);
    if (Math.abs(v - Math.floor(v) - 0.5) < margin) out.push(i);
  }
  return out;
}
