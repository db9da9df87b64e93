/**
 * How long the scheduler may sleep before it waits on a readback. Waiting blocks the event loop
 * until the GPU has finished everything submitted (Deno's `mapAsync`, see gpu/readback.ts),
 * so the engine sleeps through most of that GPU time first, with the event loop free, and
 * blocks only for the rest.
 *
 * The GPU times come from waits that had to block: then the GPU finished as the wait returned.
 * They are kept per kind of work ({@linkcode Paced.work}): per decode step for each width, per
 * prefill chunk for each size class.
 */

/** What the pacer needs to know of a submission (engine/runner/submission.ts). */
export interface Paced {
  /** `decode <width>` (timed per step) or `prefill <rows>` (per chunk). */
  work: string;
  /** When it was submitted (`performance.now()`, ms). */
  submittedAt: number;
  o: { steps: number; prefill?: boolean };
}

/** Sleep only when at least this much GPU work is estimated to be left (ms). */
export const PACE_MIN_MS = 4;
/**
 * Wake this much before the GPU should finish (ms): timers fire ≈ 1–2 ms late. Prefill chunks
 * get a tenth of their estimate more: their time varies with the cached keys attention reads,
 * and the first token waits on them.
 */
export const PACE_MARGIN_MS = 3;

/** A wait that returned sooner than this (ms) did not block: the GPU had already finished. */
export const BLOCKED_MS = 0.5;
/**
 * Estimates not measured again for this long (ms) are dropped: the next wait on that work
 * blocks and measures it afresh, so times learnt under a load that has gone do not linger.
 */
export const STALE_MS = 20_000;

/** One estimate: ms per unit, and when a wait that blocked last measured it. */
interface Estimate {
  ms: number;
  at: number;
}

/** GPU-time estimates, learnt from readbacks, and the sleep they allow. */
export class Pacer {
  readonly #ms = new Map<string, Estimate>();
  /** When the last readback returned: everything submitted before had finished (ms). */
  #doneAt = 0;

  /** The estimate for one unit of `work` (ms), if measured. */
  estimate(work: string): number | undefined {
    return this.#ms.get(work)?.ms;
  }

  /**
   * How long to sleep before waiting on `inflight` (ms; 0: wait now): until
   * {@linkcode PACE_MARGIN_MS} before the GPU should finish it, when all of it has a fresh
   * estimate ({@linkcode STALE_MS}) and at least {@linkcode PACE_MIN_MS} is left. The GPU runs
   * submissions in order, each from when it was submitted or the one before finished.
   */
  sleepMs(inflight: readonly Paced[], now = performance.now()): number {
    let end = this.#doneAt, prefill = 0;
    for (const sub of inflight) {
      const per = this.#used(sub.work, now);
      if (per === undefined) return 0;
      const ms = sub.o.prefill ? per : per * sub.o.steps;
      if (sub.o.prefill) prefill += ms;
      end = Math.max(end, sub.submittedAt) + ms;
    }
    const rest = end - now - prefill / 10;
    return rest >= PACE_MIN_MS ? rest - PACE_MARGIN_MS : 0;
  }

  /** The estimate sleeping uses for `work`: its own, or one borrowed from below; fresh only. */
  #used(work: string, now: number): number | undefined {
    const own = this.#ms.get(work);
    if (own) return now - own.at <= STALE_MS ? own.ms : undefined;
    return this.#below(work, now)?.ms;
  }

  /**
   * For work not measured yet, the fresh estimate of the largest measured work of its kind
   * below it (`decode 13` takes at least what `decode 12` took): the loop sleeps less than it
   * could and blocks for the rest, instead of blocking for all of it. Bursts of requests change
   * the batch width every round, and widths are learnt only from lone submissions.
   */
  #below(work: string, now: number): Estimate | undefined {
    const [kind, n] = work.split(" ");
    let best: Estimate | undefined, size = -1;
    for (const [w, e] of this.#ms) {
      const [k, m] = w.split(" ");
      if (k !== kind || now - e.at > STALE_MS) continue;
      if (Number(m) < Number(n) && Number(m) > size) [best, size] = [e, Number(m)];
    }
    return best;
  }

  /**
   * Learns from a readback of `batch` requested at `t0` that returned at `t1`. When it waited,
   * the GPU finished at `t1`, so a lone submission gives its time (per step for decode), averaged
   * with what was known. When it did not, the loop slept too long: every estimate the sleep used
   * (a borrowed one becoming the work's own) is halved, so an estimate learnt under load comes
   * down within a few readbacks instead of lingering.
   */
  learn(batch: readonly Paced[], t0: number, t1: number): void {
    if (t1 - t0 <= BLOCKED_MS) {
      for (const sub of new Set(batch.map((b) => b.work))) {
        const own = this.#ms.get(sub) ?? this.#below(sub, t1);
        if (own) this.#ms.set(sub, { ms: own.ms / 2, at: own.at });
      }
    } else {
      const sub = batch[0];
      const units = sub?.o.prefill ? 1 : sub?.o.steps ?? 0;
      if (batch.length === 1 && units > 0) {
        const old = this.#ms.get(sub.work);
        const per = (t1 - Math.max(sub.submittedAt, this.#doneAt)) / units;
        this.#ms.set(sub.work, { ms: old === undefined ? per : (old.ms + per) / 2, at: t1 });
      }
    }
    this.#doneAt = t1;
  }
}
