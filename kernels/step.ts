/** Wrapper for kernels/step.wgsl: the per-step bookkeeping of the GPU-resident decode loop. */
import type { Gpu } from "../gpu/device.ts";
import { type Dispatch, params, uniform } from "../gpu/dispatch.ts";
import { pipeline } from "./pipeline.ts";

/** Per-slot state buffers the step kernels read and write (see step.wgsl). */
export interface StepBuffers {
  seqLen: GPUBuffer; // u32 [S]
  pos: GPUBuffer; // u32 [S]
  slotState: GPUBuffer; // vec4<u32> [S]
  nextTok: GPUBuffer; // u32 [S]
  sampled: GPUBuffer; // vec2<u32> [S]
  ring: GPUBuffer; // vec2<u32> [regions, K, S]
  counts: GPUBuffer; // u32 [S, V]
  eos: GPUBuffer; // u32 [nEos]
}

/** Options for {@linkcode stepDispatch}. */
export interface StepOptions {
  entry: "step_begin" | "step_end";
  slotBegin: number;
  slotEnd: number;
  vocab: number;
  /** Offset (in entries) of this step's row in the ring; step_end only. */
  ringOffset?: number;
  trashPos: number;
  nEos: number;
}

const WG = 64;

/** Builds a step_begin or step_end dispatch over slots [slotBegin, slotEnd). */
export function stepDispatch(gpu: Gpu, bufs: StepBuffers, o: StepOptions): Dispatch {
  const pipe = pipeline(gpu, "step.wgsl", { entryPoint: o.entry, constants: { WG } });
  const u = uniform(
    gpu,
    params([o.slotBegin, o.slotEnd, o.vocab, o.ringOffset ?? 0, o.trashPos, o.nEos]),
  );
  const b = bufs;
  const all = [u, b.seqLen, b.pos, b.slotState, b.nextTok, b.sampled, b.ring, b.counts, b.eos];
  // layout "auto" drops bindings an entry point does not use.
  const used = o.entry === "step_begin" ? [0, 1, 2, 3] : [0, 3, 4, 5, 6, 7, 8];
  const bg = gpu.device.createBindGroup({
    layout: pipe.getBindGroupLayout(0),
    entries: used.map((i) => ({ binding: i, resource: { buffer: all[i] } })),
  });
  return {
    label: o.entry,
    pipeline: pipe,
    bindGroup: bg,
    workgroups: [Math.max(1, Math.ceil((o.slotEnd - o.slotBegin) / WG)), 1, 1],
  };
}
