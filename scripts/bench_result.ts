/**
 * What `deno task bench` measures: {@linkcode BenchResult}, which `--out` writes as JSON (its
 * field names are the JSON's). BENCHMARKS.md says what each number means.
 */
import type { KvDtype } from "../gpu/dtype.ts";
import type { DurationSummary } from "./bench_report.ts";
import type { StepProfile } from "./bench_profile.ts";

/** p50, p95 and max of `setTimeout(0)` times, ms. */
export type Lag = Pick<DurationSummary, "p50" | "p95" | "max">;

/** The `worker` measurements of `BenchOptions` (bench_options.ts). */
export interface WorkerResult {
  ttft_ms: number;
  decode_tok_s: Record<string, number>;
  /** `setTimeout(0)` on this thread while the worker decoded each batch, ms. */
  event_loop_lag_ms: Record<string, Lag>;
  sessions?: SessionsResult;
}

/** The `sessions` scenario of `BenchOptions` (bench_options.ts). */
export interface SessionsResult {
  sessions: number;
  /** Tokens per session turn. */
  turn_tokens: number;
  /** Decode rate of that generation, tokens/s. */
  decode_tok_s: number;
  /** `setTimeout(0)` while it ran, ms. */
  event_loop_lag_ms: Lag;
  /** Time to write the snapshots still pending when the generation ended, ms. */
  flush_ms: number;
  /** From the end of each session's last turn to its snapshot in the store, ms. */
  snapshot_lag_ms: { p50: number; max: number };
  /** The store's warm budget, MiB (`--kv-warm-mb`). */
  warm_mb: number;
  /**
   * Stored blocks in Deno KV and in files right after the flush, as the engine reports them (a
   * maintenance pass may still be moving some).
   */
  stored_blocks: { kv: number; fs: number };
}

/** What `runBench` (bench.ts) measured; written as JSON by `--out`. */
export interface BenchResult {
  model: string;
  adapter: string;
  /** Synthetic shape name, or null for a model folder. */
  shape: string | null;
  /** Whether the adapter is a CPU (llvmpipe, lavapipe), whose smaller defaults applied. */
  cpu_adapter: boolean;
  dtype: string;
  /** `--quantize`: what the projections ran as (none: as loaded). */
  quantize: string;
  /** Whether the 16-bit projections were kept for the monitor's fallback (`--quantize-fallback`). */
  quantize_fallback: boolean;
  /** Layers the precision monitor ran at their 16-bit weights when the run ended. */
  layers_16bit: number;
  /** Layers the monitor found out of range at least once (run quantized when the fallback is off). */
  layers_out_of_range: number;
  kv_dtype: KvDtype;
  /** `--kv-codec`: what blocks behind the hot window became ("none": nothing). */
  kv_codec: string;
  /** Tokens each sequence kept hot (0 without a codec). */
  kv_hot: number;
  /** Blocks re-encoded into codec blocks during the run. */
  kv_reencoded: number;
  /** Tokens the GPU pool holds with every block in use (hot and codec), and per GB of it. */
  kv_capacity_tokens: number;
  kv_tokens_per_gb: number;
  batch: number[];
  prompt_len: number;
  new_tokens: number;
  /** Prompt tokens per second of time to first token (batch 1, median of runs). */
  prefill_tok_s: number;
  /** Aggregate decode tokens per second, keyed by batch size. */
  decode_tok_s: Record<string, number>;
  ttft_ms: number;
  /**
   * Time to first token of prompts one to three tokens shorter than `prompt_len` (median): each
   * a length the engine has not seen, as most requests' are. Null for prompts under 4 tokens.
   */
  ttft_new_length_ms: number | null;
  /**
   * Time between deliveries at batch 1, ms: how long a streaming client waits between chunks
   * (tokens arrive in bursts of K per submission, so gaps between single tokens say little).
   */
  delivery_gap_ms_p50: number;
  delivery_gap_ms_p95: number;
  /** Median over submissions of (time since the previous burst) / (tokens in the burst). */
  step_ms_p50: number;
  /** Decode steps the engine queues on the GPU, in submissions of its maxSteps. */
  queue_depth: number;
  /** Prefill tokens per chunk (the engine's maxChunk). */
  max_chunk: number;
  /** Host time encoding and submitting, per decode step recorded, by batch size (ms). */
  host_ms_per_step: Record<string, number>;
  /**
   * How long a `setTimeout(0)` took while that batch decoded (p50 and p95, ms): how soon the
   * server can answer other requests during a generation (readbacks block the event loop).
   */
  event_loop_lag_ms: Record<string, Lag>;
  /** Tokens per delivery burst at batch 1, in order (the first is the prefill's token). */
  bursts: number[];
  bytes_per_token: number;
  weight_bytes_per_token: number;
  kv_bytes_per_token: number;
  mean_context: number;
  read_bandwidth_gb_s: number;
  read_bandwidth_method: "timestamp" | "wall";
  read_bandwidth_bytes: number;
  /** bytes_per_token × decode_tok_s[1] / read bandwidth. */
  roofline_fraction: number;
  /** The `--sessions` scenario, when run. */
  sessions?: SessionsResult;
  /** The same measurements with the engine in a worker (`--worker`). */
  worker?: WorkerResult;
  /** Per-kernel GPU time of one decode step per batch size, then of one prefill chunk (`profile`). */
  profile?: StepProfile[];
  date: string;
  deno: string;
}
