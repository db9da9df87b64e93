/**
 * Converts a Hugging Face model folder into a GGUF file the way llama.cpp does it
 * (convert_hf_to_gguf.py for f32/f16/bf16/q8_0, then llama-quantize's type mix for q4_0 and
 * q4_k_m), so tests can check strata reads what llama.cpp users have. Test side: the metadata,
 * the q/k row permutation, the tokenizer (scripts/gguf_vocab.ts) and the quantizers
 * (scripts/gguf_quantize.ts) are written here from llama.cpp's behaviour, and engine/model/gguf*.ts
 * must read them back.
 *
 * ```sh
 * deno run -A scripts/write_gguf.ts --in models/strata-default --out /tmp/default-q8_0.gguf \
 *   --type q8_0
 * ```
 */
import { parseArgs } from "node:util";
import type { ModelConfig } from "../engine/model/config.ts";
import { expectedTensors, loadModelFolder } from "../engine/model/folder.ts";
import { GGML_IDS } from "../engine/model/gguf_format.ts";
import { ggufName, permuteRows, ROPE_FREQS } from "../engine/model/gguf_names.ts";
import { dequantizeRef } from "../engine/model/gguf_quant.ts";
import { llama3Factors, ropeWavelengths } from "../engine/model/gguf_rope.ts";
import { numel, readTensor } from "../engine/model/safetensors.ts";
import type { StorageType } from "../gpu/dtype.ts";
import { quantize } from "./gguf_quantize.ts";
import { tokenizerEntries } from "./gguf_vocab.ts";
import { encodeGguf, type GgufEntry, type GgufSpec, type GgufTensorData } from "./gguf_writer.ts";

/** The file types this writes, by llama.cpp's names for them. */
export type GgufFileType = "f32" | "f16" | "bf16" | "q8_0" | "q4_0" | "q4_k_m";

/** llama.cpp's `llama_ftype` of each (general.file_type). */
const FILE_TYPE: Record<GgufFileType, number> = {
  f32: 0,
  f16: 1,
  q4_0: 2,
  q8_0: 7,
  q4_k_m: 15,
  bf16: 32,
};

/** Options for {@linkcode writeGguf}. */
export interface WriteGgufOptions {
  type: GgufFileType;
  /** GGUF version (3, or 2). */
  version?: number;
  /** Data alignment (32). */
  alignment?: number;
}

/** What {@linkcode writeGguf} wrote. */
export interface WriteGgufSummary {
  path: string;
  bytes: number;
  /** Each tensor's storage type, by Hugging Face name. */
  types: Map<string, StorageType>;
}

/** A GGUF file before encoding: what {@linkcode ggufSpec} builds. */
export interface GgufPlan {
  spec: GgufSpec;
  /** Each tensor's storage type, by Hugging Face name. */
  types: Map<string, StorageType>;
}

/**
 * Writes `dir`'s model as a GGUF file.
 *
 * @param dir a Hugging Face model folder (config.json, model.safetensors, tokenizer.json)
 * @param out the .gguf file to write
 * @param options the file type; GGUF version and alignment
 * @returns the path, size and each tensor's type
 * @throws as {@linkcode ggufSpec}
 */
export async function writeGguf(
  dir: string,
  out: string,
  options: WriteGgufOptions,
): Promise<WriteGgufSummary> {
  const { spec, types } = await ggufSpec(dir, options);
  const bytes = encodeGguf(spec);
  await Deno.writeFile(out, bytes);
  return { path: out, bytes: bytes.byteLength, types };
}

/**
 * The metadata and tensors llama.cpp would write for `dir`'s model (tests edit them to make
 * broken files).
 *
 * @throws when llama.cpp would store a tensor in a type strata does not read (Q5_0, for Q4_K rows
 *   that are not whole 256-value blocks), or the model has no GGUF form here
 */
export async function ggufSpec(dir: string, options: WriteGgufOptions): Promise<GgufPlan> {
  const folder = await loadModelFolder(dir);
  const cfg = folder.config;
  if ([...folder.tensors.values()].some((t) => !t.file.endsWith(".safetensors"))) {
    throw new Error(`${dir} is not a Hugging Face folder; write_gguf converts those`);
  }
  if (cfg.slidingWindow !== undefined) {
    throw new Error(
      `${dir} has a sliding window (${cfg.slidingWindow}), which llama.cpp's llama architecture ` +
        `drops; strata would attend differently from the HF model`,
    );
  }
  const arch = cfg.arch === "qwen2" ? "qwen2" : "llama";
  const shapes = expectedTensors(cfg);
  const types = tensorTypes(cfg, shapes, options.type);
  const tensors: GgufTensorData[] = [];
  if (cfg.ropeScaling && cfg.ropeScaling.type !== "llama3") {
    throw new Error(
      `${dir} has '${cfg.ropeScaling.type}' rope scaling; write_gguf writes llama3's only`,
    );
  }
  if (cfg.ropeScaling) {
    const f = llama3Factors(cfg.ropeScaling, ropeWavelengths(cfg.headDim, cfg.ropeTheta));
    tensors.push(tensorData(ROPE_FREQS, "f32", [f.length], quantize(f, "f32", f.length)));
  }
  for (const [name, shape] of shapes) {
    const info = folder.tensors.get(name)!;
    let values = dequantizeRef(await readTensor(info), info.dtype, numel(shape));
    const heads = arch === "llama" ? qkHeads(name, cfg) : undefined;
    if (heads !== undefined) {
      const bytes = new Uint8Array(values.buffer);
      values = new Float64Array(permuteRows(bytes, shape[0], { heads, inverse: false }).buffer);
    }
    const type = types.get(name)!;
    tensors.push(tensorData(ggufName(name)!, type, shape, quantize(values, type, shape.at(-1)!)));
  }
  const metadata = [
    ...modelEntries(cfg, arch, folder.id, options.type),
    ...tokenizerEntries(folder),
  ];
  const spec = {
    version: options.version ?? 3,
    alignment: options.alignment ?? 32,
    metadata,
    tensors,
  };
  return { spec, types };
}

function tensorData(
  name: string,
  type: StorageType,
  shape: number[],
  data: Uint8Array,
): GgufTensorData {
  return { name, ggmlType: GGML_IDS[type], dims: shape.toReversed(), data };
}

/** Query heads for q_proj, KV heads for k_proj (weights and biases), as LlamaModel.permute. */
function qkHeads(name: string, cfg: ModelConfig): number | undefined {
  if (/\.q_proj\.(weight|bias)$/.test(name)) return cfg.nHeads;
  if (/\.k_proj\.(weight|bias)$/.test(name)) return cfg.nKvHeads;
  return undefined;
}

/** llama-quantize's `use_more_bits`: layers that get more bits in Q4_K_M. */
function useMoreBits(i: number, n: number): boolean {
  const eighth = Math.floor(n / 8);
  return i < eighth || i >= Math.floor((7 * n) / 8) || (i - eighth) % 3 === 2;
}

/**
 * Each tensor's type in a file of `fileType`, as llama.cpp chooses: 1-D tensors F32; f32/f16/bf16
 * files keep every matrix in that type; q8_0 (convert_hf_to_gguf) makes every matrix Q8_0; q4_0
 * and q4_k_m (llama-quantize) give the LM head (the embedding when tied) Q6_K, and q4_k_m gives
 * attn_v and ffn_down of the `use_more_bits` layers Q6_K. Rows that are not whole blocks fall back
 * as llama-quantize's `tensor_type_fallback` does: Q6_K → Q8_0, Q8_0/Q4_0 → F16.
 *
 * @throws for a Q4_K tensor whose rows are not whole 256-value blocks (llama.cpp: Q5_0)
 */
export function tensorTypes(
  cfg: ModelConfig,
  shapes: Map<string, number[]>,
  fileType: GgufFileType,
): Map<string, StorageType> {
  const out = new Map<string, StorageType>();
  for (const [name, shape] of shapes) {
    const cols = shape.at(-1)!;
    if (shape.length < 2) {
      out.set(name, "f32");
      continue;
    }
    if (fileType === "f32" || fileType === "f16" || fileType === "bf16") {
      out.set(name, fileType);
      continue;
    }
    const head = name === "lm_head.weight" ||
      (cfg.tieEmbeddings && name === "model.embed_tokens.weight");
    const layer = Number(/^model\.layers\.(\d+)\./.exec(name)?.[1] ?? -1);
    let type: StorageType = fileType === "q8_0" ? "q8_0" : fileType === "q4_0" ? "q4_0" : "q4_k";
    if (fileType !== "q8_0" && head) type = "q6_k";
    if (fileType === "q4_k_m" && /(v_proj|down_proj)\.weight$/.test(name)) {
      if (useMoreBits(layer, cfg.nLayers)) type = "q6_k";
    }
    if (type === "q6_k" && cols % 256 !== 0) type = "q8_0";
    if (type === "q4_k" && cols % 256 !== 0) {
      throw new Error(
        `${name} has rows of ${cols} values: llama-quantize would store it as Q5_0 (Q4_K needs ` +
          `multiples of 256), which strata does not read; use --type q8_0 or q4_0, or a model ` +
          `whose widths are multiples of 256`,
      );
    }
    if ((type === "q8_0" || type === "q4_0") && cols % 32 !== 0) type = "f16";
    out.set(name, type);
  }
  return out;
}

/** general.* and {arch}.* entries, as TextModel.set_gguf_parameters and LlamaModel write them. */
function modelEntries(
  cfg: ModelConfig,
  arch: string,
  name: string,
  fileType: GgufFileType,
): GgufEntry[] {
  const e = (key: string, type: string, value: unknown): GgufEntry => ({ key, type, value });
  const a = (key: string, type: string, value: unknown) => e(`${arch}.${key}`, type, value);
  const out = [
    e("general.architecture", "string", arch),
    e("general.name", "string", name),
    a("block_count", "u32", cfg.nLayers),
    a("context_length", "u32", cfg.maxPositions),
    a("embedding_length", "u32", cfg.hiddenSize),
    a("feed_forward_length", "u32", cfg.intermediateSize),
    a("attention.head_count", "u32", cfg.nHeads),
    a("attention.head_count_kv", "u32", cfg.nKvHeads),
    a("rope.freq_base", "f32", cfg.ropeTheta),
    a("attention.layer_norm_rms_epsilon", "f32", cfg.rmsEps),
  ];
  if (cfg.headDim !== cfg.hiddenSize / cfg.nHeads) {
    out.push(a("attention.key_length", "u32", cfg.headDim));
    out.push(a("attention.value_length", "u32", cfg.headDim));
  }
  out.push(e("general.file_type", "u32", FILE_TYPE[fileType]));
  if (arch === "llama") {
    out.push(a("vocab_size", "u32", cfg.vocabSize));
    out.push(a("rope.dimension_count", "u32", cfg.headDim));
  }
  if (FILE_TYPE[fileType] > 1 && fileType !== "bf16") {
    out.push(e("general.quantization_version", "u32", 2));
  }
  return out;
}

const USAGE = `usage: deno run -A scripts/write_gguf.ts --in DIR --out FILE.gguf --type TYPE
  [--version 3] [--alignment 32]

Converts a Hugging Face model folder (config.json, model.safetensors, tokenizer.json) into a GGUF
file as llama.cpp would (convert_hf_to_gguf.py, then llama-quantize for q4_0 and q4_k_m).

  --type f32|f16|bf16|q8_0|q4_0|q4_k_m   storage of the matrices (1-D tensors are always F32):
        q4_0: Q4_0, the LM head Q6_K; q4_k_m: Q4_K, with attn_v and ffn_down Q6_K in some
        layers and the LM head Q6_K (Q4_K needs rows of multiples of 256 values)
  --version 3|2      GGUF version
  --alignment N      data alignment (a power of two)`;

async function main(): Promise<void> {
  const { values } = parseArgs({
    args: Deno.args,
    options: {
      in: { type: "string" },
      out: { type: "string" },
      type: { type: "string" },
      version: { type: "string" },
      alignment: { type: "string" },
      help: { type: "boolean", short: "h" },
    },
  });
  if (values.help) return console.log(USAGE);
  if (!values.in || !values.out || !values.type) {
    console.error(USAGE);
    Deno.exit(2);
  }
  if (!(values.type in FILE_TYPE)) {
    throw new Error(
      `--type must be one of ${Object.keys(FILE_TYPE).join(", ")}; got '${values.type}'`,
    );
  }
  const version = Number(values.version ?? 3), alignment = Number(values.alignment ?? 32);
  if (version !== 2 && version !== 3) {
    throw new Error(`--version must be 2 or 3; got '${values.version}'`);
  }
  if (!(alignment > 0 && (alignment & (alignment - 1)) === 0)) {
    throw new Error(`--alignment must be a power of two; got '${values.alignment}'`);
  }
  const s = await writeGguf(values.in, values.out, {
    type: values.type as GgufFileType,
    version,
    alignment,
  });
  const counts = new Map<string, number>();
  for (const t of s.types.values()) counts.set(t, (counts.get(t) ?? 0) + 1);
  const mix = [...counts].map(([t, n]) => `${n} ${t.toUpperCase()}`).join(", ");
  console.log(`wrote ${s.path}: ${s.bytes} bytes, tensors ${mix}`);
}

if (import.meta.main) {
  try {
    await main();
  } catch (e) {
    console.error(`error: ${(e as Error).message}`);
    Deno.exit(1);
  }
}
