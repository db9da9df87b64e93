/**
 * The paged KV cache's bookkeeping (nano-vllm size): a pool of 16-token blocks with reference
 * counts and a chained content hash, so identical prefixes share blocks and a freed block can be
 * found again by content until it is reused. The GPU memory itself is engine/kv/pool.ts.
 */
import xxhash from "xxhash-wasm";

/** Tokens per block. */
export const BLOCK = 16;

/**
 * Per-block bookkeeping (DESIGN.md "KV: paged, tiered, content-addressed"): a block nobody
 * references (refCount 0) is free, and keeps its content until it is allocated again. The tiers
 * below the GPU keep the same facts of the blocks they hold (engine/kv/manager.ts).
 */
export interface Block {
  id: number;
  refCount: number;
  /** Chained xxh64 of (parent hash, token ids); 0n until the block is full. */
  hash: bigint;
  /** Token ids of a full block (checked on a hash hit). */
  tokens: number[];
  /** Times its content was taken: written first, or found by hash. */
  accesses: number;
  /** When it was last taken (ms since the epoch). */
  lastAccess: number;
}

const hasher = await xxhash();

/** Chains a block hash: xxh64 over the parent hash and the block's token ids. */
export function blockHash(parent: bigint, tokens: number[]): bigint {
  const buf = new Uint32Array(2 + tokens.length);
  buf[0] = Number(parent & 0xffffffffn);
  buf[1] = Number(parent >> 32n);
  buf.set(tokens, 2);
  return hasher.h64Raw(new Uint8Array(buf.buffer));
}

/**
 * The root of a hash chain for requests of `tenant`: blocks are found by content only within one
 * scope, so one tenant never shares (or learns of, through cached tokens) another's KV. No
 * tenant: 0n, the one shared scope.
 */
export function scopeRoot(tenant: string | undefined): bigint {
  return tenant === undefined ? 0n : hasher.h64(`strata tenant\0${tenant}`);
}

/** Thrown when the pool has no free block; the scheduler preempts or queues. */
export class OutOfBlocksError extends Error {
  constructor(need: number, free: number) {
    super(`KV cache full: need ${need} blocks, ${free} free`);
  }
}

/**
 * A pool of `numBlocks` GPU blocks, and `codecBlocks` more (ids from `numBlocks` on) that hold
 * blocks re-encoded by a KV codec behind the hot window (engine/kv/recency.ts). Block 0 is
 * reserved as the trash block (never allocated).
 */
export class BlockPool {
  readonly blocks: Block[];
  readonly trash = 0;
  /** Hot blocks: ids `[0, hot)`; codec blocks are the ids from `hot` on. */
  readonly hot: number;
  #free: number[] = [];
  #codecFree: number[] = [];
  #byHash = new Map<bigint, number>();

  constructor(numBlocks: number, codecBlocks = 0) {
    if (numBlocks < 2) throw new Error(`internal error: pool needs >= 2 blocks, got ${numBlocks}`);
    this.hot = numBlocks;
    this.blocks = Array.from({ length: numBlocks + codecBlocks }, (_, id) => ({
      id,
      refCount: id === 0 ? 1 : 0,
      hash: 0n,
      tokens: [],
      accesses: 0,
      lastAccess: 0,
    }));
    // Lowest ids first keeps small tests readable; order after that is LRU (push on free).
    for (let i = numBlocks - 1; i >= 1; i--) this.#free.push(i);
    for (let i = numBlocks + codecBlocks - 1; i >= numBlocks; i--) this.#codecFree.push(i);
  }

  /** Hot blocks not referenced by any sequence (cached ones included). */
  get freeCount(): number {
    return this.#free.length;
  }

  /** Hot blocks in use (the trash block aside). */
  get usedCount(): number {
    return this.hot - 1 - this.#free.length;
  }

  /** Codec blocks not referenced by any sequence. */
  get codecFreeCount(): number {
    return this.#codecFree.length;
  }

  /** Codec blocks in use. */
  get codecUsedCount(): number {
    return this.blocks.length - this.hot - this.#codecFree.length;
  }

  /** Whether block `id` is a codec block. */
  isCodec(id: number): boolean {
    return id >= this.hot;
  }

  /** The free list block `id` goes back to. */
  #listOf(id: number): number[] {
    return id >= this.hot ? this.#codecFree : this.#free;
  }

  /** Takes a free hot block (the least recently freed), dropping any cached content it had. */
  allocate(): number {
    return this.#take(this.#free);
  }

  /**
   * Takes a free codec block, dropping any cached content it had.
   *
   * @throws OutOfBlocksError when none is free
   */
  allocateCodec(): number {
    return this.#take(this.#codecFree);
  }

  #take(list: number[]): number {
    const id = list.shift();
    if (id === undefined) throw new OutOfBlocksError(1, 0);
    const b = this.blocks[id];
    if (b.hash !== 0n && this.#byHash.get(b.hash) === id) this.#byHash.delete(b.hash);
    Object.assign(b, { refCount: 1, hash: 0n, tokens: [], accesses: 1, lastAccess: Date.now() });
    return id;
  }

  /** Whether a block holds this content (without taking it). */
  has(hash: bigint, tokens: readonly number[]): boolean {
    const id = this.#byHash.get(hash);
    if (id === undefined) return false;
    const b = this.blocks[id];
    return b.tokens.length === tokens.length && b.tokens.every((t, i) => t === tokens[i]);
  }

  /**
   * Hands block `from`'s content (its one reference, hash and tokens) to `to`, a block just
   * allocated that now holds the same KV (re-encoded): prefix lookups find `to` from now on, and
   * `from` goes back to the pool with nothing cached.
   *
   * @throws Error ("internal error") when `from` is not held by exactly one sequence
   */
  move(from: number, to: number): void {
    const a = this.blocks[from], b = this.blocks[to];
    if (a.refCount !== 1 || b.refCount !== 1) {
      throw new Error(`internal error: move of block ${from} (refs ${a.refCount}) to ${to}`);
    }
    Object.assign(b, { hash: a.hash, tokens: a.tokens });
    if (a.hash !== 0n && this.#byHash.get(a.hash) === from) this.#byHash.set(a.hash, to);
    Object.assign(a, { hash: 0n, tokens: [] });
    this.release(from);
  }

  /** Looks up a full block by content; on a hit takes a reference to it. */
  lookup(hash: bigint, tokens: number[]): number | undefined {
    const id = this.#byHash.get(hash);
    if (id === undefined) return undefined;
    const b = this.blocks[id];
    if (b.tokens.length !== tokens.length || b.tokens.some((t, i) => t !== tokens[i])) {
      return undefined;
    }
    if (b.refCount === 0) {
      const list = this.#listOf(id);
      list.splice(list.indexOf(id), 1);
    }
    b.refCount++;
    b.accesses++;
    b.lastAccess = Date.now();
    return id;
  }

  /** Records the content of a block that just became full, so later prompts can share it. */
  seal(id: number, hash: bigint, tokens: number[]): void {
    const b = this.blocks[id];
    b.hash = hash;
    b.tokens = tokens.slice();
    if (!this.#byHash.has(hash)) this.#byHash.set(hash, id);
  }

  /** Drops one reference; a block nobody holds becomes free but keeps its cached content. */
  release(id: number): void {
    const b = this.blocks[id];
    if (b.refCount <= 0) throw new Error(`internal error: release of free block ${id}`);
    if (--b.refCount === 0) {
      if (b.hash === 0n) this.#listOf(id).unshift(id); // nothing worth keeping: reuse first
      else this.#listOf(id).push(id);
    }
  }
}

/**
 * One sequence's view of the cache: its token ids and the blocks that hold their KV.
 * `tokens.length` may run ahead of `computed` (tokens whose KV is not written yet).
 */
export class SequenceBlocks {
  readonly table: number[] = [];
  readonly tokens: number[] = [];
  /** Tokens whose KV is in the cache. */
  computed = 0;
  #hashes: bigint[] = [];

  /**
   * @param root the hash chain's root: the scope whose blocks this sequence may share
   *   ({@linkcode scopeRoot})
   */
  constructor(readonly pool: BlockPool, readonly root = 0n) {}

  /**
   * Appends prompt tokens, sharing full blocks already in the pool when this sequence is at a
   * block boundary. Returns how many of the appended tokens were found cached.
   */
  appendPrompt(ids: number[]): number {
    const start = this.tokens.length, aligned = start === this.computed;
    for (const id of ids) this.tokens.push(id); // no spread: a 128k-token prompt overflows it
    return aligned ? this.shareCached() : 0;
  }

  /**
   * Takes the full blocks of its uncomputed tokens that the pool holds by content, in order from
   * the first uncomputed one, keeping at least one token to compute (the last one's logits start
   * generation). Nothing when its computed tokens do not end at a block boundary with no block
   * reserved past them. A sequence waiting for admission calls it again: what ran meanwhile may
   * have computed its prefix.
   *
   * @returns how many tokens were found
   */
  shareCached(): number {
    return this.extendCached((h, chunk) => this.pool.lookup(h, chunk));
  }

  /**
   * Extends the computed prefix block by block with what `find` gives for the next block (its
   * chained hash and tokens): a block that holds that content (already referenced for this
   * sequence), or undefined to stop. Rules as {@linkcode shareCached}.
   *
   * @returns how many tokens were added
   */
  extendCached(find: (hash: bigint, tokens: number[]) => number | undefined): number {
    if (!this.atBoundary) return 0;
    let added = 0;
    let parent = this.lastHash;
    for (let i = this.computed; i + BLOCK < this.tokens.length; i += BLOCK) {
      const chunk = this.tokens.slice(i, i + BLOCK);
      const h = blockHash(parent, chunk);
      const id = find(h, chunk);
      if (id === undefined) break;
      this.table.push(id);
      this.#hashes.push(h);
      parent = h;
      added += BLOCK;
    }
    this.computed += added;
    return added;
  }

  /**
   * Whether its computed tokens end at a block boundary with exactly their blocks in the table
   * (no partial block, nothing reserved past them): only then can cached blocks be appended.
   */
  get atBoundary(): boolean {
    return this.computed % BLOCK === 0 && this.table.length * BLOCK === this.computed &&
      this.#hashes.length === this.table.length;
  }

  /** The chained hash of its last full block (the root when it has none). */
  get lastHash(): bigint {
    return this.#hashes.at(-1) ?? this.root;
  }

  /** Chained hashes of its full blocks, in order. */
  get hashes(): readonly bigint[] {
    return this.#hashes;
  }

  /** Makes sure blocks exist for positions [0, upTo). */
  reserve(upTo: number): void {
    const need = Math.ceil(upTo / BLOCK) - this.table.length;
    if (need > this.pool.freeCount) throw new OutOfBlocksError(need, this.pool.freeCount);
    for (let i = 0; i < need; i++) this.table.push(this.pool.allocate());
  }

  /** Marks KV for tokens up to `n` as written; seals blocks that became full. */
  markComputed(n: number): void {
    for (let b = Math.floor(this.computed / BLOCK); b < Math.floor(n / BLOCK); b++) {
      if (this.#hashes.length !== b) continue;
      const chunk = this.tokens.slice(b * BLOCK, (b + 1) * BLOCK);
      const h = blockHash(this.#hashes.at(-1) ?? this.root, chunk);
      this.#hashes.push(h);
      this.pool.seal(this.table[b], h, chunk);
    }
    this.computed = n;
  }

  /**
   * Releases the blocks of logical blocks `[from, to)` (a window has moved past them: their keys
   * are never read again, engine/kv/window.ts); their table entries become the trash block, which
   * later releases skip. The tokens stay.
   *
   * @returns how many blocks went back to the pool
   */
  dropBlocks(from: number, to: number): number {
    let n = 0;
    for (let b = Math.max(0, from); b < Math.min(to, this.table.length); b++) {
      if (this.table[b] === this.pool.trash) continue;
      this.pool.release(this.table[b]);
      this.table[b] = this.pool.trash;
      n++;
    }
    return n;
  }

  /** Forgets tokens from `n` on (KV past them is dropped; whole blocks past them freed). */
  truncate(n: number): void {
    // A partial last block that others share or can find by hash must not be written into:
    // drop it whole and recompute its tokens instead (no copy-on-write needed). Nor a codec
    // block: writes go to hot blocks only.
    const last = this.table[Math.ceil(n / BLOCK) - 1];
    if (n % BLOCK !== 0 && last !== undefined) {
      const b = this.pool.blocks[last];
      if (b.refCount > 1 || b.hash !== 0n || this.pool.isCodec(last)) n -= n % BLOCK;
    }
    this.tokens.length = Math.min(this.tokens.length, n);
    this.computed = Math.min(this.computed, n);
    const keep = Math.ceil(n / BLOCK);
    while (this.table.length > keep) {
      const id = this.table.pop()!;
      if (id !== this.pool.trash) this.pool.release(id); // dropped by dropBlocks
    }
    this.#hashes.length = Math.min(this.#hashes.length, Math.floor(n / BLOCK));
  }

  /** Releases every block. */
  free(): void {
    this.truncate(0);
  }

  /** Releases every block but keeps the tokens: their KV will be computed again. */
  dropKv(): void {
    const tokens = this.tokens.slice();
    this.truncate(0);
    for (const t of tokens) this.tokens.push(t);
  }
}
