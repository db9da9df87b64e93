/**
 * The weight format every matmul (and the embedding) reads: a `[rows, cols]` tensor of any weight
 * dtype on the GPU (layout in docs/internals.md, "Conventions"), or quantized codes with their
 * scales (kernels/quant.ts), and the gate/up interleave that lets one `swiglu` matmul compute
 * `silu(gate) · up`.
 */
import { createStorage, type Gpu, writeBuffer } from "../gpu/device.ts";
import {
  BYTES,
  type DType,
  encode,
  isFloatFormat,
  type QuantFormat,
  type WeightFormat,
} from "../gpu/dtype.ts";
import { codeBits, formatBytes, type PackedQuant } from "./quant.ts";

/**
 * A weight tensor resident on the GPU: W[rows, cols] row-major, packed per docs/internals.md,
 * or (a quantized `dtype`) codes in `buffer` and scales in `scales` (kernels/quant.ts).
 */
export interface WeightBuffer {
  buffer: GPUBuffer;
  dtype: WeightFormat;
  rows: number;
  cols: number;
  /** The scales of a quantized weight (absent for f32, f16, bf16). */
  scales?: GPUBuffer;
  /**
   * Row blocks of different formats that together make up W (a GGUF layer's Q4_K q and k beside
   * its Q6_K v): a matmul runs one launch per part, into that part's columns of y, with the
   * part's own bias. `buffer`, `dtype` and `scales` are then the first part's.
   */
  parts?: { w: WeightBuffer; bias?: GPUBuffer }[];
}

/** A weight held as floats (what the embedding reads). */
export type FloatWeight = WeightBuffer & { dtype: DType };

/** Bytes per element of a weight format (0.5 for 4-bit codes; scales not counted). */
export function elementBytes(f: WeightFormat): number {
  return isFloatFormat(f) ? BYTES[f] : codeBits(f) / 8;
}

/** Bytes `w` occupies on the GPU, scales included. */
export function weightBytes(w: Pick<WeightBuffer, "dtype" | "rows" | "cols">): number {
  return formatBytes(w.dtype, w.rows, w.cols);
}

/** Uploads a quantized matrix the host packed (kernels/quant.ts) into two new buffers. */
export function uploadQuantWeight(
  gpu: Gpu,
  packed: PackedQuant,
  opts: { rows: number; cols: number; dtype: QuantFormat; label?: string },
): WeightBuffer {
  const label = opts.label ?? `weight ${opts.rows}x${opts.cols}`;
  const buffer = createStorage(gpu, packed.codes.byteLength, packed.codes, label);
  const scales = createStorage(gpu, packed.scales.byteLength, packed.scales, `${label} scales`);
  return { buffer, dtype: opts.dtype, rows: opts.rows, cols: opts.cols, scales };
}

/** Shape and dtype of {@linkcode uploadWeight}. */
export interface UploadWeightOptions {
  rows: number;
  cols: number;
  dtype: DType;
}

/**
 * Encodes `values` (`[rows, cols]`, row-major) as `dtype` and uploads them into a new buffer
 * sized to a multiple of 16 bytes (what the vectorised kernels bind).
 *
 * @throws Error when `values` does not hold `rows * cols` numbers.
 * @example
 * const w = uploadWeight(gpu, values, { rows: 2048, cols: 2048, dtype: "bf16" });
 */
export function uploadWeight(
  gpu: Gpu,
  values: ArrayLike<number>,
  opts: UploadWeightOptions,
): FloatWeight {
  const { rows, cols, dtype } = opts;
  if (values.length !== rows * cols) {
    throw new Error(`internal error: weight has ${values.length} values; [${rows}, ${cols}]?`);
  }
  const bytes = encode(values, dtype);
  const buffer = createStorage(gpu, bytes.byteLength, undefined, `weight ${rows}x${cols}`);
  writeBuffer(gpu, buffer, 0, bytes);
  return { buffer, dtype, rows, cols };
}

/**
 * Gate/up rows per block of the interleaved layout ({@linkcode interleaveGateUp}) that
 * `swiglu` matmuls read. 1: gate and up rows alternate, so the rows of W behind a run of
 * product columns (gate, up, gate, up, …) are adjacent: a `small` thread's 4 columns are 4
 * consecutive rows, a `tiled` tile's bn columns bn. The kernels take any block size
 * (`swigluBlock`).
 */
export const SWIGLU_BLOCK = 1;

/** Shape of {@linkcode interleaveGateUp}: each of gate and up is `[rows, cols]`. */
export interface InterleaveGateUpOptions {
  /** Rows of gate and of up (the intermediate size F). */
  rows: number;
  /** Columns (the hidden size K). */
  cols: number;
  dtype: DType;
  /** Rows per block (default {@linkcode SWIGLU_BLOCK}). */
  block?: number;
}

/**
 * Interleaves the raw bytes of `gate` and `up` (each `[F, K]` of `dtype`, row-major, as in
 * safetensors) into the `[2F, K]` layout of `swiglu` matmuls: block b holds gate rows
 * `[bB, bB + B)` followed by the same up rows, B = `block`; the last block is partial when
 * B does not divide F (`F mod B` gate rows, then as many up rows). With B = 1: gate 0, up 0,
 * gate 1, up 1, …. Apply it to a `[2F]` bias too (`cols: 1, dtype: "f32"`).
 *
 * @returns `2F·K` elements of `dtype`, padded with zeros to a multiple of 4 bytes.
 * @throws Error when an input holds fewer than `F·K` elements.
 * @example
 * const bytes = interleaveGateUp(gate, up, { rows: 5632, cols: 2048, dtype: "bf16" });
 * writeBuffer(gpu, buffer, 0, bytes);
 */
export function interleaveGateUp(
  gate: Uint8Array,
  up: Uint8Array,
  opts: InterleaveGateUpOptions,
): Uint8Array<ArrayBuffer> {
  const { rows, cols, dtype } = opts;
  const block = opts.block ?? SWIGLU_BLOCK;
  const rowBytes = cols * BYTES[dtype];
  const bytes = rows * rowBytes;
  if (gate.byteLength < bytes || up.byteLength < bytes) {
    throw new Error(
      `internal error: gate/up of [${rows}, ${cols}] ${dtype} need ${bytes} bytes each; ` +
        `got ${gate.byteLength} and ${up.byteLength}`,
    );
  }
  const out = new Uint8Array(Math.ceil((2 * bytes) / 4) * 4);
  for (let r0 = 0; r0 < rows; r0 += block) {
    const part = Math.min(block, rows - r0) * rowBytes; // bytes of this block's gate rows
    out.set(gate.subarray(r0 * rowBytes, r0 * rowBytes + part), 2 * r0 * rowBytes);
    out.set(up.subarray(r0 * rowBytes, r0 * rowBytes + part), 2 * r0 * rowBytes + part);
  }
  return out;
}
