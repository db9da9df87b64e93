/**
 * The float64 reference of constrained sampling, reading the table image exactly as the GPU
 * kernels do: the mask (with the budget rule), kernels/sample.wgsl's order of operations on the
 * masked logits, and the advance of the state by the sampled token's bytes.
 */
import { logitsStatsRef, sampleRef, type SampleRefOptions } from "../../kernels/reference.ts";
import { BLOCK_WORDS } from "./token_sets.ts";
import { DEAD, Header, STATE_WORDS, StateRecord } from "./tables.ts";

/**
 * The row a slot in `state` samples from. `remaining` = tokens it may still produce, this one
 * included (slot_state.y before step_end): when some allowed token could lead further from
 * acceptance than the budget allows (`maxNext >= remaining`), the finish row is used, whose
 * tokens each bring acceptance one token closer. Starting with `remaining >= minTokens`, every
 * output is complete when the budget runs out. undefined: no budget (the allowed row).
 */
export function maskRow(image: Uint32Array, state: number, remaining?: number): number {
  const rec = image[Header.stateOffset] + state * STATE_WORDS;
  const tight = remaining !== undefined && image[rec + StateRecord.maxNext] >= remaining;
  return image[rec + (tight ? StateRecord.finishRow : StateRecord.allowedRow)];
}

/** Whether token `t` is in mask row `row`. */
export function rowHas(image: Uint32Array, row: number, t: number): boolean {
  const B = image[Header.rowBlocks];
  const block = image[image[Header.rowsOffset] + row * B + (t >> 10)];
  const word = image[image[Header.blocksOffset] + block * BLOCK_WORDS + ((t >> 5) & 31)];
  return ((word >>> (t & 31)) & 1) === 1;
}

/** [V] 1 where the token may be sampled in `state` (with the budget rule of {@linkcode maskRow}). */
export function maskRef(image: Uint32Array, state: number, remaining?: number): Uint8Array {
  const V = image[Header.vocab], row = maskRow(image, state, remaining);
  const out = new Uint8Array(V);
  for (let t = 0; t < V; t++) out[t] = rowHas(image, row, t) ? 1 : 0;
  return out;
}

/**
 * The state after token `token` (a non-EOS token): its bytes, from the token-bytes image
 * (vocab.ts `tokenBytesImage`), walked through `trans`. DEAD when the grammar refuses it.
 */
export function advanceRef(
  image: Uint32Array,
  tokenImage: Uint32Array,
  state: number,
  token: number,
): number {
  const V = tokenImage[0], C = image[Header.classes];
  const cls = image[Header.classOffset], trans = image[Header.transOffset];
  let s = state;
  for (let j = tokenImage[1 + token]; j < tokenImage[2 + token] && s !== DEAD; j++) {
    const b = (tokenImage[V + 2 + (j >> 2)] >>> (8 * (j & 3))) & 0xff;
    const c = (image[cls + (b >> 2)] >>> (8 * (b & 3))) & 0xff;
    s = image[trans + s * C + c];
  }
  return s;
}

/** Options for {@linkcode sampleGrammarRef}. */
export interface GrammarSampleOptions extends SampleRefOptions {
  /** Tokens the slot may still produce, this one included (undefined: no budget rule). */
  remaining?: number;
}

/**
 * The token the constrained sampler picks in `state`: disallowed logits become -Infinity before
 * anything else (penalties, temperature, top-k/p, min-p, the draw: kernels/reference.ts
 * `sampleRef`). The logprob is under the raw, unmasked logits, as for unconstrained sampling.
 *
 * @example sampleGrammarRef(logits, tables.image, 0, { ...settings, seed: 1n, position: 9 })
 */
export function sampleGrammarRef(
  logits: ArrayLike<number>,
  image: Uint32Array,
  state: number,
  opts: GrammarSampleOptions,
): { token: number; logprob: number } {
  const mask = maskRef(image, state, opts.remaining);
  const masked = Float64Array.from(logits, (x, i) => mask[i] ? x : -Infinity);
  const { token } = sampleRef(masked, opts);
  const { lse } = logitsStatsRef(logits, { rows: 1, vocab: logits.length });
  return { token, logprob: logits[token] - lse[0] };
}
