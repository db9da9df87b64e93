/**
 * The launch plan of decode attention (kernels/attention_decode.ts): threads, splits along the KV
 * length and row groups, by a cost model fitted on the H200, and the scratch the splits need.
 * Compare plans with scripts/sweep_kernels.ts (docs/kernels.md, "Decode attention").
 */
import { attendedKeys, type AttentionMask, CAUSAL } from "./attention_mask.ts";

/** Threads of `main`, largest first (the plan's, or fewer where the memory budget is short). */
export const THREADS = [256, 128, 64];
/** Threads per key when scoring (`TPK`): a chunk is `wg / 4` keys. */
export const TPK = 4;
/** Keys per chunk of 256 threads: the unit of `SERIAL_CHUNKS`. */
const CHUNK = 64;
/**
 * Chunks per slot at `maxContext` up to which one pass of 256 threads is kept even for one slot:
 * four serial chunks should cost about what a second dependent dispatch does (~2 µs on the H200).
 */
const SERIAL_CHUNKS = 4;
/**
 * The launch plan's cost model ({@linkcode decodePlan}), fitted on the H200 (132 SMs). `main`
 * holds ROWS accumulators per thread, so its registers, not its workgroup memory, cap how many
 * workgroups an SM runs at once (`resident`, at 5–8 rows and at up to 4); a launch past that many
 * is a second wave. A workgroup's time is its `fixed` cost plus its chunks (`wg / 4` keys each),
 * each costing `chunk · (1 + rows / ROW_WEIGHT)` (the keys are read and scored whatever the rows;
 * each row adds a little); each split adds `SPLIT_COST` to `combine`. Fitted to a sweep of every
 * thread count, row grouping and split count of `SPLITS`, where it picks the measured best at
 * every point; it is brittle off its fit, so refit it on another GPU (docs/kernels.md, "Decode
 * attention"; BENCHMARKS.md).
 */
const SMS = 132;
const COST: Record<number, { resident: [number, number]; fixed: number; chunk: number }> = {
  256: { resident: [2, 3], fixed: 0.75, chunk: 1 },
  128: { resident: [5, 6], fixed: 0.75, chunk: 0.91 },
  64: { resident: [8, 8], fixed: 2, chunk: 0.63 },
};
const ROW_WEIGHT = 12;
const SPLIT_COST = 0.005;
/** Split counts the plan weighs (those its sweeps measured). */
const SPLITS = [1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64];
/** Most scratch a plan may take: the binding limit of our smallest targets (DESIGN.md). */
const MAX_SCRATCH = 128 * 2 ** 20;
/** Row groupings the plan weighs (workgroups per kv head, before the memory budget). */
const ROW_GROUPS = [1, 2, 4];
/** Most splits (`combine` loads one (m, l) per thread). */
const MAX_SPLITS = 64;
/** Threads of `combine`; each holds at most `CMAX` partials. */
const CWG = 64;
const CMAX = 16;
/** Rows a thread of `main` holds (`RMAX` in the WGSL). */
const RMAX = 8;

/** Options for {@linkcode attentionDecodeScratchBytes}. */
export interface AttentionDecodeScratchOptions {
  /** Batch slots of the launch (one new token each). */
  seqs: number;
  /** q heads. */
  nHeads: number;
  /** Elements per head, a multiple of 4 up to 256. */
  headDim: number;
  /** Longest context the engine serves; with `seqs`, fixes the split count. */
  maxContext: number;
  /** KV heads (the q heads of one share a workgroup's keys). */
  nKvHeads: number;
  /**
   * Keys per split at `maxContext`: forces `ceil(maxContext / splitSize)` splits (at most 64;
   * 1 = single pass). Default: {@linkcode decodePlan}'s.
   */
  splitSize?: number;
  /**
   * Workgroups per kv head at least (at most the q heads per kv head). Default: the plan's (see
   * {@linkcode decodePlan}).
   */
  minRowGroups?: number;
  /** Threads of `main` at most: 256, 128 or 64. Default: the plan's (see {@linkcode decodePlan}). */
  threads?: number;
  /**
   * Which keys a slot's query (at position `seqLen - 1`) sees (default causal), compiled into the
   * pipelines. The plan is made for the keys a query at `maxContext` attends (a window's, at
   * most), since a slot visits only the chunks it sees.
   */
  mask?: AttentionMask;
}

/**
 * Row groups a launch starts from when `asked` are wanted: enough that no workgroup holds more
 * than `RMAX` q heads, never more than the `group` q heads of a kv head.
 */
export function leastRowGroups(group: number, asked: number): number {
  return Math.max(Math.ceil(group / RMAX), Math.min(asked, group));
}

/** The launch of {@linkcode attentionDecodeDispatches}: splits along the KV length, row groups. */
export interface DecodePlan {
  /** 1 = single pass, no `combine`. */
  splits: number;
  /** Workgroups per kv head asked of {@linkcode attentionDecodeGeometry} (`minRowGroups`). */
  rowGroups: number;
  /** Threads of `main` at most, asked of {@linkcode attentionDecodeGeometry} (`threads`). */
  threads: number;
}

/**
 * Chooses threads, splits and row groups by the cost model above (`SMS` … `SPLITS`): each
 * choice's workgroups `splits · rowGroups · nKvHeads · seqs` run in waves of `SMS · resident`,
 * each wave as long as one workgroup's `fixed + ceil(chunks / splits) · chunk · (1 + rows /
 * ROW_WEIGHT)` (chunks of `threads / 4` keys of `maxContext`), plus `SPLIT_COST · splits` with a
 * `combine`; the cheapest wins, ties to fewer threads in all. Split counts whose partials would
 * take over 128 MiB are left out. Up to `SERIAL_CHUNKS` chunks of 64
 * keys keep one pass of 256 threads. A `splitSize`, `minRowGroups` or `threads` given fixes that
 * part. Rows are counted as on a GPU (all q heads of a kv head in one workgroup up to 8); where
 * the memory budget allows fewer rows or threads (llvmpipe through GL) the geometry adds row
 * groups or takes fewer threads, which changes the cost but not the correctness.
 *
 * @throws Error ("internal error") on a `splitSize` that is not an integer ≥ 1, or `threads`
 * other than 256, 128 or 64.
 * @example
 * decodePlan({ seqs: 32, nHeads: 32, nKvHeads: 4, headDim: 64, maxContext: 640 });
 * // { splits: 5, rowGroups: 1, threads: 128 }
 */
export function decodePlan(opts: AttentionDecodeScratchOptions): DecodePlan {
  const cap = Math.min(MAX_SPLITS, CMAX * Math.floor(CWG / (opts.headDim / 4)));
  const context = Math.max(1, attendedKeys(opts.mask ?? CAUSAL, opts.maxContext));
  if (opts.splitSize !== undefined && !(Number.isInteger(opts.splitSize) && opts.splitSize >= 1)) {
    throw new Error(
      `internal error: decode splitSize must be an integer ≥ 1; got ${opts.splitSize}`,
    );
  }
  if (opts.threads !== undefined && !THREADS.includes(opts.threads)) {
    throw new Error(`internal error: decode threads must be 256, 128 or 64; got ${opts.threads}`);
  }
  const serial = opts.splitSize === undefined && Math.ceil(context / CHUNK) <= SERIAL_CHUNKS;
  const threadChoices = opts.threads !== undefined ? [opts.threads] : serial ? [256] : THREADS;
  const group = Math.max(1, Math.floor(opts.nHeads / opts.nKvHeads));
  const groupChoices = opts.minRowGroups !== undefined
    ? [opts.minRowGroups]
    : ROW_GROUPS.filter((g, i) => i === 0 || g <= group);
  let best: DecodePlan & { cost: number; size: number } | undefined;
  for (const threads of threadChoices) {
    const chunks = Math.ceil(context / (threads / TPK));
    const splitChoices = opts.splitSize !== undefined
      ? [Math.max(1, Math.min(cap, Math.ceil(context / opts.splitSize)))]
      : serial
      ? [1]
      : SPLITS.filter((n) =>
        n <= Math.min(cap, chunks) && (n === 1 || scratchBytes(opts, n) <= MAX_SCRATCH)
      );
    const { resident, fixed, chunk } = COST[threads];
    for (const splits of splitChoices) {
      for (const asked of groupChoices) {
        const groups = leastRowGroups(group, asked);
        const rows = Math.ceil(group / groups);
        const workgroups = splits * groups * opts.nKvHeads * opts.seqs;
        const waves = Math.ceil(workgroups / (SMS * resident[rows > 4 ? 0 : 1]));
        const cost =
          waves * (fixed + Math.ceil(chunks / splits) * chunk * (1 + rows / ROW_WEIGHT)) +
          (splits > 1 ? SPLIT_COST * splits : 0);
        const size = workgroups * threads;
        if (!best || cost < best.cost || (cost === best.cost && size < best.size)) {
          best = { splits, rowGroups: asked, threads, cost, size };
        }
      }
    }
  }
  return { splits: best!.splits, rowGroups: best!.rowGroups, threads: best!.threads };
}

/**
 * Bytes of scratch the decode partials need: acc `f32 [S, Hq, splits, D]` then (m, l, 0, 0)
 * `f32 [S, Hq, splits, 4]`; 0 for a single pass.
 *
 * @example
 * const bytes = attentionDecodeScratchBytes({
 *   seqs: 8, nHeads: 32, nKvHeads: 4, headDim: 64, maxContext: 2048,
 * });
 */
export function attentionDecodeScratchBytes(opts: AttentionDecodeScratchOptions): number {
  const n = decodePlan(opts).splits;
  return n === 1 ? 0 : scratchBytes(opts, n);
}

/** Bytes of the partials of `n` splits. */
export function scratchBytes(opts: AttentionDecodeScratchOptions, n: number): number {
  return opts.seqs * opts.nHeads * n * (opts.headDim + 4) * 4;
}
