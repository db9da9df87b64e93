/**
 * The `small` matmul (kernels/matmul_small.wgsl): decode batches and short prompts, a thread
 * holding 4 rows of W × rm rows of x, so each 16-byte load of W is applied to rm rows of x from
 * registers and each load of x to 4 rows of W; many small tiles, K split over the threads of a
 * workgroup and reduced in workgroup memory. W of signed 8-bit codes may run with x quantized
 * per 16 k in workgroup memory and `dot4I8Packed` (`xq`). Its launch shape comes from first
 * principles ({@linkcode smallTuning}); the sweeps that checked it: docs/kernels.md, "small".
 */
import { type Gpu, isCpuAdapter } from "../gpu/device.ts";
import { isFloatFormat, type WeightFormat } from "../gpu/dtype.ts";
import { type Dispatch, grid } from "../gpu/dispatch.ts";
import { elementBytes, type WeightBuffer } from "./weight.ts";
import { codeBits } from "./quant.ts";
import { hasDot4 } from "./matmul_q8.ts";
import {
  at,
  checkWorkgroup,
  dummy,
  fail,
  isPow2,
  type MatmulLaunch,
  matmulPipeline,
  matmulUniform,
} from "./matmul_common.ts";

/**
 * Launch shape of the `small` kernel (defaults from {@linkcode smallTuning}). A workgroup has
 * `tk · tn · tm` threads and owns a tile of `rm · tm` rows of x by `4 · tn` product columns.
 */
export interface SmallTuning {
  /** Rows of x per thread (4 × rm accumulators): 1, 2, 4 or 8. */
  rm: number;
  /** Row groups per workgroup (a power of two); they share W through L1. */
  tm: number;
  /** Column groups of 4 per workgroup (a power of two); they share x through L1. */
  tn: number;
  /** Threads splitting K, unit by unit (a power of two ≥ rm). */
  tk: number;
  /** Units (16-byte loads of W) per column per loop iteration: 1, 2 or 4. */
  unroll: number;
  /**
   * Adjacent threads along a row of W (`KL`): 8 (a warp's load covers one 128-byte line of
   * each of its rows) or 16 (two lines); at most `tk` take effect.
   */
  kl: number;
  /**
   * x quantized to int8 per unit of 16 k in workgroup memory, products through `dot4I8Packed`
   * (W of signed 8-bit codes: int8, q8_0, q6_k; default for int8 where the adapter has it).
   */
  xq: boolean;
  /**
   * With `xq`: units of x per row staged per chunk (default: all of K when it fits the
   * workgroup memory, else whole loop trips of `unroll · tk` units; {@linkcode xChunk}).
   */
  xu: number;
}

/** Weights per 16-byte load of W ("unit") in the `small` kernel: it needs K a multiple of it. */
export function unitWidth(dtype: WeightFormat): number {
  if (!isFloatFormat(dtype)) return 128 / codeBits(dtype);
  return dtype === "f32" ? 4 : 8;
}

/**
 * Threads a `small` launch aims for: the H200 has 132 SMs, and a thread of an estimated ~100
 * registers leaves room for ~512 resident per SM (64K registers). For small M that is also the
 * memory parallelism: 65536 threads × 4 loads of 16 bytes = 4 MB in flight ≈ 4 TB/s × 1 µs of
 * DRAM latency.
 */
const SMALL_THREADS = 65536;
/** Threads per `small` workgroup: one vec4 of workgroup memory each (llvmpipe GL: ≤ 256). */
const SMALL_GROUP = 256;

const pow2ceil = (v: number) => 2 ** Math.max(0, Math.ceil(Math.log2(v)));
const pow2floor = (v: number) => 2 ** Math.max(0, Math.floor(Math.log2(v)));

/** Shape of {@linkcode smallTuning}. */
export interface SmallTuningOptions {
  /** Rows of x. */
  m: number;
  /** Columns of the product: N, or 2F with swiglu (gate and up both count). */
  cols: number;
  /** SwiGLU (gate/up) product. */
  swiglu?: boolean;
  /** Whether the adapter has `dot4I8Packed` (default: whether this Deno's WebGPU does). */
  dot4?: boolean;
}

/** Formats whose codes are signed 8-bit integers, which `xq` multiplies with `dot4I8Packed`. */
const XQ_FORMATS: readonly WeightFormat[] = ["int8", "q8_0", "q6_k"];
/** Bytes of workgroup memory per staged unit of x with `xq`: 16 of codes, 4 of scale. */
const XQ_UNIT_BYTES = 20;
/**
 * Workgroup memory for the staged x on CPU adapters: llvmpipe's GL compile time grows steeply
 * with workgroup arrays (docs/kernels.md), and speed there does not matter.
 */
const XQ_CPU_BYTES = 2048;

/**
 * Default `small` launch shape for `m` rows of x times `w` (its K and dtype) into `cols`
 * product columns, from first principles (tune on the GPU with the `small` option; the sweeps
 * behind the measured choices: docs/kernels.md, "small"):
 *
 * - rm: up to 8 rows of x per thread (4 × 8 accumulators; more spills registers), 4 when the
 *   product is wider than W is deep (measured faster). Each unit of W feeds 4·rm (16-bit: 8·rm)
 *   multiply-adds per 16-byte load.
 * - tk: a launch has ≈ ⌈m / rm⌉ · cols / 4 · tk threads whatever the tile, so tk is what
 *   brings it to {@linkcode smallThreads} (at least rm; at most K's units / unroll, so every
 *   lane has a full iteration).
 * - tm, tn: with tk fixed, a workgroup of 256 threads has a fixed tile area; its shape sets the
 *   L2 → SM traffic per multiply-add, 4 bytes of x / (4·tn) + bytes of W / (rm·tm), minimised
 *   (ties go to the smaller tm). E.g. TinyLlama, f16, M = 32: o (N = 2048) tk 32 and 8 × 32
 *   tiles (tm 1, tn 8): 256 workgroups; gate/up (2F = 11264) tk 8 and 16 × 64 tiles (tm 2,
 *   tn 16): 352 workgroups. M = 1: o tk 128, tn 2 (256 workgroups); LM head tk 16, tn 16.
 * - unroll: two units per column in flight (and per loop trip, which costs ~30 ns on an H200)
 *   for rm ≤ 4 and for rm = 8 when it stays 8; one when rm = 8 is narrowed to 4, which measured
 *   slower with two. 8- and 4-bit W: one where two would cap tk under what the thread aim asks
 *   (a row of 8-bit codes has half the units of f16: TinyLlama's o at M = 1 would get 64 lanes
 *   and half of f16's threads), so the aim, which counts 16-byte loads in flight, holds.
 * - kl: 16 threads along each row of W for gate/up (measured faster), 8 otherwise.
 * - xq: for int8 where the adapter has `dot4I8Packed`; xu then all of K when it fits the
 *   workgroup memory ({@linkcode xChunk}; {@linkcode smallShape} sizes it for the device).
 */
export function smallTuning(w: WeightBuffer, opts: SmallTuningOptions): SmallTuning {
  const { m, cols } = opts;
  const rm = Math.min(8, pow2ceil(m));
  const rowTiles = Math.ceil(m / rm);
  const units = w.cols / unitWidth(w.dtype);
  const threads = smallThreads(m, w.cols, cols);
  const aim = pow2ceil((4 * threads) / (cols * rowTiles)); // K lanes the thread aim asks for
  const capped = pow2floor(Math.max(1, units / 2)) < Math.min(SMALL_GROUP, aim);
  const unroll = rm <= 4 && !(capped && !isFloatFormat(w.dtype)) ? 2 : 1;
  const most = Math.min(SMALL_GROUP, pow2floor(Math.max(1, units / unroll)));
  const tk = Math.max(rm, Math.min(most, aim));
  const colGroups = pow2ceil(Math.ceil(cols / 4));
  let best = { tm: 1, tn: 1, cost: Infinity };
  for (let tm = 1; tm <= pow2ceil(rowTiles) && tk * tm <= SMALL_GROUP; tm *= 2) {
    const tn = Math.max(1, Math.min(SMALL_GROUP / (tk * tm), colGroups));
    const cost = 4 / (4 * tn) + elementBytes(w.dtype) / (rm * tm);
    if (cost < best.cost * (1 - 1e-9)) best = { tm, tn, cost };
  }
  // Wider than deep (QKV, gate/up, LM head): 4 rows of x per thread, the rest as sized for 8.
  const narrow = rm === 8 && cols > w.cols ? 4 : rm;
  const kl = opts.swiglu ? 16 : 8;
  const xq = w.dtype === "int8" && (opts.dot4 ?? hasDot4());
  const t = { rm: narrow, tm: best.tm, tn: best.tn, tk, unroll: narrow === 8 ? 2 : unroll, kl };
  return { ...t, xq, xu: xq ? xChunk(t, units, 48 * 1024) : 1 };
}

/**
 * Units of x per row a chunk of the `xq` loop stages into at most `bytes` of workgroup memory
 * (the reduction's and the norm's arrays included): all of K when it fits (one chunk, one
 * staging), else the most whole loop trips (`unroll · tk` units) that fit, else what fits.
 */
export function xChunk(
  t: Pick<SmallTuning, "rm" | "tm" | "tn" | "tk" | "unroll">,
  units: number,
  bytes: number,
): number {
  const rows = t.rm * t.tm;
  const fixed = t.tk * t.tn * t.tm * 16 + rows * 4;
  const most = Math.max(1, Math.floor((bytes - fixed) / (rows * XQ_UNIT_BYTES)));
  if (units <= most) return units;
  const trip = t.unroll * t.tk;
  return most >= trip ? Math.floor(most / trip) * trip : most;
}

/**
 * The launch shape a `small` launch of `launch` runs: {@linkcode smallTuning}'s with `tuning`
 * over it, the chunk of `xq` sized for this device unless given.
 */
export function smallShape(
  gpu: Gpu,
  launch: Pick<MatmulLaunch, "w" | "m" | "k" | "cols" | "swiglu">,
  tuning: Partial<SmallTuning> = {},
): SmallTuning {
  const { w, m, cols, swiglu } = launch;
  const t = { ...smallTuning(w, { m, cols, swiglu }), ...tuning };
  if (tuning.xu === undefined) {
    const units = launch.k / unitWidth(w.dtype);
    const most = isCpuAdapter(gpu)
      ? t.tk * t.tn * t.tm * 16 + t.rm * t.tm * 4 + XQ_CPU_BYTES
      : gpu.maxWorkgroupStorage;
    t.xu = t.xq ? xChunk(t, units, most) : 1;
  }
  return t;
}

/**
 * Threads a `small` launch aims for: {@linkcode SMALL_THREADS}, with two measured exceptions:
 *
 * - twice as many for a single row times a deep W (K > N: down at M = 1): its few columns give
 *   few column groups, and more K lanes keep more loads in flight;
 * - half as many from 8 rows for products wider than deep by at most 8× (QKV and gate/up).
 */
function smallThreads(m: number, k: number, cols: number): number {
  if (m === 1 && k > cols) return 2 * SMALL_THREADS;
  if (m >= 8 && cols > k && cols <= 8 * k) return SMALL_THREADS / 2;
  return SMALL_THREADS;
}

function checkSmall(gpu: Gpu, label: string, t: SmallTuning, dtype: WeightFormat): void {
  const threads = t.tk * t.tn * t.tm;
  // the reduction array, the 1 / rms factors, the staged x (one unit per row without xq)
  const bytes = threads * 16 + t.rm * t.tm * 4 + t.rm * t.tm * t.xu * XQ_UNIT_BYTES;
  if (![1, 2, 4, 8].includes(t.rm)) fail(label, `small rm must be 1, 2, 4 or 8; got ${t.rm}`);
  if (!isPow2(t.tk) || t.tk < t.rm) {
    fail(label, `small tk must be a power of two >= rm (${t.rm}); got ${t.tk}`);
  }
  if (!isPow2(t.tn) || !isPow2(t.tm)) {
    fail(label, `small tn and tm must be powers of two; got ${t.tn} and ${t.tm}`);
  }
  if (![1, 2, 4].includes(t.unroll)) fail(label, `small unroll must be 1, 2 or 4; got ${t.unroll}`);
  if (t.kl !== 8 && t.kl !== 16) fail(label, `small kl must be 8 or 16; got ${t.kl}`);
  if (!(Number.isInteger(t.xu) && t.xu >= 1)) fail(label, `small xu must be >= 1; got ${t.xu}`);
  if (t.xq && !XQ_FORMATS.includes(dtype)) {
    fail(
      label,
      `small xq needs W of 8-bit integer codes (${XQ_FORMATS.join(", ")}); W is ${dtype}`,
    );
  }
  if (t.xq && !hasDot4()) fail(label, "small xq needs dot4I8Packed, which this adapter lacks");
  checkWorkgroup(gpu, label, "small", threads, bytes);
}

/** The `small` dispatch of `launch` in shape `t` ({@linkcode smallShape}). */
export function smallDispatch(gpu: Gpu, launch: MatmulLaunch, t: SmallTuning): Dispatch {
  const { x, w, y, bias, normWeight, nw, m, k, cols } = launch;
  const label = launch.label + (t.xq ? " xq" : "");
  checkSmall(gpu, label, t, w.dtype);
  const groups = grid(Math.ceil(m / (t.rm * t.tm)) * Math.ceil(cols / (4 * t.tn)));
  const pipe = matmulPipeline(gpu, "matmul_small.wgsl", launch, {
    constants: {
      K: k,
      RM: t.rm,
      TM: t.tm,
      TN: t.tn,
      TK: t.tk,
      UNROLL: t.unroll,
      KL: t.kl,
      XQ: t.xq ? 1 : 0,
      XU: t.xu,
    },
  });
  const u = matmulUniform(gpu, launch, { groupsX: groups[0] });
  // Exact sizes: the runtime arrays are vec4, and the buffers may be larger than the tensor.
  const entries: GPUBindGroupEntry[] = [
    at(0, u),
    { binding: 1, resource: { buffer: x, size: m * k * 4 } },
    { binding: 2, resource: { buffer: w.buffer, size: w.rows * k * elementBytes(w.dtype) } },
    at(3, bias),
    normWeight ? { binding: 4, resource: { buffer: normWeight, size: k * 4 } } : at(4, nw),
    at(5, y),
    at(7, w.scales ?? dummy(gpu)), // statically used by every pipeline (quant_common.wgsl)
  ];
  return {
    label,
    pipeline: pipe,
    bindGroup: gpu.device.createBindGroup({ layout: pipe.getBindGroupLayout(0), entries }),
    workgroups: groups,
  };
}
