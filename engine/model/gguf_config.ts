/**
 * GGUF metadata → {@linkcode ModelConfig}: the `{arch}.*` keys llama.cpp's converter writes
 * (convert_hf_to_gguf.py `TextModel.set_gguf_parameters`), mapped to the fields `parseConfig`
 * fills from a Hugging Face config.json, so either source gives the same config.
 */
import type { Arch, ModelConfig } from "./config.ts";
import { describe, type GgufHeader, type GgufValue } from "./gguf_format.ts";
import { fitLlama3Scaling } from "./gguf_rope.ts";

/** `general.architecture` values strata runs, with the Hugging Face class each stands for. */
export const GGUF_ARCHS: Record<string, { arch: Arch; architecture: string }> = {
  // convert_hf_to_gguf.py writes MistralForCausalLM models as "llama" too.
  llama: { arch: "llama", architecture: "LlamaForCausalLM" },
  qwen2: { arch: "qwen2", architecture: "Qwen2ForCausalLM" },
};

/** `general.file_type` (llama.cpp's `llama_ftype`) of the unquantized files → torch dtype. */
const FILE_DTYPE: Record<number, string> = { 0: "float32", 1: "float16", 32: "bfloat16" };

/** What {@linkcode ggufConfig} needs besides the metadata. */
export interface GgufConfigFacts {
  /** Names of the file's tensors (GGUF names): output.weight's absence means tied. */
  tensorNames: Set<string>;
  /** `rope_freqs.weight`'s values, when the file has it. */
  ropeFreqs?: Float32Array;
  /** Size of `tokenizer.ggml.tokens`: the vocabulary. */
  vocabSize: number;
  bosId?: number;
  eosIds: number[];
}

/**
 * Builds the model config of a GGUF file.
 *
 * @param header the parsed header
 * @param facts tensor names, RoPE factors and the tokenizer's sizes and ids
 * @returns the config, as `parseConfig` would give for the model's config.json
 * @throws naming the key and the file when the architecture, a shape, RoPE or a feature is not
 *   one strata runs
 */
export function ggufConfig(header: GgufHeader, facts: GgufConfigFacts): ModelConfig {
  const md = header.metadata, path = header.path;
  const { name, ...known } = ggufArch(header);
  const key = (k: string) => `${name}.${k}`;
  const int = (k: string, fallback?: number): number => {
    const v = md.get(key(k)) ?? fallback;
    if (v === undefined) throw new Error(`${path} has no ${key(k)}; a ${name} model needs it`);
    if (typeof v !== "number" || !Number.isInteger(v) || v <= 0) {
      throw new Error(
        `${key(k)} in ${path} must be a positive integer; got ${describe(v)}` +
          (typeof v === "object" ? " (per-layer values are not supported)" : ""),
      );
    }
    return v;
  };
  const float = (k: string, fallback?: number): number => {
    const v = md.get(key(k)) ?? fallback;
    if (v === undefined) throw new Error(`${path} has no ${key(k)}; a ${name} model needs it`);
    if (typeof v !== "number" || !(v > 0)) {
      throw new Error(`${key(k)} in ${path} must be a positive number; got ${describe(v)}`);
    }
    return f32Decimal(v);
  };
  const experts = md.get(key("expert_count"));
  if (typeof experts === "number" && experts > 0) {
    throw new Error(
      `${path} is a mixture of experts (${key("expert_count")} = ${experts}); strata runs dense ` +
        `models`,
    );
  }
  const hiddenSize = int("embedding_length");
  const nHeads = int("attention.head_count");
  const nKvHeads = int("attention.head_count_kv", nHeads);
  if (nHeads % nKvHeads !== 0) {
    throw new Error(
      `${key("attention.head_count")} (${nHeads}) in ${path} must be a multiple of ` +
        `${key("attention.head_count_kv")} (${nKvHeads})`,
    );
  }
  const headDim = int("attention.key_length", hiddenSize / nHeads);
  const valueDim = int("attention.value_length", headDim);
  if (valueDim !== headDim) {
    throw new Error(
      `${path}: ${key("attention.key_length")} ${headDim} and ${key("attention.value_length")} ` +
        `${valueDim} differ; strata needs one head dimension`,
    );
  }
  if (headDim % 2 !== 0) throw new Error(`head dimension ${headDim} in ${path} must be even`);
  const rotated = int("rope.dimension_count", headDim);
  if (rotated !== headDim) {
    throw new Error(
      `${path} rotates ${rotated} of each head's ${headDim} dimensions ` +
        `(${key("rope.dimension_count")}); strata rotates whole heads (no partial RoPE)`,
    );
  }
  const ropeTheta = float("rope.freq_base", 10000);
  refuseRopeScaling(md, key, path);
  const ropeScaling = facts.ropeFreqs
    ? fitLlama3Scaling(facts.ropeFreqs, { headDim, ropeTheta, path })
    : undefined;
  const declared = md.get(key("vocab_size"));
  if (declared !== undefined && declared !== facts.vocabSize) {
    throw new Error(
      `${path}: ${key("vocab_size")} is ${describe(declared)} but tokenizer.ggml.tokens holds ` +
        `${facts.vocabSize} tokens; the file is inconsistent`,
    );
  }
  const has = (t: string) => facts.tensorNames.has(t);
  const fileType = md.get("general.file_type");
  const dtype = typeof fileType === "number" ? FILE_DTYPE[fileType] : undefined;
  return {
    arch: known.arch,
    architecture: known.architecture,
    vocabSize: facts.vocabSize,
    hiddenSize,
    intermediateSize: int("feed_forward_length"),
    nLayers: int("block_count"),
    nHeads,
    nKvHeads,
    headDim,
    rmsEps: float("attention.layer_norm_rms_epsilon"),
    ropeTheta,
    ...(ropeScaling ? { ropeScaling } : {}),
    maxPositions: int("context_length", 2048),
    tieEmbeddings: !has("output.weight"),
    // As parseConfig: Qwen2 always has q/k/v biases; a Llama has them when it was trained so.
    attentionBias: known.arch === "qwen2" || has("blk.0.attn_q.bias"),
    oProjBias: known.arch !== "qwen2" && has("blk.0.attn_output.bias"),
    ...(facts.bosId !== undefined ? { bosId: facts.bosId } : {}),
    eosIds: facts.eosIds,
    ...(dtype ? { torchDtype: dtype } : {}),
  };
}

/**
 * The file's architecture (`general.architecture`) when strata runs it.
 *
 * @throws naming it when strata does not
 */
export function ggufArch(header: GgufHeader): { name: string; arch: Arch; architecture: string } {
  const name = header.metadata.get("general.architecture"), path = header.path;
  if (typeof name !== "string") {
    throw new Error(`${path} has no general.architecture; it is not a model file llama.cpp wrote`);
  }
  const known = GGUF_ARCHS[name];
  if (!known) {
    throw new Error(
      `${path} is a '${name}' model (general.architecture); strata runs ` +
        `${Object.keys(GGUF_ARCHS).join(" and ")} GGUF files (Mistral models convert as llama)`,
    );
  }
  return { name, ...known };
}

/** Refuses the RoPE scaling schemes llama.cpp records as keys (linear, YaRN, LongRoPE). */
function refuseRopeScaling(
  md: Map<string, GgufValue>,
  key: (k: string) => string,
  path: string,
): void {
  const type = md.get(key("rope.scaling.type"));
  if (type !== undefined && type !== "none") {
    throw new Error(
      `unsupported RoPE scaling ${describe(type)} (${key("rope.scaling.type")}) in ${path}: ` +
        `strata supports Llama 3 scaling (rope_freqs.weight) or none`,
    );
  }
  const linear = md.get(key("rope.scale_linear"));
  if (typeof linear === "number" && linear !== 1) {
    throw new Error(
      `unsupported linear RoPE scaling ${linear} (${key("rope.scale_linear")}) in ${path}: ` +
        `strata supports Llama 3 scaling (rope_freqs.weight) or none`,
    );
  }
}

/**
 * The shortest decimal that rounds to the same float32 (GGUF stores eps and θ as f32: 1e-5
 * reads back as 9.99999974e-6, and config.json said 1e-5).
 */
export function f32Decimal(x: number): number {
  if (Math.fround(x) !== x) return x;
  for (let p = 1; p <= 9; p++) {
    const d = Number(x.toPrecision(p));
    if (Math.fround(d) === x) return d;
  }
  return x;
}
