/** What /metrics and /health say of the layers' precision (api/types.ts `PrecisionStats`). */
import type { LayerPrecisionStats, PrecisionStats } from "../../api/types.ts";
import type { WeightBuffer } from "../../kernels/weight.ts";
import { elementBytes } from "../../kernels/weight.ts";
import type { PrecisionMonitor } from "../runner/monitor.ts";
import { type ModelWeights, PROJECTIONS } from "../model/weights.ts";
import type { PrecisionPolicy } from "./precision.ts";

/** The formats of a weight ("q4_k+q6_k" for one of parts). */
function formatOf(w: WeightBuffer): string {
  return w.parts ? [...new Set(w.parts.map((p) => p.w.dtype))].join("+") : w.dtype;
}

/** The layers' precision now, from the weights, the monitor's choice and the policy's counts. */
export function precisionStats(
  w: ModelWeights,
  monitor: PrecisionMonitor,
  policy: PrecisionPolicy,
): PrecisionStats {
  const layers = w.layers.map((_, l): LayerPrecisionStats => {
    const formats = [...new Set(PROJECTIONS.map((p) => formatOf(monitor.weight(l, p))))];
    const s = policy.layers[l];
    return {
      format: formats.join("+"),
      bits: 8 * elementBytes(monitor.weight(l, "gateUp").dtype),
      fellBack: monitor.precise(l),
      outOfRange: s.outOfRange,
      ...(s.reason ? { reason: s.reason } : {}),
    };
  });
  return {
    mode: w.quant.mode,
    fallback: w.quant.fallback,
    layers,
    observations: policy.observations,
    fallbacks: policy.fallbacks,
    recoveries: policy.recoveries,
  };
}
