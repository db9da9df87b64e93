/**
 * When and how deep the loop speculates (pure policy, like the scheduler: no GPU, no timers). A
 * verification pass of R rows per slot costs more than a plain step; it pays when drafts are
 * accepted often enough. Sequences fall into length groups by their context (default < 128,
 * 128–512, > 512 tokens: longer contexts have more history to draft from and dearer rows of
 * attention); each group keeps the profile of its verification steps (how often the first i
 * drafts were accepted when i were allowed) and chooses its draft depth k: the one whose expected
 * tokens per step over the cost of a pass of k + 1 rows is best, or none (the group does not
 * speculate for a while). A submission's pass runs the rows the deepest group asks for, when the
 * batch's expected tokens beat its cost. Costs are the measured GPU times of a plain step and of a
 * pass of R rows at the batch's width (engine/sched/pacer.ts); an R not measured yet is assumed
 * as cheap as the next smaller one measured, so it is tried once.
 *
 * Breakers: a sequence whose steps give too few tokens stops drafting for a while; one in
 * `checkEvery` verification submissions is cross-checked against the plain path, and a sequence
 * whose check fails stops speculating for good, while failures above `failureRate` over the last
 * `failureWindow` checks turn speculation off for the whole engine until it is switched on again
 * (`setMode`: `PUT /v1/speculation`).
 */
import type { SpeculationStats } from "../../api/types.ts";
import { bestDepth, type GroupProfile, groupsOf, Profile, type SpecGroup } from "./spec_groups.ts";

/** A sequence's speculation, as the policy keeps it (on `Sequence.spec`). */
export interface SpecStats {
  /**
   * Verification steps it took part in, drafts proposed (those from the n-gram pool of guesses),
   * drafts accepted (those from the pool).
   */
  steps: number;
  drafted: number;
  pooled: number;
  accepted: number;
  pooledAccepted: number;
  /** Verification steps by the rows per slot of their pass (index R). */
  byRows: number[];
  /** Moving average of the tokens a verification step gave it (≥ 1). */
  gain: number;
  /** Steps left before its drafting comes back after being switched off. */
  pausedFor: number;
  /** Whether the request allows it at all (`"speculation": false` opts out). */
  allowed: boolean;
  /** Its steps' cross-checks against the plain path, and those that failed. */
  checks: number;
  failures: number;
  /** How often its first i drafts were accepted (its length group's profile as the prior). */
  profile: Profile;
}

/** A new sequence's stats. */
export function newSpecStats(allowed: boolean): SpecStats {
  const byRows: number[] = [];
  return {
    steps: 0,
    drafted: 0,
    pooled: 0,
    accepted: 0,
    pooledAccepted: 0,
    byRows,
    gain: 2,
    pausedFor: 0,
    allowed,
    checks: 0,
    failures: 0,
    profile: new Profile(),
  };
}

/** The policy's knobs (EngineOptions.speculation; tests force the breakers with them). */
export interface SpeculationTuning {
  /** Cross-check one verification submission in this many (0: never; default 16). */
  checkEvery: number;
  /**
   * A check fails when ‖h_verify − h_plain‖ reaches this share of mean ‖h‖ (default 0.02; 0:
   * every check fails, which tests use to trip the breaker).
   */
  checkTolerance: number;
  /** Failed checks over the window past this share turn speculation off (default 0.05). */
  failureRate: number;
  /** Checks the breaker's window holds (default 64). */
  failureWindow: number;
  /** Context lengths where the length groups part, ascending (default [128, 512]). */
  groups: number[];
  /**
   * Fixed costs of a pass of R rows per slot, as a ratio to a plain step (index R), instead of
   * the measured ones: the bench decides as a GPU with those costs would.
   */
  costs?: number[];
}

/** The defaults of {@linkcode SpeculationTuning}. */
export const DEFAULT_TUNING: SpeculationTuning = {
  checkEvery: 16,
  checkTolerance: 0.02,
  failureRate: 0.05,
  failureWindow: 64,
  groups: [128, 512],
};

/** Options of {@linkcode SpeculationPolicy}. */
export interface SpeculationOptions {
  /** Rows per slot of a verification pass at most (drafts + 1); 1 turns speculation off. */
  rows: number;
  /** "auto": speculate when it pays; "on": always, at full depth (tests); "off": never. */
  mode: "auto" | "on" | "off";
  tuning?: Partial<SpeculationTuning>;
}

/** A live sequence as {@linkcode SpeculationPolicy.plan} sees it. */
export interface SpecCandidate {
  stats: SpecStats;
  /** Tokens in its context now (prompt and output). */
  context: number;
}

/** A decode submission's speculation: rows per slot (1: plain), drafts per slot, a check. */
export interface SpecPlan {
  rows: number;
  /** By slot: the most drafts it may take (0: none). */
  caps: number[];
  /** Cross-check this submission's first pass against the plain path. */
  check: boolean;
}

/** One verification step of a sequence, as read back (engine/runner/submission.ts SpecStep). */
export interface BookedStep {
  drafted: number;
  /** Drafts from the n-gram pool (the last ones drafted). */
  pooled: number;
  accepted: number;
  /** Drafts the host allowed it (its cap, within the pass's rows). */
  allowed: number;
  /** Rows per slot of the pass. */
  rows: number;
  /** The cross-check's relative distance, when this step was checked. */
  check?: number;
}

/** Measured costs of the batch's width: a plain step, and a pass of R rows (ms). */
export interface SpecTimes {
  plain?: number;
  verify: (rows: number) => number | undefined;
}

/** How fast a sequence's moving average follows (weight of the newest step). */
const RATE = 0.25;
/** A sequence whose steps give fewer tokens than this stops drafting… */
const SEQ_OFF = 1.05;
/** …for this many of its steps, then tries again. */
const SEQ_PAUSE = 64;
/** A batch or a group that measured slower than plain stops for this many submissions. */
const PAUSE = 32;
/** Margin by which speculation must beat its cost. */
const MARGIN = 1.02;
/** Weight, in steps, of a sequence's group in its own profile. */
const SEQ_PRIOR = 4;

/** The loop's speculation switch, depth choice and breakers. */
export class SpeculationPolicy {
  readonly #opts: SpeculationOptions;
  readonly tuning: SpeculationTuning;
  /** Totals over every sequence. */
  readonly totals = {
    steps: 0,
    drafted: 0,
    pooled: 0,
    accepted: 0,
    pooledAccepted: 0,
    checks: 0,
    failures: 0,
    /** The largest relative distance a cross-check measured. */
    maxDistance: 0,
  };
  /** The length groups, shortest first. */
  readonly groups: SpecGroup[];
  /** Submissions left before a batch that measured slower tries speculation again. */
  #pausedFor = 0;
  /** Why speculation is off for good (the failure breaker), until it is switched on again. */
  #tripped?: string;
  /** The last checks' outcomes (true: failed), oldest first. */
  #window: boolean[] = [];
  /** Verification submissions planned (every checkEvery-th is cross-checked). */
  #passes = 0;
  /** Why the last decode submission was plain although speculation may run. */
  #reason?: string;

  constructor(opts: SpeculationOptions) {
    this.#opts = { ...opts };
    this.tuning = { ...DEFAULT_TUNING, ...opts.tuning };
    checkTuning(this.tuning);
    this.groups = groupsOf(this.tuning.groups, opts.rows);
  }

  /** Rows per slot of a verification pass at most (1 when it does not speculate). */
  get rows(): number {
    return this.#opts.mode === "off" ? 1 : this.#opts.rows;
  }

  get mode(): SpeculationOptions["mode"] {
    return this.#opts.mode;
  }

  /** Why speculation does not run now (the breaker, or the last plain decision), if it may. */
  get reason(): string | undefined {
    return this.#tripped ?? this.#reason;
  }

  /** The failure breaker has turned speculation off (until {@linkcode setMode}). */
  get tripped(): boolean {
    return this.#tripped !== undefined;
  }

  /** Its state for /health and /metrics. */
  stats(): SpeculationStats {
    const groups = this.profiles().map(({ name, steps, drafted, accepted, depth }) => ({
      name,
      steps,
      drafted,
      accepted,
      depth,
    }));
    const why = this.reason ? { pausedBecause: this.reason } : {};
    return { mode: this.mode, ...why, tripped: this.tripped, ...this.totals, groups };
  }

  /**
   * Switches the mode at run time; a failure breaker that tripped is reset.
   *
   * @throws Error when asked to speculate without verification rows (an engine built "off")
   */
  setMode(mode: SpeculationOptions["mode"]): void {
    if (mode !== "off" && this.#opts.rows < 2) {
      throw new Error("this engine was started with --speculate off: restart it with auto");
    }
    this.#opts.mode = mode;
    this.#pausedFor = 0;
    this.#tripped = undefined;
    this.#reason = undefined;
    this.#window = [];
  }

  /** Whether `stats`' sequence may draft at all now. */
  drafting(stats: SpecStats): boolean {
    return stats.allowed && stats.failures === 0 && stats.pausedFor === 0 && this.rows >= 2;
  }

  /** The length group of a context of `tokens` tokens. */
  groupOf(tokens: number): SpecGroup {
    return this.groups.findLast((g) => tokens >= g.from) ?? this.groups[0];
  }

  /**
   * The next decode submission of `live` (by slot): plain (rows 1), or a verification pass of
   * the rows the deepest speculating group asks for, with each slot's cap, the group's depth.
   * An unmeasured plain step goes first; in "auto" the pass must beat its cost.
   */
  plan(live: readonly (SpecCandidate | undefined)[], times: SpecTimes): SpecPlan {
    const plain: SpecPlan = { rows: 1, caps: live.map(() => 0), check: false };
    const mode = this.#opts.mode;
    if (mode === "off" || this.rows < 2 || this.#tripped) return plain;
    const seqs = live.filter((c): c is SpecCandidate => c !== undefined);
    if (!seqs.some((c) => this.drafting(c.stats))) return plain;
    let rows = this.rows, depths = live.map((c) => c && this.drafting(c.stats) ? rows - 1 : 0);
    if (mode === "auto") {
      if (this.#pausedFor > 0) {
        this.#pausedFor--;
        return plain;
      }
      // Measure a plain step first (unless the costs are given).
      if (times.plain === undefined && !this.tuning.costs) return plain;
      const cost = (R: number) => this.#cost(R, times);
      for (const g of this.groups) g.choose(cost, MARGIN);
      // Each sequence's own depth, within its group's; then the pass size that pays best.
      depths = live.map((c) => c ? this.#depth(c, cost) : 0);
      const tokens = (R: number) =>
        live.reduce((n, c, s) => c ? n + this.#expect(c, Math.min(depths[s], R - 1)) : n, 0) /
        seqs.length;
      let best = { rows: 2, value: 0 };
      for (let R = 2; R <= Math.max(2, 1 + Math.max(...depths)); R++) {
        const value = tokens(R) / cost(R);
        if (value > best.value) best = { rows: R, value };
      }
      if (best.value < MARGIN) {
        this.#pausedFor = PAUSE;
        const R = best.rows;
        this.#reason = `verification of ${R - 1} drafts costs ${cost(R).toFixed(2)}x a plain ` +
          `step for ${tokens(R).toFixed(2)} tokens per step`;
        return plain;
      }
      rows = best.rows;
    }
    this.#reason = undefined;
    const caps = depths.map((k) => Math.min(k, rows - 1));
    const every = this.tuning.checkEvery;
    const check = every > 0 && this.#passes % every === 0;
    this.#passes++;
    return { rows, caps, check };
  }

  /** Expected tokens of `c`'s next step allowed `k` drafts: its profile over its group's. */
  #expect(c: SpecCandidate, k: number): number {
    const g = this.groupOf(c.context);
    return c.stats.profile.expect(k, (i) => g.rate(i), SEQ_PRIOR);
  }

  /** `c`'s depth: its best within its group's, by its own profile (0: it does not draft). */
  #depth(c: SpecCandidate, cost: (rows: number) => number): number {
    if (!this.drafting(c.stats)) return 0;
    const g = this.groupOf(c.context);
    return bestDepth((k) => this.#expect(c, k), cost, g.depth, MARGIN).depth;
  }

  /**
   * A pass of R rows against a plain step: fixed, measured, or (not measured yet) the cost of
   * the largest smaller R measured, so that it is tried.
   */
  #cost(R: number, times: SpecTimes): number {
    const fixed = this.tuning.costs?.[R];
    if (fixed !== undefined) return fixed;
    for (let r = R; r >= 2; r--) {
      const v = times.verify(r);
      if (v !== undefined && times.plain !== undefined) return v / times.plain;
    }
    return 1;
  }

  /**
   * Books one verification step of a sequence whose context holds `context` tokens: its drafts,
   * the breaker's gain, its group's profile and the cross-check, when it had one.
   */
  record(stats: SpecStats, step: BookedStep, context: number): void {
    if (step.check !== undefined) this.#checked(stats, step.check);
    if (!stats.allowed) return; // it rode along, drafting nothing (it opted out)
    if (stats.pausedFor > 0 && step.drafted === 0) {
      stats.pausedFor--; // a paused sequence counts its steps towards its comeback
      return;
    }
    // The pool's drafts are the last ones: those accepted are the accepted past lookup's.
    const pooledAccepted = Math.max(0, step.accepted - (step.drafted - step.pooled));
    stats.steps++;
    stats.drafted += step.drafted;
    stats.pooled += step.pooled;
    stats.accepted += step.accepted;
    stats.pooledAccepted += pooledAccepted;
    stats.byRows[step.rows] = (stats.byRows[step.rows] ?? 0) + 1;
    const t = this.totals;
    t.steps++;
    t.drafted += step.drafted;
    t.pooled += step.pooled;
    t.accepted += step.accepted;
    t.pooledAccepted += pooledAccepted;
    this.groupOf(context).book(step);
    stats.profile.book(step);
    stats.gain += RATE * (1 + step.accepted - stats.gain);
    if (this.#opts.mode === "auto" && stats.gain < SEQ_OFF) {
      stats.pausedFor = SEQ_PAUSE;
      stats.gain = 2; // a fresh start when it comes back
    }
  }

  /**
   * A cross-check's outcome: the window's breaker, and the sequence's when it speculates (a
   * sequence that opted out rides along in the pass; the check is the engine's).
   */
  #checked(stats: SpecStats, distance: number): void {
    const failed = !(distance < this.tuning.checkTolerance); // NaN fails
    this.totals.maxDistance = Math.max(this.totals.maxDistance, distance || 0);
    this.totals.checks++;
    if (failed) this.totals.failures++;
    if (stats.allowed) {
      stats.checks++;
      if (failed) stats.failures++;
    }
    const w = this.#window;
    w.push(failed);
    if (w.length > this.tuning.failureWindow) w.shift();
    const n = w.filter(Boolean).length;
    if (!this.#tripped && n / w.length > this.tuning.failureRate) {
      this.#tripped = `verification failed ${n} of the last ${w.length} cross-checks against ` +
        `the plain path (more than ${this.tuning.failureRate * 100}%; last distance ` +
        `${distance.toPrecision(3)}): off until switched on again`;
    }
  }

  /** Each group's profile, for /metrics and /health. */
  profiles(): GroupProfile[] {
    return this.groups.map((g) => g.profile());
  }
}

/**
 * Checks `t`'s values.
 *
 * @throws Error naming the knob whose value is out of range
 */
export function checkTuning(t: SpeculationTuning): void {
  const bad = (name: string, v: unknown, want: string) => {
    throw new Error(`speculation.${name} must be ${want}; got ${JSON.stringify(v)}`);
  };
  if (!(Number.isInteger(t.checkEvery) && t.checkEvery >= 0)) {
    bad("checkEvery", t.checkEvery, "an integer >= 0");
  }
  if (!(t.checkTolerance >= 0)) bad("checkTolerance", t.checkTolerance, "a number >= 0");
  if (!(t.failureRate >= 0 && t.failureRate < 1)) bad("failureRate", t.failureRate, "in [0, 1)");
  if (!(Number.isInteger(t.failureWindow) && t.failureWindow >= 1)) {
    bad("failureWindow", t.failureWindow, "an integer >= 1");
  }
  if (
    !t.groups.every((v, i) => Number.isInteger(v) && v >= 1 && (i === 0 || v > t.groups[i - 1]))
  ) {
    bad("groups", t.groups, "ascending integers >= 1");
  }
  if (t.costs && !t.costs.every((c, R) => R < 2 || c === undefined || c > 0)) {
    bad("costs", t.costs, "positive ratios");
  }
}
