/**
 * Embedding lookup: `out[t, :] = table[tokens[t], :]`, the table in any weight dtype, out f32.
 * See kernels/embedding.wgsl.
 */
import type { Gpu } from "../gpu/device.ts";
import { WDTYPE } from "../gpu/dtype.ts";
import { bindGroup, type Dispatch, grid, params, uniform } from "../gpu/dispatch.ts";
import { pipeline } from "./pipeline.ts";
import type { FloatWeight } from "./weight.ts";

const WG = 256;

/** Buffers of {@linkcode embeddingDispatch}. */
export interface EmbeddingBuffers {
  /** `[vocab, hidden]` embedding table, floats (quantized models keep theirs as floats). */
  table: FloatWeight;
  /** `u32 [count]` token ids (ids ≥ vocab are clamped to the last row). */
  tokens: GPUBuffer;
  /** `f32 [count, table.cols]`. */
  out: GPUBuffer;
}

/** Shape of {@linkcode embeddingDispatch}. */
export interface EmbeddingOptions {
  /** Tokens to look up (T). */
  count: number;
}

/**
 * Builds the embedding lookup for `count` tokens.
 *
 * @example
 * const d = embeddingDispatch(gpu, { table, tokens, out: x }, { count: 1 });
 * encode(pass, [d]); // x[0, :] = E[tokens[0], :]
 */
export function embeddingDispatch(
  gpu: Gpu,
  buffers: EmbeddingBuffers,
  opts: EmbeddingOptions,
): Dispatch {
  const { table, tokens, out } = buffers;
  const { count } = opts;
  if (!(count >= 1)) throw new Error(`internal error: embedding count must be >= 1; got ${count}`);
  if (out.size < count * table.cols * 4) {
    throw new Error(
      `internal error: embedding out holds ${out.size} bytes; needs ${count * table.cols * 4}`,
    );
  }
  const groups = grid(Math.ceil((count * table.cols) / WG));
  const pipe = pipeline(gpu, "embedding.wgsl", {
    constants: { WG, WDTYPE: WDTYPE[table.dtype] },
  });
  const u = uniform(gpu, params([count, table.cols, table.rows, groups[0]]));
  return {
    label: `embedding ${count}x${table.cols} ${table.dtype}`,
    pipeline: pipe,
    bindGroup: bindGroup(gpu, pipe, [u, table.buffer, tokens, out]),
    workgroups: groups,
  };
}
