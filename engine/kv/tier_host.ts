/**
 * The host-memory tier's bytes: one buffer per KV block record, counted against a byte budget.
 * What each buffer holds, and which block goes where, is engine/kv/tiers.ts's business.
 *
 * Freed buffers are kept (up to the budget) and handed out again for records of the same size:
 * copying a spilled block into fresh memory runs at about a quarter of the speed of copying it
 * into pages touched before (page faults; 2 against 9 GB/s on the CPU machine).
 */

/** Buffers of one tier in host memory. */
export class HostTier {
  #used = 0;
  readonly #spare = new Map<number, Uint8Array<ArrayBuffer>[]>();
  #spareBytes = 0;

  /** @param budget bytes of records it should hold at most (≥ 0) */
  constructor(readonly budget: number) {
    if (!(Number.isInteger(budget) && budget >= 0)) {
      throw new Error(`internal error: a host tier budget must be an integer >= 0; got ${budget}`);
    }
  }

  /** Bytes of the buffers handed out and not given back. */
  get used(): number {
    return this.#used;
  }

  /** Bytes held past the budget (the caller moves records down a tier until it is 0). */
  get over(): number {
    return Math.max(0, this.#used - this.budget);
  }

  /** Whether `bytes` more fit within the budget. */
  fits(bytes: number): boolean {
    return this.#used + bytes <= this.budget;
  }

  /**
   * A buffer of `bytes`, counted as used: a kept one of that size when there is one. It is
   * always given, past the budget too ({@linkcode over} says by how much).
   */
  take(bytes: number): Uint8Array<ArrayBuffer> {
    const kept = this.#spare.get(bytes)?.pop();
    if (kept) this.#spareBytes -= bytes;
    this.#used += bytes;
    return kept ?? new Uint8Array(bytes);
  }

  /** Gives a buffer back: kept for reuse while the tier's memory stays within the budget. */
  give(buf: Uint8Array<ArrayBuffer>): void {
    const n = buf.byteLength;
    this.#used -= n;
    if (this.#used + this.#spareBytes + n > this.budget) return; // the collector takes it
    const list = this.#spare.get(n) ?? [];
    list.push(buf);
    this.#spare.set(n, list);
    this.#spareBytes += n;
  }
}
