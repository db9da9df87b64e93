/**
 * Kernel sources and their compiled pipelines: `kernels/<file>.wgsl` read once, compiled once per
 * device and set of override constants, with the loops marked `// @unroll` expanded
 * (kernels/unroll.ts).
 */
import type { Gpu } from "../gpu/device.ts";
import { unrollLoops } from "./unroll.ts";

const sources = new Map<string, string>();
const pipelines = new WeakMap<GPUDevice, Map<string, GPUComputePipeline>>();

/** Reads `kernels/<file>` once (synchronously: kernels are built at load time). */
export function wgsl(file: string): string {
  let s = sources.get(file);
  if (s === undefined) {
    s = Deno.readTextFileSync(new URL(`./${file}`, import.meta.url));
    sources.set(file, s);
  }
  return s;
}

/** Options for {@linkcode pipeline}. */
export interface PipelineOptions {
  /** Values for the shader's `override` constants (workgroup sizes, dtype switches). */
  constants?: Record<string, number>;
  /** Text prepended to the source, e.g. `enable f16;` for an optional fast path. */
  prelude?: string;
  entryPoint?: string;
  /**
   * Expand the loops marked `// @unroll` (default true). False compiles them as the loops they
   * are, to measure one against the other (scripts/sweep_kernels.ts).
   */
  unroll?: boolean;
}

/**
 * The WGSL that {@linkcode pipeline} compiles for `file`: the prelude, then the source, with the
 * marked loops expanded unless `unroll` is false.
 *
 * @throws Error from {@linkcode unrollLoops} on a marked loop it cannot expand.
 */
export function shaderCode(
  file: string,
  options: Pick<PipelineOptions, "prelude" | "unroll"> = {},
): string {
  const source = (options.prelude ? options.prelude + "\n" : "") + wgsl(file);
  return options.unroll ?? true ? unrollLoops(source, { label: file }) : source;
}

/**
 * Returns the compute pipeline for `file` with these constants, compiled once per device.
 * Uses `layout: "auto"`; bind with `pipeline.getBindGroupLayout(0)`.
 */
export function pipeline(
  gpu: Gpu,
  file: string,
  options: PipelineOptions = {},
): GPUComputePipeline {
  const constants = options.constants ?? {};
  const entryPoint = options.entryPoint ?? "main";
  const unroll = options.unroll ?? true;
  const key = `${file}|${entryPoint}|${unroll}|${options.prelude ?? ""}|` +
    JSON.stringify(constants);
  let cache = pipelines.get(gpu.device);
  if (!cache) pipelines.set(gpu.device, cache = new Map());
  let p = cache.get(key);
  if (!p) {
    const code = shaderCode(file, { prelude: options.prelude, unroll });
    const module = gpu.device.createShaderModule({ code, label: file });
    p = gpu.device.createComputePipeline({
      layout: "auto",
      label: `${file}:${entryPoint}`,
      compute: { module, entryPoint, constants },
    });
    cache.set(key, p);
  }
  return p;
}
