/**
 * The host-memory tier's bytes: one buffer per KV block record, counted against a byte budget.
 * What each buffer holds, and which block goes where, is engine/kv/tiers.ts's business.
 *
 * Freed buffers are kept and handed out again for records of the same size: copying a spilled
 * block into fresh memory runs at about a quarter of the speed of copying it into pages touched
 * before (page faults; 2 against 9 GB/s on the CPU machine). They are kept up to the budget, and
 * past it up to a transit allowance: blocks on their way between the GPU and files pass through
 * host memory even when the tier keeps none (a budget of 0, or a full tier).
 */

/**
 * A record's buffer: shared memory, so that the file tier's reader threads read into it in place
 * (engine/kv/tier_file_readers.ts).
 */
export type HostBuffer = Uint8Array<SharedArrayBuffer>;

/** Default bytes of freed buffers kept past the budget for blocks in transit (128 MiB). */
export const TRANSIT_BYTES = 128 * 2 ** 20;

/** Buffers of one tier in host memory. */
export class HostTier {
  #used = 0;
  readonly #spare = new Map<number, HostBuffer[]>();
  #spareBytes = 0;

  /**
   * @param budget bytes of records it should hold at most (≥ 0)
   * @param transit bytes of freed buffers it keeps past the budget (≥ 0; see the module doc)
   */
  constructor(readonly budget: number, readonly transit = TRANSIT_BYTES) {
    for (const [name, v] of [["budget", budget], ["transit allowance", transit]] as const) {
      if (!(Number.isInteger(v) && v >= 0)) {
        throw new Error(`internal error: a host tier ${name} must be an integer >= 0; got ${v}`);
      }
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
  take(bytes: number): HostBuffer {
    const kept = this.#spare.get(bytes)?.pop();
    if (kept) this.#spareBytes -= bytes;
    this.#used += bytes;
    return kept ?? new Uint8Array(new SharedArrayBuffer(bytes));
  }

  /** Bytes of freed buffers kept for reuse. */
  get spare(): number {
    return this.#spareBytes;
  }

  /**
   * Gives a buffer back: kept for reuse while the tier's memory stays within the budget, or the
   * kept buffers within the transit allowance.
   */
  give(buf: HostBuffer): void {
    const n = buf.byteLength;
    this.#used -= n;
    const room = Math.max(this.budget - this.#used, 0) + this.transit;
    if (this.#spareBytes + n > room) return; // the collector takes it
    const list = this.#spare.get(n) ?? [];
    list.push(buf);
    this.#spare.set(n, list);
    this.#spareBytes += n;
  }
}
