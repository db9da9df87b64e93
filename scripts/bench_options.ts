/**
 * The bench's options: the CLI flags, their defaults on a GPU and on a CPU adapter, their checks,
 * and `--help`. Defaults depend on the adapter because one set cannot serve both: the GPU's
 * (batch 32, 256 new tokens) ran 20–40 minutes on a 2-core CPU adapter.
 */
import { parseArgs } from "node:util";
import type { Gpu } from "../gpu/device.ts";
import { type KvDtype, parseKvDtype, parseQuantize, type QuantizeMode } from "../gpu/dtype.ts";
import type { BenchProgress } from "./bench_progress.ts";
import { type KvCodec, parseKvCodec } from "../kernels/kv_codec.ts";

/** The embedded default model (also the tokenizer of the synthetic shapes). */
export const DEFAULT_MODEL = new URL("../models/strata-default", import.meta.url).pathname;

/** What a run measures when no flag says otherwise: thorough on a GPU. */
export const GPU_DEFAULTS = { batch: [1, 8, 32], promptLen: 128, newTokens: 256 } as const;
/**
 * On a CPU adapter (llvmpipe, lavapipe): about a minute with the default model on 2 cores, where
 * prefill runs at ≈ 50 tok/s and decode at ≈ 10–15 tok/s (BENCHMARKS.md).
 */
export const CPU_DEFAULTS = { batch: [1, 4], promptLen: 32, newTokens: 32 } as const;

/** Options of `runBench` (scripts/bench.ts); the CLI flags in camelCase. */
export interface BenchOptions {
  /** Model folder (default: the embedded models/strata-default). Excludes `shape`. */
  model?: string;
  /** A synthetic shape of engine/model/synthetic.ts (random weights on the GPU) instead of a folder. */
  shape?: string;
  /** Batch sizes for decode (default 1, 8, 32; on a CPU adapter 1, 4); batch 1 is always measured. */
  batch?: number[];
  /** Prompt tokens (default 128; on a CPU adapter 32). */
  promptLen?: number;
  /** Tokens generated per request (default 256; on a CPU adapter 32; at least 2). */
  newTokens?: number;
  /** Weight dtype of a synthetic shape (default f16). */
  dtype?: "f16" | "bf16";
  /** Element type of the KV cache (default f32, the engine's). */
  kvDtype?: KvDtype;
  /**
   * What KV blocks behind the hot window become (default none; `--kv-codec`, docs/kv_codecs.md).
   * The pool's hot blocks are the same as without one; the codec blocks come on top.
   */
  kvCodec?: KvCodec;
  /** Tokens each sequence keeps hot with a codec (default: the engine's, 128). */
  kvHot?: number;
  /** Quantize the projections at load (default none; `--quantize`). */
  quantize?: QuantizeMode;
  /**
   * Keep the 16-bit projections for the precision monitor's fallback (default true;
   * `--quantize-fallback on|off`, with `quantize` only). Off, no layer runs at 16 bits: the
   * speed of the quantized kernels alone.
   */
  quantizeFallback?: boolean;
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
  /** Where progress goes (default: stderr when it is a terminal). */
  progress?: BenchProgress;
}

/** {@linkcode BenchOptions} with every default filled in. */
export type Checked =
  & Required<
    Omit<
      BenchOptions,
      "shape" | "gpu" | "readBytes" | "queueDepth" | "maxChunk" | "progress" | "kvHot"
    >
  >
  & {
    shape?: string;
    readBytes?: number;
    queueDepth?: number;
    maxChunk?: number;
    kvHot?: number;
    /** The defaults used were a CPU adapter's. */
    cpu: boolean;
  };

function isCount(v: number | undefined, min: number): boolean {
  return v === undefined || (Number.isInteger(v) && v >= min);
}

/**
 * Checks the options given, before any GPU work, so a usage error comes at once.
 *
 * @throws Error naming the flag to fix and the value it got
 */
export function checkOptions(o: BenchOptions): void {
  if (o.model !== undefined && o.shape !== undefined) {
    throw new Error("give --model DIR or --shape NAME, not both");
  }
  if (o.dtype !== undefined && o.shape === undefined) {
    throw new Error("--dtype applies to --shape only (a model folder has its own dtype)");
  }
  if (o.dtype !== undefined && o.dtype !== "f16" && o.dtype !== "bf16") {
    throw new Error(`--dtype must be f16 or bf16; got '${o.dtype}'`);
  }
  parseKvDtype(o.kvDtype);
  const quantize = parseQuantize(o.quantize);
  if (o.quantizeFallback !== undefined && quantize === "none") {
    throw new Error("--quantize-fallback applies with --quantize int8 or e4m3");
  }
  if (o.kvCodec !== undefined) parseKvCodec(o.kvCodec);
  if (o.kvHot !== undefined && (o.kvCodec ?? "none") === "none") {
    throw new Error("--kv-hot applies with --kv-codec f16|int8|bfp4|sign1");
  }
  for (const b of o.batch ?? []) {
    if (!Number.isInteger(b) || b < 1) throw new Error(`--batch sizes must be ≥ 1; got ${b}`);
  }
  const counts: [string, number | undefined, number][] = [
    ["--kv-warm-mb", o.kvWarmMb, 0],
    ["--sessions", o.sessions, 0],
    ["--max-chunk", o.maxChunk, 1],
    ["--queue-depth", o.queueDepth, 1],
    ["--prompt-len", o.promptLen, 1],
    ["--prefill-runs", o.prefillRuns, 1],
    ["--kv-hot", o.kvHot, 0],
  ];
  for (const [flag, v, min] of counts) {
    if (!isCount(v, min)) throw new Error(`${flag} must be an integer ≥ ${min}; got ${v}`);
  }
  if (o.readBytes !== undefined && !(Number.isInteger(o.readBytes) && o.readBytes > 0)) {
    throw new Error(`--read-mib must be an integer ≥ 1; got ${o.readBytes / 2 ** 20}`);
  }
  if (!isCount(o.newTokens, 2)) {
    throw new Error(
      `--new-tokens must be an integer ≥ 2 (decode is timed between tokens); got ${o.newTokens}`,
    );
  }
}

/** The options with every default filled in: a CPU adapter's when `cpu`, else a GPU's. */
export function withDefaults(o: BenchOptions, cpu: boolean): Checked {
  checkOptions(o);
  const d = cpu ? CPU_DEFAULTS : GPU_DEFAULTS;
  return {
    model: o.model ?? DEFAULT_MODEL,
    shape: o.shape,
    batch: [...new Set([1, ...(o.batch ?? d.batch)])].sort((a, b) => a - b),
    promptLen: o.promptLen ?? d.promptLen,
    newTokens: o.newTokens ?? d.newTokens,
    dtype: o.dtype ?? "f16",
    kvDtype: parseKvDtype(o.kvDtype),
    kvCodec: parseKvCodec(o.kvCodec),
    kvHot: o.kvHot,
    quantize: parseQuantize(o.quantize),
    quantizeFallback: o.quantizeFallback ?? true,
    profile: o.profile ?? false,
    readBytes: o.readBytes,
    prefillRuns: o.prefillRuns ?? 3,
    queueDepth: o.queueDepth,
    maxChunk: o.maxChunk,
    sessions: o.sessions ?? 0,
    kvWarmMb: o.kvWarmMb ?? 512,
    worker: o.worker ?? false,
    cpu,
  };
}

const list = (v: readonly number[]) => v.join(",");

/** `deno task bench --help`. */
export const USAGE = `usage: deno task bench [flags]

Measures the engine's prefill and decode speed against the read bandwidth of the same GPU (the
roofline) and prints a table on stdout; --out also writes JSON. Progress (stage, tokens, time)
goes to stderr when it is a terminal. BENCHMARKS.md says what each number means.

Defaults depend on the adapter: thorough on a GPU; on a CPU adapter (llvmpipe, lavapipe,
SwiftShader) small enough to finish in about a minute. "default A; CPU B" below means A on a GPU
and B on a CPU adapter; flags given always win.

  --speculate          measure speculative decoding instead (acceptance on the model per
                       length group, the cost of a verification pass on a shape, their
                       combination): see deno task bench --speculate --help
  --constrained        measure constrained decoding instead (json_schema against unconstrained
                       tok/s, alone and batched; compile time): deno task bench --constrained --help
  --resume             measure sessions resumed from host memory, spill files and Deno KV
                       against recomputing them: see deno task bench --resume --help
  --model DIR          model folder (default models/strata-default)
  --shape NAME         a synthetic shape instead of a folder: tinyllama-1.1b, llama-7b or tiny
                       (random weights made on the GPU, the default model's tokenizer)
  --dtype f16|bf16     weight dtype of a --shape (default f16)
  --quantize MODE      int8 or e4m3: quantize the layers' projections at load (a --shape's
                       on the GPU), keeping the 16-bit ones for the precision monitor; none
                       (default) runs them as loaded. The table says how many layers the
                       monitor ran at 16 bits
  --quantize-fallback on|off
                       with --quantize: keep the 16-bit projections for the monitor's
                       fallback (on, default) or free them (off: no layer runs at 16 bits,
                       the speed of the quantized kernels alone; the table says so)
  --kv-dtype f32|f16   element type of the KV cache (default f32)
  --kv-codec LIST      what KV blocks behind the hot window become: none, f16, int8, bfp4,
                       sign1 (default none; docs/kv_codecs.md). Several, comma-separated, run
                       the whole bench once per codec, each with a fresh engine, then print a
                       table of them side by side (--out writes {"runs": [...]})
  --kv-hot N           tokens each sequence keeps at full precision with a codec (default 128)
  --batch LIST         decode batch sizes, comma-separated; 1 is always added
                       (default ${list(GPU_DEFAULTS.batch)}; CPU ${list(CPU_DEFAULTS.batch)})
  --prompt-len N       prompt tokens per request (default ${GPU_DEFAULTS.promptLen}; CPU ${CPU_DEFAULTS.promptLen})
  --new-tokens N       tokens generated per request, at least 2 (default ${GPU_DEFAULTS.newTokens}; CPU ${CPU_DEFAULTS.newTokens})
  --prefill-runs N     time-to-first-token runs to take the median of (default 3)
  --read-mib N         MiB the bandwidth kernel reads (default 1024; CPU 64)
  --queue-depth N      decode submissions the engine keeps in flight (default 2, the engine's)
  --max-chunk N        prefill tokens per chunk (default 512; CPU 256, the engine's)
  --profile            also time every kernel of one decode step per batch size and of one
                       prefill chunk (needs timestamp-query; off by default)
  --sessions N         also decode beside N sessions taking two snapshotted turns each
                       (default 0: not run)
  --kv-warm-mb N       MiB of blocks the sessions' store keeps in Deno KV before it moves them
                       to files, as serve --kv-warm-mb (default 512)
  --worker             also measure with a second engine in a worker thread, as deno task start
                       runs it (off by default)
  --out FILE           also write the results as JSON to FILE
  -h, --help           this text

Environment:
  DENO_WEBGPU_BACKEND  wgpu's backend, vulkan or gl (unset: Vulkan when present, else GL)
  XDG_RUNTIME_DIR      wgpu's loaders want one; set to /tmp when unset

Examples:
  deno task bench                                   # the default model, adapter defaults
  deno task bench --shape tinyllama-1.1b --batch 1,8,32 --out bench.json
  deno task bench --shape llama-7b --quantize int8 --prompt-len 512
  deno task bench --shape tinyllama-1.1b --quantize int8 --quantize-fallback off --batch 1,8,32
  deno task bench --shape tinyllama-1.1b --kv-codec none,int8,bfp4 --prompt-len 1024`;

/** The parsed command line of `deno task bench`. */
export interface BenchFlags {
  options: BenchOptions;
  /** `--kv-codec`'s list (one run per codec; empty: the one run of `options`). */
  codecs: KvCodec[];
  out?: string;
  help: boolean;
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
  if (v.trim() === "" || !Number.isInteger(n)) {
    throw new Error(`--${flag} must be an integer; got '${v}'`);
  }
  return n;
}

/**
 * Parses `deno task bench`'s flags.
 *
 * @throws Error for an unknown flag or a value that is not a number, naming it
 */
export function parseFlags(args: string[]): BenchFlags {
  const { values: v } = parseArgs({
    args,
    options: {
      model: { type: "string" },
      shape: { type: "string" },
      batch: { type: "string" },
      "prompt-len": { type: "string" },
      "new-tokens": { type: "string" },
      "prefill-runs": { type: "string" },
      dtype: { type: "string" },
      "kv-dtype": { type: "string" },
      "kv-codec": { type: "string" },
      "kv-hot": { type: "string" },
      quantize: { type: "string" },
      "quantize-fallback": { type: "string" },
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
  const readMib = intFlag("read-mib", v["read-mib"]);
  const fallback = v["quantize-fallback"];
  if (fallback !== undefined && fallback !== "on" && fallback !== "off") {
    throw new Error(`--quantize-fallback must be on or off; got '${fallback}'`);
  }
  const options: BenchOptions = {
    model: v.model,
    shape: v.shape,
    batch: v.batch === undefined ? undefined : parseList("batch", v.batch),
    promptLen: intFlag("prompt-len", v["prompt-len"]),
    newTokens: intFlag("new-tokens", v["new-tokens"]),
    prefillRuns: intFlag("prefill-runs", v["prefill-runs"]),
    dtype: v.dtype as BenchOptions["dtype"],
    kvDtype: v["kv-dtype"] as KvDtype | undefined,
    kvHot: intFlag("kv-hot", v["kv-hot"]),
    quantize: v.quantize as QuantizeMode | undefined,
    quantizeFallback: fallback === undefined ? undefined : fallback === "on",
    profile: v.profile,
    readBytes: readMib === undefined ? undefined : readMib * 2 ** 20,
    queueDepth: intFlag("queue-depth", v["queue-depth"]),
    maxChunk: intFlag("max-chunk", v["max-chunk"]),
    sessions: intFlag("sessions", v.sessions),
    kvWarmMb: intFlag("kv-warm-mb", v["kv-warm-mb"]),
    worker: v.worker,
  };
  const codecs = v["kv-codec"]?.split(",").map((c) => parseKvCodec(c.trim())) ?? [];
  if (codecs.length === 1) options.kvCodec = codecs[0];
  else if (options.kvHot !== undefined && codecs.every((c) => c === "none")) {
    throw new Error("--kv-hot applies with --kv-codec f16|int8|bfp4|sign1");
  }
  return { options, codecs: codecs.length > 1 ? codecs : [], out: v.out, help: v.help ?? false };
}
