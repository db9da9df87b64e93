/**
 * Wrapper for kernels/cross_check.wgsl: the verification cross-check's two dispatches (keep the
 * plain path's final residual rows; compare a verification pass's row 0 with them) and their
 * float64 reference.
 */
import type { Gpu } from "../gpu/device.ts";
import { type Dispatch, params, uniform } from "../gpu/dispatch.ts";
import { pipeline } from "./pipeline.ts";
import { bindAt, type Binding } from "./sample.ts";

/** The fingerprint ring's value for "not cross-checked": the bits of -1.0f. */
export const NO_CHECK = 0xbf800000;

/** Where the cross-check reads and writes. */
export interface CrossCheckBuffers {
  /** `f32 [rows, hidden]`: the final residual rows (the forward pass's `x`). */
  x: Binding;
  /** `f32 [slots, hidden]`: the plain path's rows, kept. */
  plain: Binding;
  /** `vec4<u32> [S]`: slot states (a done slot is not checked). */
  slotState: Binding;
  fpRing: Binding;
}

/** Options of {@linkcode crossCheckDispatch}. */
export interface CrossCheckOptions {
  entry: "check_keep" | "check_compare";
  /** Slots [0, slots) checked. */
  slots: number;
  hidden: number;
  /** R of the verification pass (check_compare reads row s · R). */
  rowsPerSeq: number;
  /** Entry of this step's row in the fingerprint ring, and entries per slot. */
  ringOffset: number;
  ringStride: number;
}

/** `check_keep` or `check_compare` over slots [0, slots): one workgroup per slot. */
export function crossCheckDispatch(
  gpu: Gpu,
  bufs: CrossCheckBuffers,
  o: CrossCheckOptions,
): Dispatch {
  const pipe = pipeline(gpu, "cross_check.wgsl", { entryPoint: o.entry });
  const u = uniform(
    gpu,
    params([o.slots, o.hidden, o.rowsPerSeq, o.ringOffset, o.ringStride]),
  );
  const entries: [number, Binding][] = o.entry === "check_keep"
    ? [[0, u], [1, bufs.x], [2, bufs.plain]]
    : [[0, u], [1, bufs.x], [2, bufs.plain], [3, bufs.slotState], [4, bufs.fpRing]];
  return {
    label: o.entry,
    pipeline: pipe,
    bindGroup: bindAt(gpu, pipe, entries),
    workgroups: [o.slots, 1, 1],
  };
}

/**
 * The relative distance `check_compare` reports, in float64:
 * ‖verify − plain‖ / mean(‖verify‖, ‖plain‖) (0 for two zero rows).
 */
export function crossCheckRef(verify: ArrayLike<number>, plain: ArrayLike<number>): number {
  let dd = 0, vv = 0, pp = 0;
  for (let i = 0; i < verify.length; i++) {
    dd += (verify[i] - plain[i]) ** 2;
    vv += verify[i] ** 2;
    pp += plain[i] ** 2;
  }
  return Math.sqrt(dd) / Math.max(0.5 * (Math.sqrt(vv) + Math.sqrt(pp)), 1e-30);
}

/** A fingerprint ring entry R as the cross-check's relative distance, or undefined (NO_CHECK). */
export function checkValue(bits: number): number | undefined {
  if (bits >>> 0 === NO_CHECK) return undefined;
  return new Float32Array(Uint32Array.of(bits).buffer)[0];
}
