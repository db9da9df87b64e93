/**
 * Which precision each layer's projections run at (pure policy, like the scheduler: no GPU, no
 * timers). The GPU measures, per batch, the inputs of every projection of every layer and the
 * error of a sample of each quantized product (kernels/quant_x.wgsl, engine/runner/monitor.ts);
 * a layer whose measurements leave the safe range (the seed's FP8-TCS: an input's per-row
 * standard deviation below 0.01 or above 100; a sampled product more than `errMax` off its
 * 16-bit value; a value that is not finite) switches to its 16-bit weights at once, and goes back
 * to 8 bits only after `recoverAfter` batches in range in a row. Where the 16-bit weights are not
 * on the GPU (a GGUF file, or the fallback dropped to save memory), layers stay quantized and the
 * policy only counts what it would have done.
 */
import type { InputStats } from "../../kernels/quant_x.ts";
import type { Projection } from "../model/weights.ts";

/** What leaves the safe range (see the module doc). */
export interface PrecisionThresholds {
  /** Smallest per-row standard deviation of a projection's input allowed (0.01). */
  stdMin: number;
  /** Largest per-row standard deviation allowed (100). */
  stdMax: number;
  /** Largest relative error of a sampled quantized product allowed (0.1). */
  errMax: number;
  /** Batches in range in a row before a 16-bit layer goes back to 8 bits (64). */
  recoverAfter: number;
}

/** The seed's range, and an error threshold well above the default model's (docs/quantization.md). */
export const DEFAULT_THRESHOLDS: PrecisionThresholds = {
  stdMin: 0.01,
  stdMax: 100,
  errMax: 0.1,
  recoverAfter: 64,
};

/** One layer's measurements in one batch: per projection, its input's statistics. */
export type LayerInputs = Partial<Record<Projection, InputStats>>;

/**
 * Why `inputs` leave the safe range (e.g. "gateUp input std 120 > 100"), or undefined when they
 * do not; projections that saw no rows are skipped.
 */
export function outOfRange(inputs: LayerInputs, t: PrecisionThresholds): string | undefined {
  for (const [p, s] of Object.entries(inputs) as [Projection, InputStats][]) {
    if (!s || s.rows === 0) continue;
    if (s.nonfinite > 0) return `${p} input: ${s.nonfinite} rows not finite`;
    if (!(s.minStd >= t.stdMin)) return `${p} input std ${fmt(s.minStd)} < ${t.stdMin}`;
    if (!(s.maxStd <= t.stdMax)) return `${p} input std ${fmt(s.maxStd)} > ${t.stdMax}`;
    if (!(s.sampleErr <= t.errMax)) return `${p} sampled error ${fmt(s.sampleErr)} > ${t.errMax}`;
  }
  return undefined;
}

const fmt = (v: number) => (Number.isFinite(v) ? Number(v.toPrecision(3)) : v);

/** A layer's state as the policy keeps it. */
export interface LayerPrecision {
  /** Runs its 16-bit weights now. */
  precise: boolean;
  /** Batches it was seen out of range. */
  outOfRange: number;
  /** In-range batches in a row since it last was out of range. */
  clean: number;
  /** The last reason it was out of range. */
  reason?: string;
}

/** A layer the policy switched: to 16 bits (`precise`) or back. */
export interface PrecisionChange {
  layer: number;
  precise: boolean;
  reason?: string;
}

/** Options of {@linkcode PrecisionPolicy}. */
export interface PrecisionPolicyOptions {
  /** Per layer, whether its 16-bit weights are on the GPU to fall back to. */
  canFallBack: boolean[];
  thresholds?: Partial<PrecisionThresholds>;
}

/** The precision of every layer, from the batches' measurements. */
export class PrecisionPolicy {
  readonly thresholds: PrecisionThresholds;
  readonly layers: LayerPrecision[];
  readonly #can: boolean[];
  /** Batches observed; switches to 16 bits and back so far. */
  observations = 0;
  fallbacks = 0;
  recoveries = 0;

  constructor(o: PrecisionPolicyOptions) {
    this.thresholds = { ...DEFAULT_THRESHOLDS, ...o.thresholds };
    this.#can = [...o.canFallBack];
    this.layers = this.#can.map(() => ({ precise: false, outOfRange: 0, clean: 0 }));
  }

  /** Whether layer `l` runs its 16-bit weights. */
  precise(l: number): boolean {
    return this.layers[l].precise;
  }

  /** Takes one batch's measurements (one entry per layer) and returns the layers it switched. */
  observe(batch: LayerInputs[]): PrecisionChange[] {
    this.observations++;
    const changes: PrecisionChange[] = [];
    batch.forEach((inputs, l) => {
      const s = this.layers[l];
      if (!s || !Object.values(inputs).some((x) => x && x.rows > 0)) return;
      const reason = outOfRange(inputs, this.thresholds);
      if (reason) {
        s.outOfRange++;
        s.clean = 0;
        s.reason = reason;
        if (!s.precise && this.#can[l]) {
          s.precise = true;
          this.fallbacks++;
          changes.push({ layer: l, precise: true, reason });
        }
        return;
      }
      s.clean++;
      if (s.precise && s.clean >= this.thresholds.recoverAfter) {
        s.precise = false;
        this.recoveries++;
        changes.push({ layer: l, precise: false });
      }
    });
    return changes;
  }
}
