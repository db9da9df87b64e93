/**
 * Float64 references of the KV codecs (kernels/kv_codec.wgsl, kernels/kv_codec_common.wgsl):
 * a head block (16 rows × D channels of K or of V) encoded into the words the GPU writes, and
 * codec words decoded back. Where the GPU's arithmetic is f32 (sums, the int8 scale, f16
 * rounding) the reference rounds the same way, so codes agree except where a value sits on a
 * rounding tie the two sides break differently.
 */
import { codecHeadWords, type KvCodec } from "./kv_codec.ts";

const ROWS = 16;
const F16_MAX = 65504;

/** Round half to even (WGSL's `round`). */
function roundEven(x: number): number {
  const r = Math.round(x);
  return Math.abs(x % 1) === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

const f16 = (x: number) => Math.f16round(Math.min(F16_MAX, Math.max(-F16_MAX, x)));

/** The bits of an f16 value (as `pack2x16float` stores it). */
function f16Bits(x: number): number {
  return new Uint16Array(Float16Array.of(f16(x)).buffer)[0];
}

function f16Value(bits: number): number {
  return new Float16Array(Uint16Array.of(bits).buffer)[0];
}

/**
 * bfp4's exponent of a group whose largest magnitude is `mx` (as an f32): the least k with
 * mx ≤ 7·2^k, at least −126.
 */
export function bfpExponentRef(mx: number): number {
  if (mx === 0) return -126;
  const bits = new Uint32Array(Float32Array.of(mx).buffer)[0];
  const biased = (bits >>> 23) & 255, mant = bits & 0x7fffff;
  if (biased === 0) return -126; // subnormal: far below the floor
  const e = biased - 126; // mx = f · 2^e, f = 1.mant / 2 in [0.5, 1)
  return Math.max(mant <= 0x600000 ? e - 3 : e - 2, -126); // f ≤ 0.875 ⟺ 1.mant ≤ 1.75
}

/** Per-codec statistics of a head block: per channel (`chan`) and per row or group (`grp`). */
function stats(codec: KvCodec, isV: boolean, x: ArrayLike<number>, D: number) {
  const G = Math.ceil(D / 16);
  const chan = new Float64Array(D), grp = new Float64Array(ROWS * G);
  const at = (t: number, c: number) => Math.fround(x[t * D + c]);
  for (let c = 0; c < D; c++) {
    if (codec === "bfp4" && !isV) {
      let mx = 0;
      for (let t = 0; t < ROWS; t++) mx = Math.max(mx, Math.abs(at(t, c)));
      chan[c] = bfpExponentRef(mx);
    } else if (codec === "sign1") {
      let s = 0;
      for (let t = 0; t < ROWS; t++) s = Math.fround(s + at(t, c));
      chan[c] = f16(s / ROWS);
    }
  }
  for (let t = 0; t < ROWS; t++) {
    if (codec === "bfp4" && isV) {
      for (let g = 0; g < G; g++) {
        let mx = 0;
        for (let c = 16 * g; c < Math.min(16 * g + 16, D); c++) {
          mx = Math.max(mx, Math.abs(at(t, c)));
        }
        grp[t * G + g] = bfpExponentRef(mx);
      }
    } else if (codec === "int8") {
      let mx = 0;
      for (let c = 0; c < D; c++) mx = Math.max(mx, Math.abs(at(t, c)));
      grp[t] = Math.fround(mx / 127);
    } else if (codec === "sign1") {
      let s = 0;
      for (let c = 0; c < D; c++) s = Math.fround(s + Math.abs(Math.fround(at(t, c) - chan[c])));
      grp[t] = f16(Math.fround(s / D));
    }
  }
  return { chan, grp, G, at };
}

/**
 * Encodes one head block `x` (`[16, D]`, row-major, f32 values) into the codec's words, as
 * kernels/kv_codec.wgsl `encode` writes them.
 *
 * @example
 * const words = encodeHeadRef("int8", false, values, 64); // 272 words
 */
export function encodeHeadRef(
  codec: KvCodec,
  isV: boolean,
  x: ArrayLike<number>,
  D: number,
): Uint32Array {
  const out = new Uint32Array(codecHeadWords(codec, D));
  const bytes = new Uint8Array(out.buffer);
  const { chan, grp, G, at } = stats(codec, isV, x, D);
  const n = ROWS * D;
  if (codec === "f16") {
    const h = new Uint16Array(out.buffer);
    for (let i = 0; i < n; i++) h[i] = f16Bits(x[i]);
  } else if (codec === "int8") {
    for (let i = 0; i < n; i++) {
      const s = grp[Math.floor(i / D)];
      const q = s > 0 ? Math.max(-127, Math.min(127, roundEven(Math.fround(x[i] / s)))) : 0;
      bytes[i] = q & 255;
    }
    new Float32Array(out.buffer, 16 * D, ROWS).set(grp.subarray(0, ROWS));
  } else if (codec === "bfp4") {
    for (let i = 0; i < n; i++) {
      const t = Math.floor(i / D), c = i % D;
      const k = isV ? grp[t * G + Math.floor(c / 16)] : chan[c];
      const m = Math.max(-7, Math.min(7, roundEven(at(t, c) * 2 ** -k)));
      out[i >> 3] |= (m & 15) << (4 * (i % 8));
    }
    const exps = isV ? grp : chan;
    for (let b = 0; b < exps.length; b++) bytes[8 * D + b] = exps[b] + 127;
  } else if (codec === "sign1") {
    const h = new Uint16Array(out.buffer);
    for (let c = 0; c < D; c++) h[c] = f16Bits(chan[c]);
    for (let i = 0; i < n; i++) {
      if (Math.fround(at(Math.floor(i / D), i % D) - chan[i % D]) >= 0) {
        out[D / 2 + (i >> 5)] |= 1 << (i % 32);
      }
    }
    for (let t = 0; t < ROWS; t++) h[2 * D + t] = f16Bits(grp[t]);
  } else {
    throw new Error(`internal error: no encoding for '${codec}'`);
  }
  return out;
}

/**
 * Decodes one head block's codec words into its `[16, D]` values (float64), as
 * kernels/kv_codec_common.wgsl `codec_vec4` reads them.
 */
export function decodeHeadRef(
  codec: KvCodec,
  isV: boolean,
  words: Uint32Array,
  D: number,
): Float64Array {
  const n = ROWS * D, out = new Float64Array(n), G = Math.ceil(D / 16);
  const bytes = new Uint8Array(words.buffer, words.byteOffset, words.byteLength);
  const h = new Uint16Array(words.buffer, words.byteOffset, words.byteLength / 2);
  for (let i = 0; i < n; i++) {
    const t = Math.floor(i / D), c = i % D;
    if (codec === "f16") out[i] = f16Value(h[i]);
    else if (codec === "int8") {
      const scale = new Float32Array(words.buffer, words.byteOffset + 16 * D + 4 * t, 1)[0];
      out[i] = ((bytes[i] << 24) >> 24) * scale;
    } else if (codec === "bfp4") {
      const m = ((words[i >> 3] >>> (4 * (i % 8))) << 28) >> 28;
      const e = bytes[8 * D + (isV ? t * G + Math.floor(c / 16) : c)];
      out[i] = m * 2 ** (e - 127);
    } else if (codec === "sign1") {
      const a = f16Value(h[2 * D + t]);
      const bit = (words[D / 2 + (i >> 5)] >>> (i % 32)) & 1;
      out[i] = f16Value(h[c]) + (bit ? a : -a);
    } else throw new Error(`internal error: no decoding for '${codec}'`);
  }
  return out;
}

/**
 * Encodes a whole block of one pool: `heads` head blocks of `[16, D]` values one after another
 * (`[layer, kv head, 16, D]`, a hot block's layout) → `heads · codecHeadWords` words.
 */
export function encodeBlockRef(
  codec: KvCodec,
  isV: boolean,
  x: ArrayLike<number>,
  shape: { heads: number; headDim: number },
): Uint32Array {
  const D = shape.headDim, W = codecHeadWords(codec, D), out = new Uint32Array(shape.heads * W);
  const src = Float64Array.from(x);
  for (let h = 0; h < shape.heads; h++) {
    out.set(encodeHeadRef(codec, isV, src.subarray(h * ROWS * D, (h + 1) * ROWS * D), D), h * W);
  }
  return out;
}

/** Decodes a whole codec block of one pool back to `[layer, kv head, 16, D]` values. */
export function decodeBlockRef(
  codec: KvCodec,
  isV: boolean,
  words: Uint32Array,
  shape: { heads: number; headDim: number },
): Float64Array {
  const D = shape.headDim, W = codecHeadWords(codec, D);
  const out = new Float64Array(shape.heads * ROWS * D);
  for (let h = 0; h < shape.heads; h++) {
    out.set(decodeHeadRef(codec, isV, words.subarray(h * W, (h + 1) * W), D), h * ROWS * D);
  }
  return out;
}

/**
 * The largest error a codec may make on an element of a head block, by its statistics: half a
 * quantization step (int8, bfp4), an f16 rounding (f16), or for sign1 nothing bounded (it keeps
 * a sketch, not the values: Infinity).
 */
export function codecErrorBound(
  codec: KvCodec,
  isV: boolean,
  x: ArrayLike<number>,
  D: number,
): Float64Array {
  const { chan, grp, G } = stats(codec, isV, x, D);
  return Float64Array.from({ length: ROWS * D }, (_, i) => {
    const t = Math.floor(i / D), c = i % D;
    if (codec === "f16") return Math.abs(x[i]) * 2 ** -11 + 2 ** -25;
    if (codec === "int8") return grp[t] * (0.5 + 1e-6);
    if (codec === "bfp4") {
      return 2 ** (isV ? grp[t * G + Math.floor(c / 16)] : chan[c]) * (0.5 + 1e-6);
    }
    return Infinity;
  });
}
