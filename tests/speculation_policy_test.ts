/**
 * engine/sched/speculation.ts without a GPU: when a submission is a verification pass and of how
 * many rows, the length groups' depth choice from their profiles and the pass's cost, the
 * per-sequence breaker, the cross-check cadence and the failure breaker, the run-time switch.
 */
import assert from "node:assert/strict";
import {
  type BookedStep,
  newSpecStats,
  type SpecCandidate,
  type SpecTimes,
  SpeculationPolicy,
} from "../engine/sched/speculation.ts";

/** The H200's step times at M rows of the 1.1B shape against M = 1 (issue 27). */
const H200 = [0, 1, 1.05, 1.29, 1.32, 1.81, 1.85];
const measured: SpecTimes = { plain: 1, verify: (R) => H200[R] };
const seq = (context = 50, allowed = true): SpecCandidate => ({
  stats: newSpecStats(allowed),
  context,
});
const step = (drafted: number, accepted: number, o: Partial<BookedStep> = {}): BookedStep => ({
  drafted,
  pooled: 0,
  accepted,
  allowed: drafted,
  rows: 5,
  ...o,
});

Deno.test("speculation policy: off and opted-out sequences never speculate", () => {
  const off = new SpeculationPolicy({ rows: 5, mode: "off" });
  assert.equal(off.rows, 1);
  assert.equal(off.plan([seq()], measured).rows, 1);
  const auto = new SpeculationPolicy({ rows: 5, mode: "auto" });
  const plan = auto.plan([seq(50, false)], measured);
  assert.deepEqual([plan.rows, plan.caps], [1, [0]]);
  const on = new SpeculationPolicy({ rows: 5, mode: "on" });
  const mixed = on.plan([seq(), undefined, seq(50, false)], measured);
  assert.deepEqual([mixed.rows, mixed.caps], [5, [4, 0, 0]]);
});

Deno.test("speculation policy: measure a plain step, then try each pass size once", () => {
  const p = new SpeculationPolicy({ rows: 5, mode: "auto" });
  const live = [seq()];
  assert.equal(p.plan(live, { verify: () => undefined }).rows, 1, "plain first");
  // Nothing measured beyond plain: every size looks as cheap as a plain step, so the deepest
  // (the prior expects most tokens from it) is tried.
  assert.equal(p.plan(live, { plain: 1, verify: () => undefined }).rows, 5);
  // R = 5 measured at 1.81: R = 4 is assumed to cost what R = 3 did… none measured: 1.
  const some: SpecTimes = { plain: 1, verify: (R) => (R === 5 ? 1.81 : undefined) };
  assert.equal(p.plan(live, some).rows, 4);
  // All measured: the prior (0.7^i accepted) is best at 3 drafts for the H200's costs.
  assert.equal(p.plan(live, measured).rows, 4);
});

Deno.test("speculation policy: a pass that does not pay pauses the batch, saying why", () => {
  const p = new SpeculationPolicy({ rows: 5, mode: "auto" });
  const s = seq();
  for (let i = 0; i < 200; i++) p.groupOf(50).book(step(4, 0));
  const dear: SpecTimes = { plain: 1, verify: (R) => 1 + R };
  assert.equal(p.plan([s], dear).rows, 1);
  assert.match(p.reason!, /verification of \d+ drafts costs \d\.\d\dx a plain step for/);
  assert.equal(p.plan([s], measured).rows, 1, "still paused");
});

Deno.test("speculation policy: length groups choose their depth from their profiles", () => {
  const p = new SpeculationPolicy({ rows: 5, mode: "auto" });
  assert.deepEqual(p.groups.map((g) => g.name), ["<128", "128-511", "512+"]);
  assert.equal(p.groupOf(127).name, "<128");
  assert.equal(p.groupOf(128).name, "128-511");
  assert.equal(p.groupOf(5000).name, "512+");
  // Short contexts: every draft accepted. Long ones: none.
  for (let i = 0; i < 300; i++) {
    p.record(newSpecStats(true), step(4, 4), 40);
    p.record(newSpecStats(true), step(4, 0), 900);
  }
  const short = seq(40), long = seq(900);
  const plan = p.plan([short, long], measured);
  const [g0, , g2] = p.groups;
  // E(k) ≈ k + 1 at a cost of H200[k + 1]: 4 / 1.32 beats 5 / 1.81 (the step at M = 5).
  assert.equal(g0.depth, 3);
  assert.equal(g2.depth, 0, "a group whose drafts all fail does not speculate");
  assert.deepEqual([plan.rows, plan.caps], [4, [3, 0]]);
  assert.ok(Math.abs(g0.expect(3) - 4) < 0.05, `${g0.expect(3)}`);
  // A sequence adapts within its group's depth: among members whose drafts are all taken, one
  // whose first draft is always taken and the next never comes down to one draft (2 tokens for
  // 1.05 beats 2 for 1.32), while a newcomer runs the group's depth; one whose drafts all fail
  // stops drafting.
  const one = seq(40), none = seq(40), good = seq(40), depths: number[] = [];
  for (let i = 0; i < 16; i++) {
    depths.push(p.plan([one, seq(40)], measured).caps[0]);
    for (let j = 0; j < 4; j++) p.record(good.stats, step(4, 4), 40);
    p.record(one.stats, step(4, 1), 40);
    p.record(none.stats, step(4, 0), 40);
  }
  assert.deepEqual([depths[0], depths.at(-1)], [3, 1], `${depths}`);
  assert.ok(depths.every((d, i) => i === 0 || d <= depths[i - 1]), `${depths}`);
  assert.deepEqual(p.plan([one, seq(40), none], measured).caps, [1, 3, 0]);
  // Fixed costs (the bench's) replace the measured ones: cheap rows, the deepest.
  const cheap = new SpeculationPolicy({
    rows: 7,
    mode: "auto",
    tuning: { costs: [0, 1, 1, 1, 1, 1, 1, 1.05] },
  });
  for (let i = 0; i < 300; i++) cheap.record(newSpecStats(true), step(6, 6, { rows: 7 }), 40);
  assert.equal(cheap.plan([seq(40)], { verify: () => undefined, plain: 1 }).rows, 7);
  const profile = cheap.profiles()[0];
  assert.deepEqual([profile.name, profile.steps, profile.depth], ["<128", 300, 6]);
});

Deno.test("speculation policy: a sequence whose drafts fail stops drafting, then tries again", () => {
  const p = new SpeculationPolicy({ rows: 5, mode: "auto" });
  const s = newSpecStats(true);
  for (let i = 0; i < 30 && p.drafting(s); i++) p.record(s, step(4, 0), 50);
  assert.equal(p.drafting(s), false, "paused after rejected drafts");
  assert.ok(s.steps < 30);
  assert.deepEqual(
    [p.totals.steps, p.totals.drafted, p.totals.accepted],
    [s.steps, 4 * s.steps, 0],
  );
  // While paused its steps draft nothing and count towards its comeback.
  for (let i = 0; i < 64; i++) p.record(s, step(0, 0), 50);
  assert.equal(p.drafting(s), true, "back");
  for (let i = 0; i < 20; i++) p.record(s, step(4, 3, { pooled: 1 }), 50);
  assert.ok(s.gain > 3.5, `gain ${s.gain}`);
  assert.equal(s.pooled, 20);
  assert.equal(s.byRows[5], s.steps);
  // "on" never pauses a sequence (tests want every step verified).
  const on = new SpeculationPolicy({ rows: 3, mode: "on" });
  const t = newSpecStats(true);
  for (let i = 0; i < 30; i++) on.record(t, step(2, 0, { rows: 3 }), 50);
  assert.equal(on.drafting(t), true);
  assert.equal(on.plan([{ stats: t, context: 50 }], { plain: 1, verify: () => 9 }).rows, 3);
});

Deno.test("speculation policy: one verification submission in N is cross-checked", () => {
  const p = new SpeculationPolicy({ rows: 3, mode: "on", tuning: { checkEvery: 3 } });
  const checks = Array.from({ length: 7 }, () => p.plan([seq()], measured).check);
  assert.deepEqual(checks, [true, false, false, true, false, false, true]);
  const never = new SpeculationPolicy({ rows: 3, mode: "on", tuning: { checkEvery: 0 } });
  assert.equal(never.plan([seq()], measured).check, false);
  assert.equal(p.plan([seq(50, false)], measured).check, false, "a plain submission is not");
});

Deno.test("speculation policy: failed checks stop their sequence, and past 5% the engine", () => {
  const p = new SpeculationPolicy({
    rows: 5,
    mode: "on",
    tuning: { failureWindow: 40, checkTolerance: 0.02 },
  });
  const good = newSpecStats(true);
  for (let i = 0; i < 39; i++) p.record(good, step(4, 2, { check: 1e-6 }), 50);
  assert.equal(p.tripped, false);
  // One failure in 40 (2.5%) stops its sequence for good, not the engine.
  const bad = newSpecStats(true);
  p.record(bad, step(4, 2, { check: 0.03 }), 50);
  assert.deepEqual([bad.checks, bad.failures, p.drafting(bad)], [1, 1, false]);
  assert.equal(p.tripped, false);
  assert.equal(p.plan([{ stats: bad, context: 50 }], measured).rows, 1);
  assert.equal(p.plan([{ stats: good, context: 50 }], measured).rows, 5);
  // A NaN fails too: 2 of the last 40 (5%) is not past the rate; 3 are.
  p.record(newSpecStats(true), step(4, 2, { check: NaN }), 50);
  assert.equal(p.tripped, false);
  p.record(newSpecStats(true), step(4, 2, { check: 0.5 }), 50);
  assert.equal(p.tripped, true);
  assert.deepEqual([p.totals.checks, p.totals.failures], [42, 3]);
  assert.match(p.reason!, /verification failed 3 of the last 40 cross-checks .* off until/);
  assert.equal(p.plan([{ stats: good, context: 50 }], measured).rows, 1, "off, even when on");
  // It stays off until switched on again.
  for (let i = 0; i < 100; i++) p.plan([{ stats: good, context: 50 }], measured);
  assert.equal(p.tripped, true);
  p.setMode("auto");
  assert.equal(p.tripped, false);
  assert.equal(p.reason, undefined);
  assert.equal(p.plan([{ stats: good, context: 50 }], measured).rows > 1, true);
});

Deno.test("speculation policy: the run-time switch and the knobs' checks", () => {
  const p = new SpeculationPolicy({ rows: 5, mode: "auto" });
  p.setMode("off");
  assert.equal(p.mode, "off");
  assert.equal(p.plan([seq()], measured).rows, 1);
  p.setMode("auto");
  assert.ok(p.plan([seq()], measured).rows > 1);
  const built = new SpeculationPolicy({ rows: 1, mode: "off" });
  assert.throws(() => built.setMode("auto"), /started with --speculate off/);
  const bad = (tuning: object, msg: RegExp) =>
    assert.throws(() => new SpeculationPolicy({ rows: 5, mode: "auto", tuning }), msg);
  bad({ checkEvery: -1 }, /speculation.checkEvery must be an integer >= 0; got -1/);
  bad({ checkTolerance: NaN }, /speculation.checkTolerance must be a number >= 0/);
  bad({ failureRate: 1 }, /speculation.failureRate must be in \[0, 1\)/);
  bad({ failureWindow: 0 }, /speculation.failureWindow must be an integer >= 1/);
  bad({ groups: [512, 128] }, /speculation.groups must be ascending integers >= 1/);
  bad({ costs: [0, 1, -2] }, /speculation.costs must be positive ratios/);
});
