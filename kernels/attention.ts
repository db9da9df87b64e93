/**
 * Causal prefill attention over the paged KV cache (tiled, online softmax). See
 * kernels/attention.wgsl. Also exports the tile geometry that attention_decode shares.
 */
import type { Gpu } from "../engine/gpu.ts";
import { bindGroup, type Dispatch, params, pipeline, uniform } from "./dispatch.ts";

const BLOCK = 16;
/** Threads per workgroup. */
const WG = 128;

/** Workgroup shape of the attention kernels for one head dim. */
export interface AttentionTile {
  /** Threads per workgroup. */
  wg: number;
  /** Query rows per workgroup. */
  rows: number;
  /** Threads that share one score when `rows · 16 < wg`. */
  parts: number;
  /** Workgroup memory the tile uses, in bytes. */
  bytes: number;
}

/** Options for {@linkcode attentionTile}. */
export interface AttentionTileOptions {
  headDim: number;
  /** Rows worth having (more would be padding); the tile takes at most this many. */
  wantRows: number;
  /** Upper bound on rows (default 64). */
  maxRows?: number;
}

/**
 * Picks the largest row tile that fits the device's workgroup memory: q and the accumulator take
 * `rows · headDim` floats each, the K-then-V tile `16 · headDim`, scores `rows · 16 · parts`.
 * headDim 128 gets 16 rows on llvmpipe (32 KiB), 32 on the H200 (48 KiB); headDim 64 gets 32 and
 * 64.
 *
 * @throws Error ("internal error") when not even one row fits (headDim too large).
 */
export function attentionTile(gpu: Gpu, opts: AttentionTileOptions): AttentionTile {
  const D = opts.headDim;
  let rows = Math.max(1, Math.min(opts.wantRows, opts.maxRows ?? 64, WG));
  for (; rows >= 1; rows = rows > 8 ? rows >> 1 : rows - 1) {
    const parts = Math.max(1, Math.floor(WG / (rows * BLOCK)));
    const bytes = 4 * (2 * rows * D + BLOCK * D + rows * BLOCK * parts + rows);
    if (bytes <= gpu.maxWorkgroupStorage) return { wg: WG, rows, parts, bytes };
  }
  throw new Error(
    `internal error: attention head dim ${D} needs more than ${gpu.maxWorkgroupStorage} bytes ` +
      "of workgroup memory",
  );
}

/** Buffers of {@linkcode attentionDispatch}. */
export interface AttentionBuffers {
  /** `f32 [T, Hq, D]` rotated queries (rows from `tokenOffset`). */
  q: GPUBuffer;
  /** `f32 [numBlocks, nLayers, Hkv, 16, D]` */
  kPool: GPUBuffer;
  vPool: GPUBuffer;
  /** `u32 [S, maxBlocks]` */
  blockTable: GPUBuffer;
  /** `f32 [T, Hq, D]` out (rows from `tokenOffset`). */
  out: GPUBuffer;
}

/** Shape of {@linkcode attentionDispatch}. */
export interface AttentionOptions {
  /** Queries of this sequence in the step (T ≥ 1). */
  tokens: number;
  /** Batch slot of the sequence (its block-table row). */
  slot: number;
  /** Position of the first query; keys `0..pos0-1` are already cached. */
  pos0: number;
  nHeads: number;
  nKvHeads: number;
  headDim: number;
  layer: number;
  nLayers: number;
  maxBlocks: number;
  /** Softmax scale (default `1 / sqrt(headDim)`). */
  scale?: number;
  /** Row of `q` / `out` holding this sequence's first token (default 0). */
  tokenOffset?: number;
}

/**
 * Builds causal attention for one sequence: query i (position `pos0 + i`) attends keys
 * `0..pos0+i` of slot `slot`, read through the block table, GQA head `h → h / (Hq / Hkv)`.
 * Writes `out[tokenOffset + i, h, :]`. One workgroup per (tile of rows, kv head).
 *
 * @throws Error ("internal error") on shapes that do not fit (odd heads, context past the
 *   table, head dim too large for workgroup memory).
 * @example
 * const d = attentionDispatch(gpu, { q, kPool, vPool, blockTable, out }, {
 *   tokens: 40, slot: 0, pos0: 0, nHeads: 32, nKvHeads: 4, headDim: 64,
 *   layer: 0, nLayers: 22, maxBlocks: 129,
 * });
 */
export function attentionDispatch(
  gpu: Gpu,
  buffers: AttentionBuffers,
  opts: AttentionOptions,
): Dispatch {
  const { tokens, slot, pos0, nHeads, nKvHeads, headDim: D, layer, nLayers, maxBlocks } = opts;
  const group = nHeads / nKvHeads;
  if (!(tokens >= 1 && Number.isInteger(group) && group >= 1 && D >= 2 && D % 2 === 0)) {
    throw new Error(
      `internal error: attention tokens ${tokens}, heads ${nHeads}/${nKvHeads}, head dim ${D}`,
    );
  }
  if (pos0 + tokens > maxBlocks * BLOCK || layer >= nLayers) {
    throw new Error(
      `internal error: attention over ${pos0 + tokens} positions, table of ${maxBlocks} ` +
        `blocks; layer ${layer} of ${nLayers}`,
    );
  }
  const tile = attentionTile(gpu, { headDim: D, wantRows: tokens * group });
  const scale = opts.scale ?? 1 / Math.sqrt(D);
  const pipe = pipeline(gpu, "attention.wgsl", {
    constants: { WG: tile.wg, HD: D, ROWS: tile.rows, PARTS: tile.parts },
  });
  const u = uniform(
    gpu,
    params([
      tokens,
      nHeads,
      nKvHeads,
      group,
      slot,
      pos0,
      layer,
      nLayers,
      maxBlocks,
      opts.tokenOffset ?? 0,
      { f: scale * Math.LOG2E },
    ]),
  );
  const b = buffers;
  return {
    label: `attention T${tokens} pos0 ${pos0} ${nHeads}/${nKvHeads}x${D} L${layer}`,
    pipeline: pipe,
    bindGroup: bindGroup(gpu, pipe, [u, b.q, b.kPool, b.vPool, b.blockTable, b.out]),
    workgroups: [Math.ceil((tokens * group) / tile.rows), nKvHeads, 1],
  };
}
