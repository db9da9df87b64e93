/**
 * Uploads a model folder's tensors to the GPU, one tensor at a time (the file is never held
 * twice). 16-bit weights stay 16-bit; q/k/v are concatenated into one matrix and gate/up are
 * interleaved into one (kernels/weight.ts `interleaveGateUp`) so one matmul computes each. Norm
 * weights and biases become f32. With `quantize`, the four projections of every layer are
 * quantized on the GPU as they arrive (engine/model/quant_load.ts); a GGUF file's quantized
 * tensors go up in their own types (repacked, kernels/quant.ts), its quantized embedding as f32
 * (the lookup reads one row; a tied LM head keeps the quantized copy). The LM head and the
 * embeddings stay as loaded under `quantize` (docs/quantization.md).
 */
import type { Gpu } from "../../gpu/device.ts";
import { createStorage, writeBuffer } from "../../gpu/device.ts";
import {
  BYTES,
  decode,
  type DType,
  encode,
  isQuantized,
  type QuantizeMode,
} from "../../gpu/dtype.ts";
import type { ModelConfig } from "./config.ts";
import { expectedTensors, type ModelFolder } from "./folder.ts";
import { dequantizeRef } from "./gguf_quant.ts";
import { numel, readTensor, type TensorInfo } from "./safetensors.ts";
import {
  type FloatWeight,
  interleaveGateUp,
  type WeightBuffer,
  weightBytes,
} from "../../kernels/weight.ts";
import type { ProductSample } from "../../kernels/quant_x.ts";
import {
  ggufGateUp,
  ggufLmHead,
  ggufMatrix,
  type LoadedProjection,
  quantizedTensor,
  quantizeLoaded,
  typeName,
} from "./quant_load.ts";
import { Progress } from "./progress.ts";

/** The four projections of a layer, as the precision monitor names them. */
export type Projection = "qkv" | "o" | "gateUp" | "down";

/** The projections in the order a layer runs them. */
export const PROJECTIONS: readonly Projection[] = ["qkv", "o", "gateUp", "down"];

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
  /** The projections as loaded, while quantized ones run: the monitor's fallback. */
  precise?: Partial<Record<Projection, FloatWeight>>;
  /** Per quantized projection, sampled rows of its float weight: the monitor's error sample. */
  samples?: Partial<Record<Projection, ProductSample>>;
}

/** How the projections are held (the LM head and embeddings stay as loaded with `--quantize`). */
export interface QuantInfo {
  /** int8 / e4m3: `--quantize`; gguf: the file's block types; none: as loaded. */
  mode: QuantizeMode | "gguf";
  /** The projections' formats, e.g. ["q4_k", "q6_k"]. */
  formats: string[];
  /** Whether the float copies are on the GPU for the monitor's fallback. */
  fallback: boolean;
}

/** All weights of a model on the GPU. */
export interface ModelWeights {
  embed: FloatWeight; // [Vmodel, H]
  layers: LayerWeights[];
  norm: GPUBuffer; // f32 [H]
  /** LM head split into row chunks that each fit one binding: [rows, H] each, in order. */
  lmHead: WeightBuffer[];
  invFreq: GPUBuffer; // f32 [D / 2]
  /** The float dtype of the embedding (and of the float matrices). */
  dtype: DType;
  /** Bytes on the GPU, fallback copies included. */
  bytes: number;
  quant: QuantInfo;
}

/** Options for {@linkcode uploadWeights}. */
export interface UploadOptions {
  /** Label for progress output (stderr, TTY only). */
  label?: string;
  invFreq: Float64Array;
  /** Quantize the projections at load (default none). */
  quantize?: QuantizeMode;
  /**
   * Keep the float projections beside the quantized ones, for the precision monitor to fall back
   * to (default true; false frees their memory and disables the fallback).
   */
  fallback?: boolean;
}

/**
 * Bytes a decode step of one token reads: the projections it runs, the LM head, one embedding
 * row and the norm weights (the numerator of the bench's roofline).
 */
export function decodeBytes(w: ModelWeights): number {
  const layers = w.layers.reduce(
    (n, l) =>
      n + weightBytes(l.qkv) + weightBytes(l.o) + weightBytes(l.gateUp) + weightBytes(l.down),
    0,
  );
  const head = w.lmHead.reduce((n, c) => n + weightBytes(c), 0);
  return layers + head + weightBytes({ ...w.embed, rows: 1 }) + (2 * w.layers.length + 1) *
      w.embed.cols * 4;
}

/**
 * Reads every tensor the model needs and writes it into GPU buffers.
 *
 * @throws Error naming the flag when `quantize` is asked of a file whose projections are
 *   already quantized, or a tensor that does not fit one binding
 */
export async function uploadWeights(
  gpu: Gpu,
  folder: ModelFolder,
  options: UploadOptions,
): Promise<ModelWeights> {
  const cfg = folder.config;
  const get = (name: string): TensorInfo => {
    const t = folder.tensors.get(name);
    if (!t) throw new Error(`tensor '${name}' is missing from ${folder.dir}`);
    return t;
  };
  for (const name of expectedTensors(cfg).keys()) get(name);
  const mode = options.quantize ?? "none";
  const keep = options.fallback ?? true;
  const quantized = [...expectedTensors(cfg).keys()].find((n) => isQuantized(get(n).dtype));
  if (mode !== "none" && quantized) {
    const t = get(quantized);
    throw new Error(
      `--quantize ${mode} quantizes F32, F16 and BF16 weights; ${folder.dir} holds ` +
        `${typeName(t.dtype)} ones (tensor ${t.name}), which run as stored: leave --quantize off`,
    );
  }
  const embedInfo = get("model.embed_tokens.weight");
  const dtype: DType = isQuantized(embedInfo.dtype) ? "f32" : embedInfo.dtype as DType;
  const label = options.label ?? `loading ${folder.id}` + (mode !== "none" ? ` (${mode})` : "");
  const progress = new Progress(label, folder.totalBytes);
  let bytes = 0;
  const read = (n: number) => progress.add(n);

  const fitBinding = (size: number, label: string) => {
    if (size > gpu.maxBinding) {
      throw new Error(
        `${label} needs ${size} bytes in one binding; this adapter allows ${gpu.maxBinding}`,
      );
    }
  };

  /** The raw bytes of a float tensor as `dtype` (dequantized for a block-quantized one). */
  const asDtype = async (t: TensorInfo): Promise<Uint8Array> => {
    const data = await readTensor(t);
    if (t.dtype === dtype) return data;
    const values = isQuantized(t.dtype)
      ? dequantizeRef(data, t.dtype, numel(t.shape))
      : decode(data, t.dtype as DType);
    return encode(values, dtype);
  };

  /** Concatenates row-major float tensors (same cols) into one weight buffer of `dtype`. */
  const matrix = async (names: string[], label: string): Promise<FloatWeight> => {
    const infos = names.map(get);
    const cols = infos[0].shape[1];
    const rows = infos.reduce((n, t) => n + t.shape[0], 0);
    const size = rows * cols * BYTES[dtype];
    fitBinding(size, label);
    const buffer = createStorage(gpu, size, undefined, label);
    let offset = 0;
    for (const t of infos) {
      if (offset % 4 !== 0) throw new Error(`internal error: unaligned concat in ${label}`);
      writeBuffer(gpu, buffer, offset, await asDtype(t));
      offset += t.shape[0] * cols * BYTES[dtype];
      read(t.nbytes);
    }
    return { buffer, dtype, rows, cols };
  };

  /** The MLP's gate and up projections (`[F, H]` each) interleaved into one `[2F, H]` buffer. */
  const gateUpFloat = async (gate: TensorInfo, up: TensorInfo, label: string) => {
    const [rows, cols] = gate.shape;
    const size = 2 * rows * cols * BYTES[dtype];
    fitBinding(size, label);
    const raw = async (t: TensorInfo) => {
      const data = await asDtype(t);
      read(t.nbytes);
      return data;
    };
    const data = interleaveGateUp(await raw(gate), await raw(up), { rows, cols, dtype });
    const buffer = createStorage(gpu, size, undefined, label);
    writeBuffer(gpu, buffer, 0, data);
    return { buffer, dtype, rows: 2 * rows, cols } satisfies FloatWeight;
  };

  /** A vector (norm weight, bias) as f32 values; `names` are concatenated. */
  const values = async (names: string[]): Promise<Float32Array[]> => {
    const parts: Float32Array[] = [];
    for (const n of names) {
      const t = get(n);
      parts.push(Float32Array.from(decode(await readTensor(t), t.dtype as DType)));
      read(t.nbytes);
    }
    return parts;
  };
  const vector = async (names: string[], label: string): Promise<GPUBuffer> => {
    const parts = await values(names);
    const all = new Float32Array(parts.reduce((n, p) => n + p.length, 0));
    let o = 0;
    for (const p of parts) all.set(p, (o += p.length) - p.length);
    bytes += all.byteLength;
    return createStorage(gpu, all.byteLength, all, label);
  };

  /** A projection: float (quantized with `quantize`), or the file's quantized types. */
  const projection = async (
    names: string[],
    label: string,
    biasNames?: string[],
  ): Promise<LoadedProjection> => {
    const infos = names.map(get);
    for (const t of infos) fitBinding(weightBytes({ dtype: t.dtype, ...shapeOf(t) }), label);
    if (infos.some(quantizedTensor)) {
      const biases = biasNames && infos.length > 1 ? await values(biasNames) : undefined;
      return { run: await ggufMatrix(gpu, infos, { label, biases, onRead: read }) };
    }
    const w = await matrix(names, label);
    return mode === "none" ? { run: w } : await quantizeLoaded(gpu, w, mode, keep);
  };
  const gateUp = async (prefix: string, label: string): Promise<LoadedProjection> => {
    const gate = get(`${prefix}.gate_proj.weight`), up = get(`${prefix}.up_proj.weight`);
    if (up.shape[0] !== gate.shape[0] || up.shape[1] !== gate.shape[1]) {
      throw new Error(`${label}: gate_proj is [${gate.shape}] but up_proj is [${up.shape}]`);
    }
    if (quantizedTensor(gate) || quantizedTensor(up)) {
      return { run: await ggufGateUp(gpu, gate, up, { label, onRead: read }) };
    }
    const w = await gateUpFloat(gate, up, label);
    return mode === "none" ? { run: w } : await quantizeLoaded(gpu, w, mode, keep);
  };

  const embed = await matrix(["model.embed_tokens.weight"], "embed");
  bytes += weightBytes(embed);
  const layers: LayerWeights[] = [];
  for (let i = 0; i < cfg.nLayers; i++) {
    const p = `model.layers.${i}`;
    const attn = `${p}.self_attn`;
    const qkvBiasNames = ["q", "k", "v"].map((x) => `${attn}.${x}_proj.bias`);
    const attnNorm = await vector([`${p}.input_layernorm.weight`], `l${i}.attn_norm`);
    const qkvBias = cfg.attentionBias ? await vector(qkvBiasNames, `l${i}.qkv_bias`) : undefined;
    const proj: Record<Projection, LoadedProjection> = {
      qkv: await projection(
        ["q", "k", "v"].map((x) => `${attn}.${x}_proj.weight`),
        `l${i}.qkv`,
        cfg.attentionBias ? qkvBiasNames : undefined,
      ),
      o: await projection([`${attn}.o_proj.weight`], `l${i}.o`),
      gateUp: await gateUp(`${p}.mlp`, `l${i}.gate_up`),
      down: await projection([`${p}.mlp.down_proj.weight`], `l${i}.down`),
    };
    const layer: LayerWeights = {
      attnNorm,
      qkv: proj.qkv.run,
      qkvBias,
      o: proj.o.run,
      oBias: cfg.oProjBias ? await vector([`${attn}.o_proj.bias`], `l${i}.o_bias`) : undefined,
      mlpNorm: await vector([`${p}.post_attention_layernorm.weight`], `l${i}.mlp_norm`),
      gateUp: proj.gateUp.run,
      down: proj.down.run,
    };
    for (const k of PROJECTIONS) {
      bytes += weightBytes(proj[k].run) + (proj[k].precise ? weightBytes(proj[k].precise!) : 0);
      if (proj[k].precise) (layer.precise ??= {})[k] = proj[k].precise;
      if (proj[k].sample) (layer.samples ??= {})[k] = proj[k].sample;
    }
    layers.push(layer);
  }
  const norm = await vector(["model.norm.weight"], "norm");
  const headInfo = cfg.tieEmbeddings || !folder.tensors.has("lm_head.weight")
    ? embedInfo
    : get("lm_head.weight");
  let lmHead: WeightBuffer[];
  const tied = headInfo === embedInfo;
  if (quantizedTensor(headInfo)) lmHead = await ggufLmHead(gpu, headInfo, tied ? () => {} : read);
  else if (tied) lmHead = [embed];
  else lmHead = await lmHeadChunks(gpu, headInfo, dtype, read);
  for (const c of lmHead) if (c !== embed) bytes += weightBytes(c);
  progress.done();
  const invFreq = createStorage(
    gpu,
    options.invFreq.length * 4,
    Float32Array.from(options.invFreq),
  );
  const formats = [
    ...new Set(layers.flatMap((l) => PROJECTIONS.flatMap((k) => formatsOf(l[k])))),
  ];
  const fallback = layers.some((l) => l.precise);
  const quant: QuantInfo = { mode: quantized ? "gguf" : mode, formats, fallback };
  return { embed, layers, norm, lmHead, invFreq, dtype, bytes, quant };
}

/** `[rows, cols]` of a matrix tensor. */
function shapeOf(t: TensorInfo): { rows: number; cols: number } {
  return { rows: t.shape[0], cols: t.shape[1] };
}

/** The formats a weight's parts hold. */
function formatsOf(w: WeightBuffer): string[] {
  return w.parts ? w.parts.map((p) => p.w.dtype) : [w.dtype];
}

/** Splits a float LM head into row chunks that fit one storage binding each. */
async function lmHeadChunks(
  gpu: Gpu,
  t: TensorInfo,
  dtype: DType,
  onBytes: (n: number) => void,
): Promise<WeightBuffer[]> {
  const [rows, cols] = t.shape;
  const rowBytes = cols * BYTES[dtype];
  // Chunk row counts keep byte offsets 4-aligned (even rows for 16-bit with odd cols).
  let per = Math.max(1, Math.floor(gpu.maxBinding / rowBytes));
  if (per < rows && per % 2) per--;
  let data = await readTensor(t);
  if (t.dtype !== dtype) data = encode(decode(data, t.dtype as DType), dtype);
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
  }
  onBytes(t.nbytes);
  return out;
}

/** The model's config, re-exported for callers that only hold weights. */
export type { ModelConfig };
