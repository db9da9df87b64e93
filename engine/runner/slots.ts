/**
 * The per-slot GPU state of the batch: block tables, sampling parameters, the step kernels'
 * buffers (positions, slot states, the token ring, penalty counts), the top-logprobs ring and,
 * when the engine speculates, each slot's token history and the rows of a verification pass;
 * and the arithmetic of where each slot's rows live. Created and written only by the runner
 * (engine/runner/runner.ts); the forward pass binds them.
 */
import { createStorage, type Gpu } from "../../gpu/device.ts";
import { SAMPLE_PARAMS_BYTES } from "../../kernels/sample.ts";
import { POOL_WORDS, type SpecBuffers } from "../../kernels/speculate.ts";
import {
  DONE,
  RING_ENTRY_BYTES,
  SLOT_STATE_BYTES,
  slotStateWords,
  type StepBuffers,
} from "../../kernels/step.ts";
import { BLOCK } from "../kv/blocks.ts";

/** Bytes of one fingerprint ring entry (kernels/fingerprint.wgsl: a u32 per token entry). */
export const FINGERPRINT_BYTES = 4;

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
  /** Rows per slot a verification pass may run (drafts + 1); 1: the engine never speculates. */
  specRows: number;
}

/** Entries of one top-logprobs alternative: (id u32, logprob f32). */
const TOP_ENTRY_BYTES = 8;

/** Where a slot's rows are, derived from {@linkcode SlotShape}. */
export class SlotLayout {
  /** Columns of a slot's block table: its blocks, then the trash column (always block 0). */
  readonly maxBlocks: number;
  /** The position whose KV lands in the trash column: writes nobody reads. */
  readonly trashPos: number;
  /** Rows per slot of a step's work at most (its ring, samples and top logprobs). */
  readonly rows: number;
  /**
   * Ring entries per slot and step: 1, or with speculation a token per row and one more for
   * the step's (drafted, accepted) counts.
   */
  readonly ringStride: number;

  constructor(readonly shape: SlotShape) {
    this.maxBlocks = Math.ceil(shape.contextLength / BLOCK) + 1;
    this.trashPos = (this.maxBlocks - 1) * BLOCK;
    this.rows = shape.specRows;
    this.ringStride = shape.specRows > 1 ? shape.specRows + 1 : 1;
  }

  /** Bytes per (region, step) row of the top-logprobs ring (256-aligned for bind offsets). */
  topStride(): number {
    const bytes = this.shape.maxSlots * this.rows * this.shape.topK * TOP_ENTRY_BYTES;
    return Math.ceil(bytes / 256) * 256;
  }

  /** Ring entry offset (in entries) of (region, step). */
  ringOffset(region: number, k: number): number {
    return (region * this.shape.maxSteps + k) * this.shape.maxSlots * this.ringStride;
  }

  /** Byte offset of (region, step)'s row in the ring. */
  ringByteOffset(region: number, k: number): number {
    return this.ringOffset(region, k) * RING_ENTRY_BYTES;
  }

  /** Bytes of `steps` ring rows (every slot's entries of each step). */
  ringBytes(steps: number): number {
    return steps * this.shape.maxSlots * this.ringStride * RING_ENTRY_BYTES;
  }

  /** Bytes of `steps` rows of the fingerprint ring (a u32 per token ring entry). */
  fingerprintBytes(steps: number): number {
    return steps * this.shape.maxSlots * this.ringStride * FINGERPRINT_BYTES;
  }

  /** Entry index, in a copy of ring rows, of (step k, slot, entry j). */
  ringEntry(k: number, slot: number, j = 0): number {
    return (k * this.shape.maxSlots + slot) * this.ringStride + j;
  }

  /**
   * Word offset in a copy of top-ring rows of row `row`'s alternatives at step `k` (a slot's
   * row j is `slot · rows + j` in a verification pass, the slot itself otherwise): pairs
   * (id, logprob) for i < topK at words `+ 2 i`, `+ 2 i + 1`.
   */
  topOffset(k: number, row: number): number {
    return (k * this.topStride()) / 4 + row * this.shape.topK * 2;
  }
}

/** The batch's GPU state (see the module doc); every slot starts done. */
export interface SlotBuffers {
  /** u32 [maxSlots, maxBlocks]: a slot's physical blocks; zeros are the trash block. */
  blockTable: GPUBuffer;
  /** Sampling parameters [maxSlots] (kernels/sample.ts `packSampleParams`). */
  params: GPUBuffer;
  step: StepBuffers;
  /** Verification rows (kernels/speculate.ts); absent when the engine never speculates. */
  spec?: SpecBuffers;
  /** (id, logprob) [regions, maxSteps, topStride / 8]. */
  topRing: GPUBuffer;
  /** u32 per token ring entry: the fingerprint of the hidden row that produced its token. */
  fpRing: GPUBuffer;
  /** EOS ids in `step.eos` (0: none; the buffer then holds one unmatchable id). */
  eosCount: number;
}

/** Creates the batch's buffers for a model of `vocab` tokens whose EOS ids are `eosIds`. */
export function createSlotBuffers(
  gpu: Gpu,
  layout: SlotLayout,
  opts: { vocab: number; eosIds: number[] },
): SlotBuffers {
  const { maxSlots: S, maxSteps, regions, contextLength } = layout.shape, V = opts.vocab;
  const R = layout.rows;
  const buf = (bytes: number, label: string, data?: ArrayBufferView) =>
    createStorage(gpu, bytes, data, label);
  const eos = opts.eosIds.length ? opts.eosIds : [0xffffffff];
  const done = new Uint32Array(S * (SLOT_STATE_BYTES / 4));
  for (let s = 0; s < S; s++) done.set(slotStateWords(DONE), s * (SLOT_STATE_BYTES / 4));
  const pos = buf(S * 4, "decode_pos");
  const spec = R > 1
    ? {
      hist: buf(S * contextLength * 4, "hist"),
      rowTok: buf(S * R * 4, "row_tok"),
      rowPos: buf(S * R * 4, "row_pos"),
      rowLen: buf(S * R * 4, "row_len"),
      rowSlot: buf(S * R * 4, "row_slot", Uint32Array.from({ length: S * R }, (_, i) => i / R | 0)),
      cap: buf(S * 4, "spec_cap"),
      pool: buf(S * POOL_WORDS * 4, "spec_pool"),
      // the plain path's cross-check writes KV where a plain step would (its `pos`)
      checkPos: pos,
      checkLen: buf(S * 4, "check_len"),
    }
    : undefined;
  return {
    blockTable: buf(S * layout.maxBlocks * 4, "block_table"),
    params: buf(S * SAMPLE_PARAMS_BYTES, "sample_params"),
    step: {
      seqLen: buf(S * 4, "seq_len"),
      pos,
      slotState: buf(S * SLOT_STATE_BYTES, "slot_state", done),
      nextTok: buf(S * 4, "next_tok"),
      sampled: buf(S * R * RING_ENTRY_BYTES, "sampled"),
      ring: buf(layout.ringBytes(regions * maxSteps), "ring"),
      counts: buf(S * V * 4, "counts"),
      eos: buf(eos.length * 4, "eos", Uint32Array.from(eos)),
      hist: spec?.hist ?? buf(16, "no_hist"),
    },
    spec,
    topRing: buf(regions * maxSteps * layout.topStride(), "top_ring"),
    fpRing: buf(layout.fingerprintBytes(regions * maxSteps), "fingerprint_ring"),
    eosCount: opts.eosIds.length,
  };
}
