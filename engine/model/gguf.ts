/**
 * A GGUF model file (llama.cpp's format) read into what a Hugging Face folder gives: the config,
 * the tensors under their Hugging Face names and shapes (with their storage type: f32, f16, bf16
 * or a ggml block type), and tokenizer.json / tokenizer_config.json objects. No weight is read
 * here; `readTensor` reads each one's bytes later, q and k rows already in Hugging Face's order.
 * docs/gguf.md says what is read and what is refused.
 */
import type { ModelConfig } from "./config.ts";
import { GGML_TYPE_NAMES, type GgufHeader, readGgufHeader } from "./gguf_format.ts";
import { ggufArch, ggufConfig } from "./gguf_config.ts";
import { hfName, permutedHeads, ROPE_FREQS } from "./gguf_names.ts";
import { ggufTokenizer } from "./gguf_tokenizer.ts";
import { readTensor, type TensorInfo } from "./safetensors.ts";

/** A GGUF file's model, in the shapes `ModelFolder` holds. */
export interface GgufModel {
  /** Absolute path of the .gguf file. */
  file: string;
  header: GgufHeader;
  config: ModelConfig;
  /** Every weight by Hugging Face name, HF shapes; `rope_freqs.weight` is in the config. */
  tensors: Map<string, TensorInfo>;
  tokenizerJson: Record<string, unknown>;
  tokenizerConfig: Record<string, unknown>;
}

/** The types strata reads, for refusals. */
const READ = "F32, F16, BF16, Q8_0, Q4_0, Q4_K and Q6_K";

/**
 * Reads a GGUF file's header, config, tensor table and tokenizer.
 *
 * @param file path of the .gguf file
 * @returns the model; tensors are located, not read
 * @throws naming the tensor, key or value when the file is not one strata runs: another
 *   architecture or tokenizer, a tensor type outside F32/F16/BF16/Q8_0/Q4_0/Q4_K/Q6_K, a tensor
 *   with no place in a Llama decoder, a truncated or corrupt file
 * @example
 * ```ts
 * const m = await readGgufModel("models/tinyllama-1.1b-chat.Q4_K_M.gguf");
 * console.log(m.config.nLayers, m.tensors.get("model.layers.0.self_attn.q_proj.weight")?.dtype);
 * ```
 */
export async function readGgufModel(file: string): Promise<GgufModel> {
  const header = await readGgufHeader(file);
  const arch = ggufArch(header).name;
  const tok = ggufTokenizer(header);
  const names = new Set(header.tensors.map((t) => t.name));
  const freqs = header.tensors.find((t) => t.name === ROPE_FREQS);
  let ropeFreqs: Float32Array | undefined;
  if (freqs) {
    if (freqs.type !== "f32" || freqs.dims.length !== 1) {
      throw new Error(
        `${ROPE_FREQS} in ${file} must be a 1-D F32 tensor; got ` +
          `${GGML_TYPE_NAMES[freqs.ggmlType] ?? freqs.ggmlType} [${freqs.dims}]`,
      );
    }
    const info = { name: ROPE_FREQS, dtype: "f32", shape: freqs.dims, file, ...located(freqs) };
    ropeFreqs = new Float32Array((await readTensor(info as TensorInfo)).buffer);
  }
  const config = ggufConfig(header, {
    tensorNames: names,
    ...(ropeFreqs ? { ropeFreqs } : {}),
    vocabSize: tok.vocabSize,
    ...(tok.bosId !== undefined ? { bosId: tok.bosId } : {}),
    eosIds: tok.eosIds,
  });
  const tensors = new Map<string, TensorInfo>();
  for (const t of header.tensors) {
    if (t.name === ROPE_FREQS) continue;
    const name = hfName(t.name);
    if (!name) {
      throw new Error(
        `tensor '${t.name}' in ${file} has no place in a ${arch} decoder: strata runs ` +
          `token_embd, output_norm, output and blk.N.{attn_norm, attn_q, attn_k, attn_v, ` +
          `attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down} (biases too); this model has ` +
          `parts strata does not run`,
      );
    }
    if (!t.type) {
      throw new Error(
        `tensor ${t.name} in ${file} is ${
          GGML_TYPE_NAMES[t.ggmlType] ?? `ggml type ${t.ggmlType}`
        }` +
          `; strata reads ${READ}: use a file quantized to one of them (llama-quantize ... ` +
          `Q4_K_M or Q8_0), or the Hugging Face model`,
      );
    }
    const heads = permutedHeads(t.name, arch, config);
    tensors.set(name, {
      name,
      dtype: t.type,
      shape: t.dims.toReversed(),
      file,
      ...located(t),
      ...(heads !== undefined ? { permutedHeads: heads } : {}),
    });
  }
  return {
    file,
    header,
    config,
    tensors,
    tokenizerJson: tok.tokenizerJson,
    tokenizerConfig: tok.tokenizerConfig,
  };
}

function located(t: { offset: number; nbytes?: number }): { offset: number; nbytes: number } {
  return { offset: t.offset, nbytes: t.nbytes ?? 0 };
}
