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

/** Threads of `main`, largest first (the plan's, or fewer where the memory budget is short). */
const THREADS = [256, 128, 64];
/** Threads per key when scoring (`TPK`): a chunk is `wg / 4` keys. */
const TPK = 4;
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
  /** Threads of `main` at most: 256, 128 or 64. Default: the plan's (see {@linkcode decodePlan}). */
  threads?: number;
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
  /** Expand the kernels' `// @unroll` loops (default true; false to measure the plain loops). */
  unroll?: boolean;
  /**
   * Query rows per sequence (default 1). With R > 1 (a verification pass of speculative
   * decoding), `seqs` counts rows: row s reads block-table row `s / R` and its own `pos` and
   * `seqLen` entries, and writes no K or V (rope_kv wrote every row's before).
   */
  rowsPerSeq?: number;
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
  const context = Math.max(1, opts.maxContext);
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
function scratchBytes(opts: AttentionDecodeScratchOptions, n: number): number {
  return opts.seqs * opts.nHeads * n * (opts.headDim + 4) * 4;
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
  const { splits, rowGroups, threads } = decodePlan(opts);
  const geo = attentionDecodeGeometry(gpu, {
    headDim: D,
    group,
    maxBytes: opts.maxTileBytes,
    minRowGroups: rowGroups,
    threads,
  });
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
  const common = wgsl("attention_decode_common.wgsl");
  const prelude = wgsl("rope_common.wgsl") + KV_PRELUDE[opts.kvDtype ?? "f32"] + common;
  const main = pipeline(gpu, "attention_decode.wgsl", {
    constants: {
      WG: geo.wg,
      HD: D,
      ROWS: geo.rows,
      RPR: geo.rpr,
      ...(opts.rowsPerSeq && opts.rowsPerSeq > 1 ? { SEQ_ROWS: opts.rowsPerSeq, WRITE_KV: 0 } : {}),
    },
    prelude,
    unroll: opts.unroll,
  });
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
    const combine = pipeline(gpu, "attention_combine.wgsl", {
      constants: { WG: geo.wg, HD: D },
      prelude: common,
      entryPoint: "combine",
      unroll: opts.unroll,
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
