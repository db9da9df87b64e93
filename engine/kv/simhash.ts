/**
 * A 64-bit SimHash of a prompt (Charikar): each run of {@linkcode SHINGLE} consecutive token ids
 * votes on every bit with a hash of its own, and a bit is set where most runs have it set. Prompts
 * that share much of their text land a few bits apart; unrelated ones about 32. The scheduler
 * uses it to admit similar prompts together, so that the blocks they share stay on the GPU.
 */

/** Tokens per shingle. */
export const SHINGLE = 4;
/** Prompts at most this many bits apart count as similar (unrelated ones differ in about 32). */
export const SIMILAR_BITS = 12;
/** Tokens of a prompt that vote (its start: where shared prefixes and documents are). */
const MAX_TOKENS = 4096;

function fmix32(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  return (h ^ (h >>> 16)) >>> 0;
}

/** A 32-bit hash of `ids[at, at + n)` under `seed` (murmur3's mixing). */
function shingleHash(ids: readonly number[], at: number, n: number, seed: number): number {
  let h = seed;
  for (let i = at; i < at + n; i++) {
    h = Math.imul(h ^ ids[i], 0xcc9e2d51);
    h = Math.imul((h << 15) | (h >>> 17), 0x1b873593);
  }
  return fmix32(h ^ n);
}

/**
 * The SimHash of `ids` (its first 4096 tokens).
 *
 * @example
 * hamming(promptSimhash(doc.concat(q1)), promptSimhash(doc.concat(q2))) <= SIMILAR_BITS;
 */
export function promptSimhash(ids: readonly number[]): bigint {
  const len = Math.min(ids.length, MAX_TOKENS);
  if (len === 0) return 0n;
  const votes = new Int32Array(64), n = Math.min(SHINGLE, len);
  for (let at = 0; at + n <= len; at++) {
    const lo = shingleHash(ids, at, n, 0x9747b28c), hi = shingleHash(ids, at, n, 0x3c6ef372);
    for (let b = 0; b < 32; b++) {
      votes[b] += (lo >>> b) & 1 ? 1 : -1;
      votes[32 + b] += (hi >>> b) & 1 ? 1 : -1;
    }
  }
  let lo = 0, hi = 0;
  for (let b = 0; b < 32; b++) {
    if (votes[b] > 0) lo |= 1 << b;
    if (votes[32 + b] > 0) hi |= 1 << b;
  }
  return (BigInt(hi >>> 0) << 32n) | BigInt(lo >>> 0);
}

/** Bits in which `a` and `b` differ. */
export function hamming(a: bigint, b: bigint): number {
  let x = a ^ b, n = 0;
  while (x) {
    x &= x - 1n;
    n++;
  }
  return n;
}
