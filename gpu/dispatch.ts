/**
 * What every kernel wrapper returns: a ready-to-encode dispatch. Wrappers build these once per
 * shape (pipeline from a cache, uniform buffer written once, bind group made once), so the hot
 * loop only calls {@linkcode encode}.
 */
import type { Gpu } from "./device.ts";

/** One compute dispatch: pipeline, bind group and workgroup counts. */
export interface Dispatch {
  label: string;
  pipeline: GPUComputePipeline;
  bindGroup: GPUBindGroup;
  workgroups: [number, number, number];
}

/** Records dispatches into an open compute pass, in order. */
export function encode(pass: GPUComputePassEncoder, dispatches: Iterable<Dispatch>): void {
  for (const d of dispatches) {
    pass.setPipeline(d.pipeline);
    pass.setBindGroup(0, d.bindGroup);
    pass.dispatchWorkgroups(d.workgroups[0], d.workgroups[1], d.workgroups[2]);
  }
}

/** Encodes the dispatches in one pass, submits, and waits until the GPU has finished. */
export async function run(gpu: Gpu, dispatches: Iterable<Dispatch>): Promise<void> {
  const enc = gpu.device.createCommandEncoder();
  const pass = enc.beginComputePass();
  encode(pass, dispatches);
  pass.end();
  gpu.device.queue.submit([enc.finish()]);
  await gpu.device.queue.onSubmittedWorkDone();
}

/** A uniform buffer holding `words` (u32 / f32 mixed via DataView), written once. */
export function uniform(gpu: Gpu, words: ArrayBuffer): GPUBuffer {
  const size = Math.max(16, Math.ceil(words.byteLength / 16) * 16);
  const buffer = gpu.device.createBuffer({
    size,
    usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
  });
  gpu.device.queue.writeBuffer(buffer, 0, words);
  return buffer;
}

/** Packs a params struct of u32 (number) and f32 ({ f: number }) fields in declaration order. */
export function params(fields: (number | { f: number })[]): ArrayBuffer {
  const buf = new ArrayBuffer(Math.max(16, Math.ceil(fields.length / 4) * 16));
  const view = new DataView(buf);
  fields.forEach((v, i) => {
    if (typeof v === "number") view.setUint32(i * 4, v >>> 0, true);
    else view.setFloat32(i * 4, v.f, true);
  });
  return buf;
}

/** Makes a bind group for group 0 of `pipe` from buffers in binding order. */
export function bindGroup(
  gpu: Gpu,
  pipe: GPUComputePipeline,
  buffers: (GPUBuffer | GPUBufferBinding)[],
): GPUBindGroup {
  return gpu.device.createBindGroup({
    layout: pipe.getBindGroupLayout(0),
    entries: buffers.map((b, binding) => ({
      binding,
      resource: b instanceof GPUBuffer ? { buffer: b } : b,
    })),
  });
}

/** Splits a 1-D workgroup count over x and y when it exceeds the per-dimension limit. */
export function grid(count: number, limit = 65535): [number, number, number] {
  if (count <= limit) return [Math.max(1, count), 1, 1];
  const y = Math.ceil(count / limit);
  return [Math.ceil(count / y), y, 1];
}
