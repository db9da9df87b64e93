/**
 * Bringing a sequence's blocks back onto the GPU: a plan made when its request is queued lists,
 * block by block along its prompt's hash chain, where each block's KV is (the GPU's cache, host
 * memory, a spill file, the snapshot store) and starts reading the ones not in memory at once,
 * a few at a time (the prefetch distance). At admission, {@linkcode RestorePlan.take} uploads
 * what was read, in order, before the sequence's prefill is submitted; the first block it lacks
 * (missing, corrupt, another size) ends the restore, and the tokens from there are prefilled.
 */
import type { BlockTier } from "./manager.ts";
import type { KvPool } from "./pool.ts";
import type { SequenceBlocks } from "./blocks.ts";

/** Where one planned block comes from. */
export interface RestoreSource {
  hash: bigint;
  tokens: number[];
  tier: BlockTier;
  /** Reads the block's K‖V record (undefined: it could not be read). Absent for the GPU. */
  load?: () => Promise<Uint8Array | undefined>;
  /** Lets go of what the source holds (a pin on a tier block, a buffer); called once. */
  release?: () => void;
}

/** What {@linkcode RestorePlan.take} brought back. */
export interface Restored {
  /** Tokens whose KV it restored (whole blocks). */
  tokens: number;
  /** Blocks by the tier they came from ("gpu": found in the GPU's cache after all). */
  blocks: Record<BlockTier, number>;
  /** Bytes uploaded. */
  bytes: number;
  /** From the plan to the upload (ms). */
  ms: number;
}

/** The blocks of one queued sequence on their way back (see the module doc). */
export class RestorePlan {
  readonly #sources: RestoreSource[];
  readonly #values: (Uint8Array | undefined)[];
  readonly #byHash = new Map<bigint, number>();
  readonly #started = performance.now();
  #next = 0;
  #running = 0;
  #failed = false;
  #ready = false;
  #released = false;
  #resolve!: () => void;
  /** Resolves once every read it started has settled. */
  readonly done: Promise<void>;

  /**
   * Starts reading `sources` (in order), at most `distance` at a time.
   *
   * @param owner the session whose KV it brings back, if any
   */
  constructor(sources: RestoreSource[], readonly distance: number, readonly owner?: string) {
    this.#sources = sources;
    this.#values = new Array(sources.length).fill(undefined);
    sources.forEach((s, i) => this.#byHash.set(s.hash, i));
    this.done = new Promise((r) => (this.#resolve = r));
    this.#pump();
  }

  /** Blocks planned. */
  get blocks(): number {
    return this.#sources.length;
  }

  /** Whether every read has settled: admission may take it. */
  get ready(): boolean {
    return this.#ready;
  }

  /** Whether a read failed (the blocks from there are prefilled). */
  get failed(): boolean {
    return this.#failed;
  }

  #pump(): void {
    while (!this.#failed && this.#running < this.distance && this.#next < this.#sources.length) {
      const i = this.#next++, load = this.#sources[i].load;
      if (!load) continue;
      this.#running++;
      load().catch(() => undefined).then((v) => {
        this.#running--;
        if (this.#released) return;
        this.#values[i] = v;
        if (!v) this.#failed = true;
        this.#pump();
      });
    }
    if (this.#running === 0 && (this.#failed || this.#next >= this.#sources.length)) {
      this.#ready = true;
      this.#resolve();
    }
  }

  /**
   * Uploads the planned blocks `blocks` reaches next (in order, from its computed prefix) and
   * appends them to it: a block the GPU's cache holds by then is taken from there; the others
   * get a free block (the scheduler reserved room for them) written with the record. Releases
   * every source.
   */
  take(pool: KvPool, blocks: SequenceBlocks): Restored {
    const counts: Record<BlockTier, number> = { gpu: 0, host: 0, file: 0, kv: 0 };
    let bytes = 0;
    // The GPU's cache first: blocks allocated for the others must not reuse what it holds.
    const onGpu = this.#sources.map((s) => pool.blocks.lookup(s.hash, s.tokens));
    const used = new Set<number>();
    const tokens = blocks.extendCached((hash, chunk) => {
      const i = this.#byHash.get(hash);
      if (i === undefined) return undefined;
      const cached = onGpu[i];
      if (cached !== undefined) {
        counts.gpu++;
        used.add(i);
        return cached;
      }
      const data = this.#values[i];
      if (!data) return undefined;
      const id = pool.blocks.allocate();
      if (data.byteLength !== 2 * pool.blockBytesOf(id)) {
        pool.blocks.release(id);
        return undefined;
      }
      pool.write(id, data);
      pool.blocks.seal(id, hash, chunk);
      counts[this.#sources[i].tier]++;
      bytes += data.byteLength;
      return id;
    });
    onGpu.forEach((id, i) => id !== undefined && !used.has(i) && pool.blocks.release(id));
    this.release();
    return { tokens, blocks: counts, bytes, ms: performance.now() - this.#started };
  }

  /** Lets go of every source (the sequence ended, or took what it could). */
  release(): void {
    if (this.#released) return;
    this.#released = true;
    for (const s of this.#sources) s.release?.();
    this.#values.fill(undefined);
    if (!this.#ready) {
      this.#ready = true;
      this.#resolve();
    }
  }
}
