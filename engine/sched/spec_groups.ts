/**
 * Acceptance profiles and length groups of speculation (engine/sched/speculation.ts).
 *
 * A profile counts, for each i, the verification steps that were allowed at least i drafts and
 * those whose first i drafts were accepted (decayed, so that it follows the text); a step allowed
 * k drafts is then expected to give 1 + Σ_{i ≤ k} accepted(i) / allowed(i) tokens, which holds
 * whatever stopped a draft short (no match in the history or the pool, the token budget).
 *
 * The sequences whose context falls in [from, to) tokens form a length group: the group's profile
 * is the prior of each member's own, and the group chooses the draft depth its members run at most:
 * the k whose expected tokens over the cost of a pass of k + 1 rows is best, or none for a while.
 */

/** A group's counters and choice, for /metrics, /health and the bench. */
export interface GroupProfile {
  /** "<128", "128-511", "512+" with the default bounds. */
  name: string;
  from: number;
  /** One past the longest context in the group (absent: no bound). */
  to?: number;
  steps: number;
  drafted: number;
  accepted: number;
  /** The draft depth it chose last (0: it does not speculate now). */
  depth: number;
  /** Tokens per verification step expected at that depth. */
  expected: number;
}

/** Deepest draft a profile tracks (kernels/speculate.ts MAX_SPEC_ROWS − 1). */
const MAX_DEPTH = 15;
/** Each booked step multiplies the older counts by this (a half-life of ≈ 44 steps). */
const DECAY = 1 - 1 / 64;

/** See the module doc. */
export class Profile {
  readonly #allowed = new Float64Array(MAX_DEPTH + 1);
  readonly #taken = new Float64Array(MAX_DEPTH + 1);

  /**
   * P(the first i drafts are accepted | i were allowed), with `weight` steps of `prior(i)` mixed
   * in (the group's estimate for a sequence's profile; 0.7^i for a group's).
   */
  rate(i: number, prior: (i: number) => number, weight: number): number {
    return (this.#taken[i] + weight * prior(i)) / (this.#allowed[i] + weight);
  }

  /** Expected tokens of a step allowed `k` drafts (1: a plain step's). */
  expect(k: number, prior: (i: number) => number, weight: number): number {
    let e = 1;
    for (let i = 1; i <= Math.min(k, MAX_DEPTH); i++) e += this.rate(i, prior, weight);
    return e;
  }

  /** Books a verification step: drafts allowed and accepted. */
  book(step: { allowed: number; accepted: number }): void {
    for (let i = 1; i <= MAX_DEPTH; i++) {
      this.#allowed[i] *= DECAY;
      this.#taken[i] *= DECAY;
    }
    for (let i = 1; i <= Math.min(step.allowed, MAX_DEPTH); i++) this.#allowed[i]++;
    for (let i = 1; i <= Math.min(step.accepted, MAX_DEPTH); i++) this.#taken[i]++;
  }

  /** Forgets every step. */
  reset(): void {
    this.#allowed.fill(0);
    this.#taken.fill(0);
  }
}

/** A group's prior, in steps, and its acceptance of the first i drafts: 0.7^i. */
const PRIOR = 2;
const prior = (i: number) => 0.7 ** i;
/** Submissions a group that does not pay stays off, before it tries again from the prior. */
const PAUSE = 64;

/**
 * The best depth in 1..max by expected tokens over the cost of its pass, and that value; depth 0
 * when none reaches `margin`.
 */
export function bestDepth(
  expect: (k: number) => number,
  cost: (rows: number) => number,
  max: number,
  margin: number,
): { depth: number; value: number } {
  let depth = 0, value = 0;
  for (let k = 1; k <= max; k++) {
    const v = expect(k) / cost(k + 1);
    if (v > value) [depth, value] = [k, v];
  }
  return value < margin ? { depth: 0, value } : { depth, value };
}

/** One length group (see the module doc). */
export class SpecGroup {
  /** Draft depth chosen last (0: off). */
  depth: number;
  steps = 0;
  drafted = 0;
  accepted = 0;
  readonly #profile = new Profile();
  #pausedFor = 0;

  constructor(readonly from: number, readonly to: number | undefined, readonly maxDepth: number) {
    this.depth = maxDepth;
  }

  get name(): string {
    if (this.to === undefined) return `${this.from}+`;
    return this.from === 0 ? `<${this.to}` : `${this.from}-${this.to - 1}`;
  }

  /** P(the first i drafts are accepted), the group's estimate (a sequence's prior). */
  rate(i: number): number {
    return this.#profile.rate(i, prior, PRIOR);
  }

  /** Expected tokens of a step allowed `k` drafts. */
  expect(k: number): number {
    return this.#profile.expect(k, prior, PRIOR);
  }

  /** Books a verification step of a member. */
  book(step: { allowed: number; drafted: number; accepted: number }): void {
    this.#profile.book(step);
    this.steps++;
    this.drafted += step.drafted;
    this.accepted += step.accepted;
  }

  /**
   * Chooses the depth for a batch whose pass of R rows costs `cost(R)` plain steps; 0 (off for
   * a while, then back with the prior's optimism) when none beats a plain step by `margin`.
   */
  choose(cost: (rows: number) => number, margin: number): void {
    if (this.#pausedFor > 0) {
      if (--this.#pausedFor > 0) return;
      this.#profile.reset();
    }
    this.depth = bestDepth((k) => this.expect(k), cost, this.maxDepth, margin).depth;
    if (this.depth === 0) this.#pausedFor = PAUSE;
  }

  profile(): GroupProfile {
    return {
      name: this.name,
      from: this.from,
      ...(this.to === undefined ? {} : { to: this.to }),
      steps: this.steps,
      drafted: this.drafted,
      accepted: this.accepted,
      depth: this.depth,
      expected: this.expect(this.depth),
    };
  }
}

/** Groups parted at `bounds` (ascending), each drafting up to `rows − 1`. */
export function groupsOf(bounds: readonly number[], rows: number): SpecGroup[] {
  const edges = [0, ...bounds];
  return edges.map((from, i) => new SpecGroup(from, edges[i + 1], Math.max(0, rows - 1)));
}
