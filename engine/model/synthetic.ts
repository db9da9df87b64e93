/**
 * Synthetic models for the bench: a named Llama shape with random weights made directly on the
 * GPU (kernels/fill_random.wgsl). Nothing is read or written on disk except the tokenizer, which
 * comes from a real model folder (its vocabulary may be smaller than the shape's: the extra rows
 * decode to nothing). The numbers such a model produces are meaningless; its speed is not.
 */
import type { Gpu } from "../../gpu/device.ts";
import { createStorage } from "../../gpu/device.ts";
import { BYTES, type DType, type QuantizeMode } from "../../gpu/dtype.ts";
import { type ModelConfig, ropeInvFreq } from "./config.ts";
import { type LayerWeights, type ModelWeights, type Projection, PROJECTIONS } from "./weights.ts";
import { type LoadedProjection, quantizeLoaded } from "./quant_load.ts";
import type { GpuModel } from "./gpu_model.ts";
import { loadModelFolder } from "./folder.ts";
import { TextTokenizer } from "./tokenizer.ts";
import { Progress } from "./progress.ts";
import { type FloatWeight, weightBytes } from "../../kernels/weight.ts";
import { type Dispatch, run } from "../../gpu/dispatch.ts";
import { fillRandomDispatch } from "../../kernels/fill_random.ts";

/** The sizes that define a Llama-family shape. */
export interface Shape {
  layers: number;
  hidden: number;
  heads: number;
  kvHeads: number;
  headDim: number;
  ffn: number;
  vocab: number;
  /** The LM head is the embedding matrix. */
  tied: boolean;
}

/** Shapes the bench knows by name. */
export const SHAPES = {
  /** TinyLlama-1.1B: the shape of the anchors in DESIGN.md (2.2 GB of 16-bit weights). */
  "tinyllama-1.1b": {
    layers: 22,
    hidden: 2048,
    heads: 32,
    kvHeads: 4,
    headDim: 64,
    ffn: 5632,
    vocab: 32000,
    tied: false,
  },
  /** Llama-2-7B: 13.5 GB of 16-bit weights (the 7B anchors of the quantization targets). */
  "llama-7b": {
    layers: 32,
    hidden: 4096,
    heads: 32,
    kvHeads: 32,
    headDim: 128,
    ffn: 11008,
    vocab: 32000,
    tied: false,
  },
  /** A few MB: fast enough for CI on llvmpipe. */
  tiny: {
    layers: 2,
    hidden: 256,
    heads: 4,
    kvHeads: 2,
    headDim: 64,
    ffn: 512,
    vocab: 8192,
    tied: false,
  },
} as const satisfies Record<string, Shape>;

/** A name in {@linkcode SHAPES}. */
export type ShapeName = keyof typeof SHAPES;

/**
 * The {@linkcode ModelConfig} of a named shape.
 *
 * @throws Error naming the known shapes when `name` is not one of them.
 * @example
 * shapeConfig("tinyllama-1.1b").nLayers; // 22
 */
export function shapeConfig(name: string): ModelConfig {
  if (!Object.hasOwn(SHAPES, name)) {
    throw new Error(`unknown shape '${name}': use one of ${Object.keys(SHAPES).join(", ")}`);
  }
  const s: Shape = SHAPES[name as ShapeName];
  return {
    arch: "llama",
    architecture: "LlamaForCausalLM",
    vocabSize: s.vocab,
    hiddenSize: s.hidden,
    intermediateSize: s.ffn,
    nLayers: s.layers,
    nHeads: s.heads,
    nKvHeads: s.kvHeads,
    headDim: s.headDim,
    rmsEps: 1e-5,
    ropeTheta: 10000,
    maxPositions: 2048,
    tieEmbeddings: s.tied,
    attentionBias: false,
    oProjBias: false,
    eosIds: [],
  };
}

/** Options for {@linkcode syntheticWeights}. */
export interface SyntheticWeightsOptions {
  /** Weight dtype of the matrices (default f16); norms are f32 as always. */
  dtype?: DType;
  /** Seed of the random values (default 1). */
  seed?: number;
  /** Progress label (stderr, TTY only). */
  label?: string;
  /** Quantize the projections on the GPU (default none), as `--quantize` does at load. */
  quantize?: QuantizeMode;
  /** Keep the float projections for the monitor's fallback (default true). */
  fallback?: boolean;
}

/**
 * Allocates every weight of `cfg` on the GPU and fills it with random values: matrices uniform
 * in ±1/√fan_in, embeddings ±0.05, norm weights 1 ± 0.05; with `quantize`, the projections
 * then quantized on the GPU. Resolves once the GPU is done.
 *
 * @throws Error when one matrix exceeds the adapter's largest storage binding.
 * @example
 * const w = await syntheticWeights(gpu, shapeConfig("tiny"), { dtype: "bf16" });
 */
export async function syntheticWeights(
  gpu: Gpu,
  cfg: ModelConfig,
  options: SyntheticWeightsOptions = {},
): Promise<ModelWeights> {
  const dtype = options.dtype ?? "f16";
  const { hiddenSize: H, nHeads, nKvHeads, headDim: D, intermediateSize: F } = cfg;
  const V = cfg.vocabSize;
  const seed0 = options.seed ?? 1;
  let tensors = 0, bytes = 0;
  const fills: Dispatch[] = [];

  const matrix = (rows: number, cols: number, label: string, scale: number): FloatWeight => {
    const size = Math.ceil((rows * cols * BYTES[dtype]) / 4) * 4;
    if (size > gpu.maxBinding) {
      throw new Error(
        `${label} needs ${size} bytes in one binding; this adapter allows ${gpu.maxBinding}`,
      );
    }
    const buffer = createStorage(gpu, size, undefined, label);
    fills.push(fillRandomDispatch(gpu, buffer, {
      count: rows * cols,
      dtype,
      scale,
      seed: seed0 * 7919 + tensors++,
    }));
    bytes += size;
    return { buffer, dtype, rows, cols };
  };
  const norm = (label: string): GPUBuffer => {
    const buffer = createStorage(gpu, H * 4, undefined, label);
    fills.push(fillRandomDispatch(gpu, buffer, {
      count: H,
      dtype: "f32",
      scale: 0.05,
      center: 1,
      seed: seed0 * 7919 + tensors++,
    }));
    bytes += H * 4;
    return buffer;
  };

  const progress = new Progress(options.label ?? "random weights", cfg.nLayers + 2);
  const flush = async () => {
    await run(gpu, fills.splice(0));
    progress.add(1);
  };
  const embed = matrix(V, H, "embed", 0.05);
  await flush();
  const layers: LayerWeights[] = [];
  const mode = options.quantize ?? "none", keep = options.fallback ?? true;
  for (let l = 0; l < cfg.nLayers; l++) {
    const layer: LayerWeights = {
      attnNorm: norm(`l${l}.attn_norm`),
      qkv: matrix((nHeads + 2 * nKvHeads) * D, H, `l${l}.qkv`, 1 / Math.sqrt(H)),
      o: matrix(H, nHeads * D, `l${l}.o`, 1 / Math.sqrt(nHeads * D)),
      mlpNorm: norm(`l${l}.mlp_norm`),
      gateUp: matrix(2 * F, H, `l${l}.gate_up`, 1 / Math.sqrt(H)),
      down: matrix(H, F, `l${l}.down`, 1 / Math.sqrt(F)),
    };
    await flush();
    if (mode !== "none") {
      for (const k of PROJECTIONS) {
        const q: LoadedProjection = await quantizeLoaded(gpu, layer[k] as FloatWeight, mode, keep);
        if (!q.precise) bytes -= weightBytes(layer[k]);
        layer[k] = q.run;
        bytes += weightBytes(q.run);
        if (q.precise) (layer.precise ??= {})[k as Projection] = q.precise;
        if (q.sample) (layer.samples ??= {})[k as Projection] = q.sample;
      }
    }
    layers.push(layer);
  }
  const finalNorm = norm("norm");
  const lmHead = cfg.tieEmbeddings ? [embed] : lmHeadChunks(V, H, dtype, gpu.maxBinding).map(
    (rows) => matrix(rows, H, "lm_head", 1 / Math.sqrt(H)),
  );
  await flush();
  progress.done();
  const inv = Float32Array.from(ropeInvFreq(cfg));
  const invFreq = createStorage(gpu, inv.byteLength, inv, "inv_freq");
  const formats = mode === "none" ? [dtype] : [mode];
  const quant = { mode, formats, fallback: mode !== "none" && keep };
  return { embed, layers, norm: finalNorm, lmHead, invFreq, dtype, bytes, quant };
}

/** Row counts of LM head chunks that each fit one binding (even, so 16-bit chunks align). */
function lmHeadChunks(rows: number, cols: number, dtype: DType, maxBinding: number): number[] {
  let per = Math.max(1, Math.floor(maxBinding / (cols * BYTES[dtype])));
  if (per < rows && per % 2) per--;
  const out: number[] = [];
  for (let r = 0; r < rows; r += per) out.push(Math.min(per, rows - r));
  return out;
}

/** Options for {@linkcode syntheticModel}. */
export interface SyntheticModelOptions extends SyntheticWeightsOptions {
  /** Model folder whose tokenizer (and EOS ids) the synthetic model uses. */
  tokenizerDir: string;
}

/**
 * A named shape with random GPU weights and a real tokenizer, ready for `Engine.create`.
 *
 * @throws Error for an unknown shape or a tokenizer folder that does not load.
 * @example
 * const model = await syntheticModel(gpu, "tinyllama-1.1b", { tokenizerDir: DEFAULT_MODEL });
 * const engine = Engine.create(gpu, model, { maxSlots: 32 });
 */
export async function syntheticModel(
  gpu: Gpu,
  shape: string,
  options: SyntheticModelOptions,
): Promise<GpuModel> {
  const folder = await loadModelFolder(options.tokenizerDir);
  const tokenizer = TextTokenizer.load(folder);
  const config = { ...shapeConfig(shape), eosIds: tokenizer.eosIds };
  if (folder.config.bosId !== undefined) config.bosId = folder.config.bosId;
  const dtype = options.dtype ?? "f16";
  const weights = await syntheticWeights(gpu, config, { ...options, dtype });
  const q = options.quantize && options.quantize !== "none" ? `-${options.quantize}` : "";
  return { id: `synthetic-${shape}-${dtype}${q}`, config, tokenizer, weights };
}
