/**
 * A verification pass of speculative decoding as dispatches (docs/speculation.md), over the
 * forward pass's weights and scratch (engine/runner/forward.ts hands them over): `spec_begin`
 * drafts every slot's rows, the layers run all `slots · R` rows (rope_kv writes each row's K and
 * V first, then decode attention runs each row over its slot's table), the rows are sampled as
 * plain decoding would sample them, and `spec_end` accepts the longest prefix the model agrees
 * with into the ring.
 *
 * A cross-checked pass first runs the plain decode path for every slot's row 0 (the token at L
 * over keys 0..L, as a plain step would: M = slots rows, decode attention writing its own K and V
 * at L) and keeps its final residual rows; the pass's row 0 is compared with them after its
 * layers (kernels/cross_check.wgsl). The plain path writes nothing a later step reads: its K and V
 * at L are written again by the pass's rope_kv before any row attends them, and it touches no
 * step state.
 */
import type { Gpu } from "../../gpu/device.ts";
import { createStorage } from "../../gpu/device.ts";
import type { Dispatch } from "../../gpu/dispatch.ts";
import {
  attentionDecodeDispatches,
  type AttentionDecodeOptions,
} from "../../kernels/attention_decode.ts";
import { crossCheckDispatch } from "../../kernels/cross_check.ts";
import { embeddingDispatch } from "../../kernels/embedding.ts";
import { ropeKvDispatch } from "../../kernels/rope_kv.ts";
import { specDispatch } from "../../kernels/speculate.ts";
import type { ModelConfig } from "../model/config.ts";
import type { ModelWeights } from "../model/weights.ts";
import type { KvPool } from "../kv/pool.ts";
import type { SlotBuffers, SlotLayout } from "./slots.ts";
import { memo, type StepTail, type TailFlags } from "./step_tail.ts";

/** What a verification pass is built from: the forward pass's parts. */
export interface VerifyParts {
  gpu: Gpu;
  cfg: ModelConfig;
  w: ModelWeights;
  kv: KvPool;
  slots: SlotBuffers;
  layout: SlotLayout;
  tail: StepTail;
  /** Draft from the n-gram pool of guesses too (kernels/speculate.wgsl). */
  pool: boolean;
  /** Scratch: the residual stream, fused QKV, rotated q and attention output rows. */
  x: GPUBuffer;
  qkv: GPUBuffer;
  q: GPUBuffer;
  attn: GPUBuffer;
  /** The transformer layers over `m` rows of `x`, attention supplied per layer. */
  layers: (m: number, attention: (layer: number) => Dispatch[]) => Dispatch[];
  /** Attention's head shape, table width, KV dtype, scale and mask for `layer`. */
  heads: (layer: number) => Heads;
  /** The final norm and LM head over `m` rows of `x` into the logits. */
  lmHead: (m: number) => Dispatch[];
}

/** What {@linkcode VerifyParts.heads} gives, for rope_kv and decode attention alike. */
export type Heads = Omit<AttentionDecodeOptions, "seqs" | "maxContext" | "rowsPerSeq">;

/** Builds (and memoises) verification passes; see the module doc. */
export class VerifyPlans {
  readonly #plans = new Map<string, Dispatch[]>();
  /** f32 [maxSlots, hidden]: the cross-check's plain rows. */
  #plain?: GPUBuffer;

  constructor(readonly o: VerifyParts) {}

  /** Forgets the built plans (the weights a layer runs changed). */
  clear(): void {
    this.#plans.clear();
  }

  /**
   * One pass over slots [0, slots), R rows each, at (region, k); decode attention runs the plan
   * of `bucket`. With `check`, the plain path of row 0 runs first and is compared (see the
   * module doc).
   */
  step(
    slots: number,
    R: number,
    o: { region: number; k: number; f: TailFlags; bucket: number; check: boolean },
  ): Dispatch[] {
    const { gpu, cfg, slots: b, layout } = this.o, sp = b.spec;
    if (!sp || R < 2 || R > layout.rows) {
      throw new Error(`internal error: a verification pass of ${R} rows per slot`);
    }
    const rows = slots * R, bucket = o.bucket;
    const body = memo(this.#plans, `${slots}:${R}:${bucket}:${o.check}`, () => [
      specDispatch(gpu, { step: b.step, spec: sp }, {
        entry: "spec_begin",
        slotBegin: 0,
        slotEnd: slots,
        rows: R,
        histLen: layout.shape.contextLength,
        trashPos: layout.trashPos,
        vocab: cfg.vocabSize,
        nEos: b.eosCount,
        pool: this.o.pool,
      }),
      ...(o.check ? this.#plainPath(slots, bucket) : []),
      embeddingDispatch(gpu, { table: this.o.w.embed, tokens: sp.rowTok, out: this.o.x }, {
        count: rows,
      }),
      ...this.o.layers(rows, (layer) => [
        ropeKvDispatch(gpu, {
          qkv: this.o.qkv,
          q: this.o.q,
          kPool: this.o.kv.k,
          vPool: this.o.kv.v,
          pos: sp.rowPos,
          tokSeq: sp.rowSlot,
          blockTable: b.blockTable,
          invFreq: this.o.w.invFreq,
        }, { tokens: rows, ...this.o.heads(layer) }),
        ...attentionDecodeDispatches(gpu, {
          qkv: this.o.qkv,
          pos: sp.rowPos,
          invFreq: this.o.w.invFreq,
          kPool: this.o.kv.k,
          vPool: this.o.kv.v,
          blockTable: b.blockTable,
          seqLen: sp.rowLen,
          out: this.o.attn,
        }, { seqs: rows, rowsPerSeq: R, maxContext: bucket, ...this.o.heads(layer) }),
      ]),
      ...this.o.lmHead(rows),
    ]);
    const compare = () =>
      crossCheckDispatch(gpu, this.#checkBuffers(), {
        entry: "check_compare",
        slots,
        hidden: cfg.hiddenSize,
        rowsPerSeq: R,
        ringOffset: layout.ringOffset(o.region, o.k),
        ringStride: layout.ringStride,
      });
    return [
      ...body,
      ...this.o.tail.sample(rows, o.region, o.k, o.f, R),
      ...this.o.tail.specEnd(slots, R, o.region, o.k, o.f, o.check ? compare : undefined),
    ];
  }

  /** The plain decode path of every slot's row 0, its final residual rows kept. */
  #plainPath(slots: number, bucket: number): Dispatch[] {
    const { gpu, cfg, slots: b } = this.o, sp = b.spec!;
    return [
      embeddingDispatch(gpu, { table: this.o.w.embed, tokens: b.step.nextTok, out: this.o.x }, {
        count: slots,
      }),
      ...this.o.layers(slots, (layer) =>
        attentionDecodeDispatches(gpu, {
          qkv: this.o.qkv,
          pos: sp.checkPos,
          invFreq: this.o.w.invFreq,
          kPool: this.o.kv.k,
          vPool: this.o.kv.v,
          blockTable: b.blockTable,
          seqLen: sp.checkLen,
          out: this.o.attn,
        }, { seqs: slots, maxContext: bucket, ...this.o.heads(layer) })),
      crossCheckDispatch(gpu, this.#checkBuffers(), {
        entry: "check_keep",
        slots,
        hidden: cfg.hiddenSize,
        rowsPerSeq: 1,
        ringOffset: 0,
        ringStride: 1,
      }),
    ];
  }

  #checkBuffers() {
    const { gpu, cfg, slots: b, layout } = this.o;
    this.#plain ??= createStorage(
      gpu,
      layout.shape.maxSlots * cfg.hiddenSize * 4,
      undefined,
      "check_plain",
    );
    return { x: this.o.x, plain: this.#plain, slotState: b.step.slotState, fpRing: b.fpRing };
  }
}
