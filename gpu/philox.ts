/**
 * Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011; the
 * Random123 constants), the one counter-based RNG of strata. `kernels/sample.wgsl` implements the
 * same function word for word; tests check both against the Random123 known-answer vectors.
 *
 * Convention (fixed; host and GPU agree): key = (seed_lo, seed_hi) of the u64 request seed,
 * counter = (position, draw, 0, 0) where position is the absolute sequence position of the token
 * being sampled, and a uniform float in [0, 1) is `(word0 >>> 8) * 2^-24`. A token's randomness is
 * therefore a function of (seed, position) only.
 */

/** Four u32 words (a Philox counter or output block). */
export type Philox4 = [number, number, number, number];
/** Two u32 words (a Philox key). */
export type Philox2 = [number, number];

const M0 = 0xd2511f53;
const M1 = 0xcd9e8d57;
const W0 = 0x9e3779b9;
const W1 = 0xbb67ae85;
const ROUNDS = 10;

/** High 32 bits of the 64-bit product a * b (u32 operands), exactly as the WGSL version does it. */
function mulhi(a: number, b: number): number {
  const al = a & 0xffff, ah = a >>> 16, bl = b & 0xffff, bh = b >>> 16;
  const ll = al * bl, lh = al * bh, hl = ah * bl, hh = ah * bh;
  const mid = (ll >>> 16) + (lh & 0xffff) + (hl & 0xffff);
  return (hh + Math.floor(lh / 65536) + Math.floor(hl / 65536) + Math.floor(mid / 65536)) >>> 0;
}

/**
 * Philox4x32 with 10 rounds.
 *
 * @param counter four u32 words (position, draw, 0, 0 in strata's convention)
 * @param key two u32 words (seed_lo, seed_hi)
 * @returns four pseudo-random u32 words
 * @example philox4x32([0, 0, 0, 0], [0, 0]) // [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
 */
export function philox4x32(counter: Philox4, key: Philox2): Philox4 {
  let [c0, c1, c2, c3] = counter.map((v) => v >>> 0);
  let [k0, k1] = key.map((v) => v >>> 0);
  for (let r = 0; r < ROUNDS; r++) {
    if (r > 0) {
      k0 = (k0 + W0) >>> 0;
      k1 = (k1 + W1) >>> 0;
    }
    const hi0 = mulhi(M0, c0), lo0 = Math.imul(M0, c0) >>> 0;
    const hi1 = mulhi(M1, c2), lo1 = Math.imul(M1, c2) >>> 0;
    [c0, c1, c2, c3] = [(hi1 ^ c1 ^ k0) >>> 0, lo1, (hi0 ^ c3 ^ k1) >>> 0, lo0];
  }
  return [c0, c1, c2, c3];
}

/** Splits a u64 seed into the Philox key (seed_lo, seed_hi). */
export function seedKey(seed: bigint): Philox2 {
  return [Number(seed & 0xffffffffn), Number((seed >> 32n) & 0xffffffffn)];
}

/**
 * The uniform float in [0, 1) that sampling uses for the token at `position`:
 * `(word0 >>> 8) * 2^-24` of Philox at counter (position, draw, 0, 0), key (seed_lo, seed_hi).
 * Exactly representable in f32, so the GPU sees the same number.
 *
 * @example philoxUniform(42n, 7) // same value every time, on the host and on the GPU
 */
export function philoxUniform(seed: bigint, position: number, draw = 0): number {
  const [w0] = philox4x32([position >>> 0, draw >>> 0, 0, 0], seedKey(seed));
  return (w0 >>> 8) * 2 ** -24;
}
