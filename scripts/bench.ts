/**
 * `deno task bench`: prefill and decode speed of the engine, measured against the read bandwidth
 * of the same GPU in the same run (the roofline). See BENCHMARKS.md for what each number means;
 * `deno task bench --help` (scripts/bench_options.ts) for the flags and their defaults, which are
 * smaller on a CPU adapter.
 *
 * The table goes to stdout, progress to stderr (TTY only), and with `--out` a JSON object.
 */
import { Engine, type HostStats } from "../engine/engine.ts";
import { getGpu, type Gpu, isCpuAdapter } from "../gpu/device.ts";
import { syntheticModel } from "../engine/model/synthetic.ts";
import { BLOCK } from "../engine/kv/blocks.ts";
import { SessionStore } from "../engine/sessions/store.ts";
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
  DurationHistogram,
  type DurationSummary,
  formatTable,
  percentile,
  type Timed,
} from "./bench_report.ts";
import {
  type BenchOptions,
  type Checked,
  checkOptions,
  DEFAULT_MODEL,
  parseFlags,
  USAGE,
  withDefaults,
} from "./bench_options.ts";
import { BenchProgress } from "./bench_progress.ts";
import { speculationMain } from "./bench_speculation.ts";
import { constrainedMain } from "./bench_constrained.ts";
import { resumeMain } from "./bench_resume.ts";
import { codecsMain, kvCodecResult } from "./bench_codecs.ts";

import type { BenchResult, Lag, SessionsResult, WorkerResult } from "./bench_result.ts";

export { type BenchOptions, DEFAULT_MODEL } from "./bench_options.ts";
export type { BenchResult, Lag, SessionsResult, WorkerResult } from "./bench_result.ts";

/** Warm-up tokens per request at each batch size: enough for the engine's K to ramp to 32. */
const WARM_TOKENS = 64;

/**
 * Loads (or synthesises) the model, measures read bandwidth, warms up, then measures prefill,
 * time to first token and decode at every batch size, and optionally profiles one decode step.
 * Defaults not given are a GPU's, or a CPU adapter's when the adapter is one (bench_options.ts).
 *
 * @throws Error for contradictory or out-of-range options, with the flag to fix.
 * @example
 * const r = await runBench({ shape: "tiny", batch: [1, 2], promptLen: 8, newTokens: 8 });
 * console.log(formatTable(r));
 */
export async function runBench(options: BenchOptions = {}): Promise<BenchResult> {
  checkOptions(options); // usage errors before any GPU work
  const gpu = options.gpu ?? await getGpu();
  const o = withDefaults(options, isCpuAdapter(gpu));
  const progress = options.progress ?? new BenchProgress();
  progress.stages = stageCount(o, gpu);
  // The sessions scenario snapshots into a store of its own, removed afterwards.
  const dir = o.sessions > 0 ? await Deno.makeTempDir({ prefix: "strata-bench-" }) : undefined;
  const warmBytes = o.kvWarmMb * 2 ** 20;
  const store = dir ? await SessionStore.open(`${dir}/sessions.sqlite3`, { warmBytes }) : undefined;
  try {
    return await measure(o, { gpu, progress, store, workerKv: dir && `${dir}/worker.sqlite3` });
  } finally {
    progress.end();
    store?.close();
    if (dir) await Deno.remove(dir, { recursive: true });
  }
}

/** The stages {@linkcode measure} goes through, for the progress line's "[i/N]". */
function stageCount(o: Checked, gpu: Gpu): number {
  // warm-up, prefill, one decode per batch size, and the sessions scenario when asked for
  const perEngine = 2 + o.batch.length + (o.sessions > 0 ? 1 : 0);
  const profile = o.profile && gpu.hasTimestamps ? o.batch.length + 1 : 0;
  // loading, read bandwidth; the worker's loading and its runs
  return 2 + perEngine + (o.worker ? 1 + perEngine : 0) + profile;
}

/** What {@linkcode measure} works with besides the options. */
interface MeasureContext {
  gpu: Gpu;
  progress: BenchProgress;
  /** The engine's session store, when the options ask for one. */
  store?: SessionStore;
  /** Where the worker engine keeps its store. */
  workerKv?: string;
}

/** {@linkcode runBench}'s work. */
async function measure(o: Checked, ctx: MeasureContext): Promise<BenchResult> {
  const { gpu, progress, store, workerKv } = ctx;
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
    kvCodec: o.kvCodec,
    ...(o.kvHot !== undefined ? { kvHot: o.kvHot } : {}),
    store,
  };
  const q = o.quantize !== "none" ? `, ${o.quantize}` : "";
  progress.stage(`loading ${o.shape ? `shape ${o.shape} (${o.dtype}${q})` : `${o.model}${q}`}`);
  const synthetic = {
    dtype: o.dtype,
    tokenizerDir: DEFAULT_MODEL,
    quantize: o.quantize,
    fallback: o.quantizeFallback,
  };
  const quantize = { quantize: o.quantize, fallback: o.quantizeFallback };
  const engine = o.shape
    ? Engine.create(gpu, await syntheticModel(gpu, o.shape, synthetic), engineOptions)
    : await Engine.load(o.model, { ...engineOptions, ...quantize });
  progress.end(); // a warning may follow
  const cfg = engine.config;
  if (engine.kvStats().gpu.total < maxBatch * Math.ceil(context / BLOCK)) {
    status(`bench: the KV pool cannot hold batch ${maxBatch} at once; it will queue`, true);
  }

  progress.stage(`read bandwidth (${(o.readBytes ?? defaultReadBytes(gpu)) / 2 ** 20} MiB)`);
  const bw = await measureReadBandwidth(gpu, { bytes: o.readBytes });

  const vocab = Math.min(cfg.vocabSize, engine.tokenizer.vocabSize);
  const d = await decodeRuns(engine, { o, vocab, progress });
  const sessions = o.sessions > 0
    ? await sessionsScenario(engine, { o, vocab, progress })
    : undefined;
  const groups = bursts(d.batch1.arrivals);
  const gaps = groups.slice(1).map((g, i) => g.start - groups[i].end);
  const stepMs = groups.slice(1).map((g, i) => (g.start - groups[i].end) / g.tokens);

  let worker: WorkerResult | undefined;
  if (o.worker) {
    progress.stage("loading the same model into an engine in a worker");
    const { gpu: _, store: __, ...rest } = engineOptions;
    const w = await WorkerEngine.load(
      o.shape ? { shape: o.shape, ...synthetic } : { dir: o.model },
      { ...rest, kvPath: workerKv, kvWarmBytes: o.kvWarmMb * 2 ** 20, ...quantize },
    );
    try {
      const run = { o, vocab, progress, label: "worker: " };
      const wd = await decodeRuns(w, run);
      worker = {
        ttft_ms: wd.ttft,
        decode_tok_s: wd.decode,
        event_loop_lag_ms: wd.lag,
        ...(o.sessions > 0 ? { sessions: await sessionsScenario(w, run) } : {}),
      };
    } finally {
      await w.close();
    }
  }

  let profile: StepProfile[] | undefined;
  if (o.profile) {
    if (!gpu.hasTimestamps) {
      progress.end();
      status(`bench: --profile needs timestamp-query; ${gpu.adapterName} has none`, true);
    } else {
      profile = [];
      for (const b of o.batch) {
        progress.stage(`profiling one decode step at batch ${b}`);
        const meanContext = Math.round(o.promptLen + o.newTokens / 2);
        profile.push(await profileDecodeStep(engine, { slots: b, context: meanContext }));
      }
      const tokens = Math.min(o.promptLen, engine.opts.maxChunk);
      progress.stage(`profiling one prefill chunk of ${tokens} tokens`);
      profile.push(await profilePrefill(engine, { tokens }));
    }
  }

  const meanContext = o.promptLen + o.newTokens / 2;
  const bytes: BytesPerToken = bytesPerToken(cfg, engine.weights, meanContext, o.kvDtype);
  const precision = engine.precisionStats();
  return {
    model: engine.modelId,
    adapter: engine.adapterName,
    shape: o.shape ?? null,
    cpu_adapter: o.cpu,
    dtype: engine.weights.dtype,
    quantize: o.quantize,
    quantize_fallback: engine.weights.quant.fallback,
    layers_16bit: precision.layers.filter((l) => l.fellBack).length,
    layers_out_of_range: precision.layers.filter((l) => l.outOfRange > 0).length,
    kv_dtype: o.kvDtype,
    ...kvCodecResult(engine),
    batch: o.batch,
    prompt_len: o.promptLen,
    new_tokens: o.newTokens,
    prefill_tok_s: o.promptLen / (d.ttft / 1000),
    decode_tok_s: d.decode,
    ttft_ms: d.ttft,
    ttft_new_length_ms: d.fresh.length ? percentile(d.fresh, 50) : null,
    delivery_gap_ms_p50: percentile(gaps, 50),
    delivery_gap_ms_p95: percentile(gaps, 95),
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
  lag: Record<string, Lag>;
  batch1: Timed;
}

/** The options and progress of one engine's runs; `label` prefixes its stages ("worker: "). */
interface RunContext {
  o: Checked;
  /** Prompt ids are drawn below this. */
  vocab: number;
  progress: BenchProgress;
  label?: string;
}

/** Warms `engine` up, then times its first token and its decode at every batch size. */
async function decodeRuns(
  engine: EngineLike & { hostStats(): HostStats | Promise<HostStats> },
  run: RunContext,
): Promise<DecodeRuns> {
  const { o, progress, label = "" } = run;
  const prompts = promptMaker(run.vocab, o.promptLen);
  const onToken = () => progress.tick();
  const generateAll = (batch: number, tokens: number) =>
    Promise.all(
      Array.from({ length: batch }, () => timed(engine, prompts(), tokens, { onToken })),
    );

  // Pipelines compile on first use: every batch size once, long enough for K to ramp up.
  const warm = Math.min(o.newTokens, WARM_TOKENS);
  const warmTotal = 1 + o.batch.reduce((n, b) => n + b * warm, 0);
  progress.stage(`${label}warming up (pipelines compile on first use)`, warmTotal);
  await generateAll(1, 1);
  for (const b of o.batch) await generateAll(b, warm);

  const fresh: number[] = [];
  const freshRuns = o.promptLen > 3 ? 3 : 0;
  progress.stage(`${label}prefill of ${o.promptLen} tokens`, o.prefillRuns + freshRuns, "runs");
  const ttfts: number[] = [];
  for (let i = 0; i < o.prefillRuns; i++) {
    const [r] = await generateAll(1, 1);
    ttfts.push(r.arrivals[0] - r.t0);
  }
  for (let i = 1; i <= freshRuns; i++) {
    const r = await timed(engine, prompts().slice(i), 1, { onToken });
    fresh.push(r.arrivals[0] - r.t0);
  }

  const decode: Record<string, number> = {};
  const hostMs: Record<string, number> = {};
  let batch1: Timed | undefined;
  const lag: DecodeRuns["lag"] = {};
  for (const b of o.batch) {
    progress.stage(`${label}decode, batch ${b} x ${o.newTokens} tokens`, b * o.newTokens);
    const before = await engine.hostStats();
    const probe = lagProbe();
    const runs = await generateAll(b, o.newTokens);
    const { p50, p95, max } = await probe.stop();
    lag[b] = { p50, p95, max };
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
  run: RunContext,
): Promise<SessionsResult> {
  const { o, progress, label = "" } = run;
  // Its own prompts: sessions must not find the decode runs' blocks by hash.
  const prompts = promptMaker(run.vocab, o.promptLen, 0xfeed);
  // Turns that fit the context: half a prompt and `turn` tokens, then 16 more and `turn` more.
  const turn = Math.max(2, Math.min(32, Math.floor(o.newTokens / 4)));
  progress.stage(
    `${label}${o.newTokens} tokens while ${o.sessions} sessions take two turns each`,
    o.newTokens + 2 * o.sessions * turn,
  );
  const onToken = () => progress.tick();
  const lags = lagProbe();
  const long = timed(engine, prompts(), o.newTokens, { onToken });
  const turns = Array.from({ length: o.sessions }, async (_, i) => {
    const sessionId = `bench-${i}`, first = prompts().slice(0, Math.ceil(o.promptLen / 2));
    const said = await timed(engine, first, turn, { sessionId, onToken });
    const next = [...first, ...said.ids, ...prompts().slice(0, BLOCK)];
    await timed(engine, next, turn, { sessionId, onToken });
  });
  const [r] = await Promise.all([long, ...turns]);
  const { p50, p95, max } = await lags.stop();
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
    event_loop_lag_ms: { p50, p95, max },
    flush_ms: flushMs,
    snapshot_lag_ms: { p50: percentile(snapLag, 50), max: Math.max(...snapLag) },
    warm_mb: o.kvWarmMb,
    stored_blocks: { kv: engine.kvStats().kv.used, fs: engine.kvStats().fs.used },
  };
}

/**
 * Records how long `setTimeout(0)` takes, over and over, until `stop`, into a
 * {@linkcode DurationHistogram}: memory stays the same however long it runs.
 *
 * @example
 * const probe = lagProbe();
 * await work();
 * const { p95, max } = await probe.stop();
 */
export function lagProbe(): { stop: () => Promise<DurationSummary> } {
  const lags = new DurationHistogram();
  let running = true;
  const loop = (async () => {
    while (running) {
      const t = performance.now();
      await new Promise((r) => setTimeout(r, 0));
      lags.add(performance.now() - t);
    }
  })();
  return {
    stop: async () => {
      running = false;
      await loop;
      return lags.summary();
    },
  };
}

/** Greedy sampling that never stops early: every request produces exactly `maxTokens`. */
function greedy(maxTokens: number): SamplingOptions {
  return sampling({ maxTokens, stopAtEos: false });
}

/** Options of {@linkcode timed}. */
interface TimedOptions {
  sessionId?: string;
  /** Called as each token arrives (progress). */
  onToken?: () => void;
}

/** Runs one request and records when each token reached the caller. */
async function timed(
  engine: EngineLike,
  promptIds: number[],
  maxTokens: number,
  options: TimedOptions = {},
): Promise<Timed & { ids: number[] }> {
  const t0 = performance.now();
  const gen = engine.generate({
    promptIds,
    sampling: greedy(maxTokens),
    sessionId: options.sessionId,
  });
  const arrivals: number[] = [], ids: number[] = [];
  for await (const t of gen) {
    arrivals.push(performance.now());
    ids.push(t.id);
    options.onToken?.();
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

/** The CLI: parses flags, runs the bench, prints the table, writes `--out`. */
export async function main(args: string[]): Promise<void> {
  if (args.includes("--speculate")) return await speculationMain(args);
  if (args.includes("--constrained")) return await constrainedMain(args);
  if (args.includes("--resume")) return await resumeMain(args);
  const flags = parseFlags(args);
  if (flags.help) return console.log(USAGE);
  if (flags.codecs.length) return await codecsMain(flags, runBench);
  const result = await runBench(flags.options);
  console.log(formatTable(result));
  if (flags.out) {
    await Deno.writeTextFile(flags.out, JSON.stringify(result, null, 2) + "\n");
    status(`bench: wrote ${flags.out}`);
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
