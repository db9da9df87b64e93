/**
 * Kernel sources and their compiled pipelines: `kernels/<file>.wgsl` read once, compiled once per
 * device and set of override constants.
 */
import type { Gpu } from "../gpu/device.ts";

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
  const key = `${file}|${entryPoint}|${options.prelude ?? ""}|${JSON.stringify(constants)}`;
  let cache = pipelines.get(gpu.device);
  if (!cache) pipelines.set(gpu.device, cache = new Map());
  let p = cache.get(key);
  if (!p) {
    const code = (options.prelude ? options.prelude + "\n" : "") + wgsl(file);
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
