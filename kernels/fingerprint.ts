/**
 * Wrapper for kernels/fingerprint.wgsl: 32-bit SimHash fingerprints of the hidden rows that
 * produced tokens, written next to the tokens (the fingerprint ring shares the token ring's
 * entry layout), and their float64 reference.
 */
import type { Gpu } from "../gpu/device.ts";
import { type Dispatch, params, uniform } from "../gpu/dispatch.ts";
import { pipeline, wgsl } from "./pipeline.ts";
import { bindAt, type Binding } from "./sample.ts";

/** lowbias32, as kernels/hash_common.wgsl's `mix` (fingerprints and the n-gram pool's keys). */
export function mix(v: number): number {
  let h = v >>> 0;
  h ^= h >>> 16;
  h = Math.imul(h, 0x7feb352d) >>> 0;
  h ^= h >>> 15;
  h = Math.imul(h, 0x846ca68b) >>> 0;
  h ^= h >>> 16;
  return h >>> 0;
}

/**
 * The 32 projections of `row` fingerprint.wgsl takes the signs of, in float64: projection j is
 * sum_i ±row[i], the sign from bit j of mix(i + 0x9e3779b9).
 */
export function projectionsRef(row: ArrayLike<number>): Float64Array {
  const acc = new Float64Array(32);
  for (let i = 0; i < row.length; i++) {
    const h = mix(i + 0x9e3779b9);
    for (let j = 0; j < 32; j++) acc[j] += (h >>> j) & 1 ? row[i] : -row[i];
  }
  return acc;
}

/** The fingerprint of `row`: bit j set when projection j is positive. */
export function fingerprintRef(row: ArrayLike<number>): number {
  const p = projectionsRef(row);
  let f = 0;
  for (let j = 0; j < 32; j++) if (p[j] > 0) f |= 1 << j;
  return f >>> 0;
}

/** Bits in which two fingerprints differ (0: the same state; ~16: unrelated ones). */
export function fingerprintDistance(a: number, b: number): number {
  let x = (a ^ b) >>> 0, n = 0;
  while (x) {
    x &= x - 1;
    n++;
  }
  return n;
}

/** Where {@linkcode fingerprintDispatch} reads rows and writes fingerprints. */
export interface FingerprintOptions {
  /** Rows of `x` to fingerprint, from row 0 (ignored with `prefill`: one row). */
  rows: number;
  hidden: number;
  /** Entry of this step's ring row (the token ring's offset, in entries). */
  ringOffset: number;
  /** Entries per sequence and step (the token ring's stride). */
  ringStride: number;
  /** Rows per sequence (a verification pass's R; default 1). */
  rowsPerSeq?: number;
  /** A prefill chunk's last token: the row `lastRow` names, into sequence `slot`'s entry. */
  prefill?: { slot: number };
}

/** Fingerprints rows of `x` into `fpRing` (see {@linkcode FingerprintOptions}). */
export function fingerprintDispatch(
  gpu: Gpu,
  bufs: { x: Binding; fpRing: Binding; lastRow: Binding },
  o: FingerprintOptions,
): Dispatch {
  const pipe = pipeline(gpu, "fingerprint.wgsl", {
    entryPoint: "fingerprint",
    prelude: wgsl("hash_common.wgsl"),
  });
  const rows = o.prefill ? 1 : o.rows;
  const u = uniform(
    gpu,
    params([
      rows,
      o.hidden,
      o.rowsPerSeq ?? 1,
      o.ringOffset,
      o.ringStride,
      o.prefill?.slot ?? 0,
      o.prefill ? 1 : 0,
      0,
    ]),
  );
  // last_row is read (and bound) either way; only a prefill's value matters.
  const entries: [number, Binding][] = [[0, u], [1, bufs.x], [2, bufs.fpRing], [3, bufs.lastRow]];
  return {
    label: "fingerprint",
    pipeline: pipe,
    bindGroup: bindAt(gpu, pipe, entries),
    workgroups: [rows, 1, 1],
  };
}
