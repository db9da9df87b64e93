/**
 * The spill breaker: a spill (blocks copied down from the GPU, or moved from host memory to
 * files) slower than a limit means the tier below cannot keep up (a saturated disk, a host
 * under memory pressure), and waiting on it would cost more than recomputing. Spills pause for
 * a while: evicted sessions then drop their KV, as if there were no tier below, and prefill
 * again. Pure policy: the caller passes the clock.
 */

/** Options of {@linkcode SpillBreaker}. */
export interface BreakerOptions {
  /** A spill slower than this trips the breaker (ms; default 200). */
  limitMs?: number;
  /** How long spills pause after a trip (ms; default 30 s). */
  pauseMs?: number;
}

/** Spill latency over 200 ms pauses spills (the limit). */
export const SPILL_LIMIT_MS = 200;
/** Pause after a slow spill. */
export const SPILL_PAUSE_MS = 30_000;

/** The breaker's state, as /health and /metrics show it. */
export interface BreakerState {
  paused: boolean;
  /** Why spills paused (the last trip), while they are paused. */
  reason?: string;
  /** Slow spills seen so far. */
  trips: number;
  /** Evictions that dropped KV because spills were paused. */
  skipped: number;
}

/** Pauses spills after a slow one (see the module doc). */
export class SpillBreaker {
  readonly limitMs: number;
  readonly pauseMs: number;
  #until = -Infinity;
  #reason = "";
  #trips = 0;
  #skipped = 0;

  constructor(o: BreakerOptions = {}) {
    this.limitMs = o.limitMs ?? SPILL_LIMIT_MS;
    this.pauseMs = o.pauseMs ?? SPILL_PAUSE_MS;
  }

  /**
   * Records a spill that took `ms` (ending at `now`): over the limit, spills pause until
   * `now + pauseMs`.
   *
   * @returns whether it tripped the breaker
   */
  record(ms: number, what: string, now: number): boolean {
    if (!(ms > this.limitMs)) return false;
    this.#trips++;
    this.#until = now + this.pauseMs;
    this.#reason = `${what} took ${Math.round(ms)} ms (limit ${this.limitMs} ms): ` +
      `spills paused for ${Math.round(this.pauseMs / 1000)} s`;
    return true;
  }

  /** Whether spills are paused at `now`. */
  paused(now: number): boolean {
    return now < this.#until;
  }

  /** Counts an eviction that dropped its KV because spills were paused. */
  skip(): void {
    this.#skipped++;
  }

  state(now: number): BreakerState {
    const paused = this.paused(now);
    return {
      paused,
      ...(paused ? { reason: this.#reason } : {}),
      trips: this.#trips,
      skipped: this.#skipped,
    };
  }
}
