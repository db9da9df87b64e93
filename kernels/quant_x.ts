/**
 * A projection's input, before the projection (kernels/quant_x.wgsl): quantized to int8 per row
 * for the int8 matmul (kernels/matmul_q8.ts), with the RMSNorm folded in, and/or measured for
 * the precision monitor (engine/runner/monitor.ts): the statistics of the rows and the
 * quantization error of a sample of the product. Also the layout of the statistics buffer and
 * its decoder.
 */
import { createStorage, type Gpu, isCpuAdapter } from "../gpu/device.ts";
import { type Dispatch, grid, params, uniform } from "../gpu/dispatch.ts";
import { isFloatFormat, WDTYPE } from "../gpu/dtype.ts";
import { pipeline, wgsl } from "./pipeline.ts";
import type { FloatWeight, WeightBuffer } from "./weight.ts";
import { embeddingDispatch } from "./embedding.ts";

/** u32 words per statistics slot (one slot per layer and projection input). */
export const STATS_WORDS = 8;

/** Rows of W a sample of the product takes at most. */
export const MAX_SAMPLES = 8;

/** What one statistics slot says about the rows folded into it (see quant_x.wgsl). */
export interface InputStats {
  /** Smallest and largest value of the input (after the folded norm). */
  min: number;
  max: number;
  /** Smallest and largest standard deviation of a row. */
  minStd: number;
  maxStd: number;
  /** Largest relative error of a row quantized to int8 per row (‖x − s·q‖ / ‖x‖). */
  actErr: number;
  /** Largest relative error of the sampled product against the 16-bit weights (0: not sampled). */
  sampleErr: number;
  /** Rows folded in. */
  rows: number;
  /** Rows holding a value that is not finite. */
  nonfinite: number;
}

/** The value behind an ordered key (quant_x.wgsl `key`); a zeroed field gives NaN. */
function keyValue(k: number): number {
  if (k === 0) return NaN;
  const bits = k & 0x80000000 ? k & 0x7fffffff : ~k >>> 0;
  return new Float32Array(Uint32Array.of(bits).buffer)[0];
}

/** Decodes statistics slot `slot` of a read-back buffer. */
export function decodeStats(words: Uint32Array, slot: number): InputStats {
  const w = words.subarray(slot * STATS_WORDS, (slot + 1) * STATS_WORDS);
  const rows = w[6];
  const orZero = (v: number) => (Number.isNaN(v) && rows > 0 ? 0 : v);
  return {
    min: -keyValue(w[0]),
    max: keyValue(w[1]),
    minStd: -keyValue(w[2]),
    maxStd: keyValue(w[3]),
    actErr: keyValue(w[4]),
    sampleErr: orZero(keyValue(w[5])),
    rows,
    nonfinite: w[7],
  };
}

/** A sample of a product to measure: the quantized W, its 16-bit rows as f32, which rows. */
export interface ProductSample {
  /** The quantized weight the path runs. */
  w: WeightBuffer;
  /** `f32 [rows.length, K]`: the same rows of the 16-bit weight. */
  s16: GPUBuffer;
  /** Rows of W sampled (at most {@linkcode MAX_SAMPLES}). */
  rows: number[];
}

/** {@linkcode MAX_SAMPLES} rows of `n`, evenly spaced (all of them when fewer). */
export function sampleRows(n: number): number[] {
  const s = Math.min(n, MAX_SAMPLES);
  return Array.from({ length: s }, (_, i) => Math.floor(((i + 0.5) * n) / s));
}

/**
 * The sample of a quantized product that the monitor measures: {@linkcode sampleRows} of the
 * float weight `precise`, gathered as f32 by the dispatch returned (an embedding lookup of those
 * rows), beside the quantized weight `w` they were quantized into. Run the dispatch before
 * `precise` is destroyed.
 */
export function productSample(
  gpu: Gpu,
  precise: FloatWeight,
  w: WeightBuffer,
): { sample: ProductSample; dispatch: Dispatch } {
  const rows = sampleRows(precise.rows);
  const s16 = createStorage(gpu, rows.length * precise.cols * 4, undefined, "monitor sample");
  const tokens = createStorage(gpu, rows.length * 4, Uint32Array.from(rows));
  const dispatch = embeddingDispatch(gpu, { table: precise, tokens, out: s16 }, {
    count: rows.length,
  });
  return { sample: { w, s16, rows }, dispatch };
}

/** Buffers of {@linkcode quantXDispatch}. */
export interface QuantXBuffers {
  /** `f32 [m, K]`. */
  x: GPUBuffer;
  /** Optional `f32 [K]`: normalise each row first (set `eps`). */
  normWeight?: GPUBuffer;
  /** `u32 [m, K / 4]` int8 codes and `f32 [m]` scales: with both, x is quantized for matmul_q8. */
  xq?: GPUBuffer;
  xscale?: GPUBuffer;
  /** The statistics buffer and the slot the rows fold into. */
  stats?: { buffer: GPUBuffer; slot: number };
  /** A sample of the product to measure (needs `stats`). */
  sample?: ProductSample;
  /**
   * Which rows the statistics count: `done`, a decode step's slot states (kernels/step.ts, a
   * row per slot: slots not done); `chunk`, a prefill chunk's words (kernels/attention.ts
   * `chunkWords`: rows below its token count). Default: every row.
   */
  live?: { buffer: GPUBuffer; kind: "done" | "chunk" };
}

/** What the precision monitor asks a matmul to measure of its input (its `measure` buffer). */
export type Measure =
  & Required<Pick<QuantXBuffers, "stats">>
  & Pick<QuantXBuffers, "sample" | "live">;

/** Shape of {@linkcode quantXDispatch}. */
export interface QuantXOptions {
  m: number;
  k: number;
  /** RMSNorm epsilon, with `normWeight`. */
  eps?: number;
  /** Sample every this many rows (default: about 8 rows of the m). */
  every?: number;
  /**
   * The product measured multiplies x rounded to int8 per unit of 16 k (`small`'s `xq`), not x
   * as it is: the sample rounds it so (K a multiple of 16).
   */
  unitCodes?: boolean;
}

const dummies = new WeakMap<GPUDevice, GPUBuffer[]>();
/**
 * A 16-byte buffer bound at `binding` when a launch does not use it (one per binding: a buffer
 * bound both read-only and read-write in one dispatch is refused).
 */
function dummy(gpu: Gpu, binding: number): GPUBuffer {
  let d = dummies.get(gpu.device);
  if (!d) dummies.set(gpu.device, d = []);
  return d[binding] ??= createStorage(gpu, 16, undefined, `quant_x unused ${binding}`);
}

/** Threads per row: 256 on GPUs, 64 on CPU adapters (GL zero-fills workgroup arrays slowly). */
function groupSize(gpu: Gpu): number {
  return isCpuAdapter(gpu) ? 64 : 256;
}

/**
 * Builds the quantization and/or measurement of `m` rows of x: one workgroup per row.
 *
 * @throws Error ("internal error") when K is not a multiple of 4 (of 16 to quantize), a buffer is
 *   short, or a sample is not of a quantized weight.
 */
export function quantXDispatch(gpu: Gpu, b: QuantXBuffers, o: QuantXOptions): Dispatch {
  const { m, k } = o;
  const writeQ = !!(b.xq && b.xscale);
  const fail = (what: string): never => {
    throw new Error(`internal error: quant_x ${m}x${k}: ${what}`);
  };
  const k16 = writeQ || o.unitCodes;
  if (!(m >= 1 && k >= 4 && k % (k16 ? 16 : 4) === 0)) {
    fail(`K must be a multiple of ${k16 ? 16 : 4}`);
  }
  if (!writeQ && !b.stats) fail("neither codes nor statistics asked for");
  if (b.x.size < m * k * 4) fail(`x holds ${b.x.size} bytes`);
  if (writeQ && (b.xq!.size < m * k || b.xscale!.size < m * 4)) fail("xq or xscale is short");
  if (b.normWeight && o.eps === undefined) fail("normWeight needs eps");
  const s = b.sample;
  if (s && (isFloatFormat(s.w.dtype) || s.rows.length < 1 || s.rows.length > MAX_SAMPLES)) {
    fail(`a sample needs a quantized W and 1..${MAX_SAMPLES} rows`);
  }
  const rows = [...(s?.rows ?? []), 0, 0, 0, 0, 0, 0, 0, 0].slice(0, 8);
  const every = o.every ?? Math.max(1, Math.ceil(m / MAX_SAMPLES));
  const u = uniform(
    gpu,
    params([
      m,
      k,
      { f: o.eps ?? 0 },
      b.stats?.slot ?? 0,
      every,
      s?.w.rows ?? 0,
      s?.rows.length ?? 0,
      b.live ? (b.live.kind === "done" ? 1 : 2) : 0,
      ...rows,
    ]),
  );
  const pipe = pipeline(gpu, "quant_x.wgsl", {
    prelude: wgsl("quant_common.wgsl"),
    constants: {
      WG: groupSize(gpu),
      NORM: b.normWeight ? 1 : 0,
      WRITE_Q: writeQ ? 1 : 0,
      STATS: b.stats ? 1 : 0,
      SAMPLE: s ? 1 : 0,
      SAMPLES: s?.rows.length ?? 0,
      UNIT_CODES: o.unitCodes ? 1 : 0,
      WDTYPE: s ? WDTYPE[s.w.dtype] : 3,
    },
  });
  const d = (binding: number) => dummy(gpu, binding);
  const buffers = [ // in binding order
    u,
    b.x,
    b.xq ?? d(2),
    b.xscale ?? d(3),
    b.normWeight ?? d(4),
    b.stats?.buffer ?? d(5),
    s?.s16 ?? d(6),
    s?.w.scales ?? d(7),
    s?.w.buffer ?? d(8),
    b.live?.buffer ?? d(9),
  ];
  const what = [
    writeQ ? "int8" : "",
    b.stats ? `stats ${b.stats.slot}` : "",
    s ? (o.unitCodes ? "sample x per 16" : "sample") : "",
  ];
  return {
    label: `quant_x ${m}x${k}${b.normWeight ? " +norm" : ""} ${what.filter(Boolean).join(" ")}`,
    pipeline: pipe,
    bindGroup: gpu.device.createBindGroup({
      layout: pipe.getBindGroupLayout(0),
      entries: buffers.map((buffer, binding) => ({ binding, resource: { buffer } })),
    }),
    workgroups: grid(m),
  };
}

/** Zeroes the first `slots` statistics slots of `stats` (put one before the pass that fills them). */
export function statsClearDispatch(gpu: Gpu, stats: GPUBuffer, slots: number): Dispatch {
  const words = slots * STATS_WORDS;
  const pipe = pipeline(gpu, "quant_x.wgsl", {
    prelude: wgsl("quant_common.wgsl"),
    entryPoint: "clear",
  });
  const u = uniform(gpu, params([words, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]));
  return {
    label: `quant_x clear ${slots} slots`,
    pipeline: pipe,
    bindGroup: gpu.device.createBindGroup({
      layout: pipe.getBindGroupLayout(0),
      entries: [{ binding: 0, resource: { buffer: u } }, {
        binding: 5,
        resource: { buffer: stats },
      }],
    }),
    workgroups: grid(Math.ceil(words / 64)),
  };
}
