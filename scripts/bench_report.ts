/**
 * The bench's arithmetic and its table: decode rate from token arrival times, delivery bursts,
 * percentiles, bytes a decode step must read, and the stdout report.
 */
import type { ModelConfig } from "../engine/model/config.ts";
import type { ModelWeights } from "../engine/model/weights.ts";
import { BYTES, KV_BYTES, type KvDtype } from "../gpu/dtype.ts";
import type { BenchResult, SessionsResult } from "./bench_result.ts";
import { formatProfile } from "./bench_profile.ts";

/** One request as the caller saw it: when it was submitted and when each token arrived (ms). */
export interface Timed {
  t0: number;
  arrivals: number[];
}

/** Tokens delivered together (one submission's ring readback, or several read at once). */
export interface Burst {
  tokens: number;
  /** Arrival of its first and last token (ms). */
  start: number;
  end: number;
}

/**
 * Arrivals closer than this (ms) belong to one burst. Tokens of one submission are handed over
 * in a single run of microtasks (microseconds apart); submissions are at least a decode step
 * apart, and the scheduler yields to the event loop (≈ 2 ms) between readbacks.
 */
export const BURST_GAP_MS = 1;

/** Groups arrival times (ascending, ms) into delivery bursts. */
export function bursts(arrivals: number[]): Burst[] {
  const out: Burst[] = [];
  for (const t of arrivals) {
    const last = out.at(-1);
    if (last && t - last.end < BURST_GAP_MS) {
      last.tokens++;
      last.end = t;
    } else out.push({ tokens: 1, start: t, end: t });
  }
  return out;
}

/**
 * Aggregate decode tokens per second of concurrent requests, in steady state: from the delivery
 * that completes the last first token (every prefill done) to the last token of any request,
 * counting the tokens delivered after it. Tokens delivered together with a first token are not
 * counted: when their computation started is unknown.
 *
 * @throws Error when no delivery follows the window's start (too few new tokens to time).
 */
export function decodeRate(runs: Timed[]): number {
  const all = runs.flatMap((r) => r.arrivals).sort((a, b) => a - b);
  const lastFirst = Math.max(...runs.map((r) => r.arrivals[0]));
  const open = bursts(all).find((b) => b.end >= lastFirst)!.end;
  const close = all.at(-1)!;
  const count = all.filter((t) => t > open).length;
  if (count === 0 || !(close > open)) {
    throw new Error(
      "decode could not be timed: no tokens were delivered after the first ones " +
        "(raise --new-tokens)",
    );
  }
  return count / ((close - open) / 1000);
}

/** The p-th percentile (0..100) by linear interpolation; 0 for an empty list. */
export function percentile(values: number[], p: number): number {
  if (values.length === 0) return 0;
  const s = [...values].sort((a, b) => a - b);
  const x = (p / 100) * (s.length - 1);
  const i = Math.floor(x);
  return i + 1 < s.length ? s[i] + (s[i + 1] - s[i]) * (x - i) : s[i];
}

/** p50, p95 and max of some durations (ms), and how many there were. */
export interface DurationSummary {
  p50: number;
  p95: number;
  max: number;
  count: number;
}

/**
 * Durations (ms) counted in fixed log-spaced bins, {@linkcode DurationHistogram.PER_DECADE} per
 * decade from 1 µs to 1000 s: its memory stays the same however long a run records. (A list of
 * every event-loop sample grew to ~200 000 numbers in a 20-minute bench and overflowed the stack
 * in `Math.max(...list)`.) Percentiles are exact to a bin's width, 2.3 %; count and max are exact.
 */
export class DurationHistogram {
  static readonly PER_DECADE = 100;
  static readonly MIN_MS = 1e-3;
  static readonly DECADES = 9;
  /** Bin 0 holds what is under MIN_MS, the last what is over 1000 s. */
  readonly #bins = new Float64Array(DurationHistogram.PER_DECADE * DurationHistogram.DECADES + 2);
  #count = 0;
  #min = Infinity;
  #max = 0;

  /** Counts one duration. */
  add(ms: number): void {
    const { PER_DECADE, MIN_MS } = DurationHistogram;
    const x = Math.floor(Math.log10(ms / MIN_MS) * PER_DECADE) + 1;
    this.#bins[Math.min(Math.max(Number.isFinite(x) ? x : 0, 0), this.#bins.length - 1)]++;
    this.#count++;
    this.#min = Math.min(this.#min, ms);
    this.#max = Math.max(this.#max, ms);
  }

  /**
   * The p-th percentile (0..100): the geometric middle of the bin of the sample that
   * {@linkcode percentile} would pick first, clamped to the smallest and largest seen (which p0
   * and p100 are exactly); 0 when empty.
   */
  percentile(p: number): number {
    if (this.#count === 0) return 0;
    const { PER_DECADE, MIN_MS } = DurationHistogram;
    const rank = Math.floor((p / 100) * (this.#count - 1));
    if (rank <= 0) return this.#min;
    if (rank >= this.#count - 1) return this.#max;
    let seen = 0, bin = 0;
    while (seen + this.#bins[bin] <= rank) seen += this.#bins[bin++];
    const middle = MIN_MS * 10 ** ((bin - 0.5) / PER_DECADE);
    return Math.min(Math.max(middle, this.#min), this.#max);
  }

  summary(): DurationSummary {
    const max = this.#max;
    return { p50: this.percentile(50), p95: this.percentile(95), max, count: this.#count };
  }
}

/** Bytes one batch-1 decode step reads from GPU memory. */
export interface BytesPerToken {
  /** Every matrix once (the LM head included), one embedding row, the norm weights. */
  weights: number;
  /** K and V of every layer over `meanContext` positions (f32 cache). */
  kv: number;
  total: number;
  meanContext: number;
}

/**
 * What a batch-1 decode step must read at a mean context of `meanContext` tokens: the lower
 * bound on its memory traffic, and so the numerator of the roofline.
 */
export function bytesPerToken(
  cfg: ModelConfig,
  w: Pick<ModelWeights, "dtype"> & { decodeBytes?: number },
  meanContext: number,
  kvDtype: KvDtype = "f32",
): BytesPerToken {
  const b = BYTES[w.dtype];
  const { hiddenSize: H, nHeads, nKvHeads, headDim: D, intermediateSize: F, nLayers: L } = cfg;
  const perLayer = (nHeads + 2 * nKvHeads) * D * H + H * nHeads * D + 2 * F * H + H * F;
  // The engine's count when given (quantized projections read their codes and scales).
  const weights = w.decodeBytes ??
    (L * perLayer + cfg.vocabSize * H + H) * b + (2 * L + 1) * H * 4;
  const kv = L * 2 * nKvHeads * D * KV_BYTES[kvDtype] * meanContext;
  return { weights, kv, total: weights + kv, meanContext };
}

/** "1.23 GB", "4.5 MB", "512 B". */
export function formatBytes(n: number): string {
  if (n >= 1e9) return `${(n / 1e9).toFixed(2)} GB`;
  if (n >= 1e6) return `${(n / 1e6).toFixed(1)} MB`;
  if (n >= 1e3) return `${(n / 1e3).toFixed(1)} kB`;
  return `${n} B`;
}

/** Burst sizes with runs compressed: [1, 1, 2, 32, 32, 32] → "1,1,2,32×3". */
export function formatBursts(sizes: number[]): string {
  const parts: string[] = [];
  for (let i = 0; i < sizes.length;) {
    let j = i;
    while (j < sizes.length && sizes[j] === sizes[i]) j++;
    parts.push(j - i > 2 ? `${sizes[i]}×${j - i}` : sizes.slice(i, j).join(","));
    i = j;
  }
  return parts.join(",");
}

/** `setTimeout(0)` p50 / p95 / max per batch size. */
function lagRow(
  batch: number[],
  lag: Record<string, { p50: number; p95: number; max: number }>,
): string {
  return batch.map((b) => {
    const l = lag[b];
    return l ? [l.p50, l.p95, l.max].map((x) => x.toFixed(1)).join(" / ") : "-";
  }).join(", ") + ` ms  (batch ${batch.join(", ")})`;
}

/** The rows of the `--sessions` scenario. */
function sessionRows(s: SessionsResult, newTokens: number, indent = ""): [string, string][] {
  const l = s.event_loop_lag_ms;
  return [
    [
      `${indent}decode beside ${s.sessions} sessions' turns`,
      `${s.decode_tok_s.toFixed(1)} tok/s  (${newTokens} tokens; turns of ${s.turn_tokens})`,
    ],
    [
      `${indent}  event-loop lag p50 / p95 / max`,
      `${l.p50.toFixed(1)} / ${l.p95.toFixed(1)} / ${l.max.toFixed(1)} ms`,
    ],
    [`${indent}  snapshots pending at its end`, `${s.flush_ms.toFixed(1)} ms to write`],
    [
      `${indent}  turn end to snapshot stored p50 / max`,
      `${s.snapshot_lag_ms.p50.toFixed(0)} / ${s.snapshot_lag_ms.max.toFixed(0)} ms`,
    ],
    [
      `${indent}  blocks stored in Deno KV / files`,
      `${s.stored_blocks.kv} / ${s.stored_blocks.fs}  (warm budget ${s.warm_mb} MiB)`,
    ],
  ];
}

/** The human-readable report (stdout). */
export function formatTable(r: BenchResult): string {
  const rows: [string, string][] = [
    [`prefill (${r.prompt_len}-token prompt, batch 1)`, `${r.prefill_tok_s.toFixed(1)} tok/s`],
    ["time to first token (batch 1)", `${r.ttft_ms.toFixed(1)} ms`],
    ...(r.ttft_new_length_ms === null ? [] : [[
      "  at a prompt length not seen before",
      `${r.ttft_new_length_ms.toFixed(1)} ms`,
    ] as [string, string]]),
  ];
  for (const b of r.batch) {
    const agg = b > 1 ? "  (aggregate)" : "";
    rows.push([`decode, batch ${b}`, `${r.decode_tok_s[b].toFixed(1)} tok/s${agg}`]);
  }
  rows.push(
    [
      "time between deliveries p50 / p95 (batch 1)",
      `${r.delivery_gap_ms_p50.toFixed(2)} / ${r.delivery_gap_ms_p95.toFixed(2)} ms`,
    ],
    [
      "step time p50 (burst gap / K, batch 1)",
      `${r.step_ms_p50.toFixed(2)} ms  (bursts ${formatBursts(r.bursts)})`,
    ],
    [
      "host encode + submit per step",
      r.batch.map((b) => `${(r.host_ms_per_step[b] ?? 0).toFixed(2)}`).join(" / ") +
      ` ms  (batch ${r.batch.join(" / ")})`,
    ],
    ["event-loop lag p50 / p95 / max while decoding", lagRow(r.batch, r.event_loop_lag_ms)],
    [
      "bytes per token (batch 1)",
      `${formatBytes(r.bytes_per_token)}  (weights ${formatBytes(r.weight_bytes_per_token)}` +
      ` + KV ${formatBytes(r.kv_bytes_per_token)} at mean context ${r.mean_context})`,
    ],
    [
      `read bandwidth (WGSL, ${r.read_bandwidth_bytes / 2 ** 20} MiB)`,
      `${r.read_bandwidth_gb_s.toFixed(2)} GB/s  (${r.read_bandwidth_method})`,
    ],
    ["roofline fraction (batch 1)", r.roofline_fraction.toFixed(4)],
  );
  if (r.sessions) rows.push(...sessionRows(r.sessions, r.new_tokens));
  const w = r.worker;
  if (w) {
    rows.push(["engine in a worker: time to first token", `${w.ttft_ms.toFixed(1)} ms`]);
    for (const b of r.batch) {
      const agg = b > 1 ? "  (aggregate)" : "";
      rows.push([`  decode, batch ${b}`, `${w.decode_tok_s[b].toFixed(1)} tok/s${agg}`]);
    }
    rows.push(["  event-loop lag p50 / p95 / max", lagRow(r.batch, w.event_loop_lag_ms)]);
    if (w.sessions) rows.push(...sessionRows(w.sessions, r.new_tokens, "  "));
  }
  const width = Math.max(...rows.map(([k]) => k.length)) + 2;
  const lines = [
    `strata bench: ${r.model} on ${r.adapter}, Deno ${r.deno}, ${r.date}`,
    `prompt ${r.prompt_len} tokens, ${r.new_tokens} new tokens per request, ` +
    `batch ${r.batch.join(",")}, ${r.dtype} weights` +
    (r.quantize !== "none"
      ? r.quantize_fallback
        ? ` (projections ${r.quantize}, ${r.layers_16bit} layers at 16 bits by the monitor)`
        : ` (projections ${r.quantize}, fallback off: every layer at 8 bits; ` +
          `${r.layers_out_of_range} out of the monitor's range)`
      : "") +
    `, ${r.kv_dtype} KV cache` +
    (r.kv_codec !== "none"
      ? ` (${r.kv_codec} behind the newest ${r.kv_hot} tokens, ${r.kv_reencoded} blocks ` +
        `re-encoded)`
      : "") +
    `, ${Math.round(r.kv_tokens_per_gb)} tokens per GB of KV`,
    ...(r.cpu_adapter
      ? ["(a CPU adapter: flags not given took its smaller defaults; see deno task bench --help)"]
      : []),
    "",
    `${"metric".padEnd(width)}value`,
    ...rows.map(([k, v]) => `${k.padEnd(width)}${v}`),
  ];
  for (const p of r.profile ?? []) lines.push("", formatProfile(p));
  return lines.join("\n");
}
