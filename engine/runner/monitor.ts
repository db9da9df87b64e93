/**
 * The GPU side of the precision monitor: a statistics buffer of one slot per layer and projection
 * (kernels/quant_x.ts), the measurements the forward pass asks its matmuls to make in monitored
 * passes (a prefill chunk; the first decode step of a submission), the copy of the buffer into
 * the submission's readback, and which weights each layer runs. Its policy lives above it
 * (engine/sched/precision.ts); engine/engine.ts hands the read-back measurements to the policy
 * and the policy's switches back here.
 */
import type { Gpu } from "../../gpu/device.ts";
import type { Dispatch } from "../../gpu/dispatch.ts";
import { ReadbackPool } from "../../gpu/readback.ts";
import { createStorage } from "../../gpu/device.ts";
import {
  decodeStats,
  type InputStats,
  type Measure,
  STATS_WORDS,
  statsClearDispatch,
} from "../../kernels/quant_x.ts";
import type { WeightBuffer } from "../../kernels/weight.ts";
import {
  type LayerWeights,
  type ModelWeights,
  type Projection,
  PROJECTIONS,
} from "../model/weights.ts";

/** What a submission copies and hands back for the monitor (engine/runner/submission.ts). */
export interface MonitorReadback {
  src: GPUBuffer;
  bytes: number;
  pool: ReadbackPool;
  /** Called with the bytes once the submission is read. */
  take: (data: ArrayBuffer) => void;
}

/** Which rows of a pass hold tokens (see kernels/quant_x.ts `QuantXBuffers.live`). */
export type LiveRows = NonNullable<Measure["live"]>;

/** The precision monitor's GPU state and the layers' current weights. */
export class PrecisionMonitor {
  /** Whether any projection is quantized (else the monitor measures nothing). */
  readonly enabled: boolean;
  /** Per layer, whether its float projections are on the GPU to fall back to. */
  readonly canFallBack: boolean[];
  /** Bumps whenever a layer's precision changes: built dispatch plans are stale then. */
  version = 0;
  /** Called with every read-back batch of measurements, a record per layer. */
  onObserve?: (batch: Partial<Record<Projection, InputStats>>[]) => void;
  readonly #stats: GPUBuffer;
  readonly #pool: ReadbackPool;
  readonly #clear: Dispatch;
  readonly #w: ModelWeights;
  readonly #precise: boolean[];

  constructor(readonly gpu: Gpu, w: ModelWeights) {
    this.#w = w;
    this.enabled = w.quant.mode !== "none";
    this.canFallBack = w.layers.map((l) => PROJECTIONS.some((p) => l.precise?.[p]));
    this.#precise = w.layers.map(() => false);
    const slots = w.layers.length * PROJECTIONS.length;
    this.#stats = createStorage(gpu, slots * STATS_WORDS * 4, undefined, "monitor stats");
    this.#pool = new ReadbackPool(gpu.device, slots * STATS_WORDS * 4, this.enabled ? 4 : 0);
    this.#clear = statsClearDispatch(gpu, this.#stats, slots);
  }

  /** Whether layer `l` runs its float weights. */
  precise(l: number): boolean {
    return this.#precise[l];
  }

  /** Switches layer `l` to its float weights (`precise`) or back; bumps {@linkcode version}. */
  setPrecise(l: number, precise: boolean): void {
    if (this.#precise[l] === precise) return;
    if (precise && !this.canFallBack[l]) {
      throw new Error(`internal error: layer ${l} has no float weights to fall back to`);
    }
    this.#precise[l] = precise;
    this.version++;
  }

  /** The weight layer `l` runs for projection `p` now. */
  weight(l: number, p: Projection): WeightBuffer {
    const layer = this.#w.layers[l];
    return (this.#precise[l] && layer.precise?.[p]) || layer[p];
  }

  /** Layer `l`'s weights as the forward runs them now (its projections swapped when precise). */
  layer(l: number): LayerWeights {
    const layer = this.#w.layers[l];
    if (!this.#precise[l]) return layer;
    const swapped = { ...layer };
    for (const p of PROJECTIONS) swapped[p] = this.weight(l, p);
    return swapped;
  }

  /** What a monitored pass's matmul of projection `p` of layer `l` measures. */
  measure(l: number, p: Projection, live?: LiveRows): Measure | undefined {
    if (!this.enabled) return undefined;
    const slot = l * PROJECTIONS.length + PROJECTIONS.indexOf(p);
    return { stats: { buffer: this.#stats, slot }, sample: this.#w.layers[l].samples?.[p], live };
  }

  /** Zeroes the statistics: the first dispatch of a monitored pass. */
  clear(): Dispatch {
    return this.#clear;
  }

  /** What a submission holding a monitored pass copies back, or undefined when disabled. */
  readback(): MonitorReadback | undefined {
    if (!this.enabled) return undefined;
    return {
      src: this.#stats,
      bytes: this.#stats.size,
      pool: this.#pool,
      take: (data) => this.onObserve?.(this.decode(new Uint32Array(data))),
    };
  }

  /** The statistics buffer's words as a record per layer. */
  decode(words: Uint32Array): Partial<Record<Projection, InputStats>>[] {
    return this.#w.layers.map((_, l) => {
      const out: Partial<Record<Projection, InputStats>> = {};
      PROJECTIONS.forEach((p, i) => {
        const s = decodeStats(words, l * PROJECTIONS.length + i);
        if (s.rows > 0) out[p] = s;
      });
      return out;
    });
  }
}
