/**
 * Decode attention for a ragged batch, with the new token's RoPE and KV-cache write folded in
 * (rope_kv's work at decode, without its dispatch): each workgroup of 256, 128 or 64 threads steps
 * through chunks of `threads / 4` keys (4 threads per key, online softmax, no long serial loops),
 * in one pass or split along the KV length (flash-decoding) with a parallel `combine`
 * (kernels/attention_combine.wgsl), as {@linkcode decodePlan}'s cost model decides. See
 * kernels/attention_decode.wgsl for the kernel and why it looks this way.
 *
 * The plan's constants were fitted on the H200 (132 SMs). Compare them with `deno run -A
 * scripts/sweep_kernels.ts --m "" --batches 1,8,24,32 --contexts 640,2048 --attn-variants '[{},
 * {"threads": 256, "splitSize": 320, "minRowGroups": 2}, {"threads": 64, "splitSize": 80}]'` (the
 * plan; 2 splits of 256 threads in two row groups; 8 splits of 64 threads at 640 keys).
 */
import type { KvDtype } from "../gpu/dtype.ts";
import { createStorage, type Gpu, isCpuAdapter } from "../gpu/device.ts";
import { bindGroup, type Dispatch, params, uniform } from "../gpu/dispatch.ts";
import { pipeline, wgsl } from "./pipeline.ts";
import { CAUSAL, maskConstants, maskLabel } from "./attention_mask.ts";
import { codecConstants, type KvCodecRegion } from "./kv_codec.ts";

import {
  type AttentionDecodeScratchOptions,
  decodePlan,
  leastRowGroups,
  scratchBytes,
  THREADS,
  TPK,
} from "./attention_decode_plan.ts";

export {
  attentionDecodeScratchBytes,
  type AttentionDecodeScratchOptions,
  type DecodePlan,
  decodePlan,
} from "./attention_decode_plan.ts";

/** V rows a thread holds (`VMAX`), partial maxima per row, as in the WGSL. */
const VMAX = 16;
const MP = 8;
/** Largest head dim / 4: a scoring thread holds a quarter of a K row, at most 16 vec4. */
const MAX_D4 = 64;
/** Workgroup memory on GPUs (12.6 KiB at head dim 64 and GQA 8): several workgroups per SM fit. */
const GPU_BYTES = 16384;
/**
 * Workgroup memory on Mesa llvmpipe through GL, where naga zero-fills workgroup memory one store
 * per element and compile time grows with the square of that count (see `attentionTile`).
 */
const SLOW_COMPILE_BYTES = 2560;

/** Buffers of {@linkcode attentionDecodeDispatches}. */
export interface AttentionDecodeBuffers {
  /**
   * `f32 [S, (Hq + 2·Hkv)·D]`: each slot's new token as the QKV matmul wrote it (bias added, no
   * RoPE yet): q heads, then k heads, then v heads.
   */
  qkv: GPUBuffer;
  /**
   * `u32 [S]` the new token's position: q and k are rotated at it, k and v written there. For a
   * running slot `seqLen[s] - 1`; for a finished one the trash position (a key nobody attends).
   */
  pos: GPUBuffer;
  /** `f32 [D / 2]` RoPE inverse frequencies (rope scaling already applied). */
  invFreq: GPUBuffer;
  /** `[numBlocks, nLayers, Hkv, 16, D]` of `kvDtype`: read, and the new k (rotated) written. */
  kPool: GPUBuffer;
  /** `[numBlocks, nLayers, Hkv, 16, D]` of `kvDtype`: read, and the new v written. */
  vPool: GPUBuffer;
  /** `u32 [S, maxBlocks]` */
  blockTable: GPUBuffer;
  /**
   * `u32 [S]`: the query attends the keys of `0..seqLen[s]-1` (after the write) that the mask
   * lets position `seqLen[s] - 1` see.
   */
  seqLen: GPUBuffer;
  /** `f32 [S, Hq, D]` out. */
  out: GPUBuffer;
  /**
   * Partials, ≥ {@linkcode attentionDecodeScratchBytes} (unused by a single pass). Default: one
   * buffer per device, shared by every decode dispatch (they run one after another, so sharing is
   * safe).
   */
  scratch?: GPUBuffer;
}

/** Shape of {@linkcode attentionDecodeDispatches}. */
export interface AttentionDecodeOptions extends AttentionDecodeScratchOptions {
  /** The decoder layer whose rows of the pools are read and written. */
  layer: number;
  /** Layers in the pools (a block holds every layer's rows). */
  nLayers: number;
  /** Entries per slot in the block table. */
  maxBlocks: number;
  /** Softmax scale (default `1 / sqrt(headDim)`). */
  scale?: number;
  /** Cap on workgroup memory in bytes (default: see {@linkcode attentionDecodeGeometry}). */
  maxTileBytes?: number;
  /** Element type of the pools (default f32). */
  kvDtype?: KvDtype;
  /**
   * Codec blocks in the pools (kernels/kv_codec.ts): keys in blocks from `codec.hot` on are
   * decoded on load. Default none: the pools hold only hot blocks, and no codec code is compiled.
   */
  codec?: KvCodecRegion;
  /** Expand the kernels' `// @unroll` loops (default true; false to measure the plain loops). */
  unroll?: boolean;
  /**
   * Query rows per sequence (default 1). With R > 1 (a verification pass of speculative
   * decoding), `seqs` counts rows: row s reads block-table row `s / R` and its own `pos` and
   * `seqLen` entries, and writes no K or V (rope_kv wrote every row's before).
   */
  rowsPerSeq?: number;
}

/** Workgroup shape of `main` (the WGSL's override constants). */
export interface AttentionDecodeGeometry {
  /** Threads: 256, 128 or 64. */
  wg: number;
  /** Keys per chunk: `wg / 4`. */
  keys: number;
  /** q heads per workgroup (≤ 8). */
  rows: number;
  /** Workgroups per kv head to cover its q heads. */
  rowGroups: number;
  /** Rows per round of the final reduction. */
  rpr: number;
  /** Workgroup memory, in bytes. */
  bytes: number;
}

/** Options for {@linkcode attentionDecodeGeometry}. */
export interface AttentionDecodeGeometryOptions {
  /** Elements per head, a multiple of 4 up to 256. */
  headDim: number;
  /** q heads per kv head. */
  group: number;
  /** Workgroup memory to stay within (default 16 KiB; 2.5 KiB on llvmpipe through GL). */
  maxBytes?: number;
  /** Workgroups per kv head at least (default 1), at most `group`. */
  minRowGroups?: number;
  /** Threads at most (default 256). */
  threads?: number;
}

/**
 * Picks the largest workgroup of at most `threads` whose memory fits, all q heads of a kv head
 * (up to 8) before fewer rows, before fewer threads: q `rows · D` floats, the partial scores
 * `rows · keys` vec4s (shared with one round of the final sum, `rpr · wg` vec4s), the scores
 * `rows · keys` floats, and small change. The GL budget gives one or two rows of 32 or 16 keys, which only has to be correct.
 *
 * @throws Error ("internal error") when headDim is not a multiple of 4 up to 256, or nothing
 * fits the budget.
 * @example
 * attentionDecodeGeometry(gpu, { headDim: 64, group: 8 }); // on a GPU: 256 threads, 8 x 64 keys
 */
export function attentionDecodeGeometry(
  gpu: Gpu,
  opts: AttentionDecodeGeometryOptions,
): AttentionDecodeGeometry {
  const { headDim: D, group } = opts;
  const d4 = D / 4;
  if (!(Number.isInteger(d4) && d4 >= 1 && d4 <= MAX_D4)) {
    throw new Error(
      `internal error: decode attention needs a head dim that is a multiple of 4, ≤ 256; got ${D}`,
    );
  }
  const slow = !gpu.hasF16 && isCpuAdapter(gpu);
  const budget = opts.maxBytes ??
    Math.min(gpu.maxWorkgroupStorage, slow ? SLOW_COMPILE_BYTES : GPU_BYTES);
  for (const wg of THREADS.filter((t) => t <= (opts.threads ?? THREADS[0]))) {
    const keys = wg / TPK, kg = Math.floor(wg / d4);
    if (kg < 1 || Math.ceil(keys / kg) > VMAX) continue;
    const first = leastRowGroups(group, opts.minRowGroups ?? 1);
    for (let rowGroups = first; rowGroups <= group; rowGroups++) {
      const rows = Math.ceil(group / rowGroups);
      for (let rpr = Math.min(rows, 2); rpr >= 1; rpr--) {
        const bytes = 16 * rows * d4 + 16 * Math.max(rows * keys, rpr * kg * d4) +
          4 * rows * keys + 4 * rows * MP + 4 * rows + 4 * 2 * (keys / 16) + 4;
        if (bytes <= budget) return { wg, keys, rows, rowGroups, rpr, bytes };
      }
    }
  }
  throw new Error(`internal error: decode attention head dim ${D} does not fit ${budget} bytes`);
}

/**
 * The kernel's view of a pool element by cache dtype: `KV` holds one vec4 of a key row (4 f32, or
 * 4 halves packed two per u32 as `pack2x16float` leaves them), `kv_get` widens it, `kv_put`
 * rounds to it; `pool_word` reads word w of a pool (codec blocks, kernels/kv_codec_common.wgsl).
 */
const KV_PRELUDE: Record<KvDtype, string> = {
  f32: `
alias KV = vec4<f32>;
fn kv_get(v: KV) -> vec4<f32> { return v; }
fn kv_put(v: vec4<f32>) -> KV { return v; }
fn pool_word(is_v: bool, w: u32) -> u32 {
  if (is_v) { return bitcast<u32>(v_pool[w / 4u][w % 4u]); }
  return bitcast<u32>(k_pool[w / 4u][w % 4u]);
}
`,
  f16: `
alias KV = vec2<u32>;
fn kv_get(v: KV) -> vec4<f32> { return vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y)); }
fn kv_put(v: vec4<f32>) -> KV { return vec2<u32>(pack2x16float(v.xy), pack2x16float(v.zw)); }
fn pool_word(is_v: bool, w: u32) -> u32 {
  if (is_v) { return v_pool[w / 2u][w % 2u]; }
  return k_pool[w / 2u][w % 2u];
}
`,
};

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
 * Builds one decoder layer's decode attention for `seqs` slots, RoPE and KV write included: for
 * slot s, the k and v heads of row s of `qkv` (k rotated at `pos[s]`, as `ropeKvDispatch` does)
 * are written into the pools at `(s, pos[s])` (no write when `pos[s] ≥ 16·maxBlocks`), then its q
 * heads, rotated at `pos[s]`, attend the keys of `0..seqLen[s]-1` that the mask lets position
 * `seqLen[s] - 1` see (only their chunks are read: O(window) with a window) through row s of
 * the block table, the new key included when `pos[s] < seqLen[s]`; a slot with `seqLen` 0 gets zeros. The engine
 * passes `pos = seqLen - 1` for running slots and the trash position for finished ones, as
 * `step_begin` leaves them.
 *
 * One dispatch (a single pass), or up to 64 splits (at most one per 64 keys of `maxContext`) and
 * a `combine` dispatch; the q heads of a kv head in one workgroup or shared by two or four. Both
 * are {@linkcode decodePlan}'s choice: one pass when `maxContext` is at most 256 keys or the batch
 * alone fills the GPU (64 slots of TinyLlama's 4 kv heads), many splits and row groups for small
 * batches (batch 1 at 640 keys: 10 splits of four row groups, 2 q heads each), and between them
 * whatever keeps the launch in the fewest waves of the shortest workgroups. Each slot's chunks
 * are spread over the splits by its own length, so any length stays correct; `maxContext` only
 * sets the split count.
 *
 * @throws Error ("internal error") on shapes that do not fit, or scratch over the binding limit.
 * @example
 * const ds = attentionDecodeDispatches(gpu, {
 *   qkv, pos, invFreq, kPool, vPool, blockTable, seqLen, out,
 * }, {
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
  if (!(seqs >= 1 && Number.isInteger(group) && group >= 1)) {
    throw new Error(`internal error: decode attention seqs ${seqs}, heads ${nHeads}/${nKvHeads}`);
  }
  if (!(layer >= 0 && layer < nLayers && maxBlocks >= 1)) {
    throw new Error(`internal error: decode attention layer ${layer} of ${nLayers}`);
  }
  const { splits, geo, main, combine } = decodePipelines(gpu, opts);
  const bytes = splits === 1 ? 0 : scratchBytes(opts, splits);
  if (bytes > gpu.maxBinding) {
    throw new Error(
      `internal error: decode scratch of ${bytes} bytes exceeds the ${gpu.maxBinding}-byte ` +
        "binding limit; raise splitSize or lower the batch",
    );
  }
  // A single pass needs no scratch: `main` writes `out` itself.
  const scratch = splits === 1 ? undefined : buffers.scratch ?? sharedScratch(gpu, bytes);
  if (scratch && scratch.size < bytes) {
    throw new Error(`internal error: decode scratch has ${scratch.size} bytes, needs ${bytes}`);
  }
  const mask = opts.mask ?? CAUSAL;
  const scale = opts.scale ?? 1 / Math.sqrt(D);
  const u = uniform(
    gpu,
    params([
      seqs,
      nHeads,
      nKvHeads,
      group,
      geo.rowGroups,
      layer,
      nLayers,
      maxBlocks,
      { f: scale * Math.LOG2E },
      splits,
    ]),
  );
  const b = buffers;
  const kv = (opts.kvDtype === "f16" ? " kv f16" : "") +
    (opts.codec ? ` ${opts.codec.codec}@${opts.codec.hot}` : "");
  const masked = mask.kind === "causal" ? "" : ` ${maskLabel(mask)}`;
  const label = `attention_decode S${seqs} ${nHeads}/${nKvHeads}x${D}${kv}${masked} L${layer} ` +
    `${geo.rows}x${geo.keys}/${geo.wg}`;
  const dispatches: Dispatch[] = [{
    label: splits === 1 ? `${label} single pass` : `${label} ${splits} splits`,
    pipeline: main,
    // Eight storage buffers (the default limit): `main` writes `out`, or with splits the
    // partials, through its one `dst` binding.
    bindGroup: bindGroup(gpu, main, [
      u,
      b.qkv,
      b.pos,
      b.invFreq,
      b.blockTable,
      b.seqLen,
      b.kPool,
      b.vPool,
      scratch ?? b.out,
    ]),
    workgroups: [splits, nKvHeads * geo.rowGroups, seqs],
  }];
  if (scratch && combine) {
    dispatches.push({
      label: `${label} combine`,
      pipeline: combine,
      // `combine` uses bindings 0, 5, 8 (`out`) and 9 (the partials); the auto layout has no
      // others.
      bindGroup: gpu.device.createBindGroup({
        layout: combine.getBindGroupLayout(0),
        entries: [
          { binding: 0, resource: { buffer: u } },
          { binding: 5, resource: { buffer: b.seqLen } },
          { binding: 8, resource: { buffer: b.out } },
          { binding: 9, resource: { buffer: scratch } },
        ],
      }),
      workgroups: [nHeads, seqs, 1],
    });
  }
  return dispatches;
}

/** The pipelines of a decode launch (`combine` with splits), and the plan and geometry behind them. */
interface DecodePipelines {
  splits: number;
  geo: AttentionDecodeGeometry;
  main: GPUComputePipeline;
  combine?: GPUComputePipeline;
}

/** Plans a launch and compiles (or takes from the cache) its pipelines. */
function decodePipelines(gpu: Gpu, opts: DecodeWarmOptions): DecodePipelines {
  const { headDim: D } = opts;
  const { splits, rowGroups, threads } = decodePlan(opts);
  const geo = attentionDecodeGeometry(gpu, {
    headDim: D,
    group: opts.nHeads / opts.nKvHeads,
    maxBytes: opts.maxTileBytes,
    minRowGroups: rowGroups,
    threads,
  });
  const mask = opts.mask ?? CAUSAL;
  const common = wgsl("attention_mask.wgsl") + wgsl("attention_decode_common.wgsl");
  const prelude = wgsl("rope_common.wgsl") + KV_PRELUDE[opts.kvDtype ?? "f32"] +
    wgsl("kv_codec_common.wgsl") + common;
  const rows = opts.rowsPerSeq && opts.rowsPerSeq > 1;
  const main = pipeline(gpu, "attention_decode.wgsl", {
    constants: {
      WG: geo.wg,
      HD: D,
      ROWS: geo.rows,
      RPR: geo.rpr,
      ...maskConstants(mask),
      ...codecConstants(opts.codec),
      ...(rows ? { SEQ_ROWS: opts.rowsPerSeq!, WRITE_KV: 0 } : {}),
    },
    prelude,
    unroll: opts.unroll,
  });
  const combine = splits === 1 ? undefined : pipeline(gpu, "attention_combine.wgsl", {
    constants: { WG: geo.wg, HD: D, ...maskConstants(mask) },
    prelude: common,
    entryPoint: "combine",
    unroll: opts.unroll,
  });
  return { splits, geo, main, combine };
}

/** What {@linkcode warmAttentionDecode} compiles for: a launch's shape, without its layer. */
export type DecodeWarmOptions = Omit<AttentionDecodeOptions, "layer" | "nLayers" | "maxBlocks">;

/**
 * Compiles the pipelines {@linkcode attentionDecodeDispatches} would use for `opts` (they are
 * cached per device), so that a launch built later, e.g. for a longer length bucket, finds
 * them: an engine compiles every bucket's at load, not on the first long request.
 *
 * @returns the plan's split count (1: a single pass, no `combine`)
 */
export function warmAttentionDecode(gpu: Gpu, opts: DecodeWarmOptions): number {
  return decodePipelines(gpu, opts).splits;
}

/**
 * {@linkcode warmAttentionDecode} for every batch width 1..maxSeqs of each length bucket in
 * `tops` (an engine's longer buckets, compiled at load).
 */
export function warmDecodeBuckets(
  gpu: Gpu,
  tops: readonly number[],
  maxSeqs: number,
  opts: Omit<DecodeWarmOptions, "seqs" | "maxContext">,
): void {
  for (const maxContext of tops) {
    for (let seqs = 1; seqs <= maxSeqs; seqs++) {
      warmAttentionDecode(gpu, { ...opts, seqs, maxContext });
    }
  }
}
