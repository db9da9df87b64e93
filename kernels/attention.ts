/**
 * Prefill attention over the paged KV cache, causal or under a compiled-in mask
 * (kernels/attention_mask.ts): FlashAttention-2's loop with 4x4 register-blocked scores and
 * outputs, visiting only the key tiles the mask lets its rows see. See kernels/attention.wgsl for the kernel and why it
 * looks this way; this file picks the tile (rows per workgroup, keys per tile, threads) and
 * builds the dispatch.
 *
 * The default tiles were compared on an H200 (docs/kernels.md, "Prefill attention"); compare
 * others by forcing `tileRows` / `tileKeys` in {@linkcode attentionDispatch}, e.g. with
 * scripts/sweep_prefill_attention.ts.
 */
import type { KvDtype } from "../gpu/dtype.ts";
import { type Gpu, isCpuAdapter } from "../gpu/device.ts";
import { bindGroup, type Dispatch, params, uniform } from "../gpu/dispatch.ts";
import { pipeline, wgsl } from "./pipeline.ts";
import { type AttentionMask, CAUSAL, maskConstants, maskLabel } from "./attention_mask.ts";
import { codecConstants, type KvCodecRegion } from "./kv_codec.ts";

const BLOCK = 16;
/** Most threads per workgroup (WebGPU's default `maxComputeInvocationsPerWorkgroup`). */
const MAX_THREADS = 256;
/** K (and V) vec4 a thread prefetches per tile (`NT_MAX` in the WGSL). */
const NT_MAX = 8;
/** 4x4 accumulator blocks per thread (`NDG_MAX` in the WGSL). */
const NDG_MAX = 4;
/** Keys per tile the kernel handles: a tile lies in one 16-key cache block or is made of them. */
const TILE_KEYS = [4, 8, 16, 32, 64];
/**
 * (rows, keys) tiles, best first; the first that fits the workgroup memory budget wins. Rows are
 * capped at the rows there are. The threads in flight are one per 4 rows and 4 keys of a tile,
 * whatever the rows per workgroup, and a 256-token chunk of TinyLlama has only 8192 rows: 64 keys
 * give 16 threads per row group, twice what 32 keys give. 32 rows make 256 workgroups of 128
 * threads at 256 tokens (about 2 per H200 SM) and waste little on the diagonal (4 tokens per
 * workgroup at GQA 8). Long chunks put 64 × 32 first (see `WIDE_ROWS`).
 */
const PREFERRED: [number, number][] = [
  [32, 64],
  [32, 32],
  [16, 32],
  [16, 16],
  [8, 16],
  [8, 8],
  [4, 8],
  [4, 4],
];
/**
 * Rows (tokens × group) from which 64 × 32 tiles come first: they fill an H200 from 32 row
 * tiles per kv head (128 workgroups at 4 kv heads) and stage each K/V tile for twice the rows
 * (measured fastest at 256 tokens; docs/kernels.md, "Prefill attention").
 */
const WIDE_ROWS = 2048;
/**
 * Workgroup memory budget where shaders compile slowly (see {@linkcode attentionTile}): 280 vec4,
 * about 2 s of compile time on Mesa llvmpipe through GL, which grows with about the square of it
 * (docs/kernels.md, "Prefill attention").
 */
const SLOW_COMPILE_BYTES = 4608;
/**
 * K (and V) vec4 a thread prefetches per tile where shaders compile slowly: the unrolled loads
 * are much of the code, and Mesa's GL compile time grows with it; more threads load instead.
 */
const SLOW_COMPILE_NT = 2;
/** Largest head dim. */
const MAX_HEAD_DIM = 256;

/** Workgroup shape of the prefill attention kernel for one head dim. */
export interface AttentionTile {
  /** Threads per workgroup. */
  wg: number;
  /** Query rows per workgroup (a multiple of 4). */
  rows: number;
  /** Keys per KV tile: 4, 8, 16, 32 or 64. */
  keys: number;
  /** Workgroup memory the tile uses, in bytes. */
  bytes: number;
}

/** Options for {@linkcode attentionTile}. */
export interface AttentionTileOptions {
  headDim: number;
  /** Rows worth having (more would be padding); the tile takes at most this many, rounded to 4. */
  wantRows: number;
  /** Upper bound on rows (default 64). */
  maxRows?: number;
  /** Workgroup memory to stay within (default: see {@linkcode attentionTile}). */
  maxBytes?: number;
  /** Forces the rows per workgroup (a multiple of 4; still capped by `wantRows`). */
  rows?: number;
  /** Forces the keys per tile (4, 8, 16, 32 or 64). */
  keys?: number;
  /**
   * K (and V) vec4 a thread may prefetch per tile, 1 to 8 (default 8; 2 on Mesa llvmpipe through
   * GL, where more unrolled loads compile slowly).
   */
  maxPrefetch?: number;
}

/**
 * Picks the tile: the first of the preferred (rows, keys) shapes that fits the budget, with the
 * threads the shape needs: at least one per 4x4 block of scores, and enough that each holds at
 * most 4 4x4 accumulator blocks and `maxPrefetch` vec4 of each of K and V (registers, not local
 * memory). Workgroup memory, in vec4: q `rows · (D4 + 1)`, the K-then-V tile `keys · (D4 + 1)`
 * (D4 = ceil(headDim / 4)), P `rows / 4 · (keys + 1)`, partial maxima
 * `rows / 4 · (keys / 4 + 1)`, `rows / 4` rescales, and a few block ids. The budget is the
 * device's workgroup memory (headDim 64: 32 x 64 in 36 KiB of the H200's 48 KiB, 32 x 32 in
 * 22 KiB of llvmpipe's 32 KiB), except on Mesa llvmpipe through GL (a CPU adapter without
 * shader-f16), where it is 4.5 KiB (4 x 8 at headDim 64, 4 x 4 at 128, none at 256): naga
 * zero-initialises workgroup memory there with one constructor term per array element, and
 * Mesa's compile time grows with about the square of that count (a vec4 element costs little
 * more than an f32 one, so the kernel keeps its workgroup arrays in vec4).
 *
 * @throws Error ("internal error") when no tile fits (head dim too large for the budget), or
 *   when the forced `rows` / `keys` are not ones the kernel handles.
 */
export function attentionTile(gpu: Gpu, opts: AttentionTileOptions): AttentionTile {
  const D = opts.headDim;
  const budget = opts.maxBytes ?? (slowCompile(gpu) ? SLOW_COMPILE_BYTES : gpu.maxWorkgroupStorage);
  if (opts.rows !== undefined && !(Number.isInteger(opts.rows / 4) && opts.rows >= 4)) {
    throw new Error(`internal error: attention tileRows must be a multiple of 4; got ${opts.rows}`);
  }
  if (opts.keys !== undefined && !TILE_KEYS.includes(opts.keys)) {
    throw new Error(
      `internal error: attention tileKeys must be one of ${TILE_KEYS.join(", ")}; got ${opts.keys}`,
    );
  }
  const cap = Math.max(4, Math.min(4 * Math.ceil(opts.wantRows / 4), opts.maxRows ?? 64));
  const prefetch = opts.maxPrefetch ?? (slowCompile(gpu) ? SLOW_COMPILE_NT : NT_MAX);
  const ntMax = Math.max(1, Math.min(NT_MAX, Math.floor(prefetch)));
  const order: [number, number][] = opts.wantRows >= WIDE_ROWS
    ? [[64, 32], ...PREFERRED]
    : PREFERRED;
  for (const [r, k] of order) {
    const t = tileShape(D, Math.min(opts.rows ?? r, cap), opts.keys ?? k, ntMax);
    if (D <= MAX_HEAD_DIM && t.wg <= MAX_THREADS && t.bytes <= budget) return t;
  }
  throw new Error(
    `internal error: attention head dim ${D} needs more than ${budget} bytes of workgroup ` +
      `memory or is over ${MAX_HEAD_DIM}` +
      (opts.rows || opts.keys ? ` (tile ${opts.rows ?? "?"} rows x ${opts.keys ?? "?"} keys)` : ""),
  );
}

/** Threads and workgroup memory of a `rows x keys` tile (see the WGSL's override constants). */
function tileShape(D: number, rows: number, keys: number, ntMax: number): AttentionTile {
  const d4 = Math.ceil(D / 4), tr = rows / 4, tc = keys / 4;
  // Threads per row group: one per key group (scores), enough that each holds at most NDG_MAX
  // accumulator blocks and ntMax vec4 of each of K and V.
  const dgt = Math.max(tc, Math.ceil(d4 / NDG_MAX), Math.ceil((keys * d4) / (ntMax * tr)));
  const vec4s = (rows + keys) * (d4 + 1) + tr * (keys + 1) + tr * (tc + 1) + tr;
  const bpc = Math.max(1, keys / BLOCK);
  return { wg: tr * dgt, rows, keys, bytes: 16 * vec4s + 4 * 2 * bpc };
}

/** Mesa llvmpipe through GL: the one CPU adapter without shader-f16 (lavapipe has it). */
function slowCompile(gpu: Gpu): boolean {
  return !gpu.hasF16 && isCpuAdapter(gpu);
}

/** Buffers of {@linkcode attentionDispatch}. */
export interface AttentionBuffers {
  /** `f32 [T, Hq, D]` rotated queries (rows from `tokenOffset`). */
  q: GPUBuffer;
  /** `[numBlocks, nLayers, Hkv, 16, D]` of `kvDtype` */
  kPool: GPUBuffer;
  vPool: GPUBuffer;
  /** `u32 [S, maxBlocks]` */
  blockTable: GPUBuffer;
  /** `f32 [T, Hq, D]` out (rows from `tokenOffset`). */
  out: GPUBuffer;
  /**
   * `u32 [slot, pos0, tokens]` of the chunk (see {@linkcode chunkWords}): read when the launch
   * runs, so one built launch serves every chunk of up to `tokens` rows at any slot and position.
   */
  chunk: GPUBuffer;
}

/** The words of {@linkcode AttentionBuffers.chunk}: the chunk's slot, first position and rows. */
export function chunkWords(slot: number, pos0: number, tokens: number): Uint32Array<ArrayBuffer> {
  return Uint32Array.of(slot, pos0, tokens, 0);
}

/** Shape of {@linkcode attentionDispatch}. */
export interface AttentionOptions {
  /**
   * Most queries of a chunk this launch serves (T ≥ 1): it is sized for them, and its
   * workgroups past the chunk's own row count return at once.
   */
  tokens: number;
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
  /** Query rows per workgroup, a multiple of 4 (default: see {@linkcode attentionTile}). */
  tileRows?: number;
  /** Keys per tile: 4, 8, 16, 32 or 64 (default: see {@linkcode attentionTile}). */
  tileKeys?: number;
  /** Element type of the pools (default f32). */
  kvDtype?: KvDtype;
  /**
   * Codec blocks in the pools (kernels/kv_codec.ts; head dims that are multiples of 4): keys in
   * blocks from `codec.hot` on are decoded as they load. Default none.
   */
  codec?: KvCodecRegion;
  /** Expand the kernel's `// @unroll` loops (default true; false to measure the plain loops). */
  unroll?: boolean;
  /** Which keys a query sees (default causal), compiled into the pipeline. */
  mask?: AttentionMask;
}

/**
 * Builds attention for one sequence's chunk, as `chunk` says when it runs: query i (position
 * `pos0 + i`, i < its `tokens`) attends the keys of `0..pos0+i` of slot `slot` that `mask`
 * lets it see, read through the block table, GQA head `h → h / (Hq / Hkv)`. Writes
 * `out[tokenOffset + i, h, :]`. One workgroup per (tile of rows, kv head); a workgroup reads only
 * the tiles its rows can see, so table entries (and blocks) below every row's window are never
 * read. The caller keeps `pos0 + tokens` within the table.
 *
 * @throws Error ("internal error") on shapes that do not fit (odd heads, layer past the model,
 *   head dim too large for workgroup memory).
 * @example
 * const chunk = createStorage(gpu, 16, chunkWords(0, 0, 40));
 * const d = attentionDispatch(gpu, { q, kPool, vPool, blockTable, out, chunk }, {
 *   tokens: 40, nHeads: 32, nKvHeads: 4, headDim: 64, layer: 0, nLayers: 22, maxBlocks: 129,
 * });
 */
export function attentionDispatch(
  gpu: Gpu,
  buffers: AttentionBuffers,
  opts: AttentionOptions,
): Dispatch {
  const { tokens, nHeads, nKvHeads, headDim: D, layer, nLayers, maxBlocks } = opts;
  const group = nHeads / nKvHeads;
  if (!(tokens >= 1 && Number.isInteger(group) && group >= 1 && D >= 2 && D % 2 === 0)) {
    throw new Error(
      `internal error: attention tokens ${tokens}, heads ${nHeads}/${nKvHeads}, head dim ${D}`,
    );
  }
  if (opts.codec && D % 4 !== 0) {
    throw new Error(
      `internal error: codec blocks need a head dim that is a multiple of 4; got ${D}`,
    );
  }
  if (tokens > maxBlocks * BLOCK || layer >= nLayers) {
    throw new Error(
      `internal error: attention over ${tokens} positions, table of ${maxBlocks} ` +
        `blocks; layer ${layer} of ${nLayers}`,
    );
  }
  const tile = attentionTile(gpu, {
    headDim: D,
    wantRows: tokens * group,
    maxBytes: opts.maxTileBytes,
    rows: opts.tileRows,
    keys: opts.tileKeys,
  });
  const rowTiles = Math.ceil((tokens * group) / tile.rows);
  if (rowTiles > 65535) {
    throw new Error(
      `internal error: attention over ${tokens} tokens needs ${rowTiles} > 65535 ` +
        "workgroups; prefill in chunks",
    );
  }
  const scale = opts.scale ?? 1 / Math.sqrt(D);
  const kv16 = opts.kvDtype === "f16";
  const mask = opts.mask ?? CAUSAL;
  const pipe = pipeline(gpu, "attention.wgsl", {
    constants: {
      WG: tile.wg,
      HD: D,
      BR: tile.rows,
      BC: tile.keys,
      KV16: kv16 ? 1 : 0,
      ...maskConstants(mask),
      ...codecConstants(opts.codec),
    },
    prelude: wgsl("attention_mask.wgsl") + wgsl("kv_codec_common.wgsl"),
    unroll: opts.unroll,
  });
  const u = uniform(
    gpu,
    params([
      nHeads,
      nKvHeads,
      group,
      layer,
      nLayers,
      maxBlocks,
      opts.tokenOffset ?? 0,
      { f: scale * Math.LOG2E },
    ]),
  );
  const b = buffers;
  return {
    label: `attention T≤${tokens} ${nHeads}/${nKvHeads}x${D}${kv16 ? " kv f16" : ""}` +
      `${opts.codec ? ` ${opts.codec.codec}@${opts.codec.hot}` : ""} ` +
      `L${layer} ${mask.kind === "causal" ? "" : `${maskLabel(mask)} `}` +
      `tile ${tile.rows}x${tile.keys}/${tile.wg}`,
    pipeline: pipe,
    bindGroup: bindGroup(gpu, pipe, [u, b.q, b.kPool, b.vPool, b.blockTable, b.out, b.chunk]),
    workgroups: [rowTiles, nKvHeads, 1],
  };
}
