/**
 * Token sets as rows of 1024-token blocks, each block a 32-word bitmask stored once however many
 * states share it (most blocks of most states are all-zero, and string states share theirs).
 */

/** Tokens per mask block. */
export const BLOCK_TOKENS = 1024;
/** u32 words per mask block. */
export const BLOCK_WORDS = BLOCK_TOKENS / 32;

/** Deduplicated mask blocks; block 0 is all-zero. */
export class BlockStore {
  #words = new Uint32Array(BLOCK_WORDS * 64);
  #count = 1;
  readonly #byHash = new Map<number, number[]>([[hash(new Uint32Array(BLOCK_WORDS)), [0]]]);

  /** Blocks stored. */
  get count(): number {
    return this.#count;
  }

  /** The words of block `id` (a view; do not write). */
  block(id: number): Uint32Array {
    return this.#words.subarray(id * BLOCK_WORDS, (id + 1) * BLOCK_WORDS);
  }

  /** The id of a block with these words, adding it if new. */
  intern(words: Uint32Array): number {
    const h = hash(words);
    const same = this.#byHash.get(h);
    for (const id of same ?? []) if (equal(this.block(id), words)) return id;
    if ((this.#count + 1) * BLOCK_WORDS > this.#words.length) {
      const grown = new Uint32Array(this.#words.length * 2);
      grown.set(this.#words);
      this.#words = grown;
    }
    const id = this.#count++;
    this.#words.set(words, id * BLOCK_WORDS);
    if (same) same.push(id);
    else this.#byHash.set(h, [id]);
    return id;
  }

  /** All blocks, block k at words [32 k, 32 k + 32). */
  words(): Uint32Array {
    return this.#words.subarray(0, this.#count * BLOCK_WORDS);
  }
}

function hash(w: Uint32Array): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < w.length; i++) h = Math.imul(h ^ w[i], 0x01000193);
  return h >>> 0;
}

function equal(a: Uint32Array, b: Uint32Array): boolean {
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/** A set of token ids: (block index, block id) pairs by block index, non-zero blocks only. */
export type TokenSet = number[];

/** The set of `ids` (any order, repeats allowed). */
export function tokenSet(store: BlockStore, ids: ArrayLike<number>): TokenSet {
  const byBlock = new Map<number, Uint32Array>();
  for (let i = 0; i < ids.length; i++) {
    const id = ids[i], blk = Math.floor(id / BLOCK_TOKENS);
    let w = byBlock.get(blk);
    if (w === undefined) byBlock.set(blk, w = new Uint32Array(BLOCK_WORDS));
    w[(id % BLOCK_TOKENS) >> 5] |= 1 << (id & 31);
  }
  const out: TokenSet = [];
  for (const blk of [...byBlock.keys()].sort((a, b) => a - b)) {
    out.push(blk, store.intern(byBlock.get(blk)!));
  }
  return out;
}

/** The union of `sets`. */
export function union(store: BlockStore, sets: TokenSet[]): TokenSet {
  if (sets.length === 1) return sets[0];
  const byBlock = new Map<number, number[]>();
  for (const set of sets) {
    for (let i = 0; i < set.length; i += 2) {
      const list = byBlock.get(set[i]);
      if (list) list.push(set[i + 1]);
      else byBlock.set(set[i], [set[i + 1]]);
    }
  }
  const out: TokenSet = [];
  const w = new Uint32Array(BLOCK_WORDS);
  for (const blk of [...byBlock.keys()].sort((a, b) => a - b)) {
    const ids = [...new Set(byBlock.get(blk)!)];
    if (ids.length === 1) {
      out.push(blk, ids[0]);
      continue;
    }
    w.fill(0);
    for (const id of ids) {
      const b = store.block(id);
      for (let j = 0; j < BLOCK_WORDS; j++) w[j] |= b[j];
    }
    out.push(blk, store.intern(w));
  }
  return out;
}

/** The row of block ids (`blocksPerRow` long, 0 where the set has no token) of `set`. */
export function setRow(set: TokenSet, blocksPerRow: number): Uint32Array {
  const row = new Uint32Array(blocksPerRow);
  for (let i = 0; i < set.length; i += 2) row[set[i]] = set[i + 1];
  return row;
}
