/**
 * Which KV blocks a masked sequence will never read again, and their release. Under a sliding
 * window (or sinks + window, or chunked attention) a query at position q sees no key below the
 * mask's lower edge at q (past the sinks), and that edge only moves forward: once every query
 * still to be submitted sits at or after `qMin`, the whole blocks below the edge at `qMin` are
 * dead for good. The attention kernels never load them (kernels/attention_mask.wgsl), so they go
 * back to the pool at once; work already submitted that reads them is safe, since queue order
 * puts every later write to a reused block after it.
 */
import { type AttentionMask, maskLo, maskSinks } from "../../kernels/attention_mask.ts";
import { BLOCK, type SequenceBlocks } from "./blocks.ts";

/** Logical blocks `[from, to)` of a sequence (16 tokens each). */
export interface BlockRange {
  from: number;
  to: number;
}

/**
 * The logical blocks whose keys no query at a position ≥ `qMin` sees under `mask`: after the
 * sink blocks (kept whole, sinks that end inside a block keep that block), up to the last block
 * wholly below the mask's lower edge at `qMin`. Empty for causal attention.
 *
 * @example
 * deadBlocks({ kind: "window", window: 100 }, 500); // { from: 0, to: 25 }: keys 0..399
 * deadBlocks({ kind: "sinks", sinks: 4, window: 100 }, 500); // { from: 1, to: 25 }
 */
export function deadBlocks(mask: AttentionMask, qMin: number): BlockRange {
  if (mask.kind === "causal" || qMin <= 0) return { from: 0, to: 0 };
  const from = Math.ceil(maskSinks(mask) / BLOCK);
  const to = Math.floor(maskLo(mask, qMin) / BLOCK);
  return { from, to: Math.max(from, to) };
}

/**
 * Releases the blocks of `blocks` that no query at a position ≥ `qMin` reads under `mask`
 * ({@linkcode deadBlocks}). The caller guarantees that every query below `qMin` is submitted
 * (so the keys of those blocks are written, and read only by submitted work), and that no
 * session keeps the blocks: a session's next turn may rewind into them.
 *
 * @returns how many blocks went back to the pool
 */
export function releaseDead(blocks: SequenceBlocks, mask: AttentionMask, qMin: number): number {
  const { from, to } = deadBlocks(mask, qMin);
  return blocks.dropBlocks(from, to);
}
