/**
 * Writes a small, deterministic (seeded) random model folder that Hugging Face transformers and
 * strata both load: config.json, model.safetensors, generation_config.json, tokenizer.json,
 * tokenizer_config.json.
 *
 * ```sh
 * deno run -A scripts/make_test_model.ts --out /tmp/tiny --arch qwen2 --dtype bf16
 * ```
 */
import { parseArgs } from "node:util";
import { join } from "node:path";
import { type Arch, parseConfig } from "../engine/model/config.ts";
import { type DType, encode } from "../gpu/dtype.ts";
import { expectedTensors, loadModelFolder } from "../engine/model/folder.ts";
import { ReferenceModel, topMargin } from "../engine/model/reference_forward.ts";
import { type TensorData, writeSafetensors } from "../engine/model/safetensors.ts";
import { TextTokenizer } from "../engine/model/tokenizer.ts";
import { buildTokenizer } from "./test_tokenizer.ts";

/** Options for {@linkcode makeTestModel}; every field has a small default. */
export interface TestModelOptions {
  arch?: Arch;
  dtype?: DType;
  /** hidden_size (64). */
  hidden?: number;
  /** num_hidden_layers (2). */
  layers?: number;
  /** num_attention_heads (4). */
  heads?: number;
  /** num_key_value_heads (2). */
  kvHeads?: number;
  /** Explicit head_dim written to config.json (default: hidden / heads, not written). */
  headDim?: number;
  /** intermediate_size (128). */
  ffn?: number;
  /** Model vocab_size (default: tokenizer size rounded up to 64; extra rows are padding). */
  vocab?: number;
  /** tie_word_embeddings (false). */
  tie?: boolean;
  seed?: number;
  ropeTheta?: number;
  /**
   * Add a rope_scaling: llama3 (factor 8, low 1, high 4, original max_positions / 4); linear
   * (factor 4); dynamic (factor 2); yarn (factor 4, original max_positions / 4).
   */
  ropeScaling?: TestRopeScaling;
  /** Mistral's sliding_window (default null: full attention); mistral only. */
  slidingWindow?: number;
  /** max_position_embeddings (512). */
  maxPositions?: number;
  /** BPE merges to learn (200). */
  merges?: number;
  /** Tokenizer prepends `<s>` (true). */
  bos?: boolean;
}

/** The rope_scaling kinds {@linkcode makeTestModel} writes. */
export type TestRopeScaling = "llama3" | "linear" | "dynamic" | "yarn";
const ROPE_SCALINGS: TestRopeScaling[] = ["llama3", "linear", "dynamic", "yarn"];

/** What {@linkcode makeTestModel} wrote, and how peaked its logits are. */
export interface TestModelSummary {
  dir: string;
  config: Record<string, unknown>;
  tokenizerSize: number;
  params: number;
  bytes: number;
  /** Top-1 minus top-2 logit over the positions of a sample prompt. */
  margins: { min: number; median: number; fractionAbove01: number };
}

const TORCH_DTYPE: Record<DType, string> = { f32: "float32", f16: "float16", bf16: "bfloat16" };
const ARCHITECTURE: Record<Arch, string> = {
  llama: "LlamaForCausalLM",
  mistral: "MistralForCausalLM",
  qwen2: "Qwen2ForCausalLM",
};

/** mulberry32 uniform + Box–Muller normal; deterministic for a seed. */
function gaussian(seed: number) {
  let a = seed >>> 0;
  const uniform = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return (n: number, std: number, mean = 0) => {
    const out = new Float64Array(n);
    for (let i = 0; i < n; i++) {
      const r = Math.sqrt(-2 * Math.log(1 - uniform()));
      out[i] = mean + std * r * Math.cos(2 * Math.PI * uniform());
    }
    return out;
  };
}

/** The options with defaults filled in. */
type Resolved = ReturnType<typeof resolve>;

function resolve(options: TestModelOptions) {
  return {
    arch: options.arch ?? "llama",
    dtype: options.dtype ?? "f32",
    hidden: options.hidden ?? 64,
    layers: options.layers ?? 2,
    heads: options.heads ?? 4,
    kvHeads: options.kvHeads ?? 2,
    headDim: options.headDim,
    ffn: options.ffn ?? 128,
    tie: options.tie ?? false,
    seed: options.seed ?? 1,
    ropeTheta: options.ropeTheta ?? 10000,
    ropeScaling: options.ropeScaling,
    slidingWindow: options.slidingWindow,
    maxPositions: options.maxPositions ?? 512,
    merges: options.merges ?? 200,
    bos: options.bos ?? true,
  };
}

/** Builds config.json for the options (every key HF's config class writes). */
function makeConfig(
  o: Resolved & { vocab: number; bosId: number; eosId: number },
): Record<string, unknown> {
  const quarter = Math.max(16, Math.floor(o.maxPositions / 4));
  const ropeScaling = o.ropeScaling === "llama3"
    ? {
      rope_type: "llama3",
      factor: 8.0,
      low_freq_factor: 1.0,
      high_freq_factor: 4.0,
      original_max_position_embeddings: quarter,
    }
    : o.ropeScaling === "linear"
    ? { rope_type: "linear", factor: 4.0 }
    : o.ropeScaling === "dynamic"
    ? { rope_type: "dynamic", factor: 2.0 }
    : o.ropeScaling === "yarn"
    // factor = max_position_embeddings / original, as transformers 4.x recomputes it.
    ? {
      rope_type: "yarn",
      factor: o.maxPositions / quarter,
      original_max_position_embeddings: quarter,
    }
    : null;
  const config: Record<string, unknown> = {
    architectures: [ARCHITECTURE[o.arch]],
    model_type: o.arch,
    attention_dropout: 0.0,
    bos_token_id: o.bosId,
    eos_token_id: o.eosId,
    hidden_act: "silu",
    hidden_size: o.hidden,
    initializer_range: 0.02,
    intermediate_size: o.ffn,
    max_position_embeddings: o.maxPositions,
    num_attention_heads: o.heads,
    num_hidden_layers: o.layers,
    num_key_value_heads: o.kvHeads,
    rms_norm_eps: o.arch === "llama" ? 1e-5 : 1e-6,
    rope_scaling: ropeScaling,
    rope_theta: o.ropeTheta,
    tie_word_embeddings: o.tie,
    torch_dtype: TORCH_DTYPE[o.dtype],
    transformers_version: "4.46.0",
    use_cache: true,
    vocab_size: o.vocab,
  };
  if (o.headDim !== undefined) config.head_dim = o.headDim;
  if (o.arch === "llama") Object.assign(config, { attention_bias: false, mlp_bias: false });
  if (o.arch === "llama") config.pretraining_tp = 1;
  if (o.arch === "mistral") config.sliding_window = o.slidingWindow ?? null;
  else if (o.slidingWindow !== undefined) {
    throw new Error(`a sliding window is Mistral's; got arch '${o.arch}'`);
  }
  if (o.arch === "qwen2") {
    Object.assign(config, {
      max_window_layers: o.layers,
      sliding_window: o.maxPositions,
      use_sliding_window: false,
    });
  }
  return config;
}

/**
 * Writes a seeded random model folder (see the module doc) and checks its logits are peaked.
 *
 * @param dir output folder (created; existing files are overwritten)
 * @param options model shape and dtype
 * @returns what was written, with top-1 margins over a sample prompt
 * @example
 * ```ts
 * const s = await makeTestModel(await Deno.makeTempDir(), { arch: "qwen2", dtype: "f16" });
 * ```
 */
export async function makeTestModel(
  dir: string,
  options: TestModelOptions = {},
): Promise<TestModelSummary> {
  const o = resolve(options);
  if (!(o.arch in ARCHITECTURE)) {
    throw new Error(`--arch must be one of ${Object.keys(ARCHITECTURE).join(", ")}; got ${o.arch}`);
  }
  if (!(o.dtype in TORCH_DTYPE)) {
    throw new Error(`--dtype must be f32, f16 or bf16; got ${o.dtype}`);
  }
  if (o.heads % o.kvHeads !== 0) {
    throw new Error(`--heads (${o.heads}) must be a multiple of --kv-heads (${o.kvHeads})`);
  }
  if (o.headDim === undefined && o.hidden % o.heads !== 0) {
    throw new Error(`--hidden (${o.hidden}) must be divisible by --heads, or give --head-dim`);
  }
  let merges = o.merges;
  if (options.vocab !== undefined) merges = Math.min(merges, options.vocab - 256 - 4);
  if (merges < 0) throw new Error(`--vocab must be at least 260 (256 bytes + 4 specials)`);
  const tok = buildTokenizer({ merges, bos: o.bos, modelMaxLength: o.maxPositions });
  const vocab = options.vocab ?? Math.ceil(tok.size / 64) * 64;
  const config = makeConfig({
    ...o,
    vocab,
    bosId: tok.special["<s>"],
    eosId: tok.special["</s>"],
  });

  // Weights: embedding std 1; linear std gain/sqrt(fan_in); norms near 1; biases small.
  const randn = gaussian(o.seed);
  const cfgShapes = expectedTensors(parseConfig(config, "the generated config.json"));
  const tensors: TensorData[] = [];
  let params = 0;
  for (const [name, shape] of cfgShapes) {
    const n = shape.reduce((a, b) => a * b, 1);
    params += n;
    let values: Float64Array;
    // Tied: the LM head is the std-1 embedding, so the final norm scales logits to std ~3.
    const normScale = name === "model.norm.weight" && o.tie ? 3 / Math.sqrt(o.hidden) : 1;
    if (name.endsWith("norm.weight")) values = randn(n, 0.1 * normScale, normScale);
    else if (name.endsWith(".bias")) values = randn(n, 0.2);
    else if (name === "model.embed_tokens.weight") values = randn(n, 1);
    else if (name === "lm_head.weight") values = randn(n, 3 / Math.sqrt(shape[1]));
    else {
      const gain = /[qk]_proj/.test(name) ? 1.5 : 1;
      values = randn(n, gain / Math.sqrt(shape[1]));
    }
    tensors.push({ name, dtype: o.dtype, shape, data: encode(values, o.dtype) });
  }

  await Deno.mkdir(dir, { recursive: true });
  const writeJson = (file: string, v: unknown) =>
    Deno.writeTextFile(join(dir, file), JSON.stringify(v, null, 2) + "\n");
  await writeSafetensors(join(dir, "model.safetensors"), tensors, {
    metadata: { format: "pt" },
  });
  await writeJson("config.json", config);
  await writeJson("generation_config.json", {
    _from_model_config: false,
    bos_token_id: tok.special["<s>"],
    eos_token_id: [tok.special["</s>"], tok.special["<|im_end|>"]],
    transformers_version: "4.46.0",
  });
  await writeJson("tokenizer.json", tok.tokenizerJson);
  await writeJson("tokenizer_config.json", tok.tokenizerConfig);

  // Check: the folder loads, and the logits over a sample prompt are not flat.
  const folder = await loadModelFolder(dir);
  const tokenizer = TextTokenizer.load(folder);
  const model = await ReferenceModel.load(folder);
  const prompt = tokenizer.encode("The farmer walks to the market and tells a story.");
  const margins = model.forward(prompt).map(topMargin).sort((a, b) => a - b);
  return {
    dir: folder.dir,
    config,
    tokenizerSize: tok.size,
    params,
    bytes: folder.totalBytes,
    margins: {
      min: margins[0],
      median: margins[Math.floor(margins.length / 2)],
      fractionAbove01: margins.filter((m) => m > 0.1).length / margins.length,
    },
  };
}

/**
 * Writes a test model into a new temporary folder, runs `fn` on it, and removes the folder,
 * whatever `fn` does.
 *
 * @param options model shape and dtype (see {@linkcode makeTestModel})
 * @param fn what to do with the folder
 * @example
 * ```ts
 * await withTestModel({ hidden: 64, heads: 2, kvHeads: 1 }, async (dir) => {
 *   const engine = await Engine.load(dir, { maxSlots: 1 });
 * });
 * ```
 */
export async function withTestModel(
  options: TestModelOptions,
  fn: (dir: string) => Promise<void>,
): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "strata-model-" });
  try {
    await makeTestModel(dir, options);
    await fn(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

const USAGE = `usage: deno run -A scripts/make_test_model.ts --out DIR [--arch llama|mistral|qwen2]
  [--dtype f32|f16|bf16] [--hidden 64] [--layers 2] [--heads 4] [--kv-heads 2] [--head-dim N]
  [--ffn 128] [--vocab N] [--tie] [--seed 1] [--rope-theta 10000]
  [--rope-scaling llama3|linear|dynamic|yarn] [--sliding-window N (mistral)]
  [--max-positions 512] [--merges 200] [--no-bos]`;

function nonNegative(v: string): number {
  const n = Number(v);
  if (!Number.isInteger(n) || n < 0) throw new Error(`--merges must be an integer ≥ 0; got '${v}'`);
  return n;
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    args: Deno.args,
    options: {
      out: { type: "string" },
      arch: { type: "string" },
      dtype: { type: "string" },
      hidden: { type: "string" },
      layers: { type: "string" },
      heads: { type: "string" },
      "kv-heads": { type: "string" },
      "head-dim": { type: "string" },
      ffn: { type: "string" },
      vocab: { type: "string" },
      tie: { type: "boolean" },
      seed: { type: "string" },
      "rope-theta": { type: "string" },
      "rope-scaling": { type: "string" },
      "sliding-window": { type: "string" },
      "max-positions": { type: "string" },
      merges: { type: "string" },
      "no-bos": { type: "boolean" },
      help: { type: "boolean", short: "h" },
    },
  });
  if (values.help || !values.out) {
    console.log(USAGE);
    if (!values.help) Deno.exit(2);
    return;
  }
  const int = (key: keyof typeof values): number | undefined => {
    const v = values[key];
    if (v === undefined) return undefined;
    const n = Number(v);
    if (!Number.isInteger(n) || n <= 0) {
      throw new Error(`--${key} must be a positive integer; got '${v}'`);
    }
    return n;
  };
  const scaling = values["rope-scaling"];
  if (scaling !== undefined && !ROPE_SCALINGS.includes(scaling as TestRopeScaling)) {
    throw new Error(`--rope-scaling must be one of ${ROPE_SCALINGS.join(", ")}; got '${scaling}'`);
  }
  const theta = values["rope-theta"] === undefined ? undefined : Number(values["rope-theta"]);
  if (theta !== undefined && !(theta > 0)) {
    throw new Error(`--rope-theta must be a positive number; got '${values["rope-theta"]}'`);
  }
  const s = await makeTestModel(values.out, {
    arch: values.arch as Arch | undefined,
    dtype: values.dtype as DType | undefined,
    hidden: int("hidden"),
    layers: int("layers"),
    heads: int("heads"),
    kvHeads: int("kv-heads"),
    headDim: int("head-dim"),
    ffn: int("ffn"),
    vocab: int("vocab"),
    tie: values.tie,
    seed: values.seed === undefined ? undefined : Number(values.seed),
    ropeTheta: theta,
    ropeScaling: scaling as TestRopeScaling | undefined,
    slidingWindow: int("sliding-window"),
    maxPositions: int("max-positions"),
    merges: values.merges === undefined ? undefined : nonNegative(values.merges),
    bos: !values["no-bos"],
  });
  const c = s.config;
  console.log(
    `wrote ${s.dir}: ${c.architectures} ${c.torch_dtype}, hidden ${c.hidden_size}, layers ` +
      `${c.num_hidden_layers}, heads ${c.num_attention_heads}/${c.num_key_value_heads}, ffn ` +
      `${c.intermediate_size}, vocab ${c.vocab_size} (tokenizer ${s.tokenizerSize}), ` +
      `${s.params} params, ${s.bytes} bytes`,
  );
  const m = s.margins;
  console.log(
    `top-1 logit margin over a sample prompt: min ${m.min.toFixed(3)}, median ` +
      `${m.median.toFixed(3)}, ${(m.fractionAbove01 * 100).toFixed(0)}% > 0.1`,
  );
  if (m.median <= 0.1) console.warn("warning: logits are nearly flat; try another --seed");
}

if (import.meta.main) {
  try {
    await main();
  } catch (e) {
    console.error(`error: ${(e as Error).message}`);
    Deno.exit(1);
  }
}
