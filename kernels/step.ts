/**
 * Wrapper for kernels/step.wgsl: the per-step bookkeeping of the GPU-resident decode loop, and
 * the byte layouts of what it writes that the host reads or writes: the token ring and the
 * per-slot state.
 */
import type { Gpu } from "../gpu/device.ts";
import { type Dispatch, params, uniform } from "../gpu/dispatch.ts";
import { pipeline } from "./pipeline.ts";

/** A ring entry's token for "this slot was already finished at this step". */
export const NO_TOKEN = 0xffffffff;
/** Bytes of one ring entry: (token id u32, logprob f32). */
export const RING_ENTRY_BYTES = 8;
/** Bytes of one slot's state: vec4<u32> (done, tokens still allowed, stop at EOS, spare). */
export const SLOT_STATE_BYTES = 16;

/** What a slot's state says: running with a token budget, or done. */
export interface SlotState {
  /** The slot produces no more tokens (finished, stopped, or empty). */
  done: boolean;
  /** Tokens it may still produce. */
  remaining: number;
  /** Stop at the model's EOS tokens. */
  stopAtEos: boolean;
}

/** The {@linkcode SLOT_STATE_BYTES} of `s`, as step.wgsl reads them. */
export function slotStateWords(s: SlotState): Uint32Array<ArrayBuffer> {
  return Uint32Array.of(s.done ? 1 : 0, s.remaining, s.stopAtEos ? 1 : 0, 0);
}

/** The state of a slot that produces nothing (the initial state of every slot). */
export const DONE: SlotState = { done: true, remaining: 0, stopAtEos: false };

/**
 * Ring entries copied to the host: entry i is `(token, logprob)` at bytes `[8 i, 8 i + 8)`; with
 * `fingerprintsAt`, the fingerprint ring's entries follow from that byte (a u32 per entry,
 * kernels/fingerprint.wgsl).
 */
export class RingView {
  readonly #ids: Uint32Array;
  readonly #logprobs: Float32Array;
  readonly #fps?: Uint32Array;

  constructor(bytes: ArrayBuffer, fingerprintsAt?: number) {
    const n = fingerprintsAt === undefined ? undefined : fingerprintsAt / 4;
    this.#ids = new Uint32Array(bytes, 0, n);
    this.#logprobs = new Float32Array(bytes, 0, n);
    if (fingerprintsAt !== undefined) this.#fps = new Uint32Array(bytes, fingerprintsAt);
  }

  /** Entry i's fingerprint (0 when none was copied). */
  fingerprint(i: number): number {
    return this.#fps?.[i] ?? 0;
  }

  /** Entry i's token id, or undefined when its slot was already finished (NO_TOKEN). */
  token(i: number): number | undefined {
    const t = this.#ids[2 * i];
    return t === NO_TOKEN ? undefined : t;
  }

  /** Entry i's logprob (natural log, before temperature). */
  logprob(i: number): number {
    return this.#logprobs[2 * i + 1];
  }

  /** Entry i's two words as u32 (a speculative step's (drafted, accepted) entry). */
  raw(i: number): [number, number] {
    return [this.#ids[2 * i], this.#ids[2 * i + 1]];
  }
}

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
  /** u32 [S, histLen]: each slot's tokens by position (speculation's drafts; any when unused). */
  hist: GPUBuffer;
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
  /** Ring entries per slot and step (default 1; speculation's rows + 1). */
  ringStride?: number;
  /** Positions per row of `hist` (default 0: no history is kept). */
  histLen?: number;
}

const WG = 64;

/** Builds a step_begin or step_end dispatch over slots [slotBegin, slotEnd). */
export function stepDispatch(gpu: Gpu, bufs: StepBuffers, o: StepOptions): Dispatch {
  const pipe = pipeline(gpu, "step.wgsl", { entryPoint: o.entry, constants: { WG, NO_TOKEN } });
  const u = uniform(
    gpu,
    params([
      o.slotBegin,
      o.slotEnd,
      o.vocab,
      o.ringOffset ?? 0,
      o.trashPos,
      o.nEos,
      o.ringStride ?? 1,
      o.histLen ?? 0,
    ]),
  );
  const b = bufs;
  const all = [
    u,
    b.seqLen,
    b.pos,
    b.slotState,
    b.nextTok,
    b.sampled,
    b.ring,
    b.counts,
    b.eos,
    b.hist,
  ];
  // layout "auto" drops bindings an entry point does not use.
  const used = o.entry === "step_begin" ? [0, 1, 2, 3] : [0, 1, 3, 4, 5, 6, 7, 8, 9];
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
