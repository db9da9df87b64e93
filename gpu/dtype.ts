/**
 * Weight dtypes and their packed GPU form. 16-bit weights stay 16-bit on the GPU: two halves per
 * u32, the even flat index in the low half. f32 weights are bound as their bit patterns.
 */

/** Weight dtypes strata loads. */
export type DType = "f32" | "f16" | "bf16";

/** The WGSL `WDTYPE` override value for a dtype (see docs/internals.md). */
export const WDTYPE: Record<DType, number> = { f32: 0, f16: 1, bf16: 2 };

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
