/**
 * When the loop speculates (pure policy, like the scheduler: no GPU, no timers). A verification
 * pass of R rows per slot costs more GPU time than a plain step; it pays when the slots' drafts
 * are accepted often enough. The policy keeps, per sequence, how many tokens its speculative
 * steps gave, and per batch width the measured GPU time of a plain step and of a verification
 * pass (from the pacer), and speculates a submission only when the expected tokens per step beat
 * the cost ratio. A sequence whose drafts keep failing stops drafting (its cap drops to 0) for a
 * while; a batch whose speculation is measured slower than plain stops speculating for a while;
 * both come back to try again.
 */

/** A sequence's speculation, as the policy keeps it (on `Sequence.spec`). */
export interface SpecStats {
  /** Verification steps it took part in, drafts proposed, drafts accepted. */
  steps: number;
  drafted: number;
  accepted: number;
  /** Moving average of the tokens a verification step gave it (≥ 1). */
  gain: number;
  /** Steps left before its drafting comes back after being switched off. */
  pausedFor: number;
  /** Whether the request allows it at all (`"speculation": false` opts out). */
  allowed: boolean;
}

/** A new sequence's stats. */
export function newSpecStats(allowed: boolean): SpecStats {
  return { steps: 0, drafted: 0, accepted: 0, gain: 2, pausedFor: 0, allowed };
}

/** Options of {@linkcode SpeculationPolicy}. */
export interface SpeculationOptions {
  /** Rows per slot of a verification pass (drafts + 1); 1 turns speculation off. */
  rows: number;
  /** "auto": speculate when it pays; "on": always (tests); "off": never. */
  mode: "auto" | "on" | "off";
}

/** How fast the moving averages follow (weight of the newest step). */
const RATE = 0.25;
/** A sequence whose steps give fewer tokens than this stops drafting… */
const SEQ_OFF = 1.05;
/** …for this many of its steps, then tries again. */
const SEQ_PAUSE = 64;
/** A batch stops speculating for this many submissions when it measured slower than plain. */
const BATCH_PAUSE = 32;
/** Margin by which speculation must beat its cost. */
const MARGIN = 1.02;

/** The loop's speculation switch and breakers. */
export class SpeculationPolicy {
  readonly #opts: SpeculationOptions;
  /** Totals over every sequence: verification steps, drafts proposed and accepted. */
  readonly totals = { steps: 0, drafted: 0, accepted: 0 };
  /** Submissions left before a batch that measured slower tries speculation again. */
  #pausedFor = 0;
  /** Why it is off, for /health (undefined while it may run). */
  reason?: string;

  constructor(opts: SpeculationOptions) {
    this.#opts = opts;
  }

  /** Rows per slot of a verification pass (1 when it does not speculate now). */
  get rows(): number {
    return this.#opts.mode === "off" ? 1 : this.#opts.rows;
  }

  get mode(): SpeculationOptions["mode"] {
    return this.#opts.mode;
  }

  /**
   * Switches the mode at run time.
   *
   * @throws Error when asked to speculate without verification rows (an engine built "off")
   */
  setMode(mode: SpeculationOptions["mode"]): void {
    if (mode !== "off" && this.#opts.rows < 2) {
      throw new Error("this engine was started with --speculate off: restart it with auto");
    }
    this.#opts.mode = mode;
    this.#pausedFor = 0;
    this.reason = undefined;
  }

  /** The most drafts `stats`' sequence may take in its next step (0: none). */
  cap(stats: SpecStats): number {
    if (!stats.allowed || this.rows < 2 || stats.pausedFor > 0) return 0;
    return this.rows - 1;
  }

  /**
   * Whether the next decode submission of `live` is a verification pass. `times` are the
   * measured GPU times per step of a plain step and of a verification pass at this width
   * (undefined until measured): an unmeasured plain step goes first, then an unmeasured
   * verification pass, then the cheaper per token wins.
   */
  speculate(
    live: readonly SpecStats[],
    times: { plain?: number; verify?: number } = {},
  ): boolean {
    const mode = this.#opts.mode;
    if (mode === "off" || this.rows < 2) return false;
    const drafting = live.filter((s) => this.cap(s) > 0);
    if (drafting.length === 0) return false;
    if (mode === "on") return true;
    if (this.#pausedFor > 0) {
      this.#pausedFor--;
      return false;
    }
    if (times.plain === undefined) return false; // measure a plain step first
    if (times.verify === undefined) return true;
    const cost = times.verify / times.plain;
    // Expected tokens per step over the batch: plain gives 1 per live sequence.
    const gain = live.reduce((n, s) => n + (this.cap(s) > 0 ? s.gain : 1), 0) / live.length;
    if (gain >= cost * MARGIN) {
      this.reason = undefined;
      return true;
    }
    this.#pausedFor = BATCH_PAUSE;
    this.reason = `verification costs ${cost.toFixed(2)}x a plain step for ${
      gain.toFixed(2)
    } tokens per step`;
    return false;
  }

  /** Books one verification step of a sequence: it drafted `drafted`, `accepted` were taken. */
  record(stats: SpecStats, drafted: number, accepted: number): void {
    if (stats.pausedFor > 0) return this.tick(stats); // it drafted nothing (cap 0)
    stats.steps++;
    stats.drafted += drafted;
    stats.accepted += accepted;
    this.totals.steps++;
    this.totals.drafted += drafted;
    this.totals.accepted += accepted;
    stats.gain += RATE * (1 + accepted - stats.gain);
    if (this.#opts.mode === "auto" && stats.gain < SEQ_OFF) {
      stats.pausedFor = SEQ_PAUSE;
      stats.gain = 2; // a fresh start when it comes back
    }
  }

  /** A plain step of a sequence whose drafting is paused counts towards its comeback. */
  tick(stats: SpecStats): void {
    if (stats.pausedFor > 0) stats.pausedFor--;
  }
}
