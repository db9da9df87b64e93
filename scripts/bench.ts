/**
 * `deno task bench`: prefill and decode speed of the engine, measured against the read bandwidth
 * of the same GPU in the same run (the roofline). See BENCHMARKS.md for what each number means.
 *
 *   deno task bench [--model DIR | --shape tinyllama-1.1b|tiny] [--batch 1,8,32]
 *     [--prompt-len 128] [--new-tokens 256] [--dtype f16|bf16] [--kv-dtype f32|f16] [--profile]
 *     [--queue-depth N]
 *     [--max-chunk N] [--sessions N] [--kv-warm-mb N] [--worker]
 *     [--out FILE]
 *
 * The table goes to stdout, progress to stderr (TTY only), and with `--out` a JSON object.
 */
import { parseArgs } from "node:util";
import { Engine, type HostStats } from "../engine/engine.ts";
import { getGpu, type Gpu } from "../gpu/device.ts";
import { syntheticModel } from "../engine/model/synthetic.ts";
import { BLOCK } from "../engine/kv/blocks.ts";
import { SessionStore } from "../engine/sessions/store.ts";
import { type KvDtype, parseKvDtype } from "../gpu/dtype.ts";
import { status } from "../engine/model/progress.ts";
import { type EngineLike, sampling, type SamplingOptions } from "../api/types.ts";
import { WorkerEngine } from "../engine/worker/host.ts";
import { defaultReadBytes, measureReadBandwidth } from "../kernels/read_bandwidth.ts";
import { profileDecodeStep, profilePrefill, type StepProfile } from "./bench_profile.ts";
import {
  bursts,
  type BytesPerToken,
  bytesPerToken,
  decodeRate,
  formatTable,
  percentile,
  type Timed,
} from "./bench_report.ts";

/** The embedded default model (also the tokenizer of the synthetic shapes). */
export const DEFAULT_MODEL = new URL("../models/strata-default", import.meta.url).pathname;

/** Options of {@linkcode runBench}; the CLI flags in camelCase. */
export interface BenchOptions {
  /** Model folder (default: the embedded models/strata-default). Excludes `shape`. */
  model?: string;
  /** A synthetic shape of engine/model/synthetic.ts (random weights on the GPU) instead of a folder. */
  shape?: string;
  /** Batch sizes for decode (default [1, 8, 32]); batch 1 is always measured. */
  batch?: number[];
  /** Prompt tokens (default 128). */
  promptLen?: number;
  /** Tokens generated per request (default 256, at least 2). */
  newTokens?: number;
  /** Weight dtype of a synthetic shape (default f16). */
  dtype?: "f16" | "bf16";
  /** Element type of the KV cache (default f32, the engine's). */
  kvDtype?: KvDtype;
  /** Also time each kernel of one decode step (needs `timestamp-query`). */
  profile?: boolean;
  /** Bytes the bandwidth kernel reads (default 1 GiB; 64 MiB on CPU adapters). */
  readBytes?: number;
  /** Prefill runs to take the median of (default 3). */
  prefillRuns?: number;
  /** The engine's `queueDepth` (default: the engine's). */
  queueDepth?: number;
  /** The engine's `maxChunk`, prefill tokens per chunk (default: the engine's). */
  maxChunk?: number;
  /**
   * Also run one more generation of `newTokens` tokens while this many sessions take two turns
   * each beside it (half a prompt, then 16 tokens more; `newTokens / 4` tokens each, at most
   * 32), every turn snapshotted to a Deno KV store in a temporary folder (default 0: not run).
   */
  sessions?: number;
  /**
   * Packed KV blocks the sessions scenario's store keeps in Deno KV, MiB, as `serve
   * --kv-warm-mb` (default 512); past that, its blocks move to files in a folder beside it.
   */
  kvWarmMb?: number;
  /**
   * Also measure the time to first token, decode at every batch size and the sessions scenario
   * with a second engine in a worker thread, as `deno task start` serves (engine/worker/host.ts):
   * its tokens reach this thread by message, and its GPU waits do not block this event loop.
   */
  worker?: boolean;
  gpu?: Gpu;
}

/** The `worker` measurements of {@linkcode BenchOptions}. */
export interface WorkerResult {
  ttft_ms: number;
  decode_tok_s: Record<string, number>;
  /** `setTimeout(0)` on this thread while the worker decoded each batch, ms. */
  event_loop_lag_ms: Record<string, { p50: number; p95: number; max: number }>;
  sessions?: SessionsResult;
}

/** The `sessions` scenario of {@linkcode BenchOptions}. */
export interface SessionsResult {
  sessions: number;
  /** Tokens per session turn. */
  turn_tokens: number;
  /** Decode rate of that generation, tokens/s. */
  decode_tok_s: number;
  /** `setTimeout(0)` while it ran, ms. */
  event_loop_lag_ms: { p50: number; p95: number; max: number };
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

/** What {@linkcode runBench} measured; written as JSON by `--out`. */
export interface BenchResult {
  model: string;
  adapter: string;
  /** Synthetic shape name, or null for a model folder. */
  shape: string | null;
  dtype: string;
  kv_dtype: KvDtype;
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
  /** Inter-token delivery times at batch 1 (tokens arrive in bursts of K per submission). */
  ms_per_token_p50: number;
  ms_per_token_p95: number;
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
  event_loop_lag_ms: Record<string, { p50: number; p95: number; max: number }>;
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

/**
 * Loads (or synthesises) the model, measures read bandwidth, warms up, then measures prefill,
 * time to first token and decode at every batch size, and optionally profiles one decode step.
 *
 * @throws Error for contradictory or out-of-range options, with the flag to fix.
 * @example
 * const r = await runBench({ shape: "tiny", batch: [1, 2], promptLen: 8, newTokens: 8 });
 * console.log(formatTable(r));
 */
export async function runBench(options: BenchOptions = {}): Promise<BenchResult> {
  const o = checkOptions(options);
  const gpu = options.gpu ?? await getGpu();
  // The sessions scenario snapshots into a store of its own, removed afterwards.
  const dir = o.sessions > 0 ? await Deno.makeTempDir({ prefix: "strata-bench-" }) : undefined;
  const warmBytes = o.kvWarmMb * 2 ** 20;
  const store = dir ? await SessionStore.open(`${dir}/sessions.sqlite3`, { warmBytes }) : undefined;
  try {
    return await measure(o, gpu, store, dir && `${dir}/worker.sqlite3`);
  } finally {
    store?.close();
    if (dir) await Deno.remove(dir, { recursive: true });
  }
}

/**
 * {@linkcode runBench}'s work, with the engine's session store when the options ask for one (and
 * the worker engine's, at `workerKv`).
 */
async function measure(
  o: Checked,
  gpu: Gpu,
  store?: SessionStore,
  workerKv?: string,
): Promise<BenchResult> {
  const maxBatch = Math.max(...o.batch);
  const context = o.promptLen + o.newTokens;
  const engineOptions = {
    gpu,
    maxSlots: maxBatch,
    maxQueued: maxBatch + o.sessions,
    contextLength: context,
    // Every request of the largest batch at once, each with its trash-column spare.
    kvBlocks: maxBatch * (Math.ceil(context / BLOCK) + 1) + 2,
    queueDepth: o.queueDepth,
    maxChunk: o.maxChunk,
    kvDtype: o.kvDtype,
    store,
  };
  status(`bench: loading ${o.shape ? `shape ${o.shape} (${o.dtype})` : o.model}`);
  const engine = o.shape
    ? Engine.create(
      gpu,
      await syntheticModel(gpu, o.shape, { dtype: o.dtype, tokenizerDir: DEFAULT_MODEL }),
      engineOptions,
    )
    : await Engine.load(o.model, engineOptions);
  const cfg = engine.config;
  if (engine.kvStats().gpu.total < maxBatch * Math.ceil(context / BLOCK)) {
    status(`bench: the KV pool cannot hold batch ${maxBatch} at once; it will queue`, true);
  }

  status(`bench: read bandwidth (${(o.readBytes ?? defaultReadBytes(gpu)) / 2 ** 20} MiB)`);
  const bw = await measureReadBandwidth(gpu, { bytes: o.readBytes });

  const vocab = Math.min(cfg.vocabSize, engine.tokenizer.vocabSize);
  const d = await decodeRuns(engine, o, vocab);
  const sessions = o.sessions > 0 ? await sessionsScenario(engine, o, vocab) : undefined;
  const arrivals = d.batch1.arrivals;
  const gaps = arrivals.slice(1).map((t, i) => t - arrivals[i]);
  const groups = bursts(arrivals);
  const stepMs = groups.slice(1).map((g, i) => (g.start - groups[i].end) / g.tokens);

  let worker: WorkerResult | undefined;
  if (o.worker) {
    status("bench: loading the same model into an engine in a worker");
    const { gpu: _, store: __, ...rest } = engineOptions;
    const w = await WorkerEngine.load(
      o.shape ? { shape: o.shape, dtype: o.dtype, tokenizerDir: DEFAULT_MODEL } : { dir: o.model },
      { ...rest, kvPath: workerKv, kvWarmBytes: o.kvWarmMb * 2 ** 20 },
    );
    try {
      const wd = await decodeRuns(w, o, vocab, "worker: ");
      worker = {
        ttft_ms: wd.ttft,
        decode_tok_s: wd.decode,
        event_loop_lag_ms: wd.lag,
        ...(o.sessions > 0 ? { sessions: await sessionsScenario(w, o, vocab, "worker: ") } : {}),
      };
    } finally {
      await w.close();
    }
  }

  let profile: StepProfile[] | undefined;
  if (o.profile) {
    if (!gpu.hasTimestamps) {
      status(`bench: --profile needs timestamp-query; ${gpu.adapterName} has none`, true);
    } else {
      profile = [];
      for (const b of o.batch) {
        status(`bench: profiling one decode step at batch ${b}`);
        const meanContext = Math.round(o.promptLen + o.newTokens / 2);
        profile.push(await profileDecodeStep(engine, { slots: b, context: meanContext }));
      }
      const tokens = Math.min(o.promptLen, engine.opts.maxChunk);
      status(`bench: profiling one prefill chunk of ${tokens} tokens`);
      profile.push(await profilePrefill(engine, { tokens }));
    }
  }

  const meanContext = o.promptLen + o.newTokens / 2;
  const bytes: BytesPerToken = bytesPerToken(cfg, engine.weights, meanContext, o.kvDtype);
  return {
    model: engine.modelId,
    adapter: engine.adapterName,
    shape: o.shape ?? null,
    dtype: engine.weights.dtype,
    kv_dtype: o.kvDtype,
    batch: o.batch,
    prompt_len: o.promptLen,
    new_tokens: o.newTokens,
    prefill_tok_s: o.promptLen / (d.ttft / 1000),
    decode_tok_s: d.decode,
    ttft_ms: d.ttft,
    ttft_new_length_ms: d.fresh.length ? percentile(d.fresh, 50) : null,
    ms_per_token_p50: percentile(gaps, 50),
    ms_per_token_p95: percentile(gaps, 95),
    step_ms_p50: percentile(stepMs, 50),
    queue_depth: engine.opts.queueDepth,
    max_chunk: engine.opts.maxChunk,
    host_ms_per_step: d.hostMs,
    event_loop_lag_ms: d.lag,
    bursts: groups.map((g) => g.tokens),
    bytes_per_token: bytes.total,
    weight_bytes_per_token: bytes.weights,
    kv_bytes_per_token: bytes.kv,
    mean_context: bytes.meanContext,
    read_bandwidth_gb_s: bw.gbPerS,
    read_bandwidth_method: bw.method,
    read_bandwidth_bytes: bw.bytes,
    roofline_fraction: (bytes.total * d.decode[1]) / (bw.gbPerS * 1e9),
    ...(sessions ? { sessions } : {}),
    ...(worker ? { worker } : {}),
    ...(profile ? { profile } : {}),
    date: new Date().toISOString(),
    deno: Deno.version.deno,
  };
}

/** What {@linkcode decodeRuns} measured. */
interface DecodeRuns {
  ttft: number;
  fresh: number[];
  decode: Record<string, number>;
  hostMs: Record<string, number>;
  lag: Record<string, { p50: number; p95: number; max: number }>;
  batch1: Timed;
}

/** Warms `engine` up, then times its first token and its decode at every batch size. */
async function decodeRuns(
  engine: EngineLike & { hostStats(): HostStats | Promise<HostStats> },
  o: Checked,
  vocab: number,
  label = "",
): Promise<DecodeRuns> {
  const prompts = promptMaker(vocab, o.promptLen);
  const generateAll = (batch: number, tokens: number) =>
    Promise.all(Array.from({ length: batch }, () => timed(engine, prompts(), tokens)));

  status(`bench: ${label}warming up (pipelines compile on first use)`);
  await generateAll(1, 1);
  for (const b of o.batch) await generateAll(b, Math.min(o.newTokens, 64));

  status(`bench: ${label}prefill of ${o.promptLen} tokens x${o.prefillRuns}`);
  const ttfts: number[] = [];
  for (let i = 0; i < o.prefillRuns; i++) {
    const [r] = await generateAll(1, 1);
    ttfts.push(r.arrivals[0] - r.t0);
  }
  const fresh: number[] = [];
  for (let i = 1; i <= 3 && o.promptLen > 3; i++) {
    const r = await timed(engine, prompts().slice(i), 1);
    fresh.push(r.arrivals[0] - r.t0);
  }

  const decode: Record<string, number> = {};
  const hostMs: Record<string, number> = {};
  let batch1: Timed | undefined;
  const lag: DecodeRuns["lag"] = {};
  for (const b of o.batch) {
    status(`bench: ${label}decode, batch ${b} x ${o.newTokens} tokens`);
    const before = await engine.hostStats();
    const probe = lagProbe();
    const runs = await generateAll(b, o.newTokens);
    const lags = await probe.stop();
    lag[b] = lagSummary(lags);
    decode[b] = decodeRate(runs);
    const after = await engine.hostStats();
    hostMs[b] = (after.ms - before.ms) / Math.max(1, after.steps - before.steps);
    if (b === 1) batch1 = runs[0];
  }
  return { ttft: percentile(ttfts, 50), fresh, decode, hostMs, lag, batch1: batch1! };
}

/** The `--sessions` scenario (see {@linkcode BenchOptions.sessions}). */
async function sessionsScenario(
  engine: EngineLike & { flushSnapshots(): Promise<void> },
  o: Checked,
  vocab: number,
  label = "",
): Promise<SessionsResult> {
  // Its own prompts: sessions must not find the decode runs' blocks by hash.
  const prompts = promptMaker(vocab, o.promptLen, 0xfeed);
  // Turns that fit the context: half a prompt and `turn` tokens, then 16 more and `turn` more.
  const turn = Math.max(2, Math.min(32, Math.floor(o.newTokens / 4)));
  status(`bench: ${label}${o.newTokens} tokens while ${o.sessions} sessions take two turns each`);
  const lags = lagProbe();
  const long = timed(engine, prompts(), o.newTokens);
  const turns = Array.from({ length: o.sessions }, async (_, i) => {
    const id = `bench-${i}`, first = prompts().slice(0, Math.ceil(o.promptLen / 2));
    const said = await timed(engine, first, turn, id);
    await timed(engine, [...first, ...said.ids, ...prompts().slice(0, BLOCK)], turn, id);
  });
  const [r] = await Promise.all([long, ...turns]);
  const lag = await lags.stop();
  const t = performance.now();
  await engine.flushSnapshots();
  const flushMs = performance.now() - t;
  const snapLag = Array.from({ length: o.sessions }, (_, i) => {
    const s = engine.session(`bench-${i}`);
    return s?.persistedAt ? s.persistedAt - s.updatedAt : NaN;
  });
  return {
    sessions: o.sessions,
    turn_tokens: turn,
    decode_tok_s: decodeRate([r!]),
    event_loop_lag_ms: lagSummary(lag),
    flush_ms: flushMs,
    snapshot_lag_ms: { p50: percentile(snapLag, 50), max: Math.max(...snapLag) },
    warm_mb: o.kvWarmMb,
    stored_blocks: { kv: engine.kvStats().kv.used, fs: engine.kvStats().fs.used },
  };
}

/** p50, p95 and max of {@linkcode lagProbe}'s samples. */
function lagSummary(lags: number[]): { p50: number; p95: number; max: number } {
  return { p50: percentile(lags, 50), p95: percentile(lags, 95), max: Math.max(...lags) };
}

/** Records how long `setTimeout(0)` takes, over and over, until `stop`. */
export function lagProbe(): { stop: () => Promise<number[]> } {
  const lags: number[] = [];
  let running = true;
  const loop = (async () => {
    while (running) {
      const t = performance.now();
      await new Promise((r) => setTimeout(r, 0));
      lags.push(performance.now() - t);
    }
  })();
  return {
    stop: async () => {
      running = false;
      await loop;
      return lags;
    },
  };
}

type Checked =
  & Required<Omit<BenchOptions, "shape" | "gpu" | "readBytes" | "queueDepth" | "maxChunk">>
  & {
    shape?: string;
    readBytes?: number;
    queueDepth?: number;
    maxChunk?: number;
  };

function checkOptions(o: BenchOptions): Checked {
  if (o.model !== undefined && o.shape !== undefined) {
    throw new Error("give --model DIR or --shape NAME, not both");
  }
  if (o.dtype !== undefined && o.shape === undefined) {
    throw new Error("--dtype applies to --shape only (a model folder has its own dtype)");
  }
  if (o.dtype !== undefined && o.dtype !== "f16" && o.dtype !== "bf16") {
    throw new Error(`--dtype must be f16 or bf16; got '${o.dtype}'`);
  }
  const batch = [...new Set([1, ...(o.batch ?? [1, 8, 32])])].sort((a, b) => a - b);
  for (const b of batch) {
    if (!Number.isInteger(b) || b < 1) throw new Error(`--batch sizes must be ≥ 1; got ${b}`);
  }
  const c: Checked = {
    model: o.model ?? DEFAULT_MODEL,
    shape: o.shape,
    batch,
    promptLen: o.promptLen ?? 128,
    newTokens: o.newTokens ?? 256,
    dtype: o.dtype ?? "f16",
    kvDtype: parseKvDtype(o.kvDtype),
    profile: o.profile ?? false,
    readBytes: o.readBytes,
    prefillRuns: o.prefillRuns ?? 3,
    queueDepth: o.queueDepth,
    maxChunk: o.maxChunk,
    sessions: o.sessions ?? 0,
    kvWarmMb: o.kvWarmMb ?? 512,
    worker: o.worker ?? false,
  };
  if (!(Number.isInteger(c.kvWarmMb) && c.kvWarmMb >= 0)) {
    throw new Error(`--kv-warm-mb must be an integer ≥ 0; got ${c.kvWarmMb}`);
  }
  if (!(Number.isInteger(c.sessions) && c.sessions >= 0)) {
    throw new Error(`--sessions must be an integer ≥ 0; got ${c.sessions}`);
  }
  if (c.maxChunk !== undefined && !(Number.isInteger(c.maxChunk) && c.maxChunk >= 1)) {
    throw new Error(`--max-chunk must be an integer ≥ 1; got ${c.maxChunk}`);
  }
  if (c.queueDepth !== undefined && !(Number.isInteger(c.queueDepth) && c.queueDepth >= 1)) {
    throw new Error(`--queue-depth must be an integer ≥ 1; got ${c.queueDepth}`);
  }
  if (!Number.isInteger(c.promptLen) || c.promptLen < 1) {
    throw new Error(`--prompt-len must be an integer ≥ 1; got ${c.promptLen}`);
  }
  if (!Number.isInteger(c.newTokens) || c.newTokens < 2) {
    throw new Error(
      `--new-tokens must be an integer ≥ 2 (decode is timed between tokens); got ${c.newTokens}`,
    );
  }
  return c;
}

/** Greedy sampling that never stops early: every request produces exactly `maxTokens`. */
function greedy(maxTokens: number): SamplingOptions {
  return sampling({ maxTokens, stopAtEos: false });
}

/** Runs one request and records when each token reached the caller. */
async function timed(
  engine: EngineLike,
  promptIds: number[],
  maxTokens: number,
  sessionId?: string,
): Promise<Timed & { ids: number[] }> {
  const t0 = performance.now();
  const gen = engine.generate({ promptIds, sampling: greedy(maxTokens), sessionId });
  const arrivals: number[] = [], ids: number[] = [];
  for await (const t of gen) {
    arrivals.push(performance.now());
    ids.push(t.id);
  }
  const r = await gen.result;
  if (arrivals.length !== maxTokens) {
    throw new Error(
      `internal error: asked for ${maxTokens} tokens, got ${arrivals.length} (${r.finishReason})`,
    );
  }
  return { t0, arrivals, ids };
}

/**
 * Random prompts of `len` ids below `vocab`, a different one each call: identical prompts would
 * share cached KV blocks and skip prefill. `seed` picks the sequence of prompts.
 */
export function promptMaker(vocab: number, len: number, seed = 0x5eed): () => number[] {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = Math.imul(a ^ (a >>> 15), a | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return () => Array.from({ length: len }, () => Math.floor(next() * vocab));
}

function parseList(flag: string, v: string): number[] {
  return v.split(",").map((s) => {
    const n = Number(s.trim());
    if (!Number.isInteger(n) || n < 1) {
      throw new Error(`--${flag} takes positive integers separated by commas; got '${v}'`);
    }
    return n;
  });
}

function intFlag(flag: string, v: string | undefined): number | undefined {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (!Number.isInteger(n)) throw new Error(`--${flag} must be an integer; got '${v}'`);
  return n;
}

const USAGE = `usage: deno task bench [--model DIR | --shape tinyllama-1.1b|tiny] [--batch 1,8,32]
  [--prompt-len 128] [--new-tokens 256] [--dtype f16|bf16] [--kv-dtype f32|f16] [--profile]
  [--read-mib N] [--queue-depth N] [--max-chunk N] [--sessions N] [--kv-warm-mb N] [--worker]
  [--out FILE]`;

/** The CLI: parses flags, runs the bench, prints the table, writes `--out`. */
export async function main(args: string[]): Promise<void> {
  const { values: v } = parseArgs({
    args,
    options: {
      model: { type: "string" },
      shape: { type: "string" },
      batch: { type: "string" },
      "prompt-len": { type: "string" },
      "new-tokens": { type: "string" },
      dtype: { type: "string" },
      "kv-dtype": { type: "string" },
      profile: { type: "boolean" },
      "read-mib": { type: "string" },
      "queue-depth": { type: "string" },
      "max-chunk": { type: "string" },
      sessions: { type: "string" },
      "kv-warm-mb": { type: "string" },
      worker: { type: "boolean" },
      out: { type: "string" },
      help: { type: "boolean", short: "h" },
    },
  });
  if (v.help) return console.log(USAGE);
  const readMib = intFlag("read-mib", v["read-mib"]);
  const result = await runBench({
    model: v.model,
    shape: v.shape,
    batch: v.batch === undefined ? undefined : parseList("batch", v.batch),
    promptLen: intFlag("prompt-len", v["prompt-len"]),
    newTokens: intFlag("new-tokens", v["new-tokens"]),
    dtype: v.dtype as BenchOptions["dtype"],
    kvDtype: v["kv-dtype"] as KvDtype | undefined,
    profile: v.profile,
    readBytes: readMib === undefined ? undefined : readMib * 2 ** 20,
    queueDepth: intFlag("queue-depth", v["queue-depth"]),
    maxChunk: intFlag("max-chunk", v["max-chunk"]),
    sessions: intFlag("sessions", v.sessions),
    kvWarmMb: intFlag("kv-warm-mb", v["kv-warm-mb"]),
    worker: v.worker,
  });
  console.log(formatTable(result));
  if (v.out) {
    await Deno.writeTextFile(v.out, JSON.stringify(result, null, 2) + "\n");
    status(`bench: wrote ${v.out}`);
  }
}

if (import.meta.main) {
  try {
    await main(Deno.args);
    Deno.exit(0); // the GPU device keeps the event loop alive
  } catch (e) {
    console.error(`bench: ${(e as Error).message}`);
    Deno.exit(1);
  }
}
