/**
 * The oracle: a float64 forward pass written straight from the Hugging Face Llama / Mistral /
 * Qwen2 modelling code, independent of every GPU path. Weights are decoded from their stored
 * dtype (what the GPU sees), block-quantized GGUF weights dequantized exactly
 * (engine/model/gguf_quant.ts); all arithmetic is float64. No KV cache: each call recomputes the
 * whole sequence, which keeps it obviously correct.
 */
import type { AttentionMask } from "../../kernels/attention_mask.ts";
import { configMask, type ModelConfig, ropeAttentionFactor, ropeInvFreq } from "./config.ts";
import { dequantizeRef } from "./gguf_quant.ts";
import {
  expectedTensors,
  layerTensorName,
  lmHeadName,
  type ModelFolder,
  TENSOR_NAMES,
} from "./folder.ts";
import { numel, readTensor } from "./safetensors.ts";

/** One decoder layer's weights, float64, HF layout (linear `[out, in]` row-major). */
export interface ReferenceLayer {
  inputNorm: Float64Array; // [hidden]
  q: Float64Array; // [nHeads * headDim, hidden]
  k: Float64Array; // [nKvHeads * headDim, hidden]
  v: Float64Array; // [nKvHeads * headDim, hidden]
  o: Float64Array; // [hidden, nHeads * headDim]
  qBias?: Float64Array; // [nHeads * headDim]
  kBias?: Float64Array; // [nKvHeads * headDim]
  vBias?: Float64Array; // [nKvHeads * headDim]
  oBias?: Float64Array; // [hidden]
  postNorm: Float64Array; // [hidden]
  gate: Float64Array; // [ffn, hidden]
  up: Float64Array; // [ffn, hidden]
  down: Float64Array; // [hidden, ffn]
}

/** All weights of a model, float64. */
export interface ReferenceWeights {
  embed: Float64Array; // [vocab, hidden]
  layers: ReferenceLayer[];
  norm: Float64Array; // [hidden]
  lmHead: Float64Array; // [vocab, hidden] (the embedding itself when tied)
}

/** Options for {@linkcode ReferenceModel.forward}. */
export interface ForwardOptions {
  /** Only the last position's logits (what generation needs). */
  lastOnly?: boolean;
  /**
   * Rounds each element of k (after RoPE) and v as a KV cache of that precision holds it, e.g.
   * `Math.f16round` for an f16 cache (default: kept as is).
   */
  kvRound?: (x: number) => number;
  /** The attention mask (default: the config's, see `configMask`; e.g. sinks + window). */
  mask?: AttentionMask;
  /**
   * What each projection multiplies, given its input at position t of layer `layer`: the normed
   * row for q, k, v and gate/up, the attention output for o, the SwiGLU product for down
   * (default: as is). The quantization tests pass the int8 rounding of x here where the GPU's
   * int8 paths round it.
   */
  projectionInput?: (x: Float64Array, t: number, layer: number) => Float64Array;
}

/** Float64 reference model. */
export class ReferenceModel {
  readonly config: ModelConfig;
  readonly weights: ReferenceWeights;
  readonly invFreq: Float64Array; // [headDim / 2]

  constructor(config: ModelConfig, weights: ReferenceWeights) {
    this.config = config;
    this.weights = weights;
    this.invFreq = ropeInvFreq(config);
  }

  /**
   * Reads and decodes (or dequantizes) every weight of a folder to float64, one tensor at a time.
   */
  static async load(folder: Pick<ModelFolder, "config" | "tensors">): Promise<ReferenceModel> {
    const cfg = folder.config;
    const cache = new Map<string, Float64Array>();
    for (const name of expectedTensors(cfg).keys()) {
      const info = folder.tensors.get(name)!;
      cache.set(name, dequantizeRef(await readTensor(info), info.dtype, numel(info.shape)));
    }
    const get = (name: string) => cache.get(name)!;
    const layers: ReferenceLayer[] = [];
    for (let i = 0; i < cfg.nLayers; i++) {
      const l = (p: Parameters<typeof layerTensorName>[1]) => get(layerTensorName(i, p));
      layers.push({
        inputNorm: l("inputNorm"),
        q: l("q"),
        k: l("k"),
        v: l("v"),
        o: l("o"),
        ...(cfg.attentionBias ? { qBias: l("qBias"), kBias: l("kBias"), vBias: l("vBias") } : {}),
        ...(cfg.oProjBias ? { oBias: l("oBias") } : {}),
        postNorm: l("postNorm"),
        gate: l("gate"),
        up: l("up"),
        down: l("down"),
      });
    }
    return new ReferenceModel(cfg, {
      embed: get(TENSOR_NAMES.embed),
      layers,
      norm: get(TENSOR_NAMES.norm),
      lmHead: get(lmHeadName(cfg)),
    });
  }

  /**
   * Runs the model over `tokens` (positions 0..T-1).
   *
   * @param tokens token ids
   * @param options `lastOnly`: compute the LM head for the last position only (returns 1 row)
   * @returns logits per position: T arrays (1 with `lastOnly`) of length vocabSize, float64
   */
  forward(tokens: number[], options: ForwardOptions = {}): Float64Array[] {
    const cfg = this.config;
    const { hiddenSize: H, headDim: D, nHeads, nKvHeads } = cfg;
    const T = tokens.length;
    const w = this.weights;
    // Dynamic NTK: one forward over T tokens uses the frequencies of length T (transformers'
    // `dynamic_rope_update` on a fresh model); every other kind has fixed ones.
    const invFreq = cfg.ropeScaling?.type === "dynamic" ? ropeInvFreq(cfg, T) : this.invFreq;
    const scaling = ropeAttentionFactor(cfg);
    const mask = options.mask ?? configMask(cfg);
    // x: [T][hidden], the residual stream
    const x = tokens.map((t) => {
      if (!(t >= 0 && t < cfg.vocabSize)) {
        throw new Error(`token id ${t} is outside the vocabulary [0, ${cfg.vocabSize})`);
      }
      return w.embed.slice(t * H, (t + 1) * H);
    });
    for (const [l, layer] of w.layers.entries()) {
      // attention block: x += o_proj(attn(rope(q), rope(k), v)) of rmsnorm(x)
      const round = options.projectionInput;
      const input = (r: Float64Array, t: number) => (round ? round(r, t, l) : r);
      const hn = x.map((r, t) => input(rmsnorm(r, layer.inputNorm, cfg.rmsEps), t));
      const q = hn.map((r) => linear(r, layer.q, { bias: layer.qBias })); // [T][Hq*D]
      const k = hn.map((r) => linear(r, layer.k, { bias: layer.kBias })); // [T][Hkv*D]
      const v = hn.map((r) => linear(r, layer.v, { bias: layer.vBias })); // [T][Hkv*D]
      for (let t = 0; t < T; t++) {
        rope(q[t], { nHeads, headDim: D, pos: t, invFreq, scaling });
        rope(k[t], { nHeads: nKvHeads, headDim: D, pos: t, invFreq, scaling });
        const round = options.kvRound;
        if (round) {
          for (let i = 0; i < k[t].length; i++) {
            k[t][i] = round(k[t][i]);
            v[t][i] = round(v[t][i]);
          }
        }
      }
      const attn = attention(q, k, v, { nHeads, nKvHeads, headDim: D, mask });
      for (let t = 0; t < T; t++) {
        addInto(x[t], linear(input(attn[t], t), layer.o, { bias: layer.oBias }));
      }
      for (let t = 0; t < T; t++) mlpInto(x[t], layer, cfg.rmsEps, (r) => input(r, t));
    }
    const rows = options.lastOnly ? x.slice(-1) : x;
    return rows.map((r) => linear(rmsnorm(r, w.norm, cfg.rmsEps), w.lmHead));
  }
}

/** `x / sqrt(mean(x²) + eps) * w`. */
export function rmsnorm(x: Float64Array, w: Float64Array, eps: number): Float64Array {
  let ss = 0;
  for (let i = 0; i < x.length; i++) ss += x[i] * x[i];
  const inv = 1 / Math.sqrt(ss / x.length + eps);
  const out = new Float64Array(x.length);
  for (let i = 0; i < x.length; i++) out[i] = x[i] * inv * w[i];
  return out;
}

/** Options for {@linkcode linear}. */
export interface LinearOptions {
  /** `[N]`, added to the output. */
  bias?: Float64Array;
}

/** `y[n] = Σ_k x[k] W[n, k] (+ bias[n])` with `W` `[N, K]` row-major, K = x.length. */
export function linear(x: Float64Array, W: Float64Array, options: LinearOptions = {}) {
  const K = x.length, N = W.length / K, bias = options.bias;
  const y = new Float64Array(N);
  for (let n = 0; n < N; n++) {
    let s = bias ? bias[n] : 0;
    const row = n * K;
    for (let k = 0; k < K; k++) s += x[k] * W[row + k];
    y[n] = s;
  }
  return y;
}

/** Where {@linkcode rope} rotates. */
export interface RopeOptions {
  nHeads: number;
  headDim: number;
  /** Absolute position of the token. */
  pos: number;
  /** `[headDim / 2]`, from `ropeInvFreq`. */
  invFreq: Float64Array;
  /** cos and sin are multiplied by it (yarn's attention factor; default 1). */
  scaling?: number;
}

/**
 * HF rotate-half RoPE in place on `x: [nHeads, headDim]`: for i < D/2, with a = pos · invFreq[i],
 * c = cos a · scaling, s = sin a · scaling, `x[i] ← x[i] c − x[i+D/2] s`,
 * `x[i+D/2] ← x[i+D/2] c + x[i] s`.
 */
export function rope(x: Float64Array, options: RopeOptions): void {
  const { nHeads, headDim: D, pos, invFreq } = options;
  const half = D / 2, m = options.scaling ?? 1;
  for (let h = 0; h < nHeads; h++) {
    const b = h * D;
    for (let i = 0; i < half; i++) {
      const c = Math.cos(pos * invFreq[i]) * m, s = Math.sin(pos * invFreq[i]) * m;
      const x1 = x[b + i], x2 = x[b + i + half];
      x[b + i] = x1 * c - x2 * s;
      x[b + i + half] = x2 * c + x1 * s;
    }
  }
}

/** Shapes for {@linkcode attention}. */
export interface AttentionShape {
  nHeads: number;
  nKvHeads: number;
  headDim: number;
  /**
   * Which keys query i sees besides j ≤ i (default causal): window i − j < window; sinks j <
   * sinks or i − j < window; chunked ⌊j / chunk⌋ = ⌊i / chunk⌋.
   */
  mask?: AttentionMask;
}

/** Whether key j is visible from query i under `mask` (j ≤ i). */
function sees(mask: AttentionMask | undefined, i: number, j: number): boolean {
  switch (mask?.kind) {
    case "window":
      return i - j < mask.window;
    case "sinks":
      return j < mask.sinks || i - j < mask.window;
    case "chunked":
      return Math.floor(i / mask.chunk) === Math.floor(j / mask.chunk);
    default:
      return true;
  }
}

/**
 * Masked softmax attention with GQA (query head h reads kv head ⌊h / (nHeads / nKvHeads)⌋),
 * scale 1/√headDim: query i attends the keys j ≤ i its mask lets it see.
 *
 * @returns o: [T][nHeads * headDim]
 */
export function attention(
  q: Float64Array[],
  kv: Float64Array[],
  v: Float64Array[],
  shape: AttentionShape,
): Float64Array[] {
  const { nHeads, nKvHeads, headDim: D } = shape;
  const group = nHeads / nKvHeads;
  const scale = 1 / Math.sqrt(D);
  return q.map((qt, i) => {
    const out = new Float64Array(nHeads * D);
    const keys: number[] = [];
    for (let j = 0; j <= i; j++) if (sees(shape.mask, i, j)) keys.push(j);
    const scores = new Float64Array(keys.length);
    for (let h = 0; h < nHeads; h++) {
      const qb = h * D, kb = Math.floor(h / group) * D;
      let max = -Infinity;
      keys.forEach((j, n) => {
        let s = 0;
        for (let d = 0; d < D; d++) s += qt[qb + d] * kv[j][kb + d];
        scores[n] = s * scale;
        if (scores[n] > max) max = scores[n];
      });
      let sum = 0;
      for (let n = 0; n < scores.length; n++) sum += scores[n] = Math.exp(scores[n] - max);
      keys.forEach((j, n) => {
        const p = scores[n] / sum;
        for (let d = 0; d < D; d++) out[qb + d] += p * v[j][kb + d];
      });
    }
    return out;
  });
}

/**
 * The MLP block of one position, in place: `x += down(silu(gate(h)) · up(h))` of
 * `h = rmsnorm(x)` (the layer's post-attention norm). `input` sees each projection's input (the
 * forward's `projectionInput` rounding); default as it is.
 */
export function mlpInto(
  x: Float64Array,
  layer: ReferenceLayer,
  eps: number,
  input: (r: Float64Array) => Float64Array = (r) => r,
): void {
  const h = input(rmsnorm(x, layer.postNorm, eps));
  const g = linear(h, layer.gate); // [ffn]
  const u = linear(h, layer.up); // [ffn]
  for (let j = 0; j < g.length; j++) g[j] = (g[j] / (1 + Math.exp(-g[j]))) * u[j];
  addInto(x, linear(input(g), layer.down));
}

function addInto(x: Float64Array, y: Float64Array): void {
  for (let i = 0; i < x.length; i++) x[i] += y[i];
}

/** Natural-log softmax of one row of logits, float64. */
export function logSoftmax(logits: ArrayLike<number>): Float64Array {
  let max = -Infinity;
  for (let i = 0; i < logits.length; i++) if (logits[i] > max) max = logits[i];
  let sum = 0;
  for (let i = 0; i < logits.length; i++) sum += Math.exp(logits[i] - max);
  const lse = max + Math.log(sum);
  const out = new Float64Array(logits.length);
  for (let i = 0; i < logits.length; i++) out[i] = logits[i] - lse;
  return out;
}

/** Index of the largest value; the first one on ties (as `torch.argmax`). */
export function argmax(values: ArrayLike<number>): number {
  let best = 0;
  for (let i = 1; i < values.length; i++) if (values[i] > values[best]) best = i;
  return best;
}

/** Options for {@linkcode greedyGenerate}. */
export interface GreedyOptions {
  /** Tokens to generate. */
  maxTokens: number;
  /** Stop after emitting one of these (it is included in the output). */
  stopIds?: number[];
}

/** Tokens chosen by {@linkcode greedyGenerate} and their log-probabilities. */
export interface GreedyResult {
  tokens: number[];
  logprobs: number[];
  /** Top-1 minus top-2 logit at each step (how safe the argmax is to compare against). */
  margins: number[];
}

/**
 * Greedy decoding with the reference model: argmax at each step, re-running the full sequence.
 *
 * @param model the reference model
 * @param prompt prompt token ids (non-empty)
 * @param options `{maxTokens}` or just the number of tokens
 * @returns generated ids, their log-probabilities and top-1 margins
 */
export function greedyGenerate(
  model: ReferenceModel,
  prompt: number[],
  options: GreedyOptions | number,
): GreedyResult {
  const { maxTokens, stopIds = [] } = typeof options === "number"
    ? { maxTokens: options }
    : options;
  if (prompt.length === 0) throw new Error("greedyGenerate needs a non-empty prompt");
  const seq = [...prompt];
  const result: GreedyResult = { tokens: [], logprobs: [], margins: [] };
  for (let n = 0; n < maxTokens; n++) {
    const logits = model.forward(seq, { lastOnly: true })[0];
    const id = argmax(logits);
    result.tokens.push(id);
    result.logprobs.push(logSoftmax(logits)[id]);
    result.margins.push(topMargin(logits));
    seq.push(id);
    if (stopIds.includes(id)) break;
  }
  return result;
}

/** Largest minus second-largest value. */
export function topMargin(values: ArrayLike<number>): number {
  let a = -Infinity, b = -Infinity;
  for (let i = 0; i < values.length; i++) {
    const x = values[i];
    if (x > a) [a, b] = [x, a];
    else if (x > b) b = x;
  }
  return a - b;
}
