/**
 * Uploads a model folder's tensors to the GPU, one tensor at a time (the file is never held
 * twice). 16-bit weights stay 16-bit; q/k/v are concatenated into one matrix and gate/up are
 * interleaved into one (kernels/weight.ts `interleaveGateUp`) so one matmul computes each. Norm
 * weights and biases become f32.
 */
import type { Gpu } from "../../gpu/device.ts";
import { createStorage, writeBuffer } from "../../gpu/device.ts";
import { BYTES, decode, type DType, encode, isQuantized } from "../../gpu/dtype.ts";
import type { ModelConfig } from "./config.ts";
import { expectedTensors, type ModelFolder } from "./folder.ts";
import { ggmlName } from "./gguf_format.ts";
import { ggufName } from "./gguf_names.ts";
import { readTensor, type TensorInfo } from "./safetensors.ts";
import { type FloatWeight, interleaveGateUp, type WeightBuffer } from "../../kernels/weight.ts";
import { Progress } from "./progress.ts";

/** One decoder layer on the GPU. */
export interface LayerWeights {
  attnNorm: GPUBuffer; // f32 [H]
  qkv: WeightBuffer; // [(Hq + 2 Hkv) D, H]
  qkvBias?: GPUBuffer; // f32 [(Hq + 2 Hkv) D] (Qwen2)
  o: WeightBuffer; // [H, Hq D]
  oBias?: GPUBuffer; // f32 [H] (Llama with attention_bias)
  mlpNorm: GPUBuffer; // f32 [H]
  gateUp: WeightBuffer; // [2F, H]: gate/up rows interleaved (interleaveGateUp, SWIGLU_BLOCK)
  down: WeightBuffer; // [H, F]
}

/** All weights of a model on the GPU. */
export interface ModelWeights {
  embed: FloatWeight; // [Vmodel, H]
  layers: LayerWeights[];
  norm: GPUBuffer; // f32 [H]
  /** LM head split into row chunks that each fit one binding: [rows, H] each, in order. */
  lmHead: WeightBuffer[];
  invFreq: GPUBuffer; // f32 [D / 2]
  dtype: DType;
  bytes: number;
}

/** Options for {@linkcode uploadWeights}. */
export interface UploadOptions {
  /** Label for progress output (stderr, TTY only). */
  label?: string;
  invFreq: Float64Array;
}

/** A tensor the GPU takes as it is stored, or re-encoded: f32, f16 or bf16. */
type FloatTensor = TensorInfo & { dtype: DType };

/**
 * Reads every tensor the model needs and writes it into GPU buffers.
 *
 * @throws before allocating anything when a weight is block-quantized (a GGUF's Q8_0, Q4_0,
 *   Q4_K, Q6_K): the GPU has no quantized matmul yet
 */
export async function uploadWeights(
  gpu: Gpu,
  folder: ModelFolder,
  options: UploadOptions,
): Promise<ModelWeights> {
  const cfg = folder.config;
  const get = (name: string): FloatTensor => {
    const t = folder.tensors.get(name);
    if (!t) throw new Error(`tensor '${name}' is missing from ${folder.dir}`);
    return floatTensor(t);
  };
  for (const name of expectedTensors(cfg).keys()) get(name);
  const dtype = get("model.embed_tokens.weight").dtype;
  const progress = new Progress(options.label ?? `loading ${folder.id}`, folder.totalBytes);
  let bytes = 0;

  const fitBinding = (size: number, label: string) => {
    if (size > gpu.maxBinding) {
      throw new Error(
        `${label} needs ${size} bytes in one binding; this adapter allows ${gpu.maxBinding}`,
      );
    }
  };

  /** Concatenates row-major tensors (same cols) into one weight buffer of `dtype`. */
  const matrix = async (names: string[], label: string): Promise<FloatWeight> => {
    const infos = names.map(get);
    const cols = infos[0].shape[1];
    const rows = infos.reduce((n, t) => n + t.shape[0], 0);
    const size = rows * cols * BYTES[dtype];
    fitBinding(size, label);
    const buffer = createStorage(gpu, size, undefined, label);
    let offset = 0;
    for (const t of infos) {
      let data = await readTensor(t);
      if (t.dtype !== dtype || offset % 4 !== 0) {
        // Mixed dtypes or an odd 16-bit boundary: re-encode this part on the host.
        data = encode(decode(data, t.dtype), dtype);
        if (offset % 4 !== 0) throw new Error(`internal error: unaligned concat in ${label}`);
      }
      writeBuffer(gpu, buffer, offset, data);
      offset += t.shape[0] * cols * BYTES[dtype];
      progress.add(t.nbytes);
    }
    bytes += size;
    return { buffer, dtype, rows, cols };
  };

  /** The MLP's gate and up projections (`[F, H]` each) interleaved into one `[2F, H]` buffer. */
  const gateUp = async (prefix: string, label: string): Promise<WeightBuffer> => {
    const gate = get(`${prefix}.gate_proj.weight`), up = get(`${prefix}.up_proj.weight`);
    const [rows, cols] = gate.shape;
    if (up.shape[0] !== rows || up.shape[1] !== cols) {
      throw new Error(`${label}: gate_proj is [${gate.shape}] but up_proj is [${up.shape}]`);
    }
    const size = 2 * rows * cols * BYTES[dtype];
    fitBinding(size, label);
    const raw = async (t: FloatTensor) => {
      const data = await readTensor(t);
      progress.add(t.nbytes);
      return t.dtype === dtype ? data : encode(decode(data, t.dtype), dtype);
    };
    const data = interleaveGateUp(await raw(gate), await raw(up), { rows, cols, dtype });
    const buffer = createStorage(gpu, size, undefined, label);
    writeBuffer(gpu, buffer, 0, data);
    bytes += size;
    return { buffer, dtype, rows: 2 * rows, cols };
  };

  /** A vector (norm weight, bias) as f32; `names` are concatenated. */
  const vector = async (names: string[], label: string): Promise<GPUBuffer> => {
    const parts: Float64Array[] = [];
    for (const n of names) {
      const t = get(n);
      parts.push(decode(await readTensor(t), t.dtype));
      progress.add(t.nbytes);
    }
    const all = new Float32Array(parts.reduce((n, p) => n + p.length, 0));
    let o = 0;
    for (const p of parts) all.set(p, (o += p.length) - p.length);
    bytes += all.byteLength;
    return createStorage(gpu, all.byteLength, all, label);
  };

  const embed = await matrix(["model.embed_tokens.weight"], "embed");
  const layers: LayerWeights[] = [];
  for (let i = 0; i < cfg.nLayers; i++) {
    const p = `model.layers.${i}`;
    const attn = `${p}.self_attn`;
    layers.push({
      attnNorm: await vector([`${p}.input_layernorm.weight`], `l${i}.attn_norm`),
      qkv: await matrix(
        ["q", "k", "v"].map((x) => `${attn}.${x}_proj.weight`),
        `l${i}.qkv`,
      ),
      qkvBias: cfg.attentionBias
        ? await vector(["q", "k", "v"].map((x) => `${attn}.${x}_proj.bias`), `l${i}.qkv_bias`)
        : undefined,
      o: await matrix([`${attn}.o_proj.weight`], `l${i}.o`),
      oBias: cfg.oProjBias ? await vector([`${attn}.o_proj.bias`], `l${i}.o_bias`) : undefined,
      mlpNorm: await vector([`${p}.post_attention_layernorm.weight`], `l${i}.mlp_norm`),
      gateUp: await gateUp(`${p}.mlp`, `l${i}.gate_up`),
      down: await matrix([`${p}.mlp.down_proj.weight`], `l${i}.down`),
    });
  }
  const norm = await vector(["model.norm.weight"], "norm");
  const lmHead = cfg.tieEmbeddings || !folder.tensors.has("lm_head.weight")
    ? [embed]
    : await lmHeadChunks(gpu, get("lm_head.weight"), dtype, (n) => {
      bytes += n;
      progress.add(n);
    });
  progress.done();
  const invFreq = createStorage(
    gpu,
    options.invFreq.length * 4,
    Float32Array.from(options.invFreq),
  );
  return { embed, layers, norm, lmHead, invFreq, dtype, bytes };
}

/** `t`, when the GPU can take it (not block-quantized). */
function floatTensor(t: TensorInfo): FloatTensor {
  if (!isQuantized(t.dtype)) return t as FloatTensor;
  const type = ggmlName(t.dtype);
  throw new Error(
    `${type} weights need the quantized matmul, not built yet: tensor ${ggufName(t.name) ?? ""} ` +
      `(${t.name}) in ${t.file} is ${type}; load an F16, BF16 or F32 GGUF or the Hugging Face ` +
      `model for now`,
  );
}

/** Splits the LM head into row chunks that fit one storage binding each. */
async function lmHeadChunks(
  gpu: Gpu,
  t: FloatTensor,
  dtype: DType,
  onBytes: (n: number) => void,
): Promise<WeightBuffer[]> {
  const [rows, cols] = t.shape;
  const rowBytes = cols * BYTES[dtype];
  // Chunk row counts keep byte offsets 4-aligned (even rows for 16-bit with odd cols).
  let per = Math.max(1, Math.floor(gpu.maxBinding / rowBytes));
  if (per < rows && per % 2) per--;
  let data = await readTensor(t);
  if (t.dtype !== dtype) data = encode(decode(data, t.dtype), dtype);
  const out: WeightBuffer[] = [];
  for (let r = 0; r < rows; r += per) {
    const n = Math.min(per, rows - r);
    const part = data.subarray(r * rowBytes, (r + n) * rowBytes);
    out.push({
      buffer: createStorage(gpu, part.byteLength, part, "lm_head"),
      dtype,
      rows: n,
      cols,
    });
    onBytes(part.byteLength);
  }
  return out;
}

/** The model's config, re-exported for callers that only hold weights. */
export type { ModelConfig };
