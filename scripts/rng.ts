/**
 * A small seeded PRNG (mulberry32) for test inputs and probes: the same seed gives the same
 * numbers on every machine, so a failing test or a probe's random blocks can be reproduced.
 *
 * It lives in scripts/ because both scripts and tests use it and the layer rule (DESIGN.md, `deno
 * task check`) lets tests import scripts but not scripts import tests. It is not for sampling:
 * tokens draw from Philox keyed by (seed, position), gpu/philox.ts.
 *
 * @example
 * ```ts
 * const r = rng(1);
 * r.next(); // uniform in [0, 1)
 * r.uniform(4, 0.5); // Float64Array of 4 values in [-0.5, 0.5)
 * r.int(256); // an integer in [0, 256)
 * ```
 */

/** The generators {@linkcode rng} returns, all drawing from one seeded stream. */
export interface Rng {
  /** Uniform in [0, 1). */
  next: () => number;
  /** `n` values uniform in [-scale, scale) (scale defaults to 1). */
  uniform: (n: number, scale?: number) => Float64Array;
  /** An integer uniform in [0, n). */
  int: (n: number) => number;
}

/**
 * mulberry32 seeded with `seed` (taken as a u32).
 *
 * @param seed any integer; equal seeds give equal streams
 * @returns the stream's generators
 */
export function rng(seed: number): Rng {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const uniform = (n: number, scale = 1) => {
    const out = new Float64Array(n);
    for (let i = 0; i < n; i++) out[i] = (next() * 2 - 1) * scale;
    return out;
  };
  const int = (n: number) => Math.floor(next() * n);
  return { next, uniform, int };
}
