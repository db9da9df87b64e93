/**
 * The precision policy (engine/sched/precision.ts) without a GPU: what leaves the safe range,
 * the switch to 16 bits at once and back only after enough clean batches, layers without 16-bit
 * weights counted but never switched.
 */
import assert from "node:assert/strict";
import type { InputStats } from "../kernels/quant_x.ts";
import {
  DEFAULT_THRESHOLDS,
  type LayerInputs,
  outOfRange,
  PrecisionPolicy,
} from "../engine/sched/precision.ts";

const ok: InputStats = {
  min: -3,
  max: 4,
  minStd: 0.4,
  maxStd: 1.1,
  actErr: 0.01,
  sampleErr: 0.02,
  rows: 8,
  nonfinite: 0,
};
const layer = (over: Partial<InputStats> = {}, p: keyof LayerInputs = "down"): LayerInputs => ({
  qkv: ok,
  o: ok,
  gateUp: ok,
  [p]: { ...ok, ...over },
});

Deno.test("outOfRange: the seed's std range, the sampled error, values not finite", () => {
  const t = DEFAULT_THRESHOLDS;
  assert.equal(outOfRange(layer(), t), undefined);
  assert.equal(outOfRange(layer({ minStd: 0.005 }), t), "down input std 0.005 < 0.01");
  assert.equal(outOfRange(layer({ maxStd: 250 }, "o"), t), "o input std 250 > 100");
  assert.equal(outOfRange(layer({ sampleErr: 0.31 }), t), "down sampled error 0.31 > 0.1");
  assert.equal(outOfRange(layer({ nonfinite: 2 }), t), "down input: 2 rows not finite");
  assert.equal(outOfRange(layer({ maxStd: NaN }), t), "down input std NaN > 100");
  // Rows not seen (a projection the pass did not measure) say nothing.
  assert.equal(outOfRange(layer({ minStd: 0, rows: 0 }), t), undefined);
  assert.equal(
    outOfRange(layer({ minStd: 0.02 }), { ...t, stdMin: 0.05 }),
    "down input std 0.02 < 0.05",
  );
});

Deno.test("PrecisionPolicy: falls back at once, recovers after recoverAfter clean batches", () => {
  const p = new PrecisionPolicy({ canFallBack: [true, true], thresholds: { recoverAfter: 3 } });
  assert.deepEqual(p.observe([layer(), layer()]), []);
  assert.deepEqual(p.observe([layer(), layer({ maxStd: 120 })]), [
    { layer: 1, precise: true, reason: "down input std 120 > 100" },
  ]);
  assert.equal(p.precise(1), true);
  assert.equal(p.precise(0), false);
  // Still out of range: no new switch; two clean batches are not enough.
  assert.deepEqual(p.observe([layer(), layer({ maxStd: 120 })]), []);
  assert.deepEqual(p.observe([layer(), layer()]), []);
  assert.deepEqual(p.observe([layer(), layer()]), []);
  // Out of range again: the clean count starts over.
  assert.deepEqual(p.observe([layer(), layer({ sampleErr: 0.5 })]), []);
  for (let i = 0; i < 2; i++) assert.deepEqual(p.observe([layer(), layer()]), []);
  assert.deepEqual(p.observe([layer(), layer()]), [{ layer: 1, precise: false }]);
  assert.equal(p.precise(1), false);
  assert.equal(p.fallbacks, 1);
  assert.equal(p.recoveries, 1);
  assert.equal(p.observations, 9);
  assert.equal(p.layers[1].outOfRange, 3);
  assert.equal(p.layers[1].reason, "down sampled error 0.5 > 0.1");
  // A batch that measured nothing of a layer leaves it alone.
  assert.deepEqual(p.observe([{}, {}]), []);
  assert.equal(p.layers[1].clean, 3);
});

Deno.test("PrecisionPolicy: a layer without 16-bit weights is counted, never switched", () => {
  const p = new PrecisionPolicy({ canFallBack: [false, true] });
  assert.deepEqual(p.observe([layer({ minStd: 0.001 }), layer()]), []);
  assert.equal(p.precise(0), false);
  assert.equal(p.layers[0].outOfRange, 1);
  assert.equal(p.fallbacks, 0);
});
