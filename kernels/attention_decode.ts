/**
 * Decode attention for a ragged batch, with the new token's RoPE and KV-cache write folded in
 * (rope_kv's work at decode, without its dispatch): each workgroup step takes a chunk of 64 keys
 * (4 threads per key, online softmax, no long serial loops), in one pass when the batch alone
 * fills the GPU or the context is short, else split along the KV length (flash-decoding) with a
 * parallel `combine`. See kernels/attention_decode.wgsl for the kernel and why it looks this way.
 *
 * The split heuristic's constants below are reasoned from the H200's shape (132 SMs); the
 * single-pass threshold (`FULL_GPU`) was checked against split counts at batch 8 and 32 there.
 * Compare them with `deno run -A scripts/sweep_kernels.ts --variants '[]' --batches 1,8,32
 * --contexts 640,2048 --attn-variants '[{}, {"splitSize": 64}, {"splitSize": 1e9}]'` (default,
 * one split per 64-key chunk, single pass).
 */
import type { KvDtype } from "../engine/dtype.ts";
import { createStorage, type Gpu, isCpuAdapter } from "../engine/gpu.ts";
import { bindGroup, type Dispatch, params, pipeline, uniform, wgsl } from "./dispatch.ts";

/** Threads of `main`, largest first (the first that fits the budget wins). */
const THREADS = [256, 128, 64];
/** Threads per key when scoring (`TPK`): a chunk is `wg / 4` keys. */
const TPK = 4;
/** Keys per chunk that the split heuristic counts in (the GPU chunk). */
const CHUNK = 64;
/**
 * `seqs · nKvHeads` workgroups from which one pass is enough: about two per SM of an H200 (132),
 * each streaming its slot's keys, so a split would only add the `combine` dispatch. Measured on
 * the H200 at batch 32 (128 workgroups), TinyLlama heads, µs per layer, one pass vs two splits:
 * 42.2 vs 34.4 at context 640, 119 vs 81 at 2048 (scripts/sweep_kernels.ts).
 */
const FULL_GPU = 256;
/** Workgroups to aim for when splitting a smaller batch (two per SM). */
const TARGET_WORKGROUPS = 256;
/**
 * Chunks per slot at `maxContext` up to which one pass is kept even for one slot: four serial
 * chunks should cost about what a second dependent dispatch does (~2 µs on the H200).
 */
const SERIAL_CHUNKS = 4;
/** Most splits (`combine` loads one (m, l) per thread). */
const MAX_SPLITS = 64;
/** Threads of `combine`; each holds at most `CMAX` partials. */
const CWG = 64;
const CMAX = 16;
/** Rows and V rows a thread holds (`RMAX`, `VMAX`), partial maxima per row, as in the WGSL. */
const RMAX = 8;
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
  /** `u32 [S]`: the query attends keys `0..seqLen[s]-1` (after the write). */
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

/** Options for {@linkcode attentionDecodeScratchBytes}. */
export interface AttentionDecodeScratchOptions {
  seqs: number;
  nHeads: number;
  headDim: number;
  /** Longest context the engine serves; with `seqs`, fixes the split count. */
  maxContext: number;
  /** KV heads (default 1: the most splits, so the scratch size is an upper bound). */
  nKvHeads?: number;
  /**
   * Keys per split at `maxContext`: forces `ceil(maxContext / splitSize)` splits (at most 64;
   * 1 = single pass). Default: the heuristic described at {@linkcode attentionDecodeDispatches}.
   */
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
  /** Cap on workgroup memory in bytes (default: see {@linkcode attentionDecodeGeometry}). */
  maxTileBytes?: number;
  /**
   * Workgroups per kv head at least (default: 2 when the launch would have fewer than
   * `TARGET_WORKGROUPS` workgroups, else 1; see {@linkcode attentionDecodeDispatches}).
   */
  minRowGroups?: number;
  /** Element type of the pools (default f32). */
  kvDtype?: KvDtype;
}

/** Split count for these options: 1 = single pass, no `combine`. */
function splitCount(opts: AttentionDecodeScratchOptions): number {
  const cap = Math.min(MAX_SPLITS, CMAX * Math.floor(CWG / (opts.headDim / 4)));
  const context = Math.max(1, opts.maxContext);
  if (opts.splitSize !== undefined) {
    if (!(Number.isInteger(opts.splitSize) && opts.splitSize >= 1)) {
      throw new Error(
        `internal error: decode splitSize must be an integer ≥ 1; got ${opts.splitSize}`,
      );
    }
    return Math.max(1, Math.min(cap, Math.ceil(context / opts.splitSize)));
  }
  const chunks = Math.ceil(context / CHUNK);
  const workgroups = opts.seqs * (opts.nKvHeads ?? 1);
  if (chunks <= SERIAL_CHUNKS || workgroups >= FULL_GPU) return 1;
  return Math.max(1, Math.min(cap, chunks, Math.ceil(TARGET_WORKGROUPS / workgroups)));
}

/**
 * Bytes of scratch the decode partials need: acc `f32 [S, Hq, splits, D]` then (m, l, 0, 0)
 * `f32 [S, Hq, splits, 4]`; 0 for a single pass.
 *
 * @example
 * const bytes = attentionDecodeScratchBytes({ seqs: 8, nHeads: 32, headDim: 64, maxContext: 2048 });
 */
export function attentionDecodeScratchBytes(opts: AttentionDecodeScratchOptions): number {
  const n = splitCount(opts);
  return n === 1 ? 0 : opts.seqs * opts.nHeads * n * (opts.headDim + 4) * 4;
}

/** Workgroup shape of `main` (the WGSL's override constants). */
export interface AttentionDecodeGeometry {
  /** Threads: 256, 128 or 64. */
  wg: number;
  /** Keys per chunk: `wg / 4`. */
  keys: number;
  /** q heads per workgroup (≤ 8), and workgroups per kv head to cover the group. */
  rows: number;
  rowGroups: number;
  /** Rows per round of the final reduction. */
  rpr: number;
  /** Workgroup memory, in bytes. */
  bytes: number;
}

/** Options for {@linkcode attentionDecodeGeometry}. */
export interface AttentionDecodeGeometryOptions {
  headDim: number;
  /** q heads per kv head. */
  group: number;
  /** Workgroup memory to stay within (default 16 KiB; 2.5 KiB on llvmpipe through GL). */
  maxBytes?: number;
  /** Workgroups per kv head at least (default 1), at most `group`. */
  minRowGroups?: number;
}

/**
 * Picks the largest workgroup whose memory fits, all q heads of a kv head (up to 8) before fewer
 * rows, before fewer threads: q `rows · D` floats, the partial scores `rows · keys` vec4s (shared
 * with one round of the final sum, `rpr · wg` vec4s), the scores `rows · keys` floats, and small
 * change. The GL budget gives one or two rows of 32 or 16 keys, which only has to be correct.
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
  for (const wg of THREADS) {
    const keys = wg / TPK, kg = Math.floor(wg / d4);
    if (kg < 1 || Math.ceil(keys / kg) > VMAX) continue;
    const first = Math.max(Math.ceil(group / RMAX), Math.min(opts.minRowGroups ?? 1, group));
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
 * rounds to it.
 */
const KV_PRELUDE: Record<KvDtype, string> = {
  f32: `
alias KV = vec4<f32>;
fn kv_get(v: KV) -> vec4<f32> { return v; }
fn kv_put(v: vec4<f32>) -> KV { return v; }
`,
  f16: `
alias KV = vec2<u32>;
fn kv_get(v: KV) -> vec4<f32> { return vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y)); }
fn kv_put(v: vec4<f32>) -> KV { return vec2<u32>(pack2x16float(v.xy), pack2x16float(v.zw)); }
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
 * heads, rotated at `pos[s]`, attend keys `0..seqLen[s]-1` through row s of the block table,
 * the new key included when `pos[s] < seqLen[s]`; a slot with `seqLen` 0 gets zeros. The engine
 * passes `pos = seqLen - 1` for running slots and the trash position for finished ones, as
 * `step_begin` leaves them.
 *
 * One dispatch (a single pass) when `seqs · nKvHeads` workgroups already fill an H200 (≥ 256) or
 * `maxContext` is at most 256 keys; otherwise up to 64 splits (about 256 workgroups, at most one
 * per 64 keys of `maxContext`) and a `combine` dispatch. Each slot's chunks are spread over the
 * splits by its own length, so any length stays correct; `maxContext` only sets the split count.
 *
 * When the launch still has fewer than 256 workgroups (`splits · nKvHeads · seqs`: small batches,
 * short contexts), the q heads of a kv head are shared by two workgroups instead of one (4 rows
 * each with GQA 8), which halves each workgroup's serial work per chunk. H200, TinyLlama heads,
 * µs per layer, one row group vs two (scripts/sweep_kernels.ts): batch 1 11.2 → 9.9 at context
 * 640 and 11.3 → 10.6 at 2048; batch 2 11.3 → 10.5 and batch 4 12.4 → 11.8 at 640. From 256
 * workgroups on it was slower: batch 2 at 2048 12.7 → 17.1, batch 4 19.0 → 24.5, batch 8 at 640
 * 16.5 → 17.1.
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
  const splits = splitCount(opts);
  const few = splits * nKvHeads * seqs < TARGET_WORKGROUPS;
  const geo = attentionDecodeGeometry(gpu, {
    headDim: D,
    group,
    maxBytes: opts.maxTileBytes,
    minRowGroups: opts.minRowGroups ?? (few ? 2 : 1),
  });
  const bytes = attentionDecodeScratchBytes(opts);
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
  const constants = {
    WG: geo.wg,
    HD: D,
    ROWS: geo.rows,
    RPR: geo.rpr,
  };
  const prelude = wgsl("rope_common.wgsl") + KV_PRELUDE[opts.kvDtype ?? "f32"];
  const main = pipeline(gpu, "attention_decode.wgsl", { constants, prelude });
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
  const kv = opts.kvDtype === "f16" ? " kv f16" : "";
  const label = `attention_decode S${seqs} ${nHeads}/${nKvHeads}x${D}${kv} L${layer} ` +
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
  if (scratch) {
    const combine = pipeline(gpu, "attention_decode.wgsl", {
      constants,
      prelude,
      entryPoint: "combine",
    });
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
