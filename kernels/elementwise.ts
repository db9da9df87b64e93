/**
 * Elementwise f32 kernels: SwiGLU's `silu(gate) * up` and a plain add. See
 * kernels/elementwise.wgsl.
 */
import type { Gpu } from "../gpu/device.ts";
import { bindGroup, type Dispatch, grid, params, uniform } from "../gpu/dispatch.ts";
import { pipeline } from "./pipeline.ts";

const WG = 256;

/** Buffers of {@linkcode siluMulDispatch}. */
export interface SiluMulBuffers {
  /** `f32 [m, 2f]`: gate in columns `[0, f)`, up in `[f, 2f)` (one fused gate‖up matmul). */
  gateUp: GPUBuffer;
  /** `f32 [m, f]`. */
  out: GPUBuffer;
}

/** Shape of {@linkcode siluMulDispatch}. */
export interface SiluMulOptions {
  m: number;
  /** Intermediate size F. */
  f: number;
}

/**
 * Builds `out[m, j] = silu(gateUp[m, j]) * gateUp[m, f + j]`.
 *
 * @example
 * const d = siluMulDispatch(gpu, { gateUp, out: h }, { m: 1, f: 5632 });
 */
export function siluMulDispatch(gpu: Gpu, buffers: SiluMulBuffers, opts: SiluMulOptions): Dispatch {
  const { m, f } = opts;
  if (!(m >= 1 && f >= 1)) {
    throw new Error(`internal error: silu_mul needs m, f >= 1; got ${m}, ${f}`);
  }
  const groups = grid(Math.ceil((m * f) / WG));
  const pipe = pipeline(gpu, "elementwise.wgsl", { entryPoint: "silu_mul", constants: { WG } });
  const u = uniform(gpu, params([m, f, groups[0], 0]));
  return {
    label: `silu_mul ${m}x${f}`,
    pipeline: pipe,
    bindGroup: bindGroup(gpu, pipe, [u, buffers.gateUp, buffers.out]),
    workgroups: groups,
  };
}

/** Buffers of {@linkcode addDispatch}. */
export interface AddBuffers {
  a: GPUBuffer;
  b: GPUBuffer;
  /** `f32 [n]`, a buffer other than `a` and `b` (WebGPU forbids one buffer bound both read-only and writable). */
  out: GPUBuffer;
}

/** Shape of {@linkcode addDispatch}. */
export interface AddOptions {
  /** Elements. */
  n: number;
}

/**
 * Builds `out = a + b` over `n` f32 elements. (Residual adds after a matmul are better fused:
 * `matmulDispatches(..., { accumulate: true })`.)
 */
export function addDispatch(gpu: Gpu, buffers: AddBuffers, opts: AddOptions): Dispatch {
  const { n } = opts;
  if (!(n >= 1)) throw new Error(`internal error: add needs n >= 1; got ${n}`);
  const groups = grid(Math.ceil(n / WG));
  const pipe = pipeline(gpu, "elementwise.wgsl", { entryPoint: "add", constants: { WG } });
  const u = uniform(gpu, params([1, n, groups[0], 0]));
  return {
    label: `add ${n}`,
    pipeline: pipe,
    bindGroup: bindGroup(gpu, pipe, [u, buffers.a, buffers.b, buffers.out]),
    workgroups: groups,
  };
}
