/**
 * Wrapper for kernels/logits.wgsl: per-row max, log-sum-exp and argmax of the logits, and the
 * top-k alternatives OpenAI's `top_logprobs` reports. One workgroup per row.
 */
import type { Gpu } from "../gpu/device.ts";
import { type Dispatch, grid, params, uniform } from "../gpu/dispatch.ts";
import { pipeline } from "./pipeline.ts";
import { bindAt, type Binding, checkRowBytes, type RowShape, rowWorkgroupSize } from "./sample.ts";

/** Bytes of one row of `stats`: f32 max, f32 lse, u32 argmax, u32 0. */
export const STATS_BYTES = 16;
/** Largest `k` {@linkcode topKDispatch} accepts (OpenAI allows top_logprobs <= 20). */
export const MAX_TOP_K = 20;
/** Bytes of one top-k entry: u32 id, f32 logprob. */
export const TOP_ENTRY_BYTES = 8;

/** Buffers of {@linkcode logitsStatsDispatch}. */
export interface LogitsStatsBuffers {
  /** f32 [rows, vocab] */
  logits: Binding;
  /** [rows] of (f32 max, f32 lse, u32 argmax, u32 0), {@linkcode STATS_BYTES} per row */
  stats: Binding;
}

/**
 * Computes max, log-sum-exp and argmax (ties: lowest id) of each row.
 *
 * @example encode(pass, [logitsStatsDispatch(gpu, { logits, stats }, { rows, vocab })])
 */
export function logitsStatsDispatch(
  gpu: Gpu,
  bufs: LogitsStatsBuffers,
  shape: RowShape,
): Dispatch {
  checkRowBytes(gpu, shape.rows * shape.vocab * 4, "logits");
  const wg = shape.workgroupSize ?? rowWorkgroupSize(shape.vocab);
  const pipe = pipeline(gpu, "logits.wgsl", { entryPoint: "stats_main", constants: { WG: wg } });
  const dims = uniform(gpu, params([shape.rows, shape.vocab, 0]));
  return {
    label: "logits_stats",
    pipeline: pipe,
    bindGroup: bindAt(gpu, pipe, [[0, dims], [1, bufs.logits], [2, bufs.stats]]),
    workgroups: grid(shape.rows),
  };
}

/** Buffers of {@linkcode topKDispatch}. */
export interface TopKBuffers extends LogitsStatsBuffers {
  /** (u32 id, f32 logprob) [rows, k]; entries past the vocabulary are (0xffffffff, -inf) */
  out: Binding;
}

/**
 * The `k` most likely tokens of each row, sorted by logit descending (ties: lower id), with
 * logprob = logit - lse. Reads `stats` from {@linkcode logitsStatsDispatch}, encoded before it.
 *
 * @throws Error when k is not in [1, 20].
 */
export function topKDispatch(
  gpu: Gpu,
  bufs: TopKBuffers,
  shape: RowShape & { k: number },
): Dispatch {
  const { rows, vocab, k } = shape;
  if (!(Number.isInteger(k) && k >= 1 && k <= MAX_TOP_K)) {
    throw new Error(`internal error: top-k needs 1 <= k <= ${MAX_TOP_K}; got ${k}`);
  }
  checkRowBytes(gpu, rows * vocab * 4, "logits");
  const wg = shape.workgroupSize ?? rowWorkgroupSize(vocab);
  const pipe = pipeline(gpu, "logits.wgsl", { entryPoint: "top_k", constants: { WG: wg } });
  const dims = uniform(gpu, params([rows, vocab, k]));
  return {
    label: "top_k",
    pipeline: pipe,
    bindGroup: bindAt(gpu, pipe, [[0, dims], [1, bufs.logits], [2, bufs.stats], [3, bufs.out]]),
    workgroups: grid(rows),
  };
}
