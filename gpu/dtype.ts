/**
 * Weight dtypes and their packed GPU form. 16-bit weights stay 16-bit on the GPU: two halves per
 * u32, the even flat index in the low half. f32 weights are bound as their bit patterns.
 */

/** Weight dtypes strata loads. */
export type DType = "f32" | "f16" | "bf16";

/**
 * How a weight matrix is held on the GPU: a float dtype, or 8/4-bit codes with scales
 * (kernels/quant.ts draws each layout): `int8` and `e4m3` with one f32 scale per row (made at
 * load by `--quantize`), and the GGUF block types repacked word-aligned.
 */
export type WeightFormat = DType | "int8" | "e4m3" | QuantType;

/** The quantized ones of {@linkcode WeightFormat}. */
export type QuantFormat = Exclude<WeightFormat, DType>;

/**
 * The WGSL `WDTYPE` override value of a weight format (see docs/internals.md and
 * docs/quantization.md): 0–2 floats, 3 and up codes with scales (kernels/quant_common.wgsl).
 */
export const WDTYPE: Record<WeightFormat, number> = {
  f32: 0,
  f16: 1,
  bf16: 2,
  int8: 3,
  e4m3: 4,
  q8_0: 5,
  q4_0: 6,
  q4_k: 7,
  q6_k: 8,
};

/** Whether `f` is one of the float dtypes (not codes with scales). */
export function isFloatFormat(f: WeightFormat): f is DType {
  return f === "f32" || f === "f16" || f === "bf16";
}

/** What `--quantize` makes of a model's projections (`none`: they stay as loaded). */
export type QuantizeMode = "int8" | "e4m3" | "none";

/**
 * The `--quantize` flag's value (none when absent).
 *
 * @throws Error naming the flag when `v` is not int8, e4m3 or none.
 */
export function parseQuantize(v: string | undefined): QuantizeMode {
  if (v === undefined || v === "none" || v === "int8" || v === "e4m3") return v ?? "none";
  throw new Error(`--quantize must be int8, e4m3 or none; got '${v}'`);
}

/** Largest finite e4m3 value (OCP FP8 E4M3: 1.75 · 2^8); strata's codes saturate there. */
export const E4M3_MAX = 448;

/**
 * The e4m3 code nearest to `v` (round half to even), as strata stores them: sign, 4 exponent
 * bits (bias 7), 3 mantissa bits; no NaN (saturates at ±448) and no subnormals (|v| below 2^-6,
 * the smallest normal, rounds to 0 or ±2^-6, 2^-7 to 0), so the GPU decodes a code through an
 * f16 that is never subnormal (llvmpipe flushes some). `v` is taken as an f32 first, as the GPU
 * quantizer (kernels/quant_weights.wgsl) has it, and rounded exactly as that kernel rounds.
 */
export function e4m3Bits(v: number): number {
  const f = new Float32Array([v]);
  const u = new Uint32Array(f.buffer)[0];
  const sign = (u >>> 31) << 7;
  const a = u & 0x7fffffff;
  if (a > 0x7f800000) return 0x7e | sign; // NaN: never produced by a finite scale
  if (a < 0x3c800000) return a > 0x3c000000 ? 0x08 | sign : sign; // below 2^-6: 0 or 2^-6
  const r = (a + 0x7ffff + ((a >>> 20) & 1)) >>> 20; // 3 mantissa bits, half to even
  const e = (r >>> 3) - 120;
  if (e > 15 || (e === 15 && (r & 7) === 7)) return 0x7e | sign;
  return sign | (e << 3) | (r & 7);
}

/** The value of an e4m3 code as {@linkcode e4m3Bits} writes them (subnormal codes decode too). */
export function e4m3Value(bits: number): number {
  const e = (bits >> 3) & 15, m = bits & 7;
  const mag = e === 0 ? m * 2 ** -9 : (8 + m) * 2 ** (e - 10);
  return bits & 0x80 ? -mag : mag;
}

/** Bytes per element. */
export const BYTES: Record<DType, number> = { f32: 4, f16: 2, bf16: 2 };

/**
 * Block-quantized weight types, as llama.cpp's GGUF files store them (ggml's block layouts;
 * engine/model/gguf_quant.ts decodes them, docs/gguf.md draws them). The GPU reads none of them
 * yet: they are here, at the lowest layer, so the quantized matmul's wrapper can name them.
 */
export type QuantType = "q8_0" | "q4_0" | "q4_k" | "q6_k";

/** How a tensor is stored: a float dtype (one element at a time) or a block-quantized type. */
export type StorageType = DType | QuantType;

/** One block of a quantized type: `elements` consecutive values of a row in `bytes` bytes. */
export interface QuantBlock {
  elements: number;
  bytes: number;
}

/**
 * Block sizes (ggml's `QK*` and `sizeof(block_*)`): q8_0 = f16 scale + 32 int8; q4_0 = f16
 * scale + 16 bytes of nibbles; q4_k = f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128
 * bytes of nibbles; q6_k = 128 bytes low nibbles, 64 bytes high 2-bit pairs, 16 int8 scales, f16 d.
 */
export const QUANT_BLOCKS: Record<QuantType, QuantBlock> = {
  q8_0: { elements: 32, bytes: 34 },
  q4_0: { elements: 32, bytes: 18 },
  q4_k: { elements: 256, bytes: 144 },
  q6_k: { elements: 256, bytes: 210 },
};

/** Whether `t` is block-quantized (not one of f32, f16, bf16). */
export function isQuantized(t: StorageType): t is QuantType {
  return t in QUANT_BLOCKS;
}

/**
 * Element types of the KV cache: f32 (exact, the default), or f16 (half the bytes, so twice the
 * tokens per GiB and half the attention reads; K and V are rounded to f16 when written).
 */
export type KvDtype = "f32" | "f16";

/** Bytes per element of the KV cache. */
export const KV_BYTES: Record<KvDtype, number> = { f32: 4, f16: 2 };

/**
 * The `--kv-dtype` flag's value (f32 when absent).
 *
 * @throws Error naming the flag when `v` is neither f32 nor f16.
 */
export function parseKvDtype(v: string | undefined): KvDtype {
  if (v === undefined || v === "f32" || v === "f16") return v ?? "f32";
  throw new Error(`--kv-dtype must be f32 or f16; got '${v}'`);
}

/** Rounds to the nearest bf16 (round-half-to-even) and returns its 16-bit pattern. */
export function bf16Bits(x: number): number {
  const f = new Float32Array([x]);
  const u = new Uint32Array(f.buffer)[0];
  if ((u & 0x7f800000) === 0x7f800000 && (u & 0x7fffff) !== 0) return 0x7fc0; // NaN
  const rounded = u + 0x7fff + ((u >>> 16) & 1);
  return (rounded >>> 16) & 0xffff;
}

/** The value of a bf16 bit pattern. */
export function bf16Value(bits: number): number {
  return new Float32Array(new Uint32Array([(bits & 0xffff) << 16]).buffer)[0];
}

/**
 * Encodes values as raw little-endian bytes of `dtype` (the safetensors layout), padded to a
 * multiple of 4 bytes so the result can be uploaded as-is.
 */
export function encode(values: ArrayLike<number>, dtype: DType): Uint8Array<ArrayBuffer> {
  const n = values.length;
  if (dtype === "f32") return new Uint8Array(Float32Array.from(values).buffer);
  const halves = new Uint16Array(n + (n & 1));
  if (dtype === "f16") halves.set(new Uint16Array(Float16Array.from(values).buffer));
  else for (let i = 0; i < n; i++) halves[i] = bf16Bits(values[i]);
  return new Uint8Array(halves.buffer);
}

/** Decodes raw little-endian `dtype` bytes (as stored in safetensors) to float64. */
export function decode(bytes: Uint8Array, dtype: DType, count?: number): Float64Array {
  const n = count ?? bytes.byteLength / BYTES[dtype];
  const aligned = bytes.byteOffset % 4 === 0 ? bytes : bytes.slice();
  const out = new Float64Array(n);
  if (dtype === "f32") {
    const f = new Float32Array(aligned.buffer, aligned.byteOffset, n);
    for (let i = 0; i < n; i++) out[i] = f[i];
  } else if (dtype === "f16") {
    const h = new Float16Array(aligned.buffer, aligned.byteOffset, n);
    for (let i = 0; i < n; i++) out[i] = h[i];
  } else {
    const h = new Uint16Array(aligned.buffer, aligned.byteOffset, n);
    for (let i = 0; i < n; i++) out[i] = bf16Value(h[i]);
  }
  return out;
}

/** Rounds values through `dtype` and back (what the GPU will see). */
export function roundTrip(values: ArrayLike<number>, dtype: DType): Float64Array {
  return decode(encode(values, dtype), dtype, values.length);
}
