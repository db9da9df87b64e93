/**
 * Decode attention for a ragged batch, with the new token's RoPE and KV-cache write folded in
 * (rope_kv's work at decode, without its dispatch): each workgroup step takes a chunk of 64 keys
 * (4 threads per key, online softmax, no long serial loops), in one pass or split along the KV
 * length (flash-decoding) with a parallel `combine`, as {@linkcode decodePlan}'s cost model
 * decides. See kernels/attention_decode.wgsl for the kernel and why it looks this way.
 *
 * The plan's constants were fitted on the H200 (132 SMs). Compare them with `deno run -A
 * scripts/sweep_kernels.ts --m "" --batches 1,8,24,32 --contexts 640,2048 --attn-variants '[{},
 * {"splitSize": 320, "minRowGroups": 2}, {"splitSize": 64}, {"splitSize": 1e9}]'` (the plan,
 * 2 splits of two row groups at 640 keys, one split per 64-key chunk, single pass).
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
 * Chunks per slot at `maxContext` up to which one pass is kept even for one slot: four serial
 * chunks should cost about what a second dependent dispatch does (~2 µs on the H200).
 */
const SERIAL_CHUNKS = 4;
/**
 * The launch plan's cost model ({@linkcode decodePlan}), fitted on the H200 (132 SMs). `main`
 * holds ROWS accumulators per thread, so its registers, not its workgroup memory, cap how many
 * workgroups an SM runs at once: two at 5–8 rows, three at up to 4 (`RESIDENT`). A launch past
 * that many is a second wave. A workgroup's time is `WG_FIXED` plus its chunks, each costing
 * `1 + rows / ROW_WEIGHT` (the keys are read and scored whatever the rows; each row adds a
 * little). The model's best plan was the measured best at all 20 points of a sweep of every
 * split count and row grouping (`scripts/sweep_kernels.ts`, batches 1–64 at contexts 640 and
 * 2048, TinyLlama heads; see BENCHMARKS.md), where the rule before it lost 84 µs per layer summed
 * over them (24 slots at 640 keys: 37.5 µs in 3 splits, 30.3 in 2 splits of two row groups; 48
 * slots: 59.8 in 2 splits, 46.5 in one pass of two row groups; 24 slots at 2048 keys: 97.3 in 3
 * splits, 71.3 in 8). In a second sweep (15 batch sizes at 768 keys, six at 4096) its plan was
 * within 0.4 µs of the best everywhere.
 */
const SMS = 132;
const RESIDENT = (rows: number) => rows > 4 ? 2 : 3;
const WG_FIXED = 1;
const ROW_WEIGHT = 24;
/** Row groupings the plan weighs (workgroups per kv head, before the memory budget). */
const ROW_GROUPS = [1, 2, 4];
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
}

/**
 * Row groups a launch starts from when `asked` are wanted: enough that no workgroup holds more
 * than `RMAX` q heads, never more than the `group` q heads of a kv head.
 */
function leastRowGroups(group: number, asked: number): number {
  return Math.max(Math.ceil(group / RMAX), Math.min(asked, group));
}

/** The launch of {@linkcode attentionDecodeDispatches}: splits along the KV length, row groups. */
export interface DecodePlan {
  /** 1 = single pass, no `combine`. */
  splits: number;
  /** Workgroups per kv head asked of {@linkcode attentionDecodeGeometry} (`minRowGroups`). */
  rowGroups: number;
}

/**
 * Chooses splits and row groups by the cost model above (`SMS` … `ROW_WEIGHT`): each pair's
 * workgroups `splits · rowGroups · nKvHeads · seqs` run in waves of `SMS · RESIDENT(rows)`, each
 * wave as long as one workgroup's `WG_FIXED + ceil(chunks / splits) · (1 + rows / ROW_WEIGHT)`
 * (chunks of 64 keys of `maxContext`); the cheapest wins, ties to fewer workgroups. Up to
 * `SERIAL_CHUNKS` chunks keep one pass. A `splitSize` or `minRowGroups` given fixes that half.
 * Rows are counted as on a GPU (all q heads of a kv head in one workgroup up to 8); where the
 * memory budget allows fewer (llvmpipe through GL) the geometry adds row groups, which changes
 * the cost but not the correctness.
 *
 * @throws Error ("internal error") on a `splitSize` that is not an integer ≥ 1.
 * @example
 * decodePlan({ seqs: 24, nHeads: 32, nKvHeads: 4, headDim: 64, maxContext: 640 });
 * // { splits: 2, rowGroups: 2 }
 */
export function decodePlan(opts: AttentionDecodeScratchOptions): DecodePlan {
  const cap = Math.min(MAX_SPLITS, CMAX * Math.floor(CWG / (opts.headDim / 4)));
  const context = Math.max(1, opts.maxContext);
  const chunks = Math.ceil(context / CHUNK);
  let splitChoices: number[];
  if (opts.splitSize !== undefined) {
    if (!(Number.isInteger(opts.splitSize) && opts.splitSize >= 1)) {
      throw new Error(
        `internal error: decode splitSize must be an integer ≥ 1; got ${opts.splitSize}`,
      );
    }
    splitChoices = [Math.max(1, Math.min(cap, Math.ceil(context / opts.splitSize)))];
  } else if (chunks <= SERIAL_CHUNKS) {
    splitChoices = [1];
  } else {
    splitChoices = Array.from({ length: Math.min(cap, chunks) }, (_, i) => i + 1);
  }
  const group = Math.max(1, Math.floor(opts.nHeads / opts.nKvHeads));
  const groupChoices = opts.minRowGroups !== undefined
    ? [opts.minRowGroups]
    : ROW_GROUPS.filter((g, i) => i === 0 || g <= group);
  let best: DecodePlan & { cost: number; workgroups: number } | undefined;
  for (const splits of splitChoices) {
    for (const asked of groupChoices) {
      const groups = leastRowGroups(group, asked);
      const rows = Math.ceil(group / groups);
      const workgroups = splits * groups * opts.nKvHeads * opts.seqs;
      const waves = Math.ceil(workgroups / (SMS * RESIDENT(rows)));
      const cost = waves * (WG_FIXED + Math.ceil(chunks / splits) * (1 + rows / ROW_WEIGHT));
      if (
        !best || cost < best.cost || (cost === best.cost && workgroups < best.workgroups)
      ) best = { splits, rowGroups: asked, cost, workgroups };
    }
  }
  return { splits: best!.splits, rowGroups: best!.rowGroups };
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
  return n === 1 ? 0 : opts.seqs * opts.nHeads * n * (opts.headDim + 4) * 4;
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
  const { splits, rowGroups } = decodePlan(opts);
  const geo = attentionDecodeGeometry(gpu, {
    headDim: D,
    group,
    maxBytes: opts.maxTileBytes,
    minRowGroups: rowGroups,
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
