/**
 * Float64 references for every kernel family. Tests compare the GPU against these on seeded
 * random inputs. Inputs are plain number arrays (Float64Array); shapes are row-major.
 * Each family owns one section below; keep sections in this order.
 */

// ---- section: weights (dtype helpers) ----

import type { AttentionMask } from "./attention_mask.ts";
import { type DType, e4m3Value, type KvDtype, type QuantFormat, roundTrip } from "../gpu/dtype.ts";
import {
  codeBits,
  groupSize,
  int8Code,
  type PackedQuant,
  planeAWords,
  roundEven,
} from "./quant.ts";

/**
 * Weight values as the GPU sees them: each rounded through `dtype` and widened to float64.
 * References take weights in this form, so the comparison measures the kernel, not the dtype.
 *
 * @example
 * const w = weightRef([0.1, 0.2], "bf16"); // Float64Array [0.10009765625, 0.2001953125]
 */
export function weightRef(values: ArrayLike<number>, dtype: DType): Float64Array {
  return roundTrip(values, dtype);
}

/**
 * The float64 values of a quantized matrix `[rows, cols]` in the GPU layout of kernels/quant.ts,
 * read independently of the WGSL decoders: `s · code − m` per group. Subnormal f16 scales are
 * decoded exactly (the WGSL does it with integer arithmetic too).
 *
 * @example
 * const w = quantWeightRef(packRowScaled(values, "int8", 8, 64), "int8", 8, 64);
 */
export function quantWeightRef(
  p: PackedQuant,
  f: QuantFormat,
  rows: number,
  cols: number,
): Float64Array {
  const out = new Float64Array(rows * cols);
  const cb = new Uint8Array(p.codes.buffer, p.codes.byteOffset, p.codes.byteLength);
  const sb = new Uint8Array(p.scales.buffer, p.scales.byteOffset, p.scales.byteLength);
  const sf = new Float32Array(p.scales.buffer, p.scales.byteOffset, p.scales.length);
  const h = (at: number) => new Float16Array(Uint16Array.of(sb[at] | (sb[at + 1] << 8)).buffer)[0];
  const i8 = (b: number) => (b >= 128 ? b - 256 : b);
  const aw = planeAWords(f, cols), bOff = rows * aw * 4, g = groupSize(f);
  for (let r = 0; r < rows; r++) {
    for (let k = 0; k < cols; k++) {
      const i = r * cols + k;
      const code = codeBits(f) === 4 ? (cb[i >> 1] >> (4 * (i & 1))) & 15 : cb[i];
      let s = 1, m = 0, q: number;
      if (f === "int8" || f === "e4m3") {
        s = sf[r];
        q = f === "int8" ? i8(code) : e4m3Value(code);
      } else if (f === "q8_0" || f === "q4_0") {
        s = h(r * aw * 4 + 2 * Math.floor(k / g));
        q = f === "q8_0" ? i8(code) : code - 8;
      } else if (f === "q4_k") {
        const sb0 = r * aw * 4 + 4 * Math.floor(k / 256),
          o = bOff + (r * (cols / g) + k / g | 0) * 2;
        s = h(sb0) * sb[o];
        m = h(sb0 + 2) * sb[o + 1];
        q = code;
      } else {
        s = h(r * aw * 4 + 2 * Math.floor(k / 256)) * i8(sb[bOff + r * (cols / g) + (k / g | 0)]);
        q = i8(code);
      }
      out[i] = s * q - m;
    }
  }
  return out;
}

/** Activations quantized per row as kernels/quant_x.wgsl does (see {@linkcode quantActRef}). */
export interface QuantActRef {
  /** `[m, k]` int8 codes. */
  codes: Int8Array;
  /** `[m]` scales: x ≈ scale · code. */
  scales: Float64Array;
  /** `[m, k]` what the int8 matmul multiplies: scale · code. */
  values: Float64Array;
}

/**
 * Per-row int8 quantization of `x` (`[m, k]`, already normed when the kernel folds the norm):
 * scale = absmax / 127, code = round(x / scale) half to even. The GPU rounds x / scale in f32,
 * so a code may differ by one at a near-tie; references of whole matmuls absorb that in their
 * tolerance.
 */
export function quantActRef(x: ArrayLike<number>, m: number, k: number): QuantActRef {
  const codes = new Int8Array(m * k),
    scales = new Float64Array(m),
    values = new Float64Array(m * k);
  for (let i = 0; i < m; i++) {
    let amax = 0;
    for (let j = 0; j < k; j++) amax = Math.max(amax, Math.abs(x[i * k + j]));
    const s = Math.fround(Math.fround(amax) * Math.fround(1 / 127));
    scales[i] = s;
    for (let j = 0; j < k; j++) {
      const c = s > 0 ? (int8Code(roundEven(x[i * k + j] / s)) << 24) >> 24 : 0;
      codes[i * k + j] = c;
      values[i * k + j] = s * c;
    }
  }
  return { codes, scales, values };
}

// ---- section: linear (embedding, rmsnorm, matmul, elementwise) ----

/** Options for {@linkcode embeddingRef}. */
export interface EmbeddingRefOptions {
  /** Width of one table row (the hidden size). */
  cols: number;
}

/** `out[t, :] = table[tokens[t], :]` → float64 `[T, cols]`. */
export function embeddingRef(
  table: ArrayLike<number>,
  tokens: ArrayLike<number>,
  opts: EmbeddingRefOptions,
): Float64Array {
  const { cols } = opts;
  const out = new Float64Array(tokens.length * cols);
  for (let t = 0; t < tokens.length; t++) {
    for (let c = 0; c < cols; c++) out[t * cols + c] = table[tokens[t] * cols + c];
  }
  return out;
}

/** Options for {@linkcode rmsnormRef}. */
export interface RmsnormRefOptions {
  cols: number;
  eps: number;
  /** Gather: output row i normalises input row `rows[i]` (default: every row in order). */
  rows?: ArrayLike<number>;
}

/** `out[i, :] = x[r(i), :] / sqrt(mean(x[r(i), :]²) + eps) * weight` → float64 `[count, cols]`. */
export function rmsnormRef(
  x: ArrayLike<number>,
  weight: ArrayLike<number>,
  opts: RmsnormRefOptions,
): Float64Array {
  const { cols, eps } = opts;
  const count = opts.rows ? opts.rows.length : x.length / cols;
  const out = new Float64Array(count * cols);
  for (let i = 0; i < count; i++) {
    const r = opts.rows ? opts.rows[i] : i;
    let ss = 0;
    for (let c = 0; c < cols; c++) ss += x[r * cols + c] ** 2;
    const scale = 1 / Math.sqrt(ss / cols + eps);
    for (let c = 0; c < cols; c++) out[i * cols + c] = x[r * cols + c] * scale * weight[c];
  }
  return out;
}

/** Options for {@linkcode matmulRef}. */
export interface MatmulRefOptions {
  m: number;
  n: number;
  k: number;
  /** `[n]`, added to every output row. */
  bias?: ArrayLike<number>;
  /** `[m, n]` prior contents of y: the result is added to it (the fused residual add). */
  y?: ArrayLike<number>;
}

/**
 * `y[m, n] = (y0[m, n] +) Σ_k x[m, k] w[n, k] (+ bias[n])` → float64 `[m, n]`; `w` is the
 * Hugging Face `[out, in]` layout, already rounded through its dtype ({@linkcode weightRef}).
 */
export function matmulRef(
  x: ArrayLike<number>,
  w: ArrayLike<number>,
  opts: MatmulRefOptions,
): Float64Array {
  const { m, n, k } = opts;
  const out = new Float64Array(m * n);
  for (let i = 0; i < m; i++) {
    for (let j = 0; j < n; j++) {
      let s = 0;
      for (let l = 0; l < k; l++) s += x[i * k + l] * w[j * k + l];
      out[i * n + j] = s + (opts.bias ? opts.bias[j] : 0) + (opts.y ? opts.y[i * n + j] : 0);
    }
  }
  return out;
}

/** Options for {@linkcode siluMulRef}. */
export interface SiluMulRefOptions {
  m: number;
  /** Intermediate size: gate is columns `[0, f)` of each `[2f]` row, up is `[f, 2f)`. */
  f: number;
}

/** `out[m, j] = silu(gate[m, j]) * up[m, j]` from one `[m, 2f]` gate‖up array → `[m, f]`. */
export function siluMulRef(gateUp: ArrayLike<number>, opts: SiluMulRefOptions): Float64Array {
  const { m, f } = opts;
  const out = new Float64Array(m * f);
  for (let i = 0; i < m; i++) {
    for (let j = 0; j < f; j++) {
      const g = gateUp[i * 2 * f + j];
      out[i * f + j] = g / (1 + Math.exp(-g)) * gateUp[i * 2 * f + f + j];
    }
  }
  return out;
}

/** Options for {@linkcode matmulNormRef}: {@linkcode MatmulRefOptions} plus the norm. */
export interface MatmulNormRefOptions extends MatmulRefOptions {
  /** `[k]` RMSNorm weights. */
  normWeight: ArrayLike<number>;
  eps: number;
}

/** `y = (y0 +) rmsnorm(x) · wᵀ (+ bias)`: the projection with RMSNorm folded in → `[m, n]`. */
export function matmulNormRef(
  x: ArrayLike<number>,
  w: ArrayLike<number>,
  opts: MatmulNormRefOptions,
): Float64Array {
  const h = rmsnormRef(x, opts.normWeight, { cols: opts.k, eps: opts.eps });
  return matmulRef(h, w, opts);
}

/** Options for {@linkcode swigluRef}. */
export interface SwigluRefOptions {
  m: number;
  /** Intermediate size F (outputs per row). */
  f: number;
  k: number;
  /** `[2f]` in gateUp's row order, added before the activation. */
  bias?: ArrayLike<number>;
  /** `[k]` RMSNorm weights: normalise x first. */
  normWeight?: ArrayLike<number>;
  /** RMSNorm epsilon (with `normWeight`). */
  eps?: number;
  /** `[m, f]` prior contents of y: the result is added to it. */
  y?: ArrayLike<number>;
}

/**
 * The MLP's first half: `y[m, j] = (y0 +) silu(g[m, j]) · u[m, j]` with `g‖u = h · gateUpᵀ (+
 * bias)`, `h = x` or `rmsnorm(x)`; `gateUp` is `[2f, k]`, gate rows then up rows (the plain
 * Hugging Face concatenation, not the GPU's interleave) → `[m, f]`.
 */
export function swigluRef(
  x: ArrayLike<number>,
  gateUp: ArrayLike<number>,
  opts: SwigluRefOptions,
): Float64Array {
  const { m, f, k } = opts;
  const h = opts.normWeight ? rmsnormRef(x, opts.normWeight, { cols: k, eps: opts.eps ?? 0 }) : x;
  const gu = matmulRef(h, gateUp, { m, n: 2 * f, k, bias: opts.bias });
  const out = siluMulRef(gu, { m, f });
  if (opts.y) { for (let i = 0; i < out.length; i++) out[i] += opts.y[i]; }
  return out;
}

/** `out = a + b`, elementwise. */
export function addRef(a: ArrayLike<number>, b: ArrayLike<number>): Float64Array {
  const out = new Float64Array(a.length);
  for (let i = 0; i < a.length; i++) out[i] = a[i] + b[i];
  return out;
}

// ---- section: attention (rope_kv, attention, attention_decode) ----

/** Tokens per paged-KV block (docs/internals.md, "Paged KV cache"). */
const KV_BLOCK_REF = 16;

/** Options for {@linkcode ropeRef}. */
export interface RopeRefOptions {
  /** `[T]` absolute position of each row. */
  pos: ArrayLike<number>;
  /** `[headDim / 2]` inverse frequencies, as the GPU holds them (f32). */
  invFreq: ArrayLike<number>;
  heads: number;
  headDim: number;
}

/**
 * Hugging Face rotate-half RoPE on `x [T, heads, headDim]` → float64 `[T, heads, headDim]`:
 * for `i < D/2`, `x'[i] = x[i]·cos − x[i+D/2]·sin`, `x'[i+D/2] = x[i+D/2]·cos + x[i]·sin`.
 * The angle is `pos · invFreq[i]` rounded to float32, as HF computes it; cos, sin and the
 * rotation are float64.
 */
export function ropeRef(x: ArrayLike<number>, opts: RopeRefOptions): Float64Array {
  const { pos, invFreq, heads, headDim: D } = opts;
  const half = D / 2;
  const out = new Float64Array(pos.length * heads * D);
  for (let t = 0; t < pos.length; t++) {
    for (let i = 0; i < half; i++) {
      const angle = Math.fround(pos[t] * Math.fround(invFreq[i]));
      const c = Math.cos(angle), s = Math.sin(angle);
      for (let h = 0; h < heads; h++) {
        const o = (t * heads + h) * D + i;
        const x0 = x[o], x1 = x[o + half];
        out[o] = x0 * c - x1 * s;
        out[o + half] = x1 * c + x0 * s;
      }
    }
  }
  return out;
}

/** Options for {@linkcode ropeKvRef}. */
export interface RopeKvRefOptions {
  /** `[T]` absolute position of each token. */
  pos: ArrayLike<number>;
  /** `[headDim / 2]` inverse frequencies (f32 values). */
  invFreq: ArrayLike<number>;
  nHeads: number;
  nKvHeads: number;
  headDim: number;
}

/** What rope_kv produces: rotated q, and the rotated k and plain v it writes to the cache. */
export interface RopeKvRef {
  /** `[T, nHeads, headDim]` */
  q: Float64Array;
  /** `[T, nKvHeads, headDim]` */
  k: Float64Array;
  /** `[T, nKvHeads, headDim]` */
  v: Float64Array;
}

/** Splits a fused `qkv [T, (Hq + 2·Hkv)·D]` and applies {@linkcode ropeRef} to q and k. */
export function ropeKvRef(qkv: ArrayLike<number>, opts: RopeKvRefOptions): RopeKvRef {
  const { pos, invFreq, nHeads, nKvHeads, headDim: D } = opts;
  const T = pos.length, width = (nHeads + 2 * nKvHeads) * D;
  const take = (from: number, heads: number) => {
    const out = new Float64Array(T * heads * D);
    for (let t = 0; t < T; t++) {
      for (let e = 0; e < heads * D; e++) out[t * heads * D + e] = qkv[t * width + from + e];
    }
    return out;
  };
  return {
    q: ropeRef(take(0, nHeads), { pos, invFreq, heads: nHeads, headDim: D }),
    k: ropeRef(take(nHeads * D, nKvHeads), { pos, invFreq, heads: nKvHeads, headDim: D }),
    v: take((nHeads + nKvHeads) * D, nKvHeads),
  };
}

/** Options for {@linkcode attentionRef}. */
export interface AttentionRefOptions {
  /** `[L, nKvHeads, headDim]` keys of the sequence by position. */
  k: ArrayLike<number>;
  /** `[L, nKvHeads, headDim]` values of the sequence by position. */
  v: ArrayLike<number>;
  /** `[Tq]` position of each query: query i attends keys `0..qPos[i]` the mask lets it see. */
  qPos: ArrayLike<number>;
  nHeads: number;
  nKvHeads: number;
  headDim: number;
  /** Score scale (default `1 / sqrt(headDim)`). */
  scale?: number;
  /** Which keys a query sees (default causal); keys it does not see are never read. */
  mask?: AttentionMask;
}

/**
 * Whether key position `j` is visible from query position `i` under `mask`, straight from the
 * definitions (kernels/attention_mask.ts): causal j ≤ i; window i − j < window; sinks j < sinks
 * or i − j < window; chunked ⌊j / chunk⌋ = ⌊i / chunk⌋.
 */
export function visibleRef(mask: AttentionMask, i: number, j: number): boolean {
  if (j > i) return false;
  switch (mask.kind) {
    case "causal":
      return true;
    case "window":
      return i - j < mask.window;
    case "sinks":
      return j < mask.sinks || i - j < mask.window;
    case "chunked":
      return Math.floor(j / mask.chunk) === Math.floor(i / mask.chunk);
  }
}

/**
 * Masked softmax attention of `q [Tq, nHeads, headDim]` over one sequence's K/V → float64
 * `[Tq, nHeads, headDim]`: query t sees the keys `j ≤ qPos[t]` that {@linkcode visibleRef}
 * allows (causal by default). GQA: q head h reads kv head `h / (nHeads / nKvHeads)`.
 */
export function attentionRef(q: ArrayLike<number>, opts: AttentionRefOptions): Float64Array {
  const { k, v, qPos, nHeads, nKvHeads, headDim: D } = opts;
  const mask = opts.mask ?? { kind: "causal" };
  const scale = opts.scale ?? 1 / Math.sqrt(D);
  const group = nHeads / nKvHeads;
  const out = new Float64Array(qPos.length * nHeads * D);
  for (let t = 0; t < qPos.length; t++) {
    const keys: number[] = [];
    for (let j = 0; j <= qPos[t]; j++) if (visibleRef(mask, qPos[t], j)) keys.push(j);
    const s = new Float64Array(keys.length);
    for (let h = 0; h < nHeads; h++) {
      const kvh = Math.floor(h / group), qo = (t * nHeads + h) * D;
      let max = -Infinity;
      keys.forEach((j, i) => {
        const ko = (j * nKvHeads + kvh) * D;
        let dot = 0;
        for (let d = 0; d < D; d++) dot += q[qo + d] * k[ko + d];
        s[i] = dot * scale;
        max = Math.max(max, s[i]);
      });
      let sum = 0;
      for (let i = 0; i < keys.length; i++) sum += s[i] = Math.exp(s[i] - max);
      keys.forEach((j, i) => {
        const vo = (j * nKvHeads + kvh) * D, p = s[i] / sum;
        for (let d = 0; d < D; d++) out[qo + d] += p * v[vo + d];
      });
    }
  }
  return out;
}

/** Options for {@linkcode pagedCacheRef}. */
export interface PagedCacheRefOptions {
  /** Tokens each batch slot holds: positions `0..len-1` get random K/V in [-1, 1). */
  seqLens: number[];
  /** Tokens each slot has blocks for (default `seqLens`); unwritten positions are NaN. */
  capacity?: number[];
  nLayers: number;
  nKvHeads: number;
  headDim: number;
  /** Block-table row length (logical blocks per slot). */
  maxBlocks: number;
  /** Element type the cache holds (default f32): the values are rounded to it. */
  kvDtype?: KvDtype;
}

/** A paged KV cache as the GPU holds it, plus its shape. */
export interface PagedCacheRef {
  /**
   * `[numBlocks, nLayers, nKvHeads, 16, headDim]`, each value as the cache holds it (f16-rounded
   * with `kvDtype` f16; upload those as 16-bit).
   */
  kPool: Float32Array;
  vPool: Float32Array;
  kvDtype: KvDtype;
  /** `u32 [S, maxBlocks]`; unmapped entries point at block 0, which is all NaN (a poison). */
  blockTable: Uint32Array;
  numBlocks: number;
  nLayers: number;
  nKvHeads: number;
  headDim: number;
  maxBlocks: number;
}

/**
 * Builds a random paged cache: each slot's logical blocks land on shuffled physical blocks (so a
 * kernel that ignores the table fails), everything not holding a valid token is NaN (so a kernel
 * that reads past a sequence's length, or through an unmapped table entry, fails).
 *
 * @param next uniform [0, 1) generator (seeded: tests/util.ts `rng(seed).next`)
 */
export function pagedCacheRef(next: () => number, opts: PagedCacheRefOptions): PagedCacheRef {
  const { seqLens, nLayers, nKvHeads, headDim: D, maxBlocks } = opts;
  const capacity = opts.capacity ?? seqLens;
  const need = capacity.map((c, s) => Math.ceil(Math.max(c, seqLens[s]) / KV_BLOCK_REF));
  const numBlocks = 1 + need.reduce((a, b) => a + b, 0);
  const ids = Array.from({ length: numBlocks - 1 }, (_, i) => i + 1);
  for (let i = ids.length - 1; i > 0; i--) {
    const j = Math.floor(next() * (i + 1));
    [ids[i], ids[j]] = [ids[j], ids[i]];
  }
  const blockTable = new Uint32Array(seqLens.length * maxBlocks);
  const blockElems = nLayers * nKvHeads * KV_BLOCK_REF * D;
  const kPool = new Float32Array(numBlocks * blockElems).fill(NaN);
  const vPool = new Float32Array(numBlocks * blockElems).fill(NaN);
  const kvDtype = opts.kvDtype ?? "f32";
  const cache = {
    kPool,
    vPool,
    kvDtype,
    blockTable,
    numBlocks,
    nLayers,
    nKvHeads,
    headDim: D,
    maxBlocks,
  };
  const round = kvRound(kvDtype);
  let used = 0;
  seqLens.forEach((len, s) => {
    if (need[s] > maxBlocks) throw new Error(`slot ${s} needs ${need[s]} > ${maxBlocks} blocks`);
    for (let b = 0; b < need[s]; b++) blockTable[s * maxBlocks + b] = ids[used++];
    for (let l = 0; l < nLayers; l++) {
      for (let p = 0; p < len; p++) {
        for (let h = 0; h < nKvHeads; h++) {
          const o = pagedOffsetRef(cache, { slot: s, layer: l, pos: p, head: h });
          for (let d = 0; d < D; d++) {
            kPool[o + d] = round(next() * 2 - 1);
            vPool[o + d] = round(next() * 2 - 1);
          }
        }
      }
    }
  });
  return cache;
}

/** Rounds a value to what a cache of `dtype` holds (f16: round to nearest even). */
export function kvRound(dtype: KvDtype): (x: number) => number {
  return dtype === "f16" ? Math.f16round : Math.fround;
}

/** Where a token's head lives in the pools. */
export interface PagedPlace {
  slot: number;
  layer: number;
  pos: number;
  head: number;
}

/** Element offset of `(slot, layer, pos, kv head, d = 0)` in `kPool` / `vPool`. */
export function pagedOffsetRef(cache: PagedCacheRef, at: PagedPlace): number {
  const { nLayers, nKvHeads, headDim, maxBlocks } = cache;
  const b = cache.blockTable[at.slot * maxBlocks + Math.floor(at.pos / KV_BLOCK_REF)];
  const slotInBlock = at.pos % KV_BLOCK_REF;
  return (((b * nLayers + at.layer) * nKvHeads + at.head) * KV_BLOCK_REF + slotInBlock) * headDim;
}

/**
 * Gathers positions `0..len-1` of one slot and layer through the block table → float64 K and V
 * `[len, nKvHeads, headDim]` (the layout {@linkcode attentionRef} takes).
 */
export function pagedKvRef(
  cache: PagedCacheRef,
  at: { slot: number; layer: number; len: number },
): { k: Float64Array; v: Float64Array } {
  const { nKvHeads: H, headDim: D } = cache;
  const k = new Float64Array(at.len * H * D), v = new Float64Array(at.len * H * D);
  for (let p = 0; p < at.len; p++) {
    for (let h = 0; h < H; h++) {
      const o = pagedOffsetRef(cache, { slot: at.slot, layer: at.layer, pos: p, head: h });
      for (let d = 0; d < D; d++) {
        k[(p * H + h) * D + d] = cache.kPool[o + d];
        v[(p * H + h) * D + d] = cache.vPool[o + d];
      }
    }
  }
  return { k, v };
}

/** Options for {@linkcode attentionDecodeRef}. */
export interface AttentionDecodeRefOptions {
  /** `[S]` the new token's position per slot: RoPE angle of its q and k, where k and v go. */
  pos: ArrayLike<number>;
  /** `[S]` keys each slot's query attends: `0..seqLen[s]-1`, read after the write. */
  seqLen: ArrayLike<number>;
  /** `[headDim / 2]` inverse frequencies (f32 values). */
  invFreq: ArrayLike<number>;
  nHeads: number;
  layer: number;
  /** Score scale (default `1 / sqrt(headDim)`). */
  scale?: number;
  /** Which keys each slot's query (at position `seqLen[s] - 1`) sees (default causal). */
  mask?: AttentionMask;
}

/** What a decode layer's attention produces: its output and the pools after the KV write. */
export interface AttentionDecodeRef {
  /** `[S, nHeads, headDim]`; zeros for a slot with `seqLen` 0. */
  out: Float64Array;
  /** Copies of the cache's pools with each slot's new k (rotated) and v written in, rounded to
   * the cache's dtype. */
  kPool: Float32Array;
  vPool: Float32Array;
}

/**
 * One decode step of one layer's attention, RoPE and KV write included (kernels/attention_decode):
 * {@linkcode ropeKvRef} of each slot's row of `qkv [S, (Hq + 2·Hkv)·D]` at `pos[s]`; its k and v
 * stored (rounded to the cache's dtype) at `(s, pos[s])` through the block table,
 * slots in order, none past the table; then {@linkcode attentionRef} of its rotated q (at query
 * position `seqLen[s] - 1`) over the keys of `0..seqLen[s]-1` of the updated cache that `mask`
 * lets it see.
 */
export function attentionDecodeRef(
  cache: PagedCacheRef,
  qkv: ArrayLike<number>,
  opts: AttentionDecodeRefOptions,
): AttentionDecodeRef {
  const { pos, seqLen, invFreq, nHeads, layer, scale, mask } = opts;
  const { nKvHeads, headDim: D, maxBlocks } = cache;
  const S = pos.length, n = nHeads * D;
  const rot = ropeKvRef(qkv, { pos, invFreq, nHeads, nKvHeads, headDim: D });
  const after = { ...cache, kPool: cache.kPool.slice(), vPool: cache.vPool.slice() };
  const round = kvRound(cache.kvDtype);
  for (let s = 0; s < S; s++) {
    if (pos[s] >= KV_BLOCK_REF * maxBlocks) continue;
    for (let h = 0; h < nKvHeads; h++) {
      const o = pagedOffsetRef(after, { slot: s, layer, pos: pos[s], head: h });
      const from = (s * nKvHeads + h) * D;
      after.kPool.set(rot.k.subarray(from, from + D).map(round), o);
      after.vPool.set(rot.v.subarray(from, from + D).map(round), o);
    }
  }
  const out = new Float64Array(S * n);
  for (let s = 0; s < S; s++) {
    if (seqLen[s] === 0) continue;
    const kv = pagedKvRef(after, { slot: s, layer, len: seqLen[s] });
    const q = rot.q.subarray(s * n, (s + 1) * n);
    const qPos = [seqLen[s] - 1];
    out.set(attentionRef(q, { ...kv, qPos, nHeads, nKvHeads, headDim: D, scale, mask }), s * n);
  }
  return { out, kPool: after.kPool, vPool: after.vPool };
}

// ---- section: logits and sampling ----
// Sampling order (kernels/sample.wgsl does the same, in f32):
//   1. penalties on the raw logits, per token with count n (generated) and seen (prompt or output):
//      repetition (HF): if seen, l > 0 ? l / rp : l * rp; presence: l -= pp if n > 0;
//      frequency: l -= fp * n.
//   2. temperature == 0: the argmax of the penalised logits (ties: lowest id). Otherwise
//      w_i = exp((l_i - max l) / T), and tokens are ordered by (penalised logit desc, id asc);
//      every filter keeps a prefix of that order:
//   3. top-k (k > 0 and k < V): the first k.
//   4. top-p (< 1): the shortest prefix whose mass is >= top_p of the mass left by top-k
//      (top_p <= 0 keeps one token).
//   5. min-p (> 0): of those, tokens with p >= min(min_p, 1) * p_max, i.e. w >= min_p.
//   6. renormalise; u = philoxUniform(seed, position); the token is the first id, scanning ids in
//      ascending order over the kept set, whose cumulative weight exceeds u * S (S = kept mass).
//      If rounding leaves none, the last kept id with positive weight.
//   The reported logprob is logit[tok] - logsumexp(raw logits): unpenalised, untempered.
import { philoxUniform } from "../gpu/philox.ts";
import type { SamplerSettings } from "./sample.ts";

/** Per-row max, log-sum-exp and argmax (ties: lowest index) of `logits[rows, vocab]`. */
export function logitsStatsRef(
  logits: ArrayLike<number>,
  shape: { rows: number; vocab: number },
): { max: Float64Array; lse: Float64Array; argmax: Uint32Array } {
  const { rows, vocab } = shape;
  const max = new Float64Array(rows), lse = new Float64Array(rows);
  const argmax = new Uint32Array(rows);
  for (let r = 0; r < rows; r++) {
    let m = -Infinity, a = 0;
    for (let i = 0; i < vocab; i++) {
      const x = logits[r * vocab + i];
      if (x > m) [m, a] = [x, i];
    }
    let s = 0;
    for (let i = 0; i < vocab; i++) s += Math.exp(logits[r * vocab + i] - m);
    [max[r], lse[r], argmax[r]] = [m, m + Math.log(s), a];
  }
  return { max, lse, argmax };
}

/**
 * The `k` most likely tokens of each row, sorted by logit descending, ties by lower id, with
 * logprob = logit - lse. Entries past the vocabulary get id 0xffffffff and logprob -Infinity.
 */
export function topKRef(
  logits: ArrayLike<number>,
  shape: { rows: number; vocab: number; k: number },
): { ids: Uint32Array; logprobs: Float64Array } {
  const { rows, vocab, k } = shape;
  const { lse } = logitsStatsRef(logits, shape);
  const ids = new Uint32Array(rows * k).fill(0xffffffff);
  const logprobs = new Float64Array(rows * k).fill(-Infinity);
  for (let r = 0; r < rows; r++) {
    const row = Array.from({ length: vocab }, (_, i) => logits[r * vocab + i]);
    const order = sortedOrder(row).slice(0, k);
    order.forEach((id, j) => {
      ids[r * k + j] = id;
      logprobs[r * k + j] = row[id] - lse[r];
    });
  }
  return { ids, logprobs };
}

/** Token ids ordered by value descending, ties by lower id (-0 and +0 tie). */
function sortedOrder(values: ArrayLike<number>): number[] {
  const ids = Array.from({ length: values.length }, (_, i) => i);
  return ids.sort((a, b) => values[b] - values[a] || a - b);
}

/**
 * The penalised logits of one row (step 1 above). `counts[i]`: bits 0..29 = times token i was
 * generated, bit 31 = token seen in the prompt or output.
 */
export function penaliseRef(
  logits: ArrayLike<number>,
  settings: SamplerSettings,
  counts?: ArrayLike<number>,
): Float64Array {
  const out = Float64Array.from(logits);
  if (!counts) return out;
  const rp = settings.repetitionPenalty;
  for (let i = 0; i < out.length; i++) {
    const n = counts[i] & 0x3fffffff;
    if ((counts[i] >>> 31) === 1 || n > 0) out[i] = out[i] > 0 ? out[i] / rp : out[i] * rp;
    if (n > 0) out[i] -= settings.presencePenalty + settings.frequencyPenalty * n;
  }
  return out;
}

/** Kept weights (0 for filtered tokens) of one row after steps 1-5. */
function keptWeights(
  logits: ArrayLike<number>,
  settings: SamplerSettings,
  counts?: ArrayLike<number>,
): Float64Array {
  const pen = penaliseRef(logits, settings, counts);
  const V = pen.length, T = settings.temperature;
  const w = new Float64Array(V);
  const order = sortedOrder(pen);
  if (!(T > 0)) {
    w[order[0]] = 1;
    return w;
  }
  const top = pen[order[0]];
  const all = pen.map((x) => Math.exp((x - top) / T));
  let n = settings.topK > 0 && settings.topK < V ? settings.topK : V;
  if (settings.topP < 1) {
    if (settings.topP <= 0) n = 1;
    else {
      let mass = 0, cum = 0;
      for (let j = 0; j < n; j++) mass += all[order[j]];
      for (let j = 0; j < n; j++) {
        cum += all[order[j]];
        if (cum >= settings.topP * mass) {
          n = j + 1;
          break;
        }
      }
    }
  }
  const minP = Math.min(settings.minP, 1);
  for (let j = 0; j < n; j++) {
    const id = order[j];
    if (all[id] >= minP) w[id] = all[id];
  }
  return w;
}

/** The distribution one row is sampled from (steps 1-5, renormalised): probabilities over V. */
export function sampleDistRef(
  logits: ArrayLike<number>,
  settings: SamplerSettings & { counts?: ArrayLike<number> },
): Float64Array {
  const w = keptWeights(logits, settings, settings.counts);
  const s = w.reduce((a, b) => a + b, 0);
  return w.map((x) => x / s);
}

/** Options for {@linkcode sampleRef}: the settings plus the request seed and token position. */
export interface SampleRefOptions extends SamplerSettings {
  seed: bigint;
  /** Absolute sequence position of the token being sampled. */
  position: number;
  counts?: ArrayLike<number>;
}

/**
 * The token sample.wgsl picks for one row (step 6), and its logprob under the raw logits.
 *
 * @example sampleRef(row, { ...settings, seed: 42n, position: 17 }) // { token, logprob }
 */
export function sampleRef(
  logits: ArrayLike<number>,
  opts: SampleRefOptions,
): { token: number; logprob: number } {
  const w = keptWeights(logits, opts, opts.counts);
  const s = w.reduce((a, b) => a + b, 0);
  const target = philoxUniform(opts.seed, opts.position) * s;
  let cum = 0, token = -1, last = 0;
  for (let i = 0; i < w.length && token < 0; i++) {
    if (w[i] > 0) {
      cum += w[i];
      last = i;
      if (cum > target) token = i;
    }
  }
  if (token < 0) token = last;
  const { lse } = logitsStatsRef(logits, { rows: 1, vocab: logits.length });
  return { token, logprob: logits[token] - lse[0] };
}
