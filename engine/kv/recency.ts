/**
 * Precision by recency (docs/kv_codecs.md): the newest `window` tokens of a sequence stay in hot
 * blocks at full precision, and each whole block older than that is re-encoded into a codec
 * block (kernels/kv_codec.ts) and its table entry repointed, the hot block freed. This module is
 * the bookkeeping of that move (pure: no GPU); the engine's runner queues the encoding and
 * rewrites the GPU's block tables (engine/runner/reencode.ts).
 *
 * Only blocks a single sequence holds move (reference count 1): a block shared through the
 * prefix cache stays hot until the others let go of it, so no other table ever points at a
 * freed block and nothing needs to know who else holds it.
 */
import { BLOCK, type SequenceBlocks } from "./blocks.ts";

/** One block re-encoded: logical block `index` of a sequence moves from block `from` to `to`. */
export interface Reencode {
  index: number;
  from: number;
  to: number;
}

/**
 * The logical blocks of `blocks` that lie wholly behind the hot window, given that the KV of
 * positions `[0, written)` is written by work already submitted: those ending at or before
 * `written − window`.
 */
export function agedBlocks(written: number, window: number): number {
  return Math.max(0, Math.floor((written - window) / BLOCK));
}

/**
 * Moves every hot block of `blocks` behind the hot window that only this sequence holds into a
 * codec block of the same pool: takes a codec block, hands it the hot block's content (hash and
 * tokens, so prefix lookups find it) and repoints the table; the hot block goes back to the pool.
 * Stops early when the codec region is full (the rest stay hot). The caller queues the encoding
 * of every returned pair before any work that reads the new table, and after every submitted
 * work that reads the old one (queue order does the rest).
 *
 * @param written positions whose KV is written by submitted work (prompt and tokens read back,
 *   the last one aside)
 * @param window tokens kept hot at the end of the sequence (≥ 0)
 * @returns the blocks moved, and whether the codec region ran out
 * @example
 * // 70 tokens written, 32 kept hot: blocks 0 and 1 (tokens 0–31) move, block 2 (32–47) stays.
 * reencodeAged(seq.blocks, 70, 32); // { moved: [{ index: 0, ... }, { index: 1, ... }], full: false }
 */
export function reencodeAged(
  blocks: SequenceBlocks,
  written: number,
  window: number,
): { moved: Reencode[]; full: boolean } {
  const pool = blocks.pool, table = blocks.table, moved: Reencode[] = [];
  const end = Math.min(agedBlocks(written, window), table.length);
  for (let index = 0; index < end; index++) {
    const from = table[index];
    if (from === pool.trash || pool.isCodec(from) || pool.blocks[from].refCount !== 1) continue;
    if (pool.codecFreeCount === 0) return { moved, full: true };
    const to = pool.allocateCodec();
    pool.move(from, to);
    table[index] = to;
    moved.push({ index, from, to });
  }
  return { moved, full: false };
}
