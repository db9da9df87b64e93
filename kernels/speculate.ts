/**
 * Wrapper for kernels/speculate.wgsl: the draft (`spec_begin`) and accept (`spec_end`) steps of
 * speculative decoding, the byte layout of what they add to the step kernels' buffers (the
 * per-slot token history, the n-gram pool of the model's guesses, the per-row inputs of a
 * verification pass), and their references.
 */
import type { Gpu } from "../gpu/device.ts";
import { type Dispatch, params, uniform } from "../gpu/dispatch.ts";
import { mix } from "./fingerprint.ts";
import { pipeline, wgsl } from "./pipeline.ts";
import { NO_TOKEN, type StepBuffers } from "./step.ts";

/** Rows per slot a verification pass may run (drafts + 1). */
export const MAX_SPEC_ROWS = 16;
/** Entries of a slot's n-gram pool (a power of two), and words per entry. */
export const POOL_ENTRIES = 128;
const ENTRY_WORDS = 16;
/** u32 words of one slot's pool: the step's pool-draft count, then the entries. */
export const POOL_WORDS = 1 + POOL_ENTRIES * ENTRY_WORDS;

/** Buffers speculation adds to the step kernels' (see speculate.wgsl). */
export interface SpecBuffers {
  /** `u32 [S, H]`: each slot's tokens by position (prompt, then every accepted token). */
  hist: GPUBuffer;
  /** `u32 [S, R]`: each row's input token (row 0: the last sampled; then the drafts). */
  rowTok: GPUBuffer;
  /** `u32 [S, R]`: where each row's K and V are written (the trash position when dead). */
  rowPos: GPUBuffer;
  /** `u32 [S, R]`: keys each row attends, = the position its sample is for (0 when dead). */
  rowLen: GPUBuffer;
  /** `u32 [S, R]`: each row's slot (static; rope_kv's block-table row). */
  rowSlot: GPUBuffer;
  /** `u32 [S]`: most drafts per step each slot may take (0: it does not speculate). */
  cap: GPUBuffer;
  /** `u32 [S, POOL_WORDS]`: each slot's n-gram pool of guesses (zeros: empty). */
  pool: GPUBuffer;
  /** `u32 [S]`: where the plain path's cross-check writes row 0's KV (the step's `pos`). */
  checkPos: GPUBuffer;
  /** `u32 [S]`: keys the cross-check's row attends (0 for a done slot). */
  checkLen: GPUBuffer;
}

/** Options of {@linkcode specDispatch}. */
export interface SpecOptions {
  entry: "spec_begin" | "spec_end";
  slotBegin: number;
  slotEnd: number;
  /** R: rows per slot (drafts + 1), 2..{@linkcode MAX_SPEC_ROWS}. */
  rows: number;
  /** H: positions per history row. */
  histLen: number;
  trashPos: number;
  vocab: number;
  /** Entry offset of this step's row in the ring (spec_end). */
  ringOffset?: number;
  /** Ring entries per slot and step (default R + 1). */
  ringStride?: number;
  nEos: number;
  /** Longest suffix matched (default 3) and the shortest that drafts (default 1). */
  ngram?: number;
  ngramMin?: number;
  /** Draft from the n-gram pool of guesses too (default true). */
  pool?: boolean;
}

const WG = 64;

/**
 * Builds `spec_begin` (one workgroup per slot of [slotBegin, slotEnd)) or `spec_end` (a thread
 * per slot).
 *
 * @throws Error ("internal error") for a row count out of range, an empty n-gram range or a
 *   vocabulary past 2^24 tokens (a pool entry packs its key in 24 bits)
 */
export function specDispatch(
  gpu: Gpu,
  bufs: { step: StepBuffers; spec: SpecBuffers },
  o: SpecOptions,
): Dispatch {
  const ngram = o.ngram ?? 3, ngramMin = o.ngramMin ?? 1;
  if (
    !(o.rows >= 2 && o.rows <= MAX_SPEC_ROWS && ngramMin >= 1 && ngram >= ngramMin &&
      o.vocab <= 2 ** 24)
  ) {
    throw new Error(
      `internal error: speculation rows ${o.rows}, n-grams ${ngramMin}..${ngram}, vocab ${o.vocab}`,
    );
  }
  const pipe = pipeline(gpu, "speculate.wgsl", {
    entryPoint: o.entry,
    prelude: wgsl("hash_common.wgsl"),
    constants: {
      WG,
      NGRAM: ngram,
      NGRAM_MIN: ngramMin,
      NO_TOKEN,
      POOL_ENTRIES,
      POOL: o.pool === false ? 0 : 1,
    },
  });
  const u = uniform(
    gpu,
    params([
      o.slotBegin,
      o.slotEnd,
      o.rows,
      o.histLen,
      o.trashPos,
      o.vocab,
      o.ringOffset ?? 0,
      o.nEos,
      o.ringStride ?? o.rows + 1,
    ]),
  );
  const { step: b, spec: sp } = bufs;
  const all = [
    u,
    b.seqLen,
    b.slotState,
    b.nextTok,
    sp.hist,
    sp.rowTok,
    sp.rowPos,
    sp.rowLen,
    b.sampled,
    b.ring,
    b.counts,
    b.eos,
    sp.cap,
    sp.pool,
    sp.checkPos,
    sp.checkLen,
  ];
  // layout "auto" keeps only the bindings an entry point uses.
  const used = o.entry === "spec_begin"
    ? [0, 1, 2, 3, 4, 5, 6, 7, 12, 13, 14, 15]
    : [0, 1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 13];
  const bg = gpu.device.createBindGroup({
    layout: pipe.getBindGroupLayout(0),
    entries: used.map((i) => ({ binding: i, resource: { buffer: all[i] } })),
  });
  const slots = o.slotEnd - o.slotBegin;
  return {
    label: `${o.entry} R${o.rows}`,
    pipeline: pipe,
    bindGroup: bg,
    workgroups: [o.entry === "spec_begin" ? slots : Math.max(1, Math.ceil(slots / WG)), 1, 1],
  };
}

/** Word offset of `key`'s entry in one slot's pool words (speculate.wgsl `entry_of`). */
function entryOf(key: number): number {
  return 1 + (mix(key) & (POOL_ENTRIES - 1)) * ENTRY_WORDS;
}

/** The guesses one slot's pool (`POOL_WORDS` words) holds under `key` (none: empty). */
export function poolRef(pool: ArrayLike<number>, key: number): number[] {
  const at = entryOf(key), head = pool[at];
  if ((head & 0xffffff) !== key) return [];
  return Array.from({ length: head >>> 24 }, (_, i) => pool[at + 1 + i]);
}

/** Stores `guesses` under `key` in one slot's pool words, as spec_end does. */
export function poolInsertRef(pool: Uint32Array, key: number, guesses: readonly number[]): void {
  const at = entryOf(key);
  pool[at] = (key | (guesses.length << 24)) >>> 0;
  guesses.forEach((t, i) => (pool[at + 1 + i] = t));
}

/** One slot as {@linkcode draftRef} sees it. */
export interface DraftRefOptions {
  /** Tokens by position, at least `len + 1` of them. */
  hist: ArrayLike<number>;
  /** L: the position of the last sampled token (its KV is not written yet). */
  len: number;
  /** The host's cap. */
  cap: number;
  rows: number;
  /** Tokens the slot may still sample. */
  remaining: number;
  /** Its pool's words (absent: no pool). */
  pool?: ArrayLike<number>;
  ngram?: number;
  ngramMin?: number;
}

/**
 * The drafts `spec_begin` proposes for one slot: the tokens after the latest occurrence (ending
 * before L) of the longest suffix of hist[0..L] of NGRAM_MIN..NGRAM tokens, copied on past L
 * (an overlapping copy), then the pool's guesses chained from the last token; and how many of
 * them came from the pool.
 */
export function draftRef(o: DraftRefOptions): { drafts: number[]; pooled: number } {
  const ngram = o.ngram ?? 3, ngramMin = o.ngramMin ?? 1, L = o.len, h = o.hist;
  const D = Math.max(0, Math.min(o.cap, o.rows - 1, o.remaining - 1));
  let best = { n: 0, e: -1 };
  for (let e = 0; e < L; e++) {
    let n = 0;
    while (n < ngram && n <= e && h[e - n] === h[L - n]) n++;
    if (n >= ngramMin && (n > best.n || (n === best.n && e > best.e))) best = { n, e };
  }
  const drafts: number[] = [];
  if (best.e >= 0 && L >= 1) {
    const span = L - best.e;
    while (drafts.length < D) {
      const j = drafts.length;
      drafts.push(j < span ? h[best.e + 1 + j] : drafts[j - span]);
    }
  }
  const lookup = drafts.length;
  for (let t = drafts.at(-1) ?? h[L]; o.pool && drafts.length < D;) {
    const guesses = poolRef(o.pool, t).slice(0, D - drafts.length);
    if (guesses.length === 0) break;
    drafts.push(...guesses);
    t = drafts[drafts.length - 1];
  }
  return { drafts, pooled: drafts.length - lookup };
}

/** What `spec_end` does with one running slot's verified rows. */
export interface AcceptRef {
  /** Tokens accepted this step, in order. */
  tokens: number[];
  /** Drafts among them. */
  accepted: number;
  /** The slot is done (budget spent or EOS). */
  done: boolean;
  /** The pool entry it stores: the model's guesses past the first rejected draft (if any). */
  guesses?: { key: number; tokens: number[] };
}

/**
 * `spec_end` for one slot: the longest prefix of rows whose drafts the model sampled, cut by the
 * budget and at the first EOS, and the guesses the rows after a rejected draft leave the pool.
 *
 * @param sampled the token each row sampled (rows 0..d)
 * @param drafts the d drafts (row j's input is drafts[j - 1])
 */
export function acceptRef(
  sampled: readonly number[],
  drafts: readonly number[],
  o: { remaining: number; eos: readonly number[]; stopAtEos: boolean },
): AcceptRef {
  const d = drafts.length;
  let m = 0;
  while (m < d && sampled[m] === drafts[m]) m++;
  let a = Math.min(m + 1, o.remaining), done = a === o.remaining;
  for (let j = 0; j < a; j++) {
    if (o.stopAtEos && o.eos.includes(sampled[j])) {
      a = j + 1;
      done = true;
      break;
    }
  }
  return {
    tokens: sampled.slice(0, a),
    accepted: Math.min(m, a - 1),
    done,
    ...(m < d ? { guesses: { key: sampled[m], tokens: sampled.slice(m + 1, d + 1) } } : {}),
  };
}
