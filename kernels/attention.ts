/**
 * Causal prefill attention over the paged KV cache (tiled, online softmax). See
 * kernels/attention.wgsl. Also exports the tile geometry that attention_decode shares.
 */
import type { Gpu } from "../engine/gpu.ts";
import { bindGroup, type Dispatch, params, pipeline, uniform } from "./dispatch.ts";

const BLOCK = 16;
/** Threads per workgroup. */
const WG = 128;
/** Most threads that share one score (more only shortens dot products already short). */
const MAX_PARTS = 8;
/** Workgroup memory budget where shaders compile slowly (see {@linkcode attentionTile}). */
const SLOW_COMPILE_BYTES = 2560;
/** Largest head dim: a 16-key tile is then 32 floats per thread (`NT_MAX` in the WGSL). */
const MAX_HEAD_DIM = 256;

/** Workgroup shape of the attention kernels for one head dim. */
export interface AttentionTile {
  /** Threads per workgroup. */
  wg: number;
  /** Query rows per workgroup. */
  rows: number;
  /** Keys per KV tile: 16 (a whole cache block) unless workgroup memory is tight. */
  keys: number;
  /** Threads that share one score when `rows · keys < wg`. */
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
  /** Workgroup memory to stay within (default: see {@linkcode attentionTile}). */
  maxBytes?: number;
}

/**
 * Picks the tile: whole 16-key blocks and as many rows as fit, fewer keys per tile only when
 * even one row does not fit. Workgroup memory: q `rows · (headDim + 1)` and the accumulator
 * `rows · headDim` floats, the K-then-V tile `headDim · (keys + 1)`, scores `rows · keys · parts`,
 * `rows + 1` scalars. The budget is the device's workgroup memory (headDim 128: 16 rows in 32 KiB,
 * 32 rows in the H200's 48 KiB; headDim 64: 32 and 64 rows), except on Mesa llvmpipe through
 * GL (a CPU adapter without shader-f16), where it is 2.5 KiB: naga zero-initialises workgroup
 * memory there with one store per element, and Mesa's compile time grows with the square of that
 * count (6 s at 4 KiB, minutes at 16 KiB).
 *
 * @throws Error ("internal error") when not even one row and one key fit (headDim too large).
 */
export function attentionTile(gpu: Gpu, opts: AttentionTileOptions): AttentionTile {
  const D = opts.headDim;
  const budget = opts.maxBytes ?? (slowCompile(gpu) ? SLOW_COMPILE_BYTES : gpu.maxWorkgroupStorage);
  const most = Math.max(1, Math.min(opts.wantRows, opts.maxRows ?? 64, WG));
  for (let keys = BLOCK; keys >= 1 && D <= MAX_HEAD_DIM; keys >>= 1) {
    for (let rows = most; rows >= 1; rows = rows > 8 ? rows >> 1 : rows - 1) {
      let parts = Math.min(MAX_PARTS, Math.max(1, Math.floor(WG / (rows * keys))));
      while (D % parts !== 0) parts >>= 1;
      const floats = rows * (D + 1) + rows * D + D * (keys + 1) + rows * keys * parts + rows + 1;
      if (4 * floats <= budget) return { wg: WG, rows, keys, parts, bytes: 4 * floats };
    }
  }
  throw new Error(
    `internal error: attention head dim ${D} needs more than ${budget} bytes of workgroup ` +
      `memory or is over ${MAX_HEAD_DIM}`,
  );
}

/** Mesa llvmpipe through GL: the one CPU adapter without shader-f16 (lavapipe has it). */
function slowCompile(gpu: Gpu): boolean {
  return !gpu.hasF16 && /llvmpipe|lavapipe|swiftshader/i.test(gpu.adapterName);
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
  /** Cap on workgroup memory in bytes (default: see {@linkcode attentionTile}); for tests. */
  maxTileBytes?: number;
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
  const tile = attentionTile(gpu, {
    headDim: D,
    wantRows: tokens * group,
    maxBytes: opts.maxTileBytes,
  });
  const rowTiles = Math.ceil((tokens * group) / tile.rows);
  if (rowTiles > 65535) {
    throw new Error(
      `internal error: attention over ${tokens} tokens needs ${rowTiles} > 65535 ` +
        "workgroups; prefill in chunks",
    );
  }
  const scale = opts.scale ?? 1 / Math.sqrt(D);
  const pipe = pipeline(gpu, "attention.wgsl", {
    constants: { WG: tile.wg, HD: D, ROWS: tile.rows, KEYS: tile.keys, PARTS: tile.parts },
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
    label: `attention T${tokens} pos0 ${pos0} ${nHeads}/${nKvHeads}x${D} L${layer} ` +
      `tile ${tile.rows}x${tile.keys}`,
    pipeline: pipe,
    bindGroup: bindGroup(gpu, pipe, [u, b.q, b.kPool, b.vPool, b.blockTable, b.out]),
    workgroups: [rowTiles, nKvHeads, 1],
  };
}
