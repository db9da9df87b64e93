/**
 * The engine's options: what each means and its default, settled and checked before anything is
 * allocated (`settleOptions`), and the KV pool's size in blocks (`poolBlocks`, `codecBlocks`).
 */
import type { Gpu } from "../gpu/device.ts";
import { isCpuAdapter } from "../gpu/device.ts";
import { KV_BYTES, type KvDtype, type QuantizeMode } from "../gpu/dtype.ts";
import { type AttentionMask, checkMask } from "../kernels/attention_mask.ts";
import { MAX_SPEC_ROWS } from "../kernels/speculate.ts";
import { codecBlockBytes, KV_CODECS, type KvCodec } from "../kernels/kv_codec.ts";
import { configMask, type ModelConfig } from "./model/config.ts";
import { BLOCK } from "./kv/blocks.ts";
import { kvBlockBytes } from "./kv/pool.ts";
import type { SessionStore } from "./sessions/store.ts";
import type { PrecisionThresholds } from "./sched/precision.ts";
import { checkTuning, DEFAULT_TUNING, type SpeculationTuning } from "./sched/speculation.ts";

/** Options for {@linkcode Engine.load}. */
export interface EngineOptions {
  /** Sequences decoding together (default 16). */
  maxSlots?: number;
  /** Requests waiting for a slot before new ones get EngineBusyError (default 64). */
  maxQueued?: number;
  /** Longest prompt + completion (default min(model max positions, 2048)). */
  contextLength?: number;
  /** Prefill chunk in tokens (default 512; 256 on CPU adapters). */
  maxChunk?: number;
  /** Most decode steps per GPU submission (default 32; 4 on CPU adapters). */
  maxSteps?: number;
  /**
   * Decode steps queued on the GPU at once, in units of maxSteps (default 2), the one encoded
   * ahead and held for the next readback included: deeper keeps the GPU busy while K ramps up
   * and the host reads back, but tokens arrive in larger bursts and a new request's prefill
   * waits behind more queued work.
   */
  queueDepth?: number;
  /**
   * KV blocks (default: as many as fit in one binding, at most 4096 with an f32 cache and 8192
   * with an f16 one, the same memory).
   */
  kvBlocks?: number;
  /**
   * Element type of the KV cache (default f32). f16 halves the cache's memory and the bytes
   * decode attention reads; K and V are then rounded to f16 as they are written, so outputs
   * differ from an f32 cache by rounding (greedy tokens may part at near-ties).
   */
  kvDtype?: KvDtype;
  /**
   * What KV blocks behind the hot window become (`--kv-codec`, docs/kv_codecs.md): `none`
   * (default) keeps every block as `kvDtype`; `f16` (from an f32 cache), `int8`, `bfp4` or
   * `sign1` re-encodes each whole block older than the newest `kvHot` tokens of its sequence on
   * the GPU, and attention reads it as it is. Then `kvBlocks` counts hot blocks, and the pool
   * gets as many bytes again of codec blocks.
   */
  kvCodec?: KvCodec;
  /** Tokens kept at full precision at the end of each sequence with a codec (default 128). */
  kvHot?: number;
  /** Where sessions are snapshotted after every turn and restored from at load (Deno KV). */
  store?: SessionStore;
  /**
   * A turn of a session ends (its generation's `result` resolves) only once its snapshot is
   * committed to the store, so an acknowledged turn survives a crash (`--kv-sync`; needs
   * `store`). Default false: the snapshot lands shortly after (`SessionInfo.persistedAt`).
   */
  kvSync?: boolean;
  /**
   * Speculative decoding (drafts from each sequence's own history, verified in one pass; the
   * tokens are those of plain decoding): "auto" speculates when the measured cost pays, "on"
   * always (tests), "off" never (default).
   */
  speculate?: "off" | "auto" | "on";
  /** Drafts per verification step at most (default 4; rows per slot are one more). */
  drafts?: number;
  /**
   * Speculation's policy knobs (engine/sched/speculation.ts: cross-check cadence and tolerance,
   * the failure breaker, the length groups; tests force the breakers with them), and whether
   * drafts also come from the n-gram pool of the model's guesses (`pool`, default true).
   */
  speculation?: Partial<SpeculationTuning> & { pool?: boolean };
  /**
   * Streaming attention (docs/long_context.md): every query sees the first `sinks` tokens and
   * the last `window` (itself included) instead of the model's mask, so a sequence runs on past
   * what fits without prefilling again: the blocks behind the window go back to the pool as it
   * moves (sequences without a session). Positions stay absolute (keys are stored rotated).
   * Both integers ≥ 1; a window no wider than a Mistral model's own.
   */
  attentionSinks?: { sinks: number; window: number };
  /**
   * Quantize the layers' projections at load: int8 or e4m3 with one scale per row (`--quantize`;
   * default none). Norms, softmax, residuals, the KV cache, the embeddings and the LM head stay
   * as they are (docs/quantization.md).
   */
  quantize?: QuantizeMode;
  /**
   * Keep the float projections on the GPU so the precision monitor can switch a layer back to
   * them (default true); false frees their memory and only reports (`--quantize-fallback off`).
   */
  fallback?: boolean;
  /** The precision monitor's range (engine/sched/precision.ts; tests force layers out of it). */
  precision?: Partial<PrecisionThresholds>;
  gpu?: Gpu;
  /**
   * Host memory for the KV of sessions evicted from the GPU, in bytes (`--kv-host-mb`; default
   * 0: none). Their next turns bring it back instead of prefilling (docs/kv_tiers.md).
   */
  kvHostBytes?: number;
  /**
   * A folder for spill files: evicted sessions' KV goes there as host memory fills (raw binary,
   * one file per block; `--kv-spill`; `Engine.open` and `Engine.load` only). Its block files
   * from an earlier run are removed at start.
   */
  kvSpillDir?: string;
  /** Bytes of spill files at most (`--kv-spill-mb`; default 16 GiB). */
  kvSpillBytes?: number;
  /**
   * Which tiers restores use: "profile" (default) those the start-up profile measured faster
   * than recomputing; "always" every tier that holds a block (tests, benchmarks).
   */
  kvTierPolicy?: "profile" | "always";
  /** A spill slower than this pauses spills for 30 s (ms; default 200). */
  kvSpillLimitMs?: number;
}

/** Default bytes of spill files: 16 GiB. */
export const SPILL_BYTES = 16 * 2 ** 30;

/**
 * Checks the tier options of `options`.
 *
 * @throws Error naming the flag whose value is out of range
 */
export function checkTierOptions(options: EngineOptions): void {
  const bytes = (v: number | undefined, flag: string) => {
    if (v !== undefined && !(Number.isSafeInteger(v) && v >= 0)) {
      throw new Error(`${flag} must be a whole number >= 0; got ${v}`);
    }
  };
  bytes(options.kvHostBytes, "--kv-host-mb");
  bytes(options.kvSpillBytes, "--kv-spill-mb");
  const policy = options.kvTierPolicy;
  if (policy !== undefined && policy !== "profile" && policy !== "always") {
    throw new Error(`kvTierPolicy must be "profile" or "always"; got '${policy}'`);
  }
  const limit = options.kvSpillLimitMs;
  if (limit !== undefined && !(limit > 0)) {
    throw new Error(`kvSpillLimitMs must be a number of ms > 0; got ${limit}`);
  }
  if (options.kvSpillBytes !== undefined && options.kvSpillDir === undefined) {
    throw new Error("--kv-spill-mb needs --kv-spill DIR (the folder of the file tier)");
  }
}

/** The options with their defaults filled in, and the mask they give. */
export type Settled =
  & Required<
    Omit<
      EngineOptions,
      | "gpu"
      | "kvBlocks"
      | "store"
      | "attentionSinks"
      | "quantize"
      | "fallback"
      | "precision"
      | "speculation"
      | "kvHostBytes"
      | "kvSpillDir"
      | "kvSpillBytes"
      | "kvTierPolicy"
      | "kvSpillLimitMs"
    >
  >
  & { mask: AttentionMask };

/**
 * Fills in the defaults of `options` for a model of `cfg` on `gpu` and checks them.
 *
 * @throws Error naming the flag whose value is out of range or does not combine
 */
export function settleOptions(gpu: Gpu, cfg: ModelConfig, options: EngineOptions): Settled {
  const opts: Settled = {
    maxSlots: options.maxSlots ?? 16,
    maxQueued: options.maxQueued ?? 64,
    // The kernels apply the model's mask (a Mistral window), so the context may run past it.
    contextLength: options.contextLength ?? Math.min(cfg.maxPositions, 2048),
    // A chunk fills the GPU's matmuls better the longer it is (docs/internals.md); on a CPU
    // adapter a chunk blocks the event loop until it finishes.
    maxChunk: options.maxChunk ?? (isCpuAdapter(gpu) ? 256 : 512),
    // On a CPU adapter a submission blocks Deno's event loop until it finishes: keep it short
    // so cancels, pings and other requests are served between submissions.
    maxSteps: options.maxSteps ?? (isCpuAdapter(gpu) ? 4 : 32),
    queueDepth: options.queueDepth ?? 2,
    kvDtype: options.kvDtype ?? "f32",
    kvCodec: options.kvCodec ?? "none",
    kvHot: options.kvHot ?? DEFAULT_HOT,
    kvSync: options.kvSync ?? false,
    speculate: options.speculate ?? "off",
    drafts: options.drafts ?? 4,
    mask: engineMask(cfg, options.attentionSinks),
  };
  if (!["off", "auto", "on"].includes(opts.speculate)) {
    throw new Error(`--speculate must be off, auto or on; got '${opts.speculate}'`);
  }
  const { pool: _, ...tuning } = options.speculation ?? {};
  checkTuning({ ...DEFAULT_TUNING, ...tuning });
  if (!(Number.isInteger(opts.drafts) && opts.drafts >= 1 && opts.drafts < MAX_SPEC_ROWS)) {
    throw new Error(
      `--drafts must be an integer from 1 to ${MAX_SPEC_ROWS - 1}; got ${opts.drafts}`,
    );
  }
  if (cfg.ropeScaling?.type === "dynamic" && opts.contextLength > cfg.maxPositions) {
    // Past it, dynamic NTK rotates each key for the length the sequence had when it was
    // written, so KV would depend on how a prompt was split and could not be shared.
    throw new Error(
      `--context-length ${opts.contextLength} is past max_position_embeddings ` +
        `(${cfg.maxPositions}) of a model with 'dynamic' rope_scaling; strata runs dynamic NTK ` +
        `only up to it (plain RoPE there, as transformers); lower --context-length`,
    );
  }
  if (opts.kvSync && !options.store) {
    throw new Error("--kv-sync needs --kv PATH (the session store it waits for)");
  }
  checkCodec(cfg, opts, options.kvHot);
  return opts;
}

/** Tokens kept hot by default: 8 blocks (docs/kv_codecs.md, "The policy"). */
export const DEFAULT_HOT = 128;

/**
 * @throws Error naming --kv-codec or --kv-hot when they do not combine with the model or cache
 */
function checkCodec(cfg: ModelConfig, opts: Settled, kvHot: number | undefined): void {
  if (!KV_CODECS.includes(opts.kvCodec)) {
    throw new Error(`--kv-codec must be one of ${KV_CODECS.join(", ")}; got '${opts.kvCodec}'`);
  }
  if (opts.kvCodec === "none") {
    if (kvHot !== undefined) {
      throw new Error("--kv-hot applies with --kv-codec f16|int8|bfp4|sign1");
    }
    return;
  }
  if (!(Number.isInteger(opts.kvHot) && opts.kvHot >= 0)) {
    throw new Error(`--kv-hot must be an integer >= 0 (tokens); got ${opts.kvHot}`);
  }
  if (opts.kvCodec === "f16" && opts.kvDtype === "f16") {
    throw new Error(
      "--kv-codec f16 re-encodes an f32 cache, and --kv-dtype f16 holds every block in f16 " +
        "already: use --kv-codec int8, bfp4 or sign1",
    );
  }
  if (cfg.headDim % 4 !== 0) {
    throw new Error(
      `--kv-codec needs a head dim that is a multiple of 4; this model's is ${cfg.headDim}`,
    );
  }
}

/**
 * Hot blocks of the KV pool: `kvBlocks`, or by default a memory budget (4096 f32 blocks' worth;
 * with a codec half of it, the other half holding codec blocks) and at least one whole context,
 * within one binding.
 *
 * @throws Error when the pool cannot hold one sequence of the context length
 */
export function poolBlocks(
  gpu: Gpu,
  cfg: ModelConfig,
  opts: Settled,
  kvBlocks: number | undefined,
): number {
  const perPool = Math.floor(gpu.maxBinding / kvBlockBytes(cfg, opts.kvDtype));
  // The default is a memory budget, 4096 f32 blocks' worth: an f16 cache holds twice the tokens.
  // With a codec, half of it is hot and the codec blocks take the other half (codecBlocks).
  const codec = opts.kvCodec !== "none";
  const budget = Math.floor((4096 * KV_BYTES.f32) / KV_BYTES[opts.kvDtype] / (codec ? 2 : 1));
  if (
    kvBlocks !== undefined &&
    !(Number.isInteger(kvBlocks) && kvBlocks >= 2)
  ) {
    throw new Error(`--kv-blocks must be an integer >= 2; got ${kvBlocks}`);
  }
  const need = Math.ceil(opts.contextLength / BLOCK) + 1;
  // By default room for one whole context at least, where one binding holds it (a 128k
  // TinyLlama context in f16 takes 8193 blocks); with a codec, the hot blocks take at most half
  // of the binding the codec blocks share with them.
  const cap = codec ? Math.floor(perPool / 2) : perPool;
  const numBlocks = Math.min(kvBlocks ?? Math.max(Math.min(budget, cap), need), perPool);
  if (numBlocks < need) {
    throw new Error(
      `KV pool of ${numBlocks} blocks cannot hold one ${opts.contextLength}-token sequence; ` +
        `lower --context-length` +
        (opts.kvDtype === "f32" && numBlocks === perPool
          ? " or use --kv-dtype f16 (twice the tokens in one binding)"
          : ""),
    );
  }
  return numBlocks;
}

/**
 * Codec blocks after `hot` hot blocks: as many bytes as the hot blocks take, within the binding
 * the pool shares with them (0 without a codec).
 *
 * @throws Error when the hot blocks leave no room for a whole context of codec blocks
 */
export function codecBlocks(gpu: Gpu, cfg: ModelConfig, opts: Settled, hot: number): number {
  if (opts.kvCodec === "none") return 0;
  const hotBytes = hot * kvBlockBytes(cfg, opts.kvDtype);
  const n = Math.floor(
    Math.min(hotBytes, gpu.maxBinding - hotBytes) / codecBlockBytes(cfg, opts.kvCodec),
  );
  if (n < Math.ceil(opts.contextLength / BLOCK)) {
    throw new Error(
      `--kv-codec ${opts.kvCodec}: ${hot} hot blocks leave room in one binding for ${n} ` +
        `codec blocks, not one ${opts.contextLength}-token context's; lower --kv-blocks`,
    );
  }
  return n;
}

/**
 * The attention mask an engine runs: the streaming option's sinks + window, else the model's
 * (causal, or a Mistral window).
 *
 * @throws Error naming the option when its values are not integers ≥ 1, or its window is wider
 *   than the model's own.
 */
function engineMask(cfg: ModelConfig, sinks: EngineOptions["attentionSinks"]): AttentionMask {
  if (!sinks) return configMask(cfg);
  const mask = { kind: "sinks" as const, sinks: sinks.sinks, window: sinks.window };
  try {
    checkMask(mask);
  } catch (e) {
    throw new Error(
      `attentionSinks: ${(e as Error).message.replace(/^attention mask sinks: /, "")}`,
    );
  }
  if (cfg.slidingWindow !== undefined && sinks.window > cfg.slidingWindow) {
    throw new Error(
      `attentionSinks: window ${sinks.window} is wider than the model's sliding_window ` +
        `(${cfg.slidingWindow})`,
    );
  }
  return mask;
}
