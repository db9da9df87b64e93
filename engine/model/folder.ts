/**
 * A model on disk: a Hugging Face folder (config, weights as headers only — bytes are read per
 * tensor later —, generation config and tokenizer files) or a GGUF file (engine/model/gguf.ts),
 * validated against each other and given in one shape.
 */
import { basename, extname, join, resolve } from "node:path";
import { type ModelConfig, parseConfig, tokenIds } from "./config.ts";
import { readGgufModel } from "./gguf.ts";
import { ggufName } from "./gguf_names.ts";
import { readSafetensorsIndex, type TensorInfo } from "./safetensors.ts";

/** generation_config.json as loaded, plus the merged EOS ids and the BOS id. */
export interface GenerationConfig {
  /** EOS ids of config.json and generation_config.json, merged (config.json's first). */
  eosIds: number[];
  bosId?: number;
  [key: string]: unknown;
}

/** Everything in a model folder or GGUF file, parsed and checked; weights are not read yet. */
export interface ModelFolder {
  /** Absolute path: the folder, or the .gguf file when one was named. */
  dir: string;
  /** The folder's basename (a named .gguf file: its name without .gguf), used as the model id. */
  id: string;
  /**
   * Parsed config.json, `eosIds` already merged with generation_config.json; for GGUF, the same
   * fields from the file's metadata.
   */
  config: ModelConfig;
  /**
   * Every tensor of the weight files by Hugging Face name, with Hugging Face shapes; a GGUF's
   * may be block-quantized (`TensorInfo.dtype`).
   */
  tensors: Map<string, TensorInfo>;
  generation: GenerationConfig;
  /** Parsed tokenizer.json (for GGUF: rebuilt from the file's tokenizer). */
  tokenizerJson: Record<string, unknown>;
  /** Parsed tokenizer_config.json (`{}` when absent); `chat_template.jinja` folded in. */
  tokenizerConfig: Record<string, unknown>;
  /** Sum of all tensor bytes. */
  totalBytes: number;
}

/** The per-layer weights of the Llama decoder block. */
export type LayerPart =
  | "q"
  | "k"
  | "v"
  | "o"
  | "qBias"
  | "kBias"
  | "vBias"
  | "oBias"
  | "gate"
  | "up"
  | "down"
  | "inputNorm"
  | "postNorm";

const LAYER_SUFFIX: Record<LayerPart, string> = {
  q: "self_attn.q_proj.weight",
  k: "self_attn.k_proj.weight",
  v: "self_attn.v_proj.weight",
  o: "self_attn.o_proj.weight",
  qBias: "self_attn.q_proj.bias",
  kBias: "self_attn.k_proj.bias",
  vBias: "self_attn.v_proj.bias",
  oBias: "self_attn.o_proj.bias",
  gate: "mlp.gate_proj.weight",
  up: "mlp.up_proj.weight",
  down: "mlp.down_proj.weight",
  inputNorm: "input_layernorm.weight",
  postNorm: "post_attention_layernorm.weight",
};

/** Hugging Face names of the whole-model tensors. */
export const TENSOR_NAMES = {
  embed: "model.embed_tokens.weight",
  norm: "model.norm.weight",
  lmHead: "lm_head.weight",
} as const;

/**
 * The Hugging Face name of a layer weight, e.g. `layerTensorName(3, "q")` →
 * `model.layers.3.self_attn.q_proj.weight`.
 */
export function layerTensorName(layer: number, part: LayerPart): string {
  return `model.layers.${layer}.${LAYER_SUFFIX[part]}`;
}

/** The tensor used as the LM head: `lm_head.weight`, or the embedding when tied. */
export function lmHeadName(cfg: Pick<ModelConfig, "tieEmbeddings">): string {
  return cfg.tieEmbeddings ? TENSOR_NAMES.embed : TENSOR_NAMES.lmHead;
}

/**
 * Every tensor a model needs, with its expected shape (HF layout: linear weights `[out, in]`).
 *
 * @param cfg the model config
 * @returns name → shape, in load order (embedding, layers, final norm, LM head if untied)
 */
export function expectedTensors(cfg: ModelConfig): Map<string, number[]> {
  const { hiddenSize: h, headDim: d, nHeads, nKvHeads, intermediateSize: f } = cfg;
  const out = new Map<string, number[]>([[TENSOR_NAMES.embed, [cfg.vocabSize, h]]]);
  for (let i = 0; i < cfg.nLayers; i++) {
    const shapes: [LayerPart, number[]][] = [
      ["inputNorm", [h]],
      ["q", [nHeads * d, h]],
      ["k", [nKvHeads * d, h]],
      ["v", [nKvHeads * d, h]],
      ["o", [h, nHeads * d]],
      ["postNorm", [h]],
      ["gate", [f, h]],
      ["up", [f, h]],
      ["down", [h, f]],
    ];
    if (cfg.attentionBias) {
      shapes.push(["qBias", [nHeads * d]], ["kBias", [nKvHeads * d]], ["vBias", [nKvHeads * d]]);
    }
    if (cfg.oProjBias) shapes.push(["oBias", [h]]);
    for (const [part, shape] of shapes) out.set(layerTensorName(i, part), shape);
  }
  out.set(TENSOR_NAMES.norm, [h]);
  if (!cfg.tieEmbeddings) out.set(TENSOR_NAMES.lmHead, [cfg.vocabSize, h]);
  return out;
}

/**
 * Loads and validates a model folder or GGUF file.
 *
 * @param dir folder with config.json, model.safetensors (or a sharded index), tokenizer.json and
 *   optionally generation_config.json, tokenizer_config.json, chat_template.jinja; or a `.gguf`
 *   file; or a folder holding one `.gguf` file and no config.json
 * @returns the parsed folder (tensor headers only)
 * @throws naming the missing file, the unsupported setting, or the tensor with the wrong shape
 * @example
 * ```ts
 * const folder = await loadModelFolder("models/SmolLM2-135M-Instruct");
 * console.log(folder.id, folder.config.nLayers, folder.totalBytes);
 * ```
 */
export async function loadModelFolder(dir: string): Promise<ModelFolder> {
  dir = resolve(dir);
  const info = await statOrNull(dir);
  if (info?.isFile && extname(dir) === ".gguf") {
    return await loadGguf(dir, dir, basename(dir, ".gguf"));
  }
  if (!info?.isDirectory) {
    throw new Error(
      `model folder ${dir} does not exist; pass a folder with config.json, or a .gguf file`,
    );
  }
  const configPath = join(dir, "config.json");
  if (!(await statOrNull(configPath))) {
    const ggufs = [];
    for await (const e of Deno.readDir(dir)) {
      if (e.isFile && extname(e.name) === ".gguf") ggufs.push(e.name);
    }
    if (ggufs.length === 1) return await loadGguf(join(dir, ggufs[0]), dir, basename(dir));
    if (ggufs.length > 1) {
      throw new Error(
        `model folder ${dir} holds ${ggufs.length} .gguf files (${ggufs.sort().join(", ")}) ` +
          `and no config.json; pass the path of the one to load`,
      );
    }
  }
  const configJson = await readJson(configPath, true);
  const config = parseConfig(configJson!, configPath);
  const genJson = (await readJson(join(dir, "generation_config.json"), false)) ?? {};
  const eosIds = [...config.eosIds];
  for (const id of tokenIds(genJson.eos_token_id)) if (!eosIds.includes(id)) eosIds.push(id);
  config.eosIds = eosIds;
  const bosId = config.bosId ?? tokenIds(genJson.bos_token_id)[0];
  if (config.bosId === undefined && bosId !== undefined) config.bosId = bosId;
  const generation: GenerationConfig = {
    ...genJson,
    eosIds,
    ...(bosId !== undefined ? { bosId } : {}),
  };
  const tokenizerJson = (await readJson(join(dir, "tokenizer.json"), true))!;
  const tokenizerConfig = (await readJson(join(dir, "tokenizer_config.json"), false)) ?? {};
  if (tokenizerConfig.chat_template === undefined) {
    const tpl = await Deno.readTextFile(join(dir, "chat_template.jinja")).catch(() => undefined);
    const tplJson = await readJson(join(dir, "chat_template.json"), false);
    const found = tpl ?? tplJson?.chat_template;
    if (found !== undefined) tokenizerConfig.chat_template = found;
  }
  const tensors = await readSafetensorsIndex(dir);
  validateTensors(config, tensors);
  let totalBytes = 0;
  for (const t of tensors.values()) totalBytes += t.nbytes;
  return {
    dir,
    id: basename(dir),
    config,
    tensors,
    generation,
    tokenizerJson,
    tokenizerConfig,
    totalBytes,
  };
}

/** A GGUF file as a {@linkcode ModelFolder} at `dir` named `id`. */
async function loadGguf(file: string, dir: string, id: string): Promise<ModelFolder> {
  const m = await readGgufModel(file);
  for (const name of expectedTensors(m.config).keys()) {
    if (!m.tensors.has(name)) {
      throw new Error(
        `missing tensor '${ggufName(name)}' (${name}) in ${file}: a ${m.config.arch} model ` +
          `with this metadata needs it`,
      );
    }
  }
  validateTensors(m.config, m.tensors, "its GGUF metadata");
  let totalBytes = 0;
  for (const t of m.tensors.values()) totalBytes += t.nbytes;
  const { eosIds, bosId } = m.config;
  return {
    dir,
    id,
    config: m.config,
    tensors: m.tensors,
    generation: { eosIds, ...(bosId !== undefined ? { bosId } : {}) },
    tokenizerJson: m.tokenizerJson,
    tokenizerConfig: m.tokenizerConfig,
    totalBytes,
  };
}

/**
 * `path`'s stat, or null when it does not exist; other failures (a missing read permission)
 * throw as they are, so they are not reported as a missing file.
 */
async function statOrNull(path: string): Promise<Deno.FileInfo | null> {
  try {
    return await Deno.stat(path);
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) return null;
    throw e;
  }
}

/**
 * Checks that every tensor the config needs is present with the expected shape.
 *
 * @param source what the config came from, for messages ("config.json")
 * @throws naming the first missing or misshapen tensor, its file and the config values involved
 */
export function validateTensors(
  cfg: ModelConfig,
  tensors: Map<string, TensorInfo>,
  source = "config.json",
): void {
  for (const [name, shape] of expectedTensors(cfg)) {
    const t = tensors.get(name);
    if (!t) {
      const hint = name === TENSOR_NAMES.lmHead
        ? " (tie_word_embeddings is false; set it to true if the LM head is the embedding)"
        : "";
      throw new Error(`missing tensor '${name}' in the weights of ${cfg.architecture}${hint}`);
    }
    if (t.shape.length !== shape.length || t.shape.some((n, i) => n !== shape[i])) {
      throw new Error(
        `tensor '${name}' in ${t.file} has shape [${t.shape}], but ${source} implies ` +
          `[${shape}] (hidden ${cfg.hiddenSize}, heads ${cfg.nHeads}/${cfg.nKvHeads}, head_dim ` +
          `${cfg.headDim}, ffn ${cfg.intermediateSize}, vocab ${cfg.vocabSize})`,
      );
    }
  }
}

async function readJson(path: string, required: boolean): Promise<Record<string, unknown> | null> {
  let text: string;
  try {
    text = await Deno.readTextFile(path);
  } catch (e) {
    if (!(e instanceof Deno.errors.NotFound)) throw e;
    if (required) {
      throw new Error(`missing ${basename(path)} in model folder ${resolve(path, "..")}`);
    }
    return null;
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new Error(`${path} is not valid JSON: ${(e as Error).message}`);
  }
}
