/**
 * Wrapper for kernels/speculate.wgsl: the draft (`spec_begin`) and accept (`spec_end`) steps of
 * speculative decoding, and the byte layout of what they add to the step kernels' buffers: the
 * per-slot token history and the per-row inputs of a verification pass.
 */
import type { Gpu } from "../gpu/device.ts";
import { type Dispatch, params, uniform } from "../gpu/dispatch.ts";
import { pipeline } from "./pipeline.ts";
import { NO_TOKEN, type StepBuffers } from "./step.ts";

/** Rows per slot a verification pass may run (drafts + 1). */
export const MAX_SPEC_ROWS = 16;

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
  nEos: number;
  /** Longest suffix matched (default 3) and the shortest that drafts (default 1). */
  ngram?: number;
  ngramMin?: number;
}

const WG = 64;

/**
 * Builds `spec_begin` (one workgroup per slot of [slotBegin, slotEnd)) or `spec_end` (a thread
 * per slot).
 *
 * @throws Error ("internal error") for a row count out of range or an empty n-gram range
 */
export function specDispatch(
  gpu: Gpu,
  bufs: { step: StepBuffers; spec: SpecBuffers },
  o: SpecOptions,
): Dispatch {
  const ngram = o.ngram ?? 3, ngramMin = o.ngramMin ?? 1;
  if (!(o.rows >= 2 && o.rows <= MAX_SPEC_ROWS && ngramMin >= 1 && ngram >= ngramMin)) {
    throw new Error(`internal error: speculation rows ${o.rows}, n-grams ${ngramMin}..${ngram}`);
  }
  const pipe = pipeline(gpu, "speculate.wgsl", {
    entryPoint: o.entry,
    constants: { WG, NGRAM: ngram, NGRAM_MIN: ngramMin, NO_TOKEN },
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
  ];
  // layout "auto" keeps only the bindings an entry point uses.
  const used = o.entry === "spec_begin"
    ? [0, 1, 2, 3, 4, 5, 6, 7, 12]
    : [0, 1, 2, 3, 4, 5, 7, 8, 9, 10, 11];
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

/** One slot as {@linkcode draftRef} sees it. */
export interface DraftRefOptions {
  /** Tokens by position, at least `len + 1` of them. */
  hist: ArrayLike<number>;
  /** L: the position of the last sampled token (its KV is not written yet). */
  len: number;
  /** The slot's adaptive depth, and the host's cap. */
  depth: number;
  cap: number;
  rows: number;
  /** Tokens the slot may still sample. */
  remaining: number;
  ngram?: number;
  ngramMin?: number;
}

/**
 * The drafts `spec_begin` proposes for one slot: the tokens after the latest occurrence (ending
 * before L) of the longest suffix of hist[0..L] of NGRAM_MIN..NGRAM tokens.
 */
export function draftRef(o: DraftRefOptions): number[] {
  const ngram = o.ngram ?? 3, ngramMin = o.ngramMin ?? 1, L = o.len, h = o.hist;
  let best = { n: 0, e: -1 };
  for (let e = 0; e < L; e++) {
    let n = 0;
    while (n < ngram && n <= e && h[e - n] === h[L - n]) n++;
    if (n >= ngramMin && (n > best.n || (n === best.n && e > best.e))) best = { n, e };
  }
  if (best.e < 0 || L < 1) return [];
  const d = Math.min(o.depth, o.cap, o.rows - 1, L - best.e, o.remaining - 1);
  return Array.from({ length: Math.max(0, d) }, (_, j) => h[best.e + 1 + j]);
}

/** What `spec_end` does with one running slot's verified rows. */
export interface AcceptRef {
  /** Tokens accepted this step, in order. */
  tokens: number[];
  /** Drafts among them. */
  accepted: number;
  /** The slot is done (budget spent or EOS). */
  done: boolean;
  /** Its next adaptive depth. */
  depth: number;
}

/**
 * `spec_end` for one slot: the longest prefix of rows whose drafts the model sampled, cut by the
 * budget and at the first EOS.
 *
 * @param sampled the token each row sampled (rows 0..d)
 * @param drafts the d drafts (row j's input is drafts[j - 1])
 */
export function acceptRef(
  sampled: readonly number[],
  drafts: readonly number[],
  o: { remaining: number; eos: readonly number[]; stopAtEos: boolean; depth: number; rows: number },
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
  const depth = d > 0 && m === d
    ? Math.min(o.depth + 1, o.rows - 1)
    : d > 0
    ? Math.max(m, 1)
    : o.depth;
  return { tokens: sampled.slice(0, a), accepted: Math.min(m, a - 1), done, depth };
}
