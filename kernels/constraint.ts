/**
 * Wrapper for kernels/constraint.wgsl: logit_bias added to the logits before sampling, and the
 * grammar state of constrained slots advanced by the tokens a step recorded. The grammar masks
 * themselves are in the sampler (kernels/grammar_mask.wgsl); docs/grammar.md has the tables.
 */
import type { Gpu } from "../gpu/device.ts";
import { type Dispatch, grid, params, uniform } from "../gpu/dispatch.ts";
import { pipeline } from "./pipeline.ts";
import { bindAt, type Binding } from "./sample.ts";
import { NO_TOKEN } from "./step.ts";

import { MAX_LOGIT_BIAS } from "../api/types.ts";

/** logit_bias entries a sequence may have at most (a row of the bias buffer). */
export { MAX_LOGIT_BIAS };
/** Bytes of one bias entry: (token u32, bias f32). */
export const BIAS_ENTRY_BYTES = 8;

/** One sequence's bias row: (token, f32 bias) pairs, as apply_bias reads them. */
export function packBias(pairs: readonly (readonly [number, number])[]): Uint32Array<ArrayBuffer> {
  if (pairs.length > MAX_LOGIT_BIAS) {
    throw new Error(
      `internal error: ${pairs.length} logit_bias entries (at most ${MAX_LOGIT_BIAS})`,
    );
  }
  const out = new Uint32Array(2 * pairs.length);
  const f = new Float32Array(out.buffer);
  pairs.forEach(([t, b], i) => {
    out[2 * i] = t;
    f[2 * i + 1] = b;
  });
  return out;
}

/**
 * The float64 reference of apply_bias: `logits` with each pair's bias added to its token (the
 * bias rounded to f32 as the buffer holds it).
 */
export function applyBiasRef(
  logits: ArrayLike<number>,
  pairs: readonly (readonly [number, number])[],
): Float64Array {
  const out = Float64Array.from(logits);
  for (const [t, b] of pairs) out[t] += Math.fround(b);
  return out;
}

function constraintParams(o: Partial<Record<string, number>>): ArrayBuffer {
  return params([
    o.begin ?? 0,
    o.end ?? 0,
    o.ringOffset ?? 0,
    o.ringStride ?? 1,
    o.tokens ?? 1,
    o.rowsPerSeq ?? 1,
    o.vocab ?? 0,
    o.maxBias ?? MAX_LOGIT_BIAS,
  ]);
}

/**
 * Adds each sequence's logit_bias to its rows of `logits`, rows [rowBegin, rowEnd): row r
 * belongs to sequence `r / rowsPerSeq`, whose entry count is its SampleParams.n_bias.
 */
export function biasDispatch(
  gpu: Gpu,
  bufs: { params: Binding; logits: Binding; bias: Binding },
  o: { rowBegin: number; rowEnd: number; vocab: number; rowsPerSeq?: number; maxBias?: number },
): Dispatch {
  const pipe = pipeline(gpu, "constraint.wgsl", {
    entryPoint: "apply_bias",
    constants: { NO_TOKEN },
  });
  const u = uniform(
    gpu,
    constraintParams({
      begin: o.rowBegin,
      end: o.rowEnd,
      rowsPerSeq: o.rowsPerSeq ?? 1,
      vocab: o.vocab,
      maxBias: o.maxBias ?? MAX_LOGIT_BIAS,
    }),
  );
  return {
    label: "apply_bias",
    pipeline: pipe,
    bindGroup: bindAt(gpu, pipe, [[0, u], [1, bufs.params], [6, bufs.logits], [7, bufs.bias]]),
    workgroups: grid(Math.max(1, o.rowEnd - o.rowBegin)),
  };
}

/** Buffers of {@linkcode advanceDispatch}. */
export interface AdvanceBuffers {
  /** SampleParams [slots]: a slot's grammar word (kernels/sample.ts NO_GRAMMAR: none). */
  params: Binding;
  /** The token ring (kernels/step.ts). */
  ring: Binding;
  /** The packed table images. */
  tables: Binding;
  /** The model's token-bytes image (engine/grammar/vocab.ts tokenBytesImage). */
  tokenBytes: Binding;
  /** u32 [slots]: each slot's state, advanced in place. */
  state: Binding;
}

/**
 * Advances the grammar state of the constrained slots among [slotBegin, slotEnd) by the tokens
 * that (region, step)'s ring row holds: `tokens` entries per slot from `ringOffset + slot ·
 * ringStride`, up to the first NO_TOKEN.
 */
export function advanceDispatch(
  gpu: Gpu,
  bufs: AdvanceBuffers,
  o: { slotBegin: number; slotEnd: number; ringOffset: number; ringStride: number; tokens: number },
): Dispatch {
  const pipe = pipeline(gpu, "constraint.wgsl", {
    entryPoint: "grammar_advance",
    constants: { NO_TOKEN },
  });
  const u = uniform(
    gpu,
    constraintParams({
      begin: o.slotBegin,
      end: o.slotEnd,
      ringOffset: o.ringOffset,
      ringStride: o.ringStride,
      tokens: o.tokens,
    }),
  );
  const b = bufs;
  return {
    label: "grammar_advance",
    pipeline: pipe,
    bindGroup: bindAt(gpu, pipe, [
      [0, u],
      [1, b.params],
      [2, b.ring],
      [3, b.tables],
      [4, b.tokenBytes],
      [5, b.state],
    ]),
    workgroups: [Math.max(1, Math.ceil((o.slotEnd - o.slotBegin) / 64)), 1, 1],
  };
}
