/**
 * llama.cpp's tensor names ↔ Hugging Face's, and the row permutation llama.cpp's converter
 * applies to the q and k projections of `llama` models.
 *
 * Why the permutation: Hugging Face's Llama rotates pairs (i, i + D/2) of each head ("rotate
 * half"); llama.cpp's `llama` architecture rotates adjacent pairs (2i, 2i + 1). So
 * convert_hf_to_gguf.py (`LlamaModel.permute`) reorders the rows of q_proj and k_proj (and their
 * biases) within each head: viewing a head's D rows as [2][D/2] and writing them as [D/2][2],
 * GGUF row 2i + j of a head is HF row j·D/2 + i. strata's kernels are rotate-half, so reading
 * undoes it. Qwen2 (llama.cpp's NEOX rope) is converted without it.
 */

/** The whole-model tensors: GGUF name → Hugging Face name. */
const GLOBAL: Record<string, string> = {
  "token_embd.weight": "model.embed_tokens.weight",
  "output_norm.weight": "model.norm.weight",
  "output.weight": "lm_head.weight",
};

/** Per-layer tensors: GGUF suffix after `blk.N.` → Hugging Face suffix after `model.layers.N.`. */
const LAYER: Record<string, string> = {
  "attn_norm.weight": "input_layernorm.weight",
  "attn_q.weight": "self_attn.q_proj.weight",
  "attn_k.weight": "self_attn.k_proj.weight",
  "attn_v.weight": "self_attn.v_proj.weight",
  "attn_output.weight": "self_attn.o_proj.weight",
  "attn_q.bias": "self_attn.q_proj.bias",
  "attn_k.bias": "self_attn.k_proj.bias",
  "attn_v.bias": "self_attn.v_proj.bias",
  "attn_output.bias": "self_attn.o_proj.bias",
  "ffn_norm.weight": "post_attention_layernorm.weight",
  "ffn_gate.weight": "mlp.gate_proj.weight",
  "ffn_up.weight": "mlp.up_proj.weight",
  "ffn_down.weight": "mlp.down_proj.weight",
};

const HF_GLOBAL = Object.fromEntries(Object.entries(GLOBAL).map(([g, h]) => [h, g]));
const HF_LAYER = Object.fromEntries(Object.entries(LAYER).map(([g, h]) => [h, g]));

/** The GGUF tensor that holds Llama 3 RoPE frequency factors (not a weight). */
export const ROPE_FREQS = "rope_freqs.weight";

/**
 * The Hugging Face name of a GGUF tensor, e.g. `blk.3.attn_q.weight` →
 * `model.layers.3.self_attn.q_proj.weight`.
 *
 * @returns the name, or undefined when the tensor has no place in a Llama decoder
 */
export function hfName(gguf: string): string | undefined {
  if (gguf in GLOBAL) return GLOBAL[gguf];
  const m = /^blk\.(\d+)\.(.+)$/.exec(gguf);
  const suffix = m && LAYER[m[2]];
  return suffix ? `model.layers.${Number(m[1])}.${suffix}` : undefined;
}

/**
 * The GGUF name of a Hugging Face tensor (the writer's side of {@linkcode hfName}).
 *
 * @returns the name, or undefined when llama.cpp has none for it
 */
export function ggufName(hf: string): string | undefined {
  if (hf in HF_GLOBAL) return HF_GLOBAL[hf];
  const m = /^model\.layers\.(\d+)\.(.+)$/.exec(hf);
  const suffix = m && HF_LAYER[m[2]];
  return suffix ? `blk.${Number(m[1])}.${suffix}` : undefined;
}

/**
 * The heads whose rows llama.cpp's converter permuted in this tensor: q (weight and bias) over
 * the query heads, k over the KV heads; none for other tensors or other architectures.
 */
export function permutedHeads(
  gguf: string,
  arch: string,
  heads: { nHeads: number; nKvHeads: number },
): number | undefined {
  if (arch !== "llama") return undefined;
  const m = /^blk\.\d+\.attn_([qk])\.(weight|bias)$/.exec(gguf);
  if (!m) return undefined;
  return m[1] === "q" ? heads.nHeads : heads.nKvHeads;
}

/** Options for {@linkcode permuteRows}. */
export interface PermuteOptions {
  /** Heads the rows split into; rows / heads must be even. */
  heads: number;
  /** true: llama.cpp's order → HF's (reading); false: HF's → llama.cpp's (the converter). */
  inverse: boolean;
}

/**
 * Reorders whole rows within each head (see the module doc). Rows are byte ranges, so this works
 * for every storage type, quantized ones included: a row's blocks move together.
 *
 * @param bytes `rows` rows of `bytes.byteLength / rows` bytes each
 * @param rows the number of rows (shape[0]: output features, or a bias's length)
 * @returns a new array with the rows reordered
 * @throws when the rows do not split into heads of an even number of rows
 */
export function permuteRows(
  bytes: Uint8Array,
  rows: number,
  options: PermuteOptions,
): Uint8Array<ArrayBuffer> {
  const { heads, inverse } = options;
  const perHead = rows / heads, half = perHead / 2;
  const rb = bytes.byteLength / rows;
  if (!Number.isInteger(half) || !Number.isInteger(rb)) {
    throw new Error(
      `internal error: cannot permute ${rows} rows of ${bytes.byteLength} bytes over ${heads} heads`,
    );
  }
  const out = new Uint8Array(bytes.byteLength);
  for (let h = 0; h < heads; h++) {
    for (let j = 0; j < 2; j++) {
      for (let i = 0; i < half; i++) {
        const hf = h * perHead + j * half + i, gguf = h * perHead + 2 * i + j;
        const [from, to] = inverse ? [gguf, hf] : [hf, gguf];
        out.set(bytes.subarray(from * rb, (from + 1) * rb), to * rb);
      }
    }
  }
  return out;
}
