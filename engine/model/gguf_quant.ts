/**
 * ggml's block-quantized weight types: byte arithmetic and the float64 dequantization reference
 * (the oracle for the GPU's quantized matmul). Layouts follow ggml-common.h's `block_*` structs
 * and ggml-quants.c's `dequantize_row_*`; every multi-byte field is little-endian, scales are
 * IEEE half floats. A row of K values is K / elements consecutive blocks; rows follow each other.
 *
 * ```
 * q8_0  [d:f16][qs: 32 × i8]                                  x[j] = d·qs[j]
 * q4_0  [d:f16][qs: 16 bytes]                                 x[j] = d·(lo(qs[j]) − 8),
 *                                                             x[j+16] = d·(hi(qs[j]) − 8)
 * q4_k  [d:f16][dmin:f16][scales: 12][qs: 128]                8 sub-blocks of 32, 6-bit scale
 *                                                             and min each: x = d·sc·q − dmin·m
 * q6_k  [ql: 128][qh: 64][scales: 16 × i8][d:f16]             16 sub-blocks of 16, 8-bit scale
 *                                                             each: x = d·sc·(q − 32), q 6 bits
 * ```
 */
import {
  BYTES,
  decode,
  isQuantized,
  QUANT_BLOCKS,
  type QuantType,
  type StorageType,
} from "../../gpu/dtype.ts";

/**
 * Bytes of one row of `cols` values stored as `type`.
 *
 * @throws when a quantized row is not a whole number of blocks
 */
export function rowBytes(type: StorageType, cols: number, what = "a row"): number {
  if (!isQuantized(type)) return cols * BYTES[type];
  const b = QUANT_BLOCKS[type];
  if (cols % b.elements !== 0) {
    throw new Error(
      `${what} has rows of ${cols} values, but ${type.toUpperCase()} stores rows in blocks of ` +
        `${b.elements}; the file is corrupt`,
    );
  }
  return (cols / b.elements) * b.bytes;
}

/**
 * Bytes of a tensor of ggml dims `dims` (innermost first) stored as `type`.
 *
 * @throws when its rows are not whole blocks
 */
export function storageBytes(type: StorageType, dims: number[], what = "a tensor"): number {
  const rows = dims.slice(1).reduce((a, b) => a * b, 1);
  return rows * rowBytes(type, dims[0], what);
}

const half = new Uint16Array(1);
const halfValue = new Float16Array(half.buffer);

/** The value of an IEEE half stored little-endian at `bytes[at]`. */
function f16(bytes: Uint8Array, at: number): number {
  half[0] = bytes[at] | (bytes[at + 1] << 8);
  return halfValue[0];
}

/** A signed byte. */
function i8(b: number): number {
  return b >= 128 ? b - 256 : b;
}

/**
 * Scale and min of sub-block `j` (0..7) of a q4_k block (ggml's `get_scale_min_k4`): sub-blocks
 * 0–3 keep their 6 bits in the low bits of bytes j (scale) and j+4 (min); sub-blocks 4–7 keep
 * their low 4 bits in byte j+4 (scale low nibble, min high nibble) and their high 2 bits in the
 * top bits of bytes j−4 (scale) and j (min).
 */
export function q4kScaleMin(scales: Uint8Array, j: number): [number, number] {
  if (j < 4) return [scales[j] & 63, scales[j + 4] & 63];
  const sc = (scales[j + 4] & 0xf) | ((scales[j - 4] >> 6) << 4);
  const m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
  return [sc, m];
}

/**
 * Dequantizes `count` values stored as `type` to float64, exactly (every block value is a
 * product of a half, small integers and a half, which float64 holds without rounding except the
 * final subtraction of q4_k, rounded once).
 *
 * @param bytes the stored bytes (whole blocks; for float types, the raw little-endian values)
 * @param type how they are stored
 * @param count values to produce (a multiple of the block size for quantized types)
 * @returns the values, in row-major order
 * @throws when `bytes` holds fewer than `count` values
 * @example
 * ```ts
 * const w = dequantizeRef(await readTensor(info), info.dtype, numel(info.shape));
 * ```
 */
export function dequantizeRef(bytes: Uint8Array, type: StorageType, count: number): Float64Array {
  if (!isQuantized(type)) return decode(bytes, type, count);
  const b = QUANT_BLOCKS[type];
  const blocks = count / b.elements;
  if (!Number.isInteger(blocks) || bytes.byteLength < blocks * b.bytes) {
    throw new Error(
      `internal error: dequantizeRef(${type}) of ${count} values from ${bytes.byteLength} bytes`,
    );
  }
  const out = new Float64Array(count);
  for (let i = 0; i < blocks; i++) {
    const block = bytes.subarray(i * b.bytes, (i + 1) * b.bytes);
    DEQUANT[type](block, out, i * b.elements);
  }
  return out;
}

type BlockDecoder = (block: Uint8Array, out: Float64Array, at: number) => void;

const DEQUANT: Record<QuantType, BlockDecoder> = {
  q8_0(block, out, at) {
    const d = f16(block, 0);
    for (let j = 0; j < 32; j++) out[at + j] = d * i8(block[2 + j]);
  },
  q4_0(block, out, at) {
    const d = f16(block, 0);
    for (let j = 0; j < 16; j++) {
      const q = block[2 + j];
      out[at + j] = d * ((q & 0xf) - 8);
      out[at + j + 16] = d * ((q >> 4) - 8);
    }
  },
  q4_k(block, out, at) {
    const d = f16(block, 0), dmin = f16(block, 2);
    const scales = block.subarray(4, 16), qs = block.subarray(16, 144);
    // Four chunks of 64 values; chunk c's 32 bytes hold sub-block 2c in their low nibbles and
    // sub-block 2c+1 in their high nibbles.
    for (let c = 0; c < 4; c++) {
      const [sc1, m1] = q4kScaleMin(scales, 2 * c);
      const [sc2, m2] = q4kScaleMin(scales, 2 * c + 1);
      for (let l = 0; l < 32; l++) {
        const q = qs[32 * c + l];
        out[at + 64 * c + l] = d * sc1 * (q & 0xf) - dmin * m1;
        out[at + 64 * c + 32 + l] = d * sc2 * (q >> 4) - dmin * m2;
      }
    }
  },
  q6_k(block, out, at) {
    const ql = block.subarray(0, 128), qh = block.subarray(128, 192);
    const sc = block.subarray(192, 208), d = f16(block, 208);
    // Two halves of 128 values; in half n, value 32·k + l (k = 0..3) takes its low 4 bits from
    // ql[64n + l + 32·(k & 1)] (low nibble for k < 2, high for k ≥ 2) and its high 2 bits from
    // bits 2k..2k+1 of qh[32n + l]; its scale is sc[8n + l/16 + 2k].
    for (let n = 0; n < 2; n++) {
      for (let l = 0; l < 32; l++) {
        const is = 8 * n + (l >> 4), h = qh[32 * n + l];
        const a = ql[64 * n + l], b = ql[64 * n + l + 32];
        const q1 = ((a & 0xf) | ((h & 3) << 4)) - 32;
        const q2 = ((b & 0xf) | (((h >> 2) & 3) << 4)) - 32;
        const q3 = ((a >> 4) | (((h >> 4) & 3) << 4)) - 32;
        const q4 = ((b >> 4) | (((h >> 6) & 3) << 4)) - 32;
        const o = at + 128 * n + l;
        out[o] = d * i8(sc[is]) * q1;
        out[o + 32] = d * i8(sc[is + 2]) * q2;
        out[o + 64] = d * i8(sc[is + 4]) * q3;
        out[o + 96] = d * i8(sc[is + 6]) * q4;
      }
    }
  },
};
