/**
 * KV codecs on the GPU (kernels/kv_codec.wgsl; the formats' read side, which the attention
 * kernels share: kernels/kv_codec_common.wgsl): blocks of the KV pools re-encoded into a smaller
 * form in the same pools, and decoded back. This file owns the formats' byte layout (words per
 * head block) and the pipeline constants that tell a kernel where codec blocks live. Why these
 * formats: docs/kv_codecs.md. Float64 references: kernels/reference_kv.ts.
 */
import type { KvDtype } from "../gpu/dtype.ts";
import { createStorage, type Gpu, isCpuAdapter } from "../gpu/device.ts";
import { bindGroup, type Dispatch, params, uniform } from "../gpu/dispatch.ts";
import { pipeline, wgsl } from "./pipeline.ts";

/** What blocks behind the hot window become (`none`: they stay as they are). */
export type KvCodec = "none" | "f16" | "int8" | "bfp4" | "sign1";

/** The codecs, in the order of their `KV_CODEC` values (none = 0). */
export const KV_CODECS: readonly KvCodec[] = ["none", "f16", "int8", "bfp4", "sign1"];

/** Tokens per block (engine/kv/blocks.ts BLOCK; a kernel layer may not import the engine). */
const ROWS = 16;

/**
 * The `--kv-codec` flag's value (none when absent).
 *
 * @throws Error naming the flag for any other value
 */
export function parseKvCodec(v: string | undefined): KvCodec {
  if (v === undefined) return "none";
  if ((KV_CODECS as readonly string[]).includes(v)) return v as KvCodec;
  throw new Error(`--kv-codec must be one of ${KV_CODECS.join(", ")}; got '${v}'`);
}

/**
 * Words (u32) of one codec head block (16 rows × `headDim` channels of K, or of V), padded to 16
 * bytes so every head block starts aligned. The layout: kernels/kv_codec_common.wgsl.
 *
 * @throws Error ("internal error") for `none` or a head dim that is not a multiple of 4
 * @example
 * codecHeadWords("int8", 64); // 272: 256 words of codes + 16 row scales
 */
export function codecHeadWords(codec: KvCodec, headDim: number): number {
  const D = headDim;
  if (!(D >= 4 && D % 4 === 0)) {
    throw new Error(`internal error: KV codecs need a head dim that is a multiple of 4; got ${D}`);
  }
  const pad = (w: number) => Math.ceil(w / 4) * 4;
  switch (codec) {
    case "f16":
      return 8 * D;
    case "int8":
      return 4 * D + ROWS;
    case "bfp4":
      return pad(2 * D + Math.max(Math.ceil(D / 4), 4 * Math.ceil(D / 16)));
    case "sign1":
      return pad(D + ROWS / 2);
    default:
      throw new Error(`internal error: no codec head block for '${codec}'`);
  }
}

/** Where codec blocks live in a pool, as the kernels that read them need it. */
export interface KvCodecRegion {
  codec: Exclude<KvCodec, "none">;
  /** Hot blocks: ids `[0, hot)`; codec blocks are ids `hot` and up. */
  hot: number;
  /** Word (u32) of codec block `hot` in each of the K and V pools. */
  base: number;
  /** Words of one codec head block ({@linkcode codecHeadWords}). */
  headWords: number;
}

/** The shape of a KV pool, as codecs see it. */
export interface KvShape {
  nLayers: number;
  nKvHeads: number;
  headDim: number;
}

/** Bytes of one hot block (each of K and V) of a pool of `dtype`. */
export function hotBlockBytes(s: KvShape, dtype: KvDtype): number {
  return s.nLayers * s.nKvHeads * ROWS * s.headDim * (dtype === "f16" ? 2 : 4);
}

/** Bytes of one codec block (each of K and V). */
export function codecBlockBytes(s: KvShape, codec: KvCodec): number {
  return s.nLayers * s.nKvHeads * codecHeadWords(codec, s.headDim) * 4;
}

/**
 * The region of a pool of `hot` blocks of `dtype` followed by codec blocks of `codec`.
 *
 * @throws Error ("internal error") for f16 over an f16 pool (nothing to gain), or a head dim the
 *   codecs do not take
 */
export function codecRegion(
  s: KvShape,
  o: { codec: Exclude<KvCodec, "none">; dtype: KvDtype; hot: number },
): KvCodecRegion {
  if (o.codec === "f16" && o.dtype === "f16") {
    throw new Error("internal error: the f16 codec re-encodes an f32 pool; this one is f16");
  }
  return {
    codec: o.codec,
    hot: o.hot,
    base: (o.hot * hotBlockBytes(s, o.dtype)) / 4,
    headWords: codecHeadWords(o.codec, s.headDim),
  };
}

/**
 * The override constants of kernels/kv_codec_common.wgsl for `region` (none: the defaults, which
 * compile every codec branch out).
 */
export function codecConstants(region: KvCodecRegion | undefined): Record<string, number> {
  if (!region) return {};
  return {
    KV_CODEC: KV_CODECS.indexOf(region.codec),
    KV_HOT: region.hot,
    KV_BASE: region.base,
    CHW: region.headWords,
  };
}

/** Buffers of {@linkcode kvCodecDispatch}. */
export interface KvCodecBuffers {
  /**
   * `u32 [items, 2]`: encode (hot block, codec block); decode (codec block, item of `out`).
   */
  pairs: GPUBuffer;
  /** The K pool: hot blocks `[hot, L, Hkv, 16, D]` of the dtype, then the codec blocks. */
  kPool: GPUBuffer;
  vPool: GPUBuffer;
  /** Decode only: `[items, K‖V, L, Hkv, 16, D]` of the pool's dtype (KvPool.copyOut's layout). */
  out?: GPUBuffer;
}

/** Shape of {@linkcode kvCodecDispatch}. */
export interface KvCodecOptions extends KvShape {
  /** Pairs in `pairs` (≤ 65535 per dispatch). */
  items: number;
  /** The hot blocks' dtype. */
  dtype: KvDtype;
  region: KvCodecRegion;
}

/**
 * Builds the `encode` (hot blocks → codec blocks, in the pools) or `decode` (codec blocks → hot
 * form, into `out`) of `items` blocks. One workgroup per (layer × kv head, item, K or V). The
 * dispatch's `uniform` is its own: a caller that runs it once may destroy it after submitting.
 *
 * @throws Error ("internal error") on an empty or too long list, or decode without `out`
 * @example
 * const d = kvCodecDispatch(gpu, "encode", { pairs, kPool, vPool }, {
 *   items: 3, nLayers: 22, nKvHeads: 4, headDim: 64, dtype: "f32", region,
 * });
 */
export function kvCodecDispatch(
  gpu: Gpu,
  entry: "encode" | "decode",
  b: KvCodecBuffers,
  o: KvCodecOptions,
): Dispatch & { uniform: GPUBuffer } {
  const heads = o.nLayers * o.nKvHeads;
  if (!(o.items >= 1 && o.items <= 65535 && heads <= 65535)) {
    throw new Error(`internal error: kv codec ${entry} of ${o.items} blocks, ${heads} heads`);
  }
  if (entry === "decode" && !b.out) throw new Error("internal error: kv codec decode needs out");
  const pipe = pipeline(gpu, "kv_codec.wgsl", {
    constants: {
      WG: isCpuAdapter(gpu) ? 32 : 64,
      HD: o.headDim,
      KV16: o.dtype === "f16" ? 1 : 0,
      ...codecConstants(o.region),
    },
    prelude: wgsl("kv_codec_common.wgsl"),
    entryPoint: entry,
  });
  const u = uniform(gpu, params([o.items, heads, hotBlockBytes(o, o.dtype) / 4, 0]));
  return {
    uniform: u,
    label: `kv_codec ${entry} ${o.region.codec} ${o.items} blocks ${heads}x${o.headDim} ${o.dtype}`,
    pipeline: pipe,
    bindGroup: bindGroup(gpu, pipe, [
      u,
      b.pairs,
      b.kPool,
      b.vPool,
      ...(entry === "decode" ? [b.out!] : []),
    ]),
    workgroups: [heads, o.items, 2],
  };
}

/** A `u32 [n, 2]` buffer of pairs, for {@linkcode kvCodecDispatch}. */
export function pairsBuffer(gpu: Gpu, pairs: readonly (readonly [number, number])[]): GPUBuffer {
  return createStorage(gpu, pairs.length * 8, Uint32Array.from(pairs.flat()), "kv_codec pairs");
}
