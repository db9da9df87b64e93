/**
 * Quantized weights on the GPU: the byte layout of every {@linkcode QuantFormat}, and the host
 * packers that produce it (from float values for `int8` and `e4m3`, from a GGUF tensor's blocks
 * for the GGUF types). The decoding side is kernels/quant_common.wgsl; docs/quantization.md
 * draws the layouts.
 *
 * Every format is two buffers, both `array<u32>` in WGSL:
 *
 * - **codes**, row-major `[rows, cols]` in k order: 8-bit codes four per word (byte i of word j
 *   is k = 4j + i) or 4-bit codes eight per word (nibble i of word j is k = 8j + i). A row is a
 *   whole number of words (cols % 4 == 0, or % 8 for 4 bits).
 * - **scales**, per row or per group of consecutive k: a value is `s · code − m` with (s, m) of
 *   its group (kernels/reference.ts `quantWeightRef` reads them back).
 *
 * | format | code                  | group | scales (words per row)                                  |
 * | ------ | --------------------- | ----- | ------------------------------------------------------- |
 * | int8   | i8                    | row   | f32 s                                                   |
 * | e4m3   | e4m3 (no subnormals)  | row   | f32 s                                                   |
 * | q8_0   | i8                    | 32    | f16 d, two groups per word                              |
 * | q4_0   | u4, decoded as q − 8  | 32    | f16 d, two groups per word                              |
 * | q4_k   | u4                    | 32    | f16 (d, dmin) per 256; then u8 (sc, m) per group, 2/word |
 * | q6_k   | i8 = q − 32           | 16    | f16 d per 256, 2/word; then i8 sc per group, 4/word      |
 *
 * The GGUF types carry exactly the information of their blocks (ggml-common.h), moved apart so
 * that codes are in k order and every field is word-aligned: Q8_0 8.5 bits per weight as in
 * GGUF, Q4_0 4.5, Q4_K 4.625 (GGUF 4.5: the 6-bit scales take a byte each), Q6_K 8.56 (GGUF
 * 6.56: the 6-bit codes take a byte each).
 */
import {
  e4m3Bits,
  isFloatFormat,
  QUANT_BLOCKS,
  type QuantFormat,
  type WeightFormat,
} from "../gpu/dtype.ts";

/** Bits per code of a quantized format. */
export function codeBits(f: QuantFormat): 4 | 8 {
  return f === "q4_0" || f === "q4_k" ? 4 : 8;
}

/** Values per scale group (0: one scale per row). */
export function groupSize(f: QuantFormat): number {
  return f === "int8" || f === "e4m3" ? 0 : f === "q6_k" ? 16 : 32;
}

/**
 * Values a format's rows must be a multiple of: a word of codes, or a GGUF block.
 */
export function rowMultiple(f: QuantFormat): number {
  if (f === "int8" || f === "e4m3") return 4;
  return QUANT_BLOCKS[f].elements;
}

/** Words of codes of a `[rows, cols]` matrix. */
export function codeWords(f: QuantFormat, rows: number, cols: number): number {
  return (rows * cols * codeBits(f)) / 32;
}

/**
 * Words of the first scale plane per row (the only one for int8, e4m3, q8_0, q4_0): the f32
 * row scale, the f16 group scales two per word, or the f16 superblock fields.
 */
export function planeAWords(f: QuantFormat, cols: number): number {
  if (f === "int8" || f === "e4m3") return 1;
  if (f === "q8_0" || f === "q4_0") return Math.ceil(cols / 64);
  if (f === "q4_k") return cols / 256;
  return Math.ceil(cols / 512); // q6_k
}

/** Words of the second scale plane per row (q4_k, q6_k: one word per 64 values). */
export function planeBWords(f: QuantFormat, cols: number): number {
  return f === "q4_k" || f === "q6_k" ? cols / 64 : 0;
}

/** Words of the scales buffer of a `[rows, cols]` matrix (both planes). */
export function scaleWords(f: QuantFormat, rows: number, cols: number): number {
  return rows * (planeAWords(f, cols) + planeBWords(f, cols));
}

/** Bytes a weight of `format` takes on the GPU (codes and scales, or the float values). */
export function formatBytes(f: WeightFormat, rows: number, cols: number): number {
  if (isFloatFormat(f)) return Math.ceil((rows * cols * (f === "f32" ? 4 : 2)) / 4) * 4;
  return 4 * (codeWords(f, rows, cols) + scaleWords(f, rows, cols));
}

/** A quantized matrix as the host builds it: the two buffers' words. */
export interface PackedQuant {
  codes: Uint32Array<ArrayBuffer>;
  scales: Uint32Array<ArrayBuffer>;
}

/**
 * Checks that a `[rows, cols]` matrix can be held as `f`.
 *
 * @throws Error naming the format and the row length it needs.
 */
export function checkQuantShape(f: QuantFormat, rows: number, cols: number, what = "W"): void {
  const mult = rowMultiple(f);
  if (!(rows >= 1 && cols >= mult && cols % mult === 0)) {
    throw new Error(
      `${what} [${rows}, ${cols}] cannot be held as ${f}: its rows must be a multiple of ` +
        `${mult} values`,
    );
  }
}

const f32 = new Float32Array(1);
const f32Bits = new Uint32Array(f32.buffer);

/** The bits of `v` as an f32. */
function bitsOf(v: number): number {
  f32[0] = v;
  return f32Bits[0];
}

/**
 * Quantizes `values` (`[rows, cols]` row-major) to `int8` or `e4m3` with one scale per row, as
 * kernels/quant_weights.wgsl does: s = absmax · (1/127) (int8) or · (1/448) (e4m3) in f32, codes
 * the nearest to v / s (half to even; int8 clamped to ±127). A row of zeros gets s = 0 and zero
 * codes. The GPU divides with its own rounding, so at near-ties a code may differ by one step
 * (tests/kernels_quant_test.ts allows exactly that).
 */
export function packRowScaled(
  values: ArrayLike<number>,
  f: "int8" | "e4m3",
  rows: number,
  cols: number,
): PackedQuant {
  checkQuantShape(f, rows, cols);
  const codes = new Uint32Array(codeWords(f, rows, cols));
  const scales = new Uint32Array(rows);
  const bytes = new Uint8Array(codes.buffer);
  const step = Math.fround(f === "int8" ? 1 / 127 : 1 / 448);
  for (let r = 0; r < rows; r++) {
    let amax = 0;
    for (let k = 0; k < cols; k++) {
      amax = Math.max(amax, Math.abs(Math.fround(values[r * cols + k])));
    }
    const s = Math.fround(amax * step);
    scales[r] = bitsOf(s);
    const inv = s > 0 ? Math.fround(1 / s) : 0;
    for (let k = 0; k < cols; k++) {
      const q = Math.fround(Math.fround(values[r * cols + k]) * inv);
      bytes[r * cols + k] = f === "int8" ? int8Code(q) : e4m3Bits(q);
    }
  }
  return { codes, scales };
}

/** The int8 code (two's complement byte) nearest to `q`, half to even, clamped to ±127. */
export function int8Code(q: number): number {
  const r = Math.max(-127, Math.min(127, roundEven(q)));
  return r & 0xff;
}

/** Rounds half to even (WGSL's `round`). */
export function roundEven(x: number): number {
  const r = Math.round(x);
  return Math.abs(x % 1) === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/** The bits of an IEEE half stored little-endian at `b[at]`. */
const half = (b: Uint8Array, at: number) => b[at] | (b[at + 1] << 8);

/**
 * Repacks a GGUF tensor's blocks (`rows` rows of `cols` values, rows in HF order, as
 * `readTensor` returns them) into the GPU layout of its type: the same values, codes in k order.
 *
 * @throws Error when `cols` is not a whole number of blocks or `bytes` is short.
 */
export function packGguf(
  bytes: Uint8Array,
  f: "q8_0" | "q4_0" | "q4_k" | "q6_k",
  rows: number,
  cols: number,
): PackedQuant {
  checkQuantShape(f, rows, cols);
  const blk = QUANT_BLOCKS[f], per = cols / blk.elements;
  if (bytes.byteLength < rows * per * blk.bytes) {
    throw new Error(`internal error: ${f} [${rows}, ${cols}] from ${bytes.byteLength} bytes`);
  }
  const codes = new Uint32Array(codeWords(f, rows, cols));
  const scales = new Uint32Array(scaleWords(f, rows, cols));
  const cb = new Uint8Array(codes.buffer), sb = new Uint8Array(scales.buffer);
  const aw = planeAWords(f, cols), bOff = rows * aw * 4; // plane B's first byte
  const nib = (r: number, k: number, q: number) => {
    const i = r * cols + k; // nibble index; two per byte, the even k in the low nibble
    cb[i >> 1] |= (q & 15) << (4 * (i & 1));
  };
  for (let r = 0; r < rows; r++) {
    for (let b = 0; b < per; b++) {
      const at = (r * per + b) * blk.bytes, k0 = b * blk.elements;
      const block = bytes.subarray(at, at + blk.bytes);
      if (f === "q8_0" || f === "q4_0") {
        const d = half(block, 0), a = r * aw * 4 + 2 * b; // group b's f16 in plane A
        sb[a] = d & 0xff;
        sb[a + 1] = d >> 8;
        if (f === "q8_0") cb.set(block.subarray(2, 34), r * cols + k0);
        else {
          for (let j = 0; j < 16; j++) {
            nib(r, k0 + j, block[2 + j] & 15);
            nib(r, k0 + j + 16, block[2 + j] >> 4);
          }
        }
      } else if (f === "q4_k") {
        sb.set(block.subarray(0, 4), r * aw * 4 + 4 * b); // d, dmin
        const sc = block.subarray(4, 16), qs = block.subarray(16, 144);
        for (let j = 0; j < 8; j++) {
          const [s, m] = q4kScaleMin(sc, j), o = bOff + r * (cols / 32) * 2 + (8 * b + j) * 2;
          sb[o] = s;
          sb[o + 1] = m;
        }
        for (let c = 0; c < 4; c++) {
          for (let l = 0; l < 32; l++) {
            nib(r, k0 + 64 * c + l, qs[32 * c + l] & 15);
            nib(r, k0 + 64 * c + 32 + l, qs[32 * c + l] >> 4);
          }
        }
      } else {
        const d = half(block, 208), a = r * aw * 4 + 2 * b;
        sb[a] = d & 0xff;
        sb[a + 1] = d >> 8;
        sb.set(block.subarray(192, 208), bOff + r * (cols / 16) + 16 * b); // i8 scales
        const ql = block.subarray(0, 128), qh = block.subarray(128, 192);
        for (let n = 0; n < 2; n++) {
          for (let l = 0; l < 32; l++) {
            const h = qh[32 * n + l], lo = ql[64 * n + l], hi = ql[64 * n + l + 32];
            const o = r * cols + k0 + 128 * n + l;
            cb[o] = (((lo & 15) | ((h & 3) << 4)) - 32) & 0xff;
            cb[o + 32] = (((hi & 15) | (((h >> 2) & 3) << 4)) - 32) & 0xff;
            cb[o + 64] = (((lo >> 4) | (((h >> 4) & 3) << 4)) - 32) & 0xff;
            cb[o + 96] = (((hi >> 4) | (((h >> 6) & 3) << 4)) - 32) & 0xff;
          }
        }
      }
    }
  }
  return { codes, scales };
}

/** Scale and min of q4_k sub-block `j` (ggml's `get_scale_min_k4`; engine/model/gguf_quant.ts). */
function q4kScaleMin(s: Uint8Array, j: number): [number, number] {
  if (j < 4) return [s[j] & 63, s[j + 4] & 63];
  return [(s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4)];
}

/** Words of one row of codes. */
function rowWords(f: QuantFormat, cols: number): number {
  return (cols * codeBits(f)) / 32;
}

/**
 * The rows of `parts` (each `[rows[i], cols]` of format `f`) one after the other, as one matrix:
 * codes concatenated, and each scale plane concatenated (plane A of every part, then plane B).
 */
export function concatPacked(
  parts: PackedQuant[],
  f: QuantFormat,
  rows: number[],
  cols: number,
): PackedQuant {
  const total = rows.reduce((a, b) => a + b, 0);
  const codes = new Uint32Array(codeWords(f, total, cols));
  const scales = new Uint32Array(scaleWords(f, total, cols));
  const aw = planeAWords(f, cols), bw = planeBWords(f, cols);
  let r = 0;
  parts.forEach((p, i) => {
    codes.set(p.codes.subarray(0, rows[i] * rowWords(f, cols)), r * rowWords(f, cols));
    scales.set(p.scales.subarray(0, rows[i] * aw), r * aw);
    scales.set(p.scales.subarray(rows[i] * aw, rows[i] * (aw + bw)), total * aw + r * bw);
    r += rows[i];
  });
  return { codes, scales };
}

/**
 * Gate and up (`[rows, cols]` each, format `f`) interleaved row by row into the `[2 rows, cols]`
 * layout of `swiglu` matmuls (kernels/weight.ts `interleaveGateUp` with blocks of 1 row).
 */
export function interleavePacked(
  gate: PackedQuant,
  up: PackedQuant,
  f: QuantFormat,
  rows: number,
  cols: number,
): PackedQuant {
  const codes = new Uint32Array(codeWords(f, 2 * rows, cols));
  const scales = new Uint32Array(scaleWords(f, 2 * rows, cols));
  const cw = rowWords(f, cols), aw = planeAWords(f, cols), bw = planeBWords(f, cols);
  for (let i = 0; i < rows; i++) {
    [gate, up].forEach((p, h) => {
      const o = 2 * i + h;
      codes.set(p.codes.subarray(i * cw, (i + 1) * cw), o * cw);
      scales.set(p.scales.subarray(i * aw, (i + 1) * aw), o * aw);
      const b0 = rows * aw + i * bw;
      scales.set(p.scales.subarray(b0, b0 + bw), 2 * rows * aw + o * bw);
    });
  }
  return { codes, scales };
}

/** Rows `[r0, r0 + n)` of a packed `[rows, cols]` matrix (an LM head chunk). */
export function slicePacked(
  p: PackedQuant,
  f: QuantFormat,
  o: { rows: number; cols: number; r0: number; n: number },
): PackedQuant {
  const cw = rowWords(f, o.cols), aw = planeAWords(f, o.cols), bw = planeBWords(f, o.cols);
  const scales = new Uint32Array(o.n * (aw + bw));
  scales.set(p.scales.subarray(o.r0 * aw, (o.r0 + o.n) * aw));
  const b0 = o.rows * aw + o.r0 * bw;
  scales.set(p.scales.subarray(b0, b0 + o.n * bw), o.n * aw);
  return { codes: p.codes.slice(o.r0 * cw, (o.r0 + o.n) * cw), scales };
}
