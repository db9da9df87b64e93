/**
 * Hugging Face `config.json` → {@linkcode ModelConfig}, and the RoPE inverse frequencies
 * (including Llama 3.1's `rope_scaling`).
 */

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
  ropeScaling?: Llama3RopeScaling;
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
  const ropeScaling = parseRopeScaling(
    (json.rope_scaling ?? ropeParams ?? undefined) as Json | undefined,
    path,
  );
  const attentionBias = arch === "qwen2" || json.attention_bias === true;
  const sliding = arch === "mistral" && Number.isInteger(json.sliding_window)
    ? json.sliding_window as number
    : undefined;
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
    maxPositions: int("max_position_embeddings", 2048),
    tieEmbeddings: json.tie_word_embeddings === true,
    attentionBias,
    oProjBias: arch !== "qwen2" && json.attention_bias === true,
    ...(sliding !== undefined ? { slidingWindow: sliding } : {}),
    ...(bos !== undefined ? { bosId: bos } : {}),
    eosIds: tokenIds(json.eos_token_id),
    ...(typeof dtype === "string" ? { torchDtype: dtype } : {}),
  };
}

function parseRopeScaling(rs: Json | undefined, path: string): Llama3RopeScaling | undefined {
  if (!rs) return undefined;
  const type = rs.rope_type ?? rs.type;
  if (type === undefined || type === null || type === "default") return undefined;
  if (type !== "llama3") {
    throw new Error(
      `unsupported rope_scaling type '${type}' in ${path}: strata supports 'llama3' ` +
        `(or no rope_scaling)`,
    );
  }
  const need = (key: string): number => {
    const v = rs[key];
    if (typeof v !== "number" || !(v > 0)) {
      throw new Error(
        `rope_scaling.${key} in ${path} must be a positive number for 'llama3' scaling; ` +
          `got ${JSON.stringify(v)}`,
      );
    }
    return v;
  };
  const scaling: Llama3RopeScaling = {
    type: "llama3",
    factor: need("factor"),
    lowFreqFactor: need("low_freq_factor"),
    highFreqFactor: need("high_freq_factor"),
    originalMaxPositions: need("original_max_position_embeddings"),
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
 * RoPE inverse frequencies, `theta^(-2i/headDim)` for i in [0, headDim/2), with Llama 3.1
 * scaling applied exactly as transformers' `_compute_llama3_parameters` (in float64).
 *
 * @param cfg the model config (headDim, ropeTheta, ropeScaling)
 * @returns Float64Array of length headDim / 2
 */
export function ropeInvFreq(cfg: Pick<ModelConfig, "headDim" | "ropeTheta" | "ropeScaling">) {
  const half = cfg.headDim / 2;
  const inv = new Float64Array(half);
  for (let i = 0; i < half; i++) inv[i] = 1 / Math.pow(cfg.ropeTheta, (2 * i) / cfg.headDim);
  const s = cfg.ropeScaling;
  if (!s) return inv;
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
