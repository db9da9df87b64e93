/**
 * The per-slot GPU state of the batch: block tables, sampling parameters, the step kernels'
 * buffers (positions, slot states, the token ring, penalty counts) and the top-logprobs ring,
 * and the arithmetic of where each slot's rows live. Created and written only by the runner
 * (engine/runner/runner.ts); the forward pass binds them.
 */
import { createStorage, type Gpu } from "../../gpu/device.ts";
import { SAMPLE_PARAMS_BYTES } from "../../kernels/sample.ts";
import {
  DONE,
  RING_ENTRY_BYTES,
  SLOT_STATE_BYTES,
  slotStateWords,
  type StepBuffers,
} from "../../kernels/step.ts";
import { BLOCK } from "../kv/blocks.ts";

/** Sizes of the batch's state, fixed when the runner is created. */
export interface SlotShape {
  /** Batch slots (sequences decoding together). */
  maxSlots: number;
  /** Decode steps per submission at most. */
  maxSteps: number;
  /** Ring regions (submissions in flight + prefills). */
  regions: number;
  /** Alternatives kept per token for top_logprobs. */
  topK: number;
  /** Longest sequence (prompt + generated). */
  contextLength: number;
}

/** Entries of one top-logprobs alternative: (id u32, logprob f32). */
const TOP_ENTRY_BYTES = 8;

/** Where a slot's rows are, derived from {@linkcode SlotShape}. */
export class SlotLayout {
  /** Columns of a slot's block table: its blocks, then the trash column (always block 0). */
  readonly maxBlocks: number;
  /** The position whose KV lands in the trash column: writes nobody reads. */
  readonly trashPos: number;

  constructor(readonly shape: SlotShape) {
    this.maxBlocks = Math.ceil(shape.contextLength / BLOCK) + 1;
    this.trashPos = (this.maxBlocks - 1) * BLOCK;
  }

  /** Bytes per (region, step) row of the top-logprobs ring (256-aligned for bind offsets). */
  topStride(): number {
    return Math.ceil((this.shape.maxSlots * this.shape.topK * TOP_ENTRY_BYTES) / 256) * 256;
  }

  /** Ring entry offset (in entries) of (region, step). */
  ringOffset(region: number, k: number): number {
    return (region * this.shape.maxSteps + k) * this.shape.maxSlots;
  }

  /** Byte offset of (region, step)'s row in the ring. */
  ringByteOffset(region: number, k: number): number {
    return this.ringOffset(region, k) * RING_ENTRY_BYTES;
  }

  /** Bytes of `steps` ring rows (every slot's entry of each step). */
  ringBytes(steps: number): number {
    return steps * this.shape.maxSlots * RING_ENTRY_BYTES;
  }

  /**
   * Word offset in a copy of top-ring rows of slot `slot`'s alternatives at step `k`: pairs
   * (id, logprob) for j < topK at words `+ 2 j`, `+ 2 j + 1`.
   */
  topOffset(k: number, slot: number): number {
    return (k * this.topStride()) / 4 + slot * this.shape.topK * 2;
  }
}

/** The batch's GPU state (see the module doc); every slot starts done. */
export interface SlotBuffers {
  /** u32 [maxSlots, maxBlocks]: a slot's physical blocks; zeros are the trash block. */
  blockTable: GPUBuffer;
  /** Sampling parameters [maxSlots] (kernels/sample.ts `packSampleParams`). */
  params: GPUBuffer;
  step: StepBuffers;
  /** (id, logprob) [regions, maxSteps, topStride / 8]. */
  topRing: GPUBuffer;
  /** EOS ids in `step.eos` (0: none; the buffer then holds one unmatchable id). */
  eosCount: number;
}

/** Creates the batch's buffers for a model of `vocab` tokens whose EOS ids are `eosIds`. */
export function createSlotBuffers(
  gpu: Gpu,
  layout: SlotLayout,
  opts: { vocab: number; eosIds: number[] },
): SlotBuffers {
  const { maxSlots: S, maxSteps, regions } = layout.shape, V = opts.vocab;
  const buf = (bytes: number, label: string, data?: ArrayBufferView) =>
    createStorage(gpu, bytes, data, label);
  const eos = opts.eosIds.length ? opts.eosIds : [0xffffffff];
  const done = new Uint32Array(S * (SLOT_STATE_BYTES / 4));
  for (let s = 0; s < S; s++) done.set(slotStateWords(DONE), s * (SLOT_STATE_BYTES / 4));
  return {
    blockTable: buf(S * layout.maxBlocks * 4, "block_table"),
    params: buf(S * SAMPLE_PARAMS_BYTES, "sample_params"),
    step: {
      seqLen: buf(S * 4, "seq_len"),
      pos: buf(S * 4, "decode_pos"),
      slotState: buf(S * SLOT_STATE_BYTES, "slot_state", done),
      nextTok: buf(S * 4, "next_tok"),
      sampled: buf(S * RING_ENTRY_BYTES, "sampled"),
      ring: buf(layout.ringBytes(regions * maxSteps), "ring"),
      counts: buf(S * V * 4, "counts"),
      eos: buf(eos.length * 4, "eos", Uint32Array.from(eos)),
    },
    topRing: buf(regions * maxSteps * layout.topStride(), "top_ring"),
    eosCount: opts.eosIds.length,
  };
}
