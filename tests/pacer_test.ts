/**
 * Pacer: GPU times learnt from readbacks that waited, and the sleep they allow before the next
 * wait. Times are given explicitly (ms), as the engine passes `performance.now()`.
 */
import assert from "node:assert/strict";
import { PACE_MARGIN_MS, PACE_MIN_MS, type Paced, Pacer, STALE_MS } from "../engine/sched/pacer.ts";

const decode = (width: number, steps: number, submittedAt: number): Paced => ({
  work: `decode ${width}`,
  submittedAt,
  o: { steps },
});
const prefill = (rows: number, submittedAt: number): Paced => ({
  work: `prefill ${rows}`,
  submittedAt,
  o: { steps: 1, prefill: true },
});

Deno.test("pacer: nothing measured, no sleep; a wait that blocked gives the time per step", () => {
  const p = new Pacer();
  const sub = decode(1, 32, 100);
  assert.equal(p.sleepMs([sub], 100), 0);
  // Requested at 110, returned at 141.6: the GPU ran the 32 steps from 100 to 141.6.
  p.learn([sub], 110, 141.6);
  assert.ok(Math.abs(p.estimate("decode 1")! - 1.3) < 1e-9);
  // The next submission, submitted at 142 (the GPU was idle since 141.6): it should end at
  // 142 + 41.6; at 150 the loop may sleep until the margin before that.
  const next = decode(1, 32, 142);
  assert.ok(Math.abs(p.sleepMs([next], 150) - (142 + 41.6 - 150 - PACE_MARGIN_MS)) < 1e-9);
  // Too little left: wait now.
  assert.equal(p.sleepMs([next], 142 + 41.6 - PACE_MIN_MS + 0.5), 0);
  // A wider batch not measured yet takes at least what the widest narrower one did: after
  // `next`, 4 steps of width 2 at 1.3 ms.
  const wider = decode(2, 4, 143);
  const end = 142 + 41.6 + 4 * 1.3;
  assert.ok(Math.abs(p.sleepMs([next, wider], 150) - (end - 150 - PACE_MARGIN_MS)) < 1e-9);
  // Nothing measured at or below a width: a batch that holds it is not paced.
  const q = new Pacer();
  q.learn([decode(4, 10, 0)], 5, 20);
  assert.equal(q.sleepMs([decode(4, 10, 30), decode(2, 4, 31)], 35), 0);
  assert.equal(q.sleepMs([prefill(64, 30)], 35), 0, "decode times say nothing of prefill");
});

Deno.test("pacer: estimates average, halve after a wait that did not block, skip batches", () => {
  const p = new Pacer();
  p.learn([decode(4, 10, 0)], 5, 20); // 2 ms per step
  p.learn([decode(4, 10, 20)], 30, 50); // 3 ms: the average is 2.5
  assert.ok(Math.abs(p.estimate("decode 4")! - 2.5) < 1e-9);
  p.learn([decode(4, 10, 50)], 80, 80.2); // did not block: slept too long, halved
  assert.ok(Math.abs(p.estimate("decode 4")! - 1.25) < 1e-9);
  // Two submissions in one wait: their share of the time is unknown, nothing learnt.
  p.learn([decode(8, 4, 81), decode(8, 4, 82)], 83, 120);
  assert.equal(p.estimate("decode 8"), undefined);
  // A queued submission starts when the one before ends, not when it was submitted.
  const a = decode(4, 10, 200), b = decode(4, 10, 201);
  // Both known: a ends at 212.5, b at 225 (its own submit time is earlier).
  assert.ok(Math.abs(p.sleepMs([a, b], 210) - (225 - 210 - PACE_MARGIN_MS)) < 1e-9);
});

Deno.test("pacer: prefill chunks are timed per chunk, with a tenth more margin", () => {
  const p = new Pacer();
  p.learn([prefill(512, 0)], 1, 35); // 35 ms for the chunk
  assert.equal(p.estimate("prefill 512"), 35);
  const chunk = prefill(512, 100);
  assert.ok(Math.abs(p.sleepMs([chunk], 100) - (35 - 3.5 - PACE_MARGIN_MS)) < 1e-9);
  // A prefill behind known decode steps: both count.
  p.learn([decode(1, 8, 0)], 40, 50.4); // (50.4 - 35) / 8 per step, from when the prefill ended
  assert.ok(Math.abs(p.estimate("decode 1")! - 15.4 / 8) < 1e-9);
});

Deno.test("pacer: times learnt under load come down once the load is gone", () => {
  // A 64-row prefill measured at 400 ms while the machine was busy; it now takes 40.
  const p = new Pacer();
  p.learn([prefill(64, 0)], 1, 400);
  let t = 1000, slept = 0, overslept = 0;
  for (let i = 0; i < 6; i++) {
    const chunk = prefill(64, t);
    const sleep = p.sleepMs([chunk], t);
    slept += sleep;
    // The GPU finishes at t + 40; the readback is requested after the sleep.
    const t0 = t + sleep, t1 = Math.max(t0, t + 40);
    if (t0 > t + 40) overslept++;
    p.learn([chunk], t0, t1 === t0 ? t0 + 0.1 : t1);
    t = t1 + 100;
  }
  // Halving on every oversleep: 400, 200, 100, 50 ms, then it blocks and measures again.
  assert.ok(overslept <= 4, `overslept ${overslept} times`);
  assert.ok(p.estimate("prefill 64")! < 60, `estimate ${p.estimate("prefill 64")}`);
  assert.ok(slept < 900, `slept ${slept} ms over 6 chunks`);
});

Deno.test("pacer: a borrowed estimate that overslept is halved into the work's own", () => {
  const p = new Pacer();
  p.learn([prefill(32, 0)], 1, 300); // 300 ms for a 32-row chunk, learnt under load
  const chunk = prefill(64, 1000);
  assert.ok(p.sleepMs([chunk], 1000) > 200, "64 rows borrow the 32-row estimate");
  p.learn([chunk], 1297, 1297.1); // it had long finished
  assert.equal(p.estimate("prefill 64"), 150);
  assert.equal(p.estimate("prefill 32"), 300, "the lender keeps its own");
});

Deno.test("pacer: estimates not measured for a while are dropped, so the next wait measures", () => {
  const p = new Pacer();
  p.learn([decode(1, 8, 0)], 1, 17); // 2 ms per step
  assert.ok(p.sleepMs([decode(1, 8, 100)], 100) > 0);
  const later = 17 + STALE_MS + 1;
  assert.equal(p.sleepMs([decode(1, 8, later)], later), 0, "stale: wait and measure");
  assert.equal(p.sleepMs([decode(2, 8, later)], later), 0, "and no one borrows it");
  p.learn([decode(1, 8, later)], later + 1, later + 9); // measured again: 1 ms per step
  assert.ok(p.sleepMs([decode(1, 8, later + 10)], later + 10) > 0);
});
