/**
 * Test-side quantizers for ggml's block types, so tests and scripts/write_gguf.ts can write the
 * files llama.cpp would: the algorithms of ggml-quants.c's reference `quantize_row_*_ref` (the
 * ones llama-quantize uses without an importance matrix). q8_0 and q4_0 follow them in float32
 * step by step; q4_k and q6_k follow their scale searches (make_qkx2_quants, make_qx_quants) in
 * float64, so a block may differ from ggml's in a last rounding, never in layout. The layouts are
 * engine/model/gguf_quant.ts's, which reads them back.
 */
import { encode, isQuantized, QUANT_BLOCKS, type StorageType } from "../gpu/dtype.ts";

const f32 = Math.fround;
const half = new Float16Array(1);
const halfBits = new Uint16Array(half.buffer);

/** Rounds to the nearest half and stores it little-endian at `out[at]`; returns its value. */
function putF16(out: Uint8Array, at: number, x: number): number {
  half[0] = x;
  out[at] = halfBits[0] & 0xff;
  out[at + 1] = halfBits[0] >> 8;
  return half[0];
}

/** C's roundf: halves away from zero. */
function roundf(x: number): number {
  return Math.sign(x) * Math.round(Math.abs(x));
}

/**
 * Quantizes (or, for f32/f16/bf16, encodes) row-major values.
 *
 * @param values `rows × cols` values
 * @param type the storage type
 * @param cols the row length; quantized types need a multiple of their block size
 * @returns the stored bytes, as a GGUF file holds them
 * @throws when `cols` is not a whole number of blocks
 */
export function quantize(
  values: ArrayLike<number>,
  type: StorageType,
  cols: number,
): Uint8Array<ArrayBuffer> {
  if (!isQuantized(type)) {
    const bytes = encode(values, type);
    return bytes.slice(0, values.length * (type === "f32" ? 4 : 2));
  }
  const b = QUANT_BLOCKS[type];
  if (cols % b.elements !== 0 || values.length % cols !== 0) {
    throw new Error(`${type} needs rows of a multiple of ${b.elements} values; got ${cols}`);
  }
  const blocks = values.length / b.elements;
  const out = new Uint8Array(blocks * b.bytes);
  const x = new Float64Array(b.elements);
  for (let i = 0; i < blocks; i++) {
    for (let j = 0; j < b.elements; j++) x[j] = f32(values[i * b.elements + j]);
    QUANT[type](x, out.subarray(i * b.bytes, (i + 1) * b.bytes));
  }
  return out;
}

const QUANT = {
  q8_0(x: Float64Array, out: Uint8Array) {
    let amax = 0;
    for (const v of x) amax = Math.max(amax, Math.abs(v));
    const d = f32(amax / 127), id = d ? f32(1 / d) : 0;
    putF16(out, 0, d);
    for (let j = 0; j < 32; j++) out[2 + j] = roundf(f32(x[j] * id)) & 0xff;
  },
  q4_0(x: Float64Array, out: Uint8Array) {
    let amax = 0, max = 0;
    for (const v of x) {
      if (amax < Math.abs(v)) [amax, max] = [Math.abs(v), v];
    }
    const d = f32(max / -8), id = d ? f32(1 / d) : 0;
    putF16(out, 0, d);
    const q = (v: number) => Math.min(15, Math.trunc(f32(f32(v * id) + 8.5)));
    for (let j = 0; j < 16; j++) out[2 + j] = q(x[j]) | (q(x[j + 16]) << 4);
  },
  q4_k(x: Float64Array, out: Uint8Array) {
    const scales = new Float64Array(8), mins = new Float64Array(8);
    for (let j = 0; j < 8; j++) {
      const sub = x.subarray(32 * j, 32 * j + 32);
      let sumX2 = 0;
      for (const v of sub) sumX2 += v * v;
      const av = Math.sqrt(sumX2 / 32);
      const weights = sub.map((v) => av + Math.abs(v));
      [scales[j], mins[j]] = scaleMinSearch(sub, weights, 15, { rmin: -1, rdelta: 0.1, steps: 20 });
    }
    const maxScale = Math.max(...scales), maxMin = Math.max(...mins);
    const invScale = maxScale > 0 ? 63 / maxScale : 0, invMin = maxMin > 0 ? 63 / maxMin : 0;
    const sc = out.subarray(4, 16);
    for (let j = 0; j < 8; j++) {
      const ls = Math.min(63, Math.round(invScale * scales[j]));
      const lm = Math.min(63, Math.round(invMin * mins[j]));
      if (j < 4) {
        sc[j] = ls;
        sc[j + 4] = lm;
      } else {
        sc[j + 4] = (ls & 0xf) | ((lm & 0xf) << 4);
        sc[j - 4] |= (ls >> 4) << 6;
        sc[j] |= (lm >> 4) << 6;
      }
    }
    const d = putF16(out, 0, maxScale / 63), dmin = putF16(out, 2, maxMin / 63);
    const L = new Uint8Array(256);
    for (let j = 0; j < 8; j++) {
      const [s, m] = scaleMin(sc, j);
      if (!(d * s)) continue;
      for (let i = 0; i < 32; i++) {
        L[32 * j + i] = clamp(Math.round((x[32 * j + i] + dmin * m) / (d * s)), 0, 15);
      }
    }
    for (let c = 0; c < 4; c++) {
      for (let l = 0; l < 32; l++) out[16 + 32 * c + l] = L[64 * c + l] | (L[64 * c + 32 + l] << 4);
    }
  },
  q6_k(x: Float64Array, out: Uint8Array) {
    const scales = new Float64Array(16);
    let maxScale = 0, maxAbs = 0;
    for (let ib = 0; ib < 16; ib++) {
      scales[ib] = symmetricScale(x.subarray(16 * ib, 16 * ib + 16), 32);
      if (Math.abs(scales[ib]) > maxAbs) [maxAbs, maxScale] = [Math.abs(scales[ib]), scales[ib]];
    }
    if (maxAbs < 1e-15) return; // all zero: a zero block
    const iscale = -128 / maxScale;
    const d = putF16(out, 208, 1 / iscale);
    const L = new Uint8Array(256);
    for (let ib = 0; ib < 16; ib++) {
      const s = Math.min(127, Math.round(iscale * scales[ib]));
      out[192 + ib] = s & 0xff;
      if (!(d * s)) continue;
      for (let i = 0; i < 16; i++) {
        L[16 * ib + i] = clamp(Math.round(x[16 * ib + i] / (d * s)), -32, 31) + 32;
      }
    }
    for (let n = 0; n < 2; n++) {
      for (let l = 0; l < 32; l++) {
        const q = (k: number) => L[128 * n + 32 * k + l];
        out[64 * n + l] = (q(0) & 0xf) | ((q(2) & 0xf) << 4);
        out[64 * n + l + 32] = (q(1) & 0xf) | ((q(3) & 0xf) << 4);
        out[128 + 32 * n + l] = (q(0) >> 4) | ((q(1) >> 4) << 2) | ((q(2) >> 4) << 4) |
          ((q(3) >> 4) << 6);
      }
    }
  },
};

function clamp(v: number, lo: number, hi: number): number {
  return Math.max(lo, Math.min(hi, v));
}

/** q4_k's 6-bit scale and min of sub-block j (the layout engine/model/gguf_quant.ts reads). */
function scaleMin(sc: Uint8Array, j: number): [number, number] {
  if (j < 4) return [sc[j] & 63, sc[j + 4] & 63];
  return [(sc[j + 4] & 0xf) | ((sc[j - 4] >> 6) << 4), (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4)];
}

/**
 * ggml's make_qkx2_quants: the scale and (negated) min of x ≈ scale·L − min with L in
 * [0, nmax], minimising the weighted squared error over a few candidate scales.
 *
 * @returns [scale, min] with min ≥ 0
 */
function scaleMinSearch(
  x: Float64Array,
  w: Float64Array,
  nmax: number,
  o: { rmin: number; rdelta: number; steps: number },
): [number, number] {
  const n = x.length;
  let min = 0, max = -Infinity, sumW = 0, sumX = 0;
  for (let i = 0; i < n; i++) {
    min = Math.min(min, x[i]);
    max = Math.max(max, x[i]);
    sumW += w[i];
    sumX += w[i] * x[i];
  }
  if (max === min) return [0, -min];
  const L = new Uint8Array(n);
  /** Levels of x for 1/step `iscale` from `m`, into L. */
  const levels = (iscale: number, m: number) => {
    for (let i = 0; i < n; i++) L[i] = clamp(Math.round(iscale * (x[i] - m)), 0, nmax);
  };
  const err = (scale: number, m: number) => {
    let e = 0;
    for (let i = 0; i < n; i++) e += w[i] * (scale * L[i] + m - x[i]) ** 2;
    return e;
  };
  let scale = (max - min) / nmax;
  levels(1 / scale, min);
  let best = err(scale, min);
  for (let is = 0; is <= o.steps; is++) {
    levels((o.rmin + o.rdelta * is + nmax) / (max - min), min);
    let sl = 0, sl2 = 0, sxl = 0;
    for (let i = 0; i < n; i++) {
      sl += w[i] * L[i];
      sl2 += w[i] * L[i] * L[i];
      sxl += w[i] * L[i] * x[i];
    }
    const D = sumW * sl2 - sl * sl;
    if (D <= 0) continue;
    let s = (sumW * sxl - sumX * sl) / D, m = (sl2 * sumX - sl * sxl) / D;
    if (m > 0) [m, s] = [0, sxl / sl2];
    const e = err(s, m);
    if (e < best) [best, scale, min] = [e, s, m];
  }
  return [scale, -min];
}

/**
 * ggml's make_qx_quants with rmse_type 1 (weights x²): the signed scale of x ≈ scale·l with l in
 * [−nmax, nmax − 1], the best of 19 candidates around −nmax / (the value of largest magnitude).
 */
function symmetricScale(x: Float64Array, nmax: number): number {
  let amax = 0, max = 0;
  for (const v of x) if (Math.abs(v) > amax) [amax, max] = [Math.abs(v), v];
  if (amax < 1e-15) return 0;
  const fit = (iscale: number) => {
    let sumlx = 0, suml2 = 0;
    for (const v of x) {
      const l = clamp(Math.round(iscale * v), -nmax, nmax - 1), w = v * v;
      sumlx += w * v * l;
      suml2 += w * l * l;
    }
    return [sumlx, suml2];
  };
  let [sumlx, suml2] = fit(-nmax / max);
  let scale = suml2 ? sumlx / suml2 : 0, best = scale * sumlx;
  for (let is = -9; is <= 9; is++) {
    if (is === 0) continue;
    [sumlx, suml2] = fit(-(nmax + 0.1 * is) / max);
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      [scale, best] = [sumlx / suml2, sumlx * sumlx / suml2];
    }
  }
  return scale;
}
