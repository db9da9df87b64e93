/**
 * engine/sched/speculation.ts without a GPU: when a submission is a verification pass, the
 * per-sequence breaker, the batch breaker against the measured cost, and the run-time switch.
 */
import assert from "node:assert/strict";
import { newSpecStats, SpeculationPolicy } from "../engine/sched/speculation.ts";

Deno.test("speculation policy: off and opted-out sequences never speculate", () => {
  const off = new SpeculationPolicy({ rows: 5, mode: "off" });
  assert.equal(off.rows, 1);
  assert.equal(off.speculate([newSpecStats(true)], { plain: 1, verify: 1 }), false);
  const auto = new SpeculationPolicy({ rows: 5, mode: "auto" });
  const optedOut = newSpecStats(false);
  assert.equal(auto.cap(optedOut), 0);
  assert.equal(auto.speculate([optedOut], { plain: 1, verify: 1 }), false);
  assert.equal(auto.cap(newSpecStats(true)), 4);
});

Deno.test("speculation policy: measure a plain step, then a verification pass, then compare", () => {
  const p = new SpeculationPolicy({ rows: 5, mode: "auto" });
  const s = [newSpecStats(true)];
  assert.equal(p.speculate(s, {}), false, "plain first");
  assert.equal(p.speculate(s, { plain: 1 }), true, "then a verification pass");
  // A fresh sequence expects 2 tokens per step: a pass costing 1.3 steps pays…
  assert.equal(p.speculate(s, { plain: 1, verify: 1.3 }), true);
  // …one costing 2.5 does not, and the batch pauses for a while, saying why.
  assert.equal(p.speculate(s, { plain: 1, verify: 2.5 }), false);
  assert.match(p.reason!, /verification costs 2.50x a plain step for 2.00 tokens per step/);
  assert.equal(p.speculate(s, { plain: 1, verify: 1.3 }), false, "still paused");
  for (let i = 0; i < 40; i++) p.speculate(s, { plain: 1, verify: 1.3 });
  assert.equal(p.speculate(s, { plain: 1, verify: 1.3 }), true, "back after the pause");
  assert.equal(p.reason, undefined);
});

Deno.test("speculation policy: a sequence whose drafts fail stops drafting, then tries again", () => {
  const p = new SpeculationPolicy({ rows: 5, mode: "auto" });
  const s = newSpecStats(true);
  for (let i = 0; i < 30 && p.cap(s) > 0; i++) p.record(s, 4, 0);
  assert.equal(p.cap(s), 0, "paused after rejected drafts");
  assert.ok(s.steps < 30);
  assert.deepEqual(p.totals, { steps: s.steps, drafted: 4 * s.steps, accepted: 0 });
  // While paused its steps draft nothing and count towards its comeback.
  for (let i = 0; i < 64; i++) p.record(s, 0, 0);
  assert.equal(p.cap(s), 4, "back");
  // Accepted drafts keep it going, and the gain follows them.
  for (let i = 0; i < 20; i++) p.record(s, 4, 3);
  assert.equal(p.cap(s), 4);
  assert.ok(s.gain > 3.5, `gain ${s.gain}`);
  // "on" never pauses a sequence (tests want every step verified).
  const on = new SpeculationPolicy({ rows: 3, mode: "on" });
  const t = newSpecStats(true);
  for (let i = 0; i < 30; i++) on.record(t, 2, 0);
  assert.equal(on.cap(t), 2);
  assert.equal(on.speculate([t], { plain: 1, verify: 9 }), true);
});

Deno.test("speculation policy: the run-time switch", () => {
  const p = new SpeculationPolicy({ rows: 5, mode: "auto" });
  p.setMode("off");
  assert.equal(p.mode, "off");
  assert.equal(p.speculate([newSpecStats(true)], { plain: 1, verify: 1 }), false);
  p.setMode("auto");
  assert.equal(p.speculate([newSpecStats(true)], { plain: 1, verify: 1 }), true);
  const built = new SpeculationPolicy({ rows: 1, mode: "off" });
  assert.throws(() => built.setMode("auto"), /started with --speculate off/);
});
