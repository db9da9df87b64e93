/**
 * Hugging Face `config.json` → {@linkcode ModelConfig}, the RoPE inverse frequencies and
 * attention factor of every `rope_scaling` kind strata runs (llama3, linear, dynamic, yarn; as
 * transformers' modeling_rope_utils computes them), and the attention mask the model's config
 * asks for.
 */
import { type AttentionMask, CAUSAL } from "../../kernels/attention_mask.ts";

/** The model families strata runs; all share the Llama decoder block. */
export type Arch = "llama" | "mistral" | "qwen2";

/** Llama 3.1 style RoPE frequency scaling (`rope_scaling.rope_type = "llama3"`). */
export interface Llama3RopeScaling {
  type: "llama3";
  factor: number;
  lowFreqFactor: number;
  highFreqFactor: number;
  originalMaxPositions: number;
}

/** Linear position interpolation (`rope_type = "linear"`): every frequency divided by factor. */
export interface LinearRopeScaling {
  type: "linear";
  factor: number;
}

/**
 * Dynamic NTK (`rope_type = "dynamic"`): the base grows with the sequence length past
 * `originalMaxPositions` (config.json's `max_position_embeddings`); at or below it, plain RoPE.
 */
export interface DynamicRopeScaling {
  type: "dynamic";
  factor: number;
  originalMaxPositions: number;
}

/**
 * YaRN (`rope_type = "yarn"`): frequencies blended between interpolated (÷ factor) and
 * extrapolated (as they are) over a linear ramp of dims between the rotation counts betaFast and
 * betaSlow at `originalMaxPositions`; cos and sin are scaled by `attentionFactor`.
 */
export interface YarnRopeScaling {
  type: "yarn";
  factor: number;
  originalMaxPositions: number;
  betaFast: number;
  betaSlow: number;
  /** Round the ramp's ends to whole dims (transformers' default). */
  truncate: boolean;
  /** The scale of cos and sin (so of q and k): `0.1 ln(factor) + 1` unless the config says. */
  attentionFactor: number;
}

/** A `rope_scaling` that strata runs. */
export type RopeScaling =
  | Llama3RopeScaling
  | LinearRopeScaling
  | DynamicRopeScaling
  | YarnRopeScaling;

/** The facts of a model that the engine needs, in one flat structure. */
export interface ModelConfig {
  arch: Arch;
  /** The `architectures[0]` string, e.g. "LlamaForCausalLM". */
  architecture: string;
  vocabSize: number;
  hiddenSize: number;
  intermediateSize: number;
  nLayers: number;
  nHeads: number;
  nKvHeads: number;
  /** Explicit `head_dim`, else hiddenSize / nHeads. */
  headDim: number;
  rmsEps: number;
  ropeTheta: number;
  ropeScaling?: RopeScaling;
  maxPositions: number;
  /** The LM head is the embedding matrix (no `lm_head.weight`). */
  tieEmbeddings: boolean;
  /** q/k/v projections have a bias (always for Qwen2; Llama's `attention_bias`). */
  attentionBias: boolean;
  /** o_proj has a bias too (Llama with `attention_bias: true`; never Qwen2). */
  oProjBias: boolean;
  /** Mistral's `sliding_window` when set: key j is visible from query i iff i - j < window. */
  slidingWindow?: number;
  bosId?: number;
  /**
   * EOS ids. From `parseConfig` these are config.json's; `loadModelFolder` merges in
   * generation_config.json's, so `folder.config.eosIds` is the full set.
   */
  eosIds: number[];
  torchDtype?: string;
}

const ARCHS: Record<string, Arch> = {
  LlamaForCausalLM: "llama",
  MistralForCausalLM: "mistral",
  Qwen2ForCausalLM: "qwen2",
};

type Json = Record<string, unknown>;

/**
 * Reads one or many token ids (`eos_token_id` may be an int, a list or null).
 *
 * @returns the ids, in order, without duplicates
 */
export function tokenIds(value: unknown): number[] {
  const list = Array.isArray(value) ? value : value == null ? [] : [value];
  const out: number[] = [];
  for (const v of list) {
    if (Number.isInteger(v) && !out.includes(v as number)) out.push(v as number);
  }
  return out;
}

/**
 * Parses a Hugging Face `config.json` object.
 *
 * @param json the parsed config.json
 * @param path where it came from (used in error messages only)
 * @returns the model config
 * @throws when the architecture, activation or rope scaling is unsupported, or a field is missing
 * @example
 * ```ts
 * const cfg = parseConfig(JSON.parse(await Deno.readTextFile(p)), p);
 * ```
 */
export function parseConfig(json: Json, path: string): ModelConfig {
  const architecture = String((json.architectures as unknown[] | undefined)?.[0] ?? "");
  const arch = ARCHS[architecture];
  if (!arch) {
    throw new Error(
      `unsupported architecture '${architecture || "(none)"}' in ${path}: strata supports ` +
        `${Object.keys(ARCHS).join(", ")}`,
    );
  }
  const int = (key: string, fallback?: number): number => {
    const v = json[key] ?? fallback;
    if (v === undefined || v === null) {
      throw new Error(`missing '${key}' in ${path}: a ${architecture} config needs it`);
    }
    if (!Number.isInteger(v) || (v as number) <= 0) {
      throw new Error(`'${key}' in ${path} must be a positive integer; got ${JSON.stringify(v)}`);
    }
    return v as number;
  };
  const num = (key: string, fallback: number): number => {
    const v = json[key] ?? fallback;
    if (typeof v !== "number" || !(v > 0)) {
      throw new Error(`'${key}' in ${path} must be a positive number; got ${JSON.stringify(v)}`);
    }
    return v;
  };
  const act = json.hidden_act ?? json.hidden_activation ?? "silu";
  if (act !== "silu") {
    throw new Error(`unsupported hidden_act '${act}' in ${path}: strata supports 'silu'`);
  }
  if (json.mlp_bias === true) {
    throw new Error(`unsupported 'mlp_bias: true' in ${path}: strata's MLP has no biases`);
  }
  if (arch === "qwen2" && json.use_sliding_window === true) {
    throw new Error(
      `unsupported 'use_sliding_window: true' in ${path}: strata runs Qwen2 with full attention; ` +
        `set it to false`,
    );
  }
  const hiddenSize = int("hidden_size");
  const nHeads = int("num_attention_heads");
  const nKvHeads = int("num_key_value_heads", nHeads);
  if (nHeads % nKvHeads !== 0) {
    throw new Error(
      `num_attention_heads (${nHeads}) in ${path} must be a multiple of num_key_value_heads ` +
        `(${nKvHeads})`,
    );
  }
  const headDim = json.head_dim == null ? hiddenSize / nHeads : int("head_dim");
  if (!Number.isInteger(headDim) || headDim % 2 !== 0) {
    throw new Error(
      `head dimension ${headDim} in ${path} must be an even integer (hidden_size ${hiddenSize} / ` +
        `num_attention_heads ${nHeads}, or an explicit head_dim)`,
    );
  }
  // transformers v5 moves rope_theta and rope_scaling into `rope_parameters`.
  const ropeParams = (json.rope_parameters ?? undefined) as Json | undefined;
  const ropeTheta = ropeParams?.rope_theta !== undefined
    ? Number(ropeParams.rope_theta)
    : num("rope_theta", 10000);
  const maxPositions = int("max_position_embeddings", 2048);
  const ropeScaling = parseRopeScaling(
    (json.rope_scaling ?? ropeParams ?? undefined) as Json | undefined,
    { path, maxPositions },
  );
  const attentionBias = arch === "qwen2" || json.attention_bias === true;
  // Mistral's window (null or absent: full attention, as transformers' MistralConfig).
  const sw = json.sliding_window;
  if (arch === "mistral" && sw != null && !(Number.isInteger(sw) && (sw as number) >= 1)) {
    throw new Error(
      `'sliding_window' in ${path} must be a positive integer or null; got ${JSON.stringify(sw)}`,
    );
  }
  const sliding = arch === "mistral" && sw != null ? sw as number : undefined;
  const bos = tokenIds(json.bos_token_id)[0];
  const dtype = json.torch_dtype ?? json.dtype;
  return {
    arch,
    architecture,
    vocabSize: int("vocab_size"),
    hiddenSize,
    intermediateSize: int("intermediate_size"),
    nLayers: int("num_hidden_layers"),
    nHeads,
    nKvHeads,
    headDim,
    rmsEps: num("rms_norm_eps", 1e-6),
    ropeTheta,
    ...(ropeScaling ? { ropeScaling } : {}),
    maxPositions,
    tieEmbeddings: json.tie_word_embeddings === true,
    attentionBias,
    oProjBias: arch !== "qwen2" && json.attention_bias === true,
    ...(sliding !== undefined ? { slidingWindow: sliding } : {}),
    ...(bos !== undefined ? { bosId: bos } : {}),
    eosIds: tokenIds(json.eos_token_id),
    ...(typeof dtype === "string" ? { torchDtype: dtype } : {}),
  };
}

/** Where a `rope_scaling` comes from, for {@linkcode parseRopeScaling}. */
interface RopeContext {
  path: string;
  /** config.json's `max_position_embeddings`. */
  maxPositions: number;
}

const ROPE_KINDS = ["llama3", "linear", "dynamic", "yarn"];

function parseRopeScaling(rs: Json | undefined, at: RopeContext): RopeScaling | undefined {
  if (!rs) return undefined;
  const { path } = at;
  const type = rs.rope_type ?? rs.type;
  if (type === undefined || type === null || type === "default") return undefined;
  if (typeof type !== "string" || !ROPE_KINDS.includes(type)) {
    throw new Error(
      `unsupported rope_scaling type '${type}' in ${path}: strata supports ` +
        `${ROPE_KINDS.map((k) => `'${k}'`).join(", ")} (or no rope_scaling)`,
    );
  }
  const num = (key: string, fallback?: number): number => {
    const v = rs[key] ?? fallback;
    if (typeof v !== "number" || !(v > 0)) {
      throw new Error(
        `rope_scaling.${key} in ${path} must be a positive number for '${type}' scaling; ` +
          `got ${JSON.stringify(v)}`,
      );
    }
    return v;
  };
  if (type === "linear") return { type, factor: num("factor") };
  if (type === "dynamic") {
    return { type, factor: num("factor"), originalMaxPositions: at.maxPositions };
  }
  if (type === "yarn") return parseYarn(rs, at, num);
  const scaling: Llama3RopeScaling = {
    type: "llama3",
    factor: num("factor"),
    lowFreqFactor: num("low_freq_factor"),
    highFreqFactor: num("high_freq_factor"),
    originalMaxPositions: num("original_max_position_embeddings"),
  };
  if (scaling.highFreqFactor <= scaling.lowFreqFactor) {
    throw new Error(
      `rope_scaling in ${path}: high_freq_factor (${scaling.highFreqFactor}) must exceed ` +
        `low_freq_factor (${scaling.lowFreqFactor})`,
    );
  }
  return scaling;
}

/**
 * YaRN's parameters as transformers' `_compute_yarn_parameters` reads them. transformers 4.x
 * replaces `factor` by `max_position_embeddings / original_max_position_embeddings` whenever the
 * latter is given, 5.x keeps `factor`: a config where the two differ would run differently in
 * each, so it is refused.
 */
function parseYarn(
  rs: Json,
  at: RopeContext,
  num: (key: string, fallback?: number) => number,
): YarnRopeScaling {
  const hasOriginal = rs.original_max_position_embeddings != null;
  const original = num("original_max_position_embeddings", at.maxPositions);
  const factor = rs.factor == null && hasOriginal ? at.maxPositions / original : num("factor");
  if (hasOriginal && Math.abs(factor - at.maxPositions / original) > 1e-9 * factor) {
    throw new Error(
      `rope_scaling in ${at.path}: yarn factor ${factor} differs from max_position_embeddings / ` +
        `original_max_position_embeddings = ${at.maxPositions} / ${original}; transformers 4.x ` +
        `uses the ratio and 5.x the factor, so set max_position_embeddings to ` +
        `${factor * original}`,
    );
  }
  const mscale = (scale: number, m = 1) => scale <= 1 ? 1 : 0.1 * m * Math.log(scale) + 1;
  const m = rs.mscale, all = rs.mscale_all_dim;
  const attentionFactor = rs.attention_factor != null
    ? num("attention_factor")
    : typeof m === "number" && m && typeof all === "number" && all
    ? mscale(factor, m) / mscale(factor, all)
    : mscale(factor);
  if (rs.truncate != null && typeof rs.truncate !== "boolean") {
    throw new Error(
      `rope_scaling.truncate in ${at.path} must be true or false; got ${
        JSON.stringify(rs.truncate)
      }`,
    );
  }
  return {
    type: "yarn",
    factor,
    originalMaxPositions: original,
    // transformers reads these with `or`: 0 or null mean the paper's defaults.
    betaFast: rs.beta_fast ? num("beta_fast") : 32,
    betaSlow: rs.beta_slow ? num("beta_slow") : 1,
    truncate: rs.truncate !== false,
    attentionFactor,
  };
}

/**
 * RoPE inverse frequencies, `theta^(-2i/headDim)` for i in [0, headDim/2), with the config's
 * `rope_scaling` applied as transformers computes it (in float64 here): llama3
 * (`_compute_llama3_parameters`), linear (÷ factor), dynamic NTK at sequence length `seqLen`
 * (the base scaled by `(factor · seqLen / original − (factor − 1))^(D / (D − 2))` past the
 * original length, plain RoPE at or below it) and yarn (`_compute_yarn_parameters`).
 *
 * @param cfg the model config (headDim, ropeTheta, ropeScaling)
 * @param seqLen the sequence length dynamic NTK scales for (default: its original length)
 * @returns Float64Array of length headDim / 2
 */
export function ropeInvFreq(
  cfg: Pick<ModelConfig, "headDim" | "ropeTheta" | "ropeScaling">,
  seqLen?: number,
): Float64Array {
  const half = cfg.headDim / 2, D = cfg.headDim;
  const s = cfg.ropeScaling;
  let base = cfg.ropeTheta;
  if (s?.type === "dynamic") {
    const len = Math.max(seqLen ?? 0, s.originalMaxPositions);
    base *= ((s.factor * len) / s.originalMaxPositions - (s.factor - 1)) ** (D / (D - 2));
  }
  const inv = new Float64Array(half);
  for (let i = 0; i < half; i++) inv[i] = 1 / Math.pow(base, (2 * i) / D);
  if (!s || s.type === "dynamic") return inv;
  if (s.type === "linear") return inv.map((f) => f / s.factor);
  if (s.type === "yarn") return yarnInvFreq(inv, cfg.ropeTheta, D, s);
  const lowFreqWavelen = s.originalMaxPositions / s.lowFreqFactor;
  const highFreqWavelen = s.originalMaxPositions / s.highFreqFactor;
  for (let i = 0; i < half; i++) {
    const wavelen = (2 * Math.PI) / inv[i];
    if (wavelen < highFreqWavelen) continue; // high frequency: unchanged
    if (wavelen > lowFreqWavelen) {
      inv[i] = inv[i] / s.factor; // low frequency: divided by factor
      continue;
    }
    // medium: interpolate between the scaled and the unscaled frequency
    const smooth = (s.originalMaxPositions / wavelen - s.lowFreqFactor) /
      (s.highFreqFactor - s.lowFreqFactor);
    inv[i] = (1 - smooth) * inv[i] / s.factor + smooth * inv[i];
  }
  return inv;
}

/**
 * YaRN's blend of `inv` (the extrapolated frequencies): dims below the ramp keep theirs, dims
 * above it are interpolated (÷ factor), the ramp between mixes them linearly.
 */
function yarnInvFreq(inv: Float64Array, base: number, dim: number, s: YarnRopeScaling) {
  // The dim that makes `rotations` turns over the original context.
  const dimFor = (rotations: number) =>
    (dim * Math.log(s.originalMaxPositions / (rotations * 2 * Math.PI))) / (2 * Math.log(base));
  let low = dimFor(s.betaFast), high = dimFor(s.betaSlow);
  if (s.truncate) [low, high] = [Math.floor(low), Math.ceil(high)];
  low = Math.max(low, 0);
  high = Math.min(high, dim - 1);
  if (low === high) high += 0.001; // transformers' guard against a zero-width ramp
  return inv.map((f, i) => {
    const ramp = Math.min(1, Math.max(0, (i - low) / (high - low)));
    const extrapolation = 1 - ramp;
    return (f / s.factor) * (1 - extrapolation) + f * extrapolation;
  });
}

/**
 * The scale RoPE applies to cos and sin (so to q and to k): yarn's `attentionFactor`, else 1.
 * Attention scores carry its square; the kernels fold that into the softmax scale
 * ({@linkcode attentionScale}).
 */
export function ropeAttentionFactor(cfg: Pick<ModelConfig, "ropeScaling">): number {
  return cfg.ropeScaling?.type === "yarn" ? cfg.ropeScaling.attentionFactor : 1;
}

/**
 * The softmax scale of the attention kernels: `1 / sqrt(headDim)` times the square of
 * {@linkcode ropeAttentionFactor} (q and k each carry it in transformers; strata stores k
 * without it and scales the scores instead, which is the same product).
 */
export function attentionScale(cfg: Pick<ModelConfig, "headDim" | "ropeScaling">): number {
  return ropeAttentionFactor(cfg) ** 2 / Math.sqrt(cfg.headDim);
}

/**
 * The attention mask the config asks for: Mistral's `sliding_window` (key j visible from query i
 * iff i − j < window), else causal.
 */
export function configMask(cfg: Pick<ModelConfig, "slidingWindow">): AttentionMask {
  return cfg.slidingWindow !== undefined ? { kind: "window", window: cfg.slidingWindow } : CAUSAL;
}
