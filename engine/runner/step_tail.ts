/**
 * The end of every step that samples, from the LM head on: the logits, logit_bias, sampling (with grammar
 * masks when a constrained slot runs), the top-logprobs alternatives, then the step kernel that
 * records tokens in the ring (`step_end`, or a verification pass's `spec_end`) and the grammar
 * advance. The forward pass (engine/runner/forward.ts) appends these to its plans; they are
 * memoised per shape, region and step like the rest, and rebuilt when the constraint buffers
 * change (engine/runner/constraints.ts `version`).
 */
import type { Gpu } from "../../gpu/device.ts";
import type { Dispatch } from "../../gpu/dispatch.ts";
import { advanceDispatch, biasDispatch } from "../../kernels/constraint.ts";
import { fingerprintDispatch } from "../../kernels/fingerprint.ts";
import { matmulDispatches } from "../../kernels/matmul.ts";
import type { WeightBuffer } from "../../kernels/weight.ts";
import type { ModelConfig } from "../model/config.ts";
import { logitsStatsDispatch, topKDispatch } from "../../kernels/logits.ts";
import { sampleDispatch } from "../../kernels/sample.ts";
import { specDispatch } from "../../kernels/speculate.ts";
import { stepDispatch } from "../../kernels/step.ts";
import type { SlotConstraints } from "./constraints.ts";
import type { SlotBuffers, SlotLayout } from "./slots.ts";

/** Which of a step's optional dispatches its slots need. */
export interface TailFlags {
  withTop: boolean;
  /** Some running slot is constrained by a grammar: masked sampling and the advance. */
  grammar?: boolean;
  /** Some running slot has logit_bias. */
  bias?: boolean;
}

/**
 * LM head over `m` rows of `x` (RMS-normed on the fly with `normWeight`) into rows
 * [row0, row0 + m) of `y` ([rows, V]), one matmul per chunk of the head's rows.
 */
export function lmHeadDispatches(
  gpu: Gpu,
  cfg: Pick<ModelConfig, "vocabSize" | "rmsEps">,
  chunks: readonly WeightBuffer[],
  o: { m: number; row0: number; x: GPUBuffer; normWeight?: GPUBuffer; y: GPUBuffer },
): Dispatch[] {
  const V = cfg.vocabSize;
  let r = 0;
  return chunks.flatMap((chunk) => {
    const d = matmulDispatches(gpu, { x: o.x, w: chunk, y: o.y, normWeight: o.normWeight }, {
      m: o.m,
      eps: cfg.rmsEps,
      yStride: V,
      yOffset: o.row0 * V + r,
    });
    r += chunk.rows;
    return d;
  });
}

/** Memoises built dispatches (each owns a uniform buffer), keeping the newest `limit`. */
export function memo(
  cache: Map<string, Dispatch[]>,
  key: string,
  build: () => Dispatch[],
  limit = 256,
): Dispatch[] {
  let d = cache.get(key);
  if (!d) {
    d = build();
    cache.set(key, d);
    if (cache.size > limit) cache.delete(cache.keys().next().value!);
  }
  return d;
}

/** See the module doc. */
export class StepTail {
  readonly #samples = new Map<string, Dispatch[]>();
  readonly #ends = new Map<string, Dispatch[]>();

  constructor(
    readonly gpu: Gpu,
    readonly vocab: number,
    readonly o: {
      slots: SlotBuffers;
      layout: SlotLayout;
      constraints: SlotConstraints;
      logits: GPUBuffer;
      stats: GPUBuffer;
      /** The final residual rows (fingerprinted) and a prefill chunk's last row index. */
      x: GPUBuffer;
      lastRow: GPUBuffer;
      hidden: number;
    },
  ) {}

  /**
   * Bias, sampling and top-k of logits rows [0, rows) (a verification pass: R rows per slot),
   * for the slots [rowBegin / R, rows / R) that matter (a prefill: its one slot).
   */
  sample(rows: number, region: number, k: number, f: TailFlags, R = 1, rowBegin = 0): Dispatch[] {
    const c = this.o.constraints;
    const key = `${rows}:${R}:${rowBegin}:${f.grammar ? `g${c.version}` : ""}:` +
      `${f.bias ? `b${c.version}` : ""}:${f.withTop ? `${region}:${k}` : ""}`;
    return memo(this.#samples, key, () => this.#buildSample(rows, region, k, f, R, rowBegin));
  }

  #buildSample(
    rows: number,
    region: number,
    k: number,
    f: TailFlags,
    R: number,
    rowBegin: number,
  ): Dispatch[] {
    const g = this.gpu, V = this.vocab, { slots, layout, constraints, logits, stats } = this.o;
    const sp = slots.spec;
    const out: Dispatch[] = [];
    if (f.bias) {
      out.push(biasDispatch(g, { params: slots.params, logits, bias: constraints.bias }, {
        rowBegin,
        rowEnd: rows,
        vocab: V,
        rowsPerSeq: R,
      }));
    }
    const cb = f.grammar ? constraints.buffers : undefined;
    out.push(sampleDispatch(g, {
      logits,
      params: slots.params,
      // A verification row draws at its own position: the length it attends.
      position: R > 1 ? sp!.rowLen : slots.step.seqLen,
      counts: slots.step.counts,
      out: slots.step.sampled,
      rowTok: sp?.rowTok,
      grammar: cb && { tables: cb.tables, state: cb.state, slotState: slots.step.slotState },
    }, { rows, vocab: V, rowsPerSeq: R, mask: f.grammar ?? false }));
    if (f.withTop) {
      out.push(logitsStatsDispatch(g, { logits, stats }, { rows, vocab: V }));
      const top = {
        buffer: slots.topRing,
        offset: (region * layout.shape.maxSteps + k) * layout.topStride(),
        size: layout.topStride(),
      };
      out.push(topKDispatch(g, { logits, stats, out: top }, {
        rows,
        vocab: V,
        k: layout.shape.topK,
      }));
    }
    return out;
  }

  /**
   * `step_end` over slots [slotBegin, slotEnd) at (region, k), the grammar advance and the
   * fingerprints (a prefill's: of its last row, into its one slot's entry).
   */
  stepEnd(
    slotBegin: number,
    slotEnd: number,
    region: number,
    k: number,
    f: TailFlags,
    prefill = false,
  ) {
    const { slots, layout, constraints } = this.o;
    const key = `${slotBegin}:${slotEnd}:${region}:${k}:${f.grammar ? constraints.version : ""}` +
      (prefill ? ":p" : "");
    return memo(this.#ends, key, () => [
      this.#fingerprint(slotEnd, region, k, 1, prefill ? slotBegin : undefined),
      stepDispatch(this.gpu, slots.step, {
        entry: "step_end",
        slotBegin,
        slotEnd,
        vocab: this.vocab,
        ringOffset: layout.ringOffset(region, k),
        trashPos: layout.trashPos,
        nEos: slots.eosCount,
        ringStride: layout.ringStride,
        histLen: slots.spec ? layout.shape.contextLength : 0,
      }),
      ...this.#advance(slotBegin, slotEnd, region, k, 1, f),
    ], 4096);
  }

  /**
   * A verification pass's fingerprints, its cross-check's comparison when it has one (after the
   * fingerprints, which mark every slot unchecked), `spec_end` over slots [0, slots) at
   * (region, k), then the advance.
   */
  specEnd(
    slots: number,
    R: number,
    region: number,
    k: number,
    f: TailFlags,
    check?: () => Dispatch,
  ): Dispatch[] {
    const { slots: b, layout, constraints } = this.o;
    const key = `spec:${slots}:${R}:${region}:${k}:${f.grammar ? constraints.version : ""}` +
      (check ? ":c" : "");
    return memo(this.#ends, key, () => [
      this.#fingerprint(slots * R, region, k, R),
      ...(check ? [check()] : []),
      specDispatch(this.gpu, { step: b.step, spec: b.spec! }, {
        entry: "spec_end",
        slotBegin: 0,
        slotEnd: slots,
        rows: R,
        histLen: layout.shape.contextLength,
        trashPos: layout.trashPos,
        vocab: this.vocab,
        ringOffset: layout.ringOffset(region, k),
        ringStride: layout.ringStride,
        nEos: b.eosCount,
      }),
      ...this.#advance(0, slots, region, k, R, f),
    ], 4096);
  }

  /** Fingerprints of rows [0, rows) (R per slot), or of a prefill's last row for `slot`. */
  #fingerprint(rows: number, region: number, k: number, R: number, slot?: number): Dispatch {
    const { slots, layout, x, lastRow, hidden } = this.o;
    return fingerprintDispatch(this.gpu, { x, fpRing: slots.fpRing, lastRow }, {
      rows,
      hidden,
      ringOffset: layout.ringOffset(region, k),
      ringStride: layout.ringStride,
      rowsPerSeq: R,
      ...(slot === undefined ? {} : { prefill: { slot } }),
    });
  }

  #advance(
    slotBegin: number,
    slotEnd: number,
    region: number,
    k: number,
    tokens: number,
    f: TailFlags,
  ): Dispatch[] {
    if (!f.grammar) return [];
    const { slots, layout, constraints } = this.o, cb = constraints.buffers;
    return [advanceDispatch(this.gpu, {
      params: slots.params,
      ring: slots.step.ring,
      tables: cb.tables,
      tokenBytes: cb.tokenBytes,
      state: cb.state,
    }, {
      slotBegin,
      slotEnd,
      ringOffset: layout.ringOffset(region, k),
      ringStride: layout.ringStride,
      tokens,
    })];
  }
}
