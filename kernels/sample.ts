/**
 * Wrapper for kernels/sample.wgsl: GPU sampling (penalties, temperature, top-k, top-p, min-p) with
 * Philox randomness keyed by (seed, position), the penalty-count update, and a Philox test entry.
 * The order of operations is documented at the top of sample.wgsl; `sampleRef` in
 * kernels/reference.ts is the float64 twin.
 */
import { type Gpu, isCpuAdapter, writeBuffer } from "../gpu/device.ts";
import type { SamplingOptions } from "../api/types.ts";
import { seedKey } from "../gpu/philox.ts";
import { type Dispatch, grid, params, uniform } from "../gpu/dispatch.ts";
import { pipeline } from "./pipeline.ts";

/** The sampling settings the kernel reads (a subset of {@linkcode SamplingOptions}). */
export type SamplerSettings = Pick<
  SamplingOptions,
  | "temperature"
  | "topK"
  | "topP"
  | "minP"
  | "repetitionPenalty"
  | "presencePenalty"
  | "frequencyPenalty"
>;

/**
 * Bytes of one `SampleParams` struct (sample.wgsl), the stride of the params buffer:
 * temperature f32 @0, top_k u32 @4, top_p f32 @8, min_p f32 @12, repetition_penalty f32 @16,
 * presence_penalty f32 @20, frequency_penalty f32 @24, seed_lo u32 @28, seed_hi u32 @32,
 * 12 bytes of padding.
 */
export const SAMPLE_PARAMS_BYTES = 48;

/** Bit 31 of a counts entry: the token appeared in the prompt or the output. */
export const SEEN_BIT = 0x80000000;
/** Bits 0..29 of a counts entry: times the token was generated so far. */
export const COUNT_MASK = 0x3fffffff;

/**
 * Packs one row's `SampleParams`. The seed is taken modulo 2^64 (negative seeds wrap).
 *
 * @example queue.writeBuffer(params, row * SAMPLE_PARAMS_BYTES, packSampleParams({ ...s, seed }))
 */
export function packSampleParams(opts: SamplerSettings & { seed: bigint }): ArrayBuffer {
  const [lo, hi] = seedKey(BigInt.asUintN(64, opts.seed));
  const topK = Math.min(Math.max(0, Math.floor(opts.topK)), 0xffffffff);
  const fields = [
    { f: opts.temperature },
    topK,
    { f: opts.topP },
    { f: opts.minP },
    { f: opts.repetitionPenalty },
    { f: opts.presencePenalty },
    { f: opts.frequencyPenalty },
    lo,
    hi,
    0,
    0,
    0,
  ];
  return params(fields);
}

/** A buffer or a range of one (e.g. one row of a ring). */
export type Binding = GPUBuffer | GPUBufferBinding;

/** Buffers of {@linkcode sampleDispatch}. */
export interface SampleBuffers {
  /** f32 [rows, vocab] */
  logits: Binding;
  /** SampleParams [rows] (stride {@linkcode SAMPLE_PARAMS_BYTES}) */
  params: Binding;
  /** u32 [rows]: absolute position of the token being sampled */
  position: Binding;
  /** u32 [rows, vocab]: bits 0..29 times generated, bit 31 seen in prompt or output */
  counts: Binding;
  /** (token u32, logprob f32) [rows] */
  out: Binding;
}

/** Shape of {@linkcode sampleDispatch} and the other row kernels. */
export interface RowShape {
  rows: number;
  vocab: number;
  /** Threads per row (power of two, <= 256); default {@linkcode rowWorkgroupSize}. */
  workgroupSize?: number;
}

/** Shape of {@linkcode sampleDispatch}. */
export interface SampleShape extends RowShape {
  /**
   * Bits per pass of the cut search: 4 (8 passes of 16 bins) or 2 (16 passes of 4 bins).
   * Default 4, or 2 on CPU adapters, where llvmpipe compiles the radix-16 kernel very slowly.
   */
  digitBits?: 2 | 4;
}

/** Threads per row: 256 for real vocabularies, fewer for tiny ones (power of two, >= 32). */
export function rowWorkgroupSize(vocab: number): number {
  let wg = 32;
  while (wg < 256 && wg * 8 < vocab) wg *= 2;
  return wg;
}

/**
 * Samples one token per row of `logits` on the GPU into `out`; one workgroup per row.
 *
 * @throws Error when `logits` or `counts` would exceed the device's largest binding.
 * @example encode(pass, [sampleDispatch(gpu, { logits, params, position, counts, out }, shape)])
 */
export function sampleDispatch(gpu: Gpu, bufs: SampleBuffers, shape: SampleShape): Dispatch {
  const { rows, vocab } = shape;
  checkRowBytes(gpu, rows * vocab * 4, "logits/counts");
  const wg = shape.workgroupSize ?? rowWorkgroupSize(vocab);
  if (!(wg >= 1 && wg <= 256 && (wg & (wg - 1)) === 0)) {
    throw new Error(
      `internal error: sample workgroup size must be a power of two <= 256; got ${wg}`,
    );
  }
  const digitBits = shape.digitBits ?? (isCpuAdapter(gpu) ? 2 : 4);
  const pipe = pipeline(gpu, "sample.wgsl", { constants: { WG: wg, DIGIT_BITS: digitBits } });
  const dims = uniform(gpu, params([rows, vocab]));
  const b = bufs;
  const slots: [number, Binding][] = [
    [0, dims],
    [1, b.logits],
    [2, b.params],
    [3, b.position],
    [4, b.counts],
    [5, b.out],
  ];
  return {
    label: "sample",
    pipeline: pipe,
    bindGroup: bindAt(gpu, pipe, slots),
    workgroups: grid(rows),
  };
}

/**
 * counts[row, token] += 1 (saturating) and sets the seen bit, for the token in `out` of each row.
 * Encode it after {@linkcode sampleDispatch} when the host does not run a step kernel that does.
 */
export function updateCountsDispatch(
  gpu: Gpu,
  bufs: { counts: Binding; out: Binding },
  shape: { rows: number; vocab: number },
): Dispatch {
  const pipe = pipeline(gpu, "sample.wgsl", { entryPoint: "update_counts" });
  const dims = uniform(gpu, params([shape.rows, shape.vocab]));
  return {
    label: "update_counts",
    pipeline: pipe,
    bindGroup: bindAt(gpu, pipe, [[0, dims], [4, bufs.counts], [5, bufs.out]]),
    workgroups: [Math.max(1, Math.ceil(shape.rows / 64)), 1, 1],
  };
}

/** One counts row for a new sequence: the seen bit on every prompt token, no generations. */
export function promptCounts(promptIds: ArrayLike<number>, vocab: number): Uint32Array {
  const row = new Uint32Array(vocab);
  for (let i = 0; i < promptIds.length; i++) row[promptIds[i]] = SEEN_BIT;
  return row;
}

/** Writes {@linkcode promptCounts} into row `row` of the counts buffer (resetting that row). */
export function writePromptCounts(
  gpu: Gpu,
  counts: GPUBuffer,
  opts: { row: number; vocab: number; promptIds: ArrayLike<number> },
): void {
  writeBuffer(gpu, counts, opts.row * opts.vocab * 4, promptCounts(opts.promptIds, opts.vocab));
}

/**
 * Test and diagnostic entry: raw Philox4x32-10 words on the GPU. `input` holds `count` vectors of
 * six u32 (c0, c1, c2, c3, k0, k1); `out` receives four u32 per vector.
 */
export function philoxDispatch(
  gpu: Gpu,
  bufs: { input: Binding; out: Binding },
  opts: { count: number },
): Dispatch {
  const pipe = pipeline(gpu, "sample.wgsl", { entryPoint: "philox_test" });
  const dims = uniform(gpu, params([opts.count, 0]));
  return {
    label: "philox_test",
    pipeline: pipe,
    bindGroup: bindAt(gpu, pipe, [[0, dims], [5, bufs.out], [6, bufs.input]]),
    workgroups: [Math.max(1, Math.ceil(opts.count / 64)), 1, 1],
  };
}

/** Throws when a per-row buffer of `bytes` would exceed the device's largest binding. */
export function checkRowBytes(gpu: Gpu, bytes: number, what: string): void {
  if (bytes > gpu.maxBinding) {
    throw new Error(
      `${what} need ${bytes} bytes in one binding but this device allows ${gpu.maxBinding}: ` +
        "sample fewer rows per dispatch",
    );
  }
}

/** A bind group from explicit (binding, buffer) pairs: layout "auto" drops unused bindings. */
export function bindAt(
  gpu: Gpu,
  pipe: GPUComputePipeline,
  entries: [number, Binding][],
): GPUBindGroup {
  return gpu.device.createBindGroup({
    layout: pipe.getBindGroupLayout(0),
    entries: entries.map(([binding, b]) => ({
      binding,
      resource: b instanceof GPUBuffer ? { buffer: b } : b,
    })),
  });
}
