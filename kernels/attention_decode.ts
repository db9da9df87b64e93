/**
 * Decode attention for a ragged batch (flash-decoding: split along the KV length, then combine).
 * See kernels/attention_decode.wgsl.
 */
import { createStorage, type Gpu } from "../engine/gpu.ts";
import { attentionTile } from "./attention.ts";
import { bindGroup, type Dispatch, grid, params, pipeline, uniform } from "./dispatch.ts";

const BLOCK = 16;
const CWG = 64;
/**
 * Most splits the default split size makes. On the H200, batch 1 decode over 512 keys took 59 us
 * with 64-key splits and 179 us with 256-key splits (each workgroup walks its tiles serially);
 * at batch 32 the two were equal.
 */
const MAX_SPLITS = 128;

/** Buffers of {@linkcode attentionDecodeDispatches}. */
export interface AttentionDecodeBuffers {
  /** `f32 [S, Hq, D]` one rotated query per slot. */
  q: GPUBuffer;
  /** `f32 [numBlocks, nLayers, Hkv, 16, D]` */
  kPool: GPUBuffer;
  vPool: GPUBuffer;
  /** `u32 [S, maxBlocks]` */
  blockTable: GPUBuffer;
  /** `u32 [S]`: keys `0..seqLen[s]-1` are valid; the query sits at `seqLen[s] - 1`. */
  seqLen: GPUBuffer;
  /** `f32 [S, Hq, D]` out. */
  out: GPUBuffer;
  /**
   * Partials, ≥ {@linkcode attentionDecodeScratchBytes}. Default: one buffer per device, shared
   * by every decode dispatch (they run one after another, so sharing is safe).
   */
  scratch?: GPUBuffer;
}

/** Options for {@linkcode attentionDecodeScratchBytes}. */
export interface AttentionDecodeScratchOptions {
  seqs: number;
  nHeads: number;
  headDim: number;
  /** Longest context the engine serves; fixes the split count. */
  maxContext: number;
  /** Keys per split, a multiple of 16 (default: 32, or more to stay within 128 splits). */
  splitSize?: number;
}

/** Shape of {@linkcode attentionDecodeDispatches}. */
export interface AttentionDecodeOptions extends AttentionDecodeScratchOptions {
  nKvHeads: number;
  layer: number;
  nLayers: number;
  maxBlocks: number;
  /** Softmax scale (default `1 / sqrt(headDim)`). */
  scale?: number;
  /** Cap on workgroup memory in bytes (default: see {@linkcode attentionTile}); for tests. */
  maxTileBytes?: number;
}

/** Keys per split and split count for these options. */
function splits(opts: AttentionDecodeScratchOptions): { split: number; count: number } {
  const context = Math.max(1, opts.maxContext);
  const split = opts.splitSize ?? BLOCK * Math.max(2, Math.ceil(context / (BLOCK * MAX_SPLITS)));
  if (!(split >= BLOCK && split % BLOCK === 0)) {
    throw new Error(`internal error: decode splitSize must be a multiple of 16; got ${split}`);
  }
  return { split, count: Math.ceil(context / split) };
}

/**
 * Bytes of scratch the decode partials need: `f32 [S, Hq, splits, D + 2]` (m, l, acc).
 *
 * @example
 * const bytes = attentionDecodeScratchBytes({ seqs: 8, nHeads: 32, headDim: 64, maxContext: 2048 });
 */
export function attentionDecodeScratchBytes(opts: AttentionDecodeScratchOptions): number {
  return opts.seqs * opts.nHeads * splits(opts).count * (opts.headDim + 2) * 4;
}

const shared = new WeakMap<GPUDevice, GPUBuffer>();

/** The per-device shared scratch, grown when too small (old bind groups keep the old one). */
function sharedScratch(gpu: Gpu, bytes: number): GPUBuffer {
  let b = shared.get(gpu.device);
  if (!b || b.size < bytes) {
    b = createStorage(gpu, bytes, undefined, "attention_decode scratch");
    shared.set(gpu.device, b);
  }
  return b;
}

/**
 * Builds decode attention for `seqs` slots: slot s's query (row s of `q`, position
 * `seqLen[s] - 1`) attends keys `0..seqLen[s]-1` through row s of the block table. Two
 * dispatches: partials per (split, kv head, slot), then the combine. Splits past a slot's length
 * do nothing; a slot with `seqLen` 0 gets zeros. The split count is fixed by `maxContext`; longer
 * sequences stay correct (the last split takes the rest) but lose parallelism.
 *
 * @throws Error ("internal error") on shapes that do not fit, or scratch over the binding limit.
 * @example
 * const ds = attentionDecodeDispatches(gpu, { q, kPool, vPool, blockTable, seqLen, out }, {
 *   seqs: 4, nHeads: 32, nKvHeads: 4, headDim: 64, layer: 0, nLayers: 22, maxBlocks: 129,
 *   maxContext: 2048,
 * });
 */
export function attentionDecodeDispatches(
  gpu: Gpu,
  buffers: AttentionDecodeBuffers,
  opts: AttentionDecodeOptions,
): Dispatch[] {
  const { seqs, nHeads, nKvHeads, headDim: D, layer, nLayers, maxBlocks } = opts;
  const group = nHeads / nKvHeads;
  if (!(seqs >= 1 && Number.isInteger(group) && group >= 1 && D >= 2 && D % 2 === 0)) {
    throw new Error(
      `internal error: decode attention seqs ${seqs}, heads ${nHeads}/${nKvHeads}, head dim ${D}`,
    );
  }
  if (!(layer >= 0 && layer < nLayers && maxBlocks >= 1)) {
    throw new Error(`internal error: decode attention layer ${layer} of ${nLayers}`);
  }
  const { split, count } = splits(opts);
  const bytes = attentionDecodeScratchBytes(opts);
  if (bytes > gpu.maxBinding) {
    throw new Error(
      `internal error: decode scratch of ${bytes} bytes exceeds the ${gpu.maxBinding}-byte ` +
        "binding limit; raise splitSize or lower the batch",
    );
  }
  const scratch = buffers.scratch ?? sharedScratch(gpu, bytes);
  if (scratch.size < bytes) {
    throw new Error(`internal error: decode scratch has ${scratch.size} bytes, needs ${bytes}`);
  }
  const tile = attentionTile(gpu, {
    headDim: D,
    wantRows: group,
    maxRows: 32,
    maxBytes: opts.maxTileBytes,
  });
  const rowGroups = Math.ceil(group / tile.rows);
  const combineGroups = grid(Math.ceil((seqs * nHeads * D) / CWG));
  const constants = {
    WG: tile.wg,
    HD: D,
    ROWS: tile.rows,
    KEYS: tile.keys,
    PARTS: tile.parts,
    NSPLIT: count,
    CWG,
  };
  const partial = pipeline(gpu, "attention_decode.wgsl", { constants });
  const combine = pipeline(gpu, "attention_decode.wgsl", { constants, entryPoint: "combine" });
  const scale = opts.scale ?? 1 / Math.sqrt(D);
  const u = uniform(
    gpu,
    params([
      seqs,
      nHeads,
      nKvHeads,
      group,
      rowGroups,
      layer,
      nLayers,
      maxBlocks,
      split,
      { f: scale * Math.LOG2E },
      combineGroups[0],
    ]),
  );
  const b = buffers;
  const label = `attention_decode S${seqs} ${nHeads}/${nKvHeads}x${D} L${layer} ` +
    `tile ${tile.rows}x${tile.keys}`;
  return [
    {
      label: `${label} partial ${count}x${split}`,
      pipeline: partial,
      bindGroup: bindGroup(gpu, partial, [
        u,
        b.q,
        b.kPool,
        b.vPool,
        b.blockTable,
        b.seqLen,
        scratch,
      ]),
      workgroups: [count, nKvHeads * rowGroups, seqs],
    },
    {
      label: `${label} combine`,
      pipeline: combine,
      // `combine` uses bindings 0, 5, 6, 7 only; the auto layout has no others.
      bindGroup: gpu.device.createBindGroup({
        layout: combine.getBindGroupLayout(0),
        entries: [
          { binding: 0, resource: { buffer: u } },
          { binding: 5, resource: { buffer: b.seqLen } },
          { binding: 6, resource: { buffer: scratch } },
          { binding: 7, resource: { buffer: b.out } },
        ],
      }),
      workgroups: combineGroups,
    },
  ];
}
