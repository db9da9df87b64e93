/**
 * RoPE on the q and k parts of the fused qkv projection, and the KV-cache write (prefill; a
 * decode step does both inside `attention_decode`). See kernels/rope_kv.wgsl.
 */
import type { KvDtype } from "../gpu/dtype.ts";
import type { Gpu } from "../gpu/device.ts";
import { bindGroup, type Dispatch, grid, params, uniform } from "../gpu/dispatch.ts";
import { pipeline, wgsl } from "./pipeline.ts";

const WG = 64;

/** Buffers of {@linkcode ropeKvDispatch}. */
export interface RopeKvBuffers {
  /** `f32 [T, (Hq + 2·Hkv)·D]`: q heads, then k heads, then v heads. */
  qkv: GPUBuffer;
  /** `f32 [T, Hq, D]` out: rotated q. */
  q: GPUBuffer;
  /** `[numBlocks, nLayers, Hkv, 16, D]` of `kvDtype`: rotated k is written here. */
  kPool: GPUBuffer;
  /** `[numBlocks, nLayers, Hkv, 16, D]` of `kvDtype`: v is written here. */
  vPool: GPUBuffer;
  /** `u32 [T]` absolute position of each token. */
  pos: GPUBuffer;
  /** `u32 [T]` batch slot of each token. */
  tokSeq: GPUBuffer;
  /** `u32 [S, maxBlocks]` physical block of each logical 16-token block. */
  blockTable: GPUBuffer;
  /** `f32 [D / 2]` RoPE inverse frequencies (rope scaling already applied). */
  invFreq: GPUBuffer;
}

/** Shape of {@linkcode ropeKvDispatch}. */
export interface RopeKvOptions {
  tokens: number;
  nHeads: number;
  nKvHeads: number;
  headDim: number;
  /** Which layer's slice of the pools to write. */
  layer: number;
  nLayers: number;
  /** Block-table row length. */
  maxBlocks: number;
  /** Element type of the pools (default f32; f16 rounds k and v as they are written). */
  kvDtype?: KvDtype;
}

/**
 * Builds the RoPE + KV write for `tokens` rows of `qkv`: HF rotate-half RoPE with angle
 * `pos[t] · invFreq[i]` (computed in f32 like HF, with an accurate sin/cos for positions up to
 * ~400k) on q (→ `q`) and k; rotated k and plain v go to the pools at `(tokSeq[t], pos[t])`.
 * Tokens whose position is past the block table (`pos ≥ 16·maxBlocks`) write no KV.
 *
 * @throws Error ("internal error") on an odd head dim or heads that do not group.
 * @example
 * const d = ropeKvDispatch(gpu, { qkv, q, kPool, vPool, pos, tokSeq, blockTable, invFreq }, {
 *   tokens: T, nHeads: 32, nKvHeads: 4, headDim: 64, layer: 3, nLayers: 22, maxBlocks: 129,
 * });
 */
export function ropeKvDispatch(gpu: Gpu, buffers: RopeKvBuffers, opts: RopeKvOptions): Dispatch {
  const { tokens, nHeads, nKvHeads, headDim, layer, nLayers, maxBlocks } = opts;
  if (!(tokens >= 1 && headDim >= 2 && headDim % 2 === 0)) {
    throw new Error(
      `internal error: rope_kv needs tokens >= 1 and an even head dim; got ${tokens}, ${headDim}`,
    );
  }
  if (!(nKvHeads >= 1 && nHeads % nKvHeads === 0 && layer >= 0 && layer < nLayers)) {
    throw new Error(
      `internal error: rope_kv heads ${nHeads}/${nKvHeads}, layer ${layer} of ${nLayers}`,
    );
  }
  const threads = tokens * (nHeads + 2 * nKvHeads) * (headDim / 2);
  const groups = grid(Math.ceil(threads / WG));
  const kv16 = opts.kvDtype === "f16";
  const pipe = pipeline(gpu, "rope_kv.wgsl", {
    constants: { WG, KV16: kv16 ? 1 : 0 },
    prelude: wgsl("rope_common.wgsl"),
  });
  const u = uniform(
    gpu,
    params([tokens, nHeads, nKvHeads, headDim, layer, nLayers, maxBlocks, groups[0]]),
  );
  const b = buffers;
  return {
    label: `rope_kv ${tokens}x(${nHeads}+2x${nKvHeads})x${headDim}${
      kv16 ? " kv f16" : ""
    } L${layer}`,
    pipeline: pipe,
    bindGroup: bindGroup(gpu, pipe, [
      u,
      b.qkv,
      b.pos,
      b.tokSeq,
      b.blockTable,
      b.invFreq,
      b.q,
      b.kPool,
      b.vPool,
    ]),
    workgroups: groups,
  };
}
