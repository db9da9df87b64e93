/**
 * How much each KV codec, and each grouping it could have had, disturbs a model's real keys and
 * values: the float64 reference forward over a text, every 16-token block of every layer's K and
 * V encoded and decoded, and the error measured where it matters, in each layer's attention
 * output (every query attending every key of its past through the codec, none kept hot). The
 * formats strata ships (kernels/reference_kv.ts) against the groupings docs/kv_codecs.md weighs:
 * int8 with a scale per channel for K, bfp4 with K grouped per row and V per channel, sign1 with
 * a magnitude per channel. CPU only; about a minute for 256 tokens of the default model.
 *
 *   deno run -A scripts/probe_kv_codecs.ts [--model DIR] [--file TEXT] [--tokens N]
 */
import { parseArgs } from "node:util";
import { loadModelFolder } from "../engine/model/folder.ts";
import { TextTokenizer } from "../engine/model/tokenizer.ts";
import {
  attention,
  linear,
  mlpInto,
  ReferenceModel,
  rmsnorm,
  rope,
} from "../engine/model/reference_forward.ts";
import { bfpExponentRef, decodeHeadRef, encodeHeadRef } from "../kernels/reference_kv.ts";
import { helpFromComment } from "./help.ts";

helpFromComment(import.meta.url);

const DEFAULT_MODEL = new URL("../models/strata-default", import.meta.url).pathname;

/** A codec as the probe sees it: a head block [16, D] of K or V in, its decoded values out. */
type Roundtrip = (x: Float64Array, D: number, isV: boolean) => Float64Array;

const shipped = (codec: "f16" | "int8" | "bfp4" | "sign1"): Roundtrip => (x, D, isV) =>
  decodeHeadRef(codec, isV, encodeHeadRef(codec, isV, x, D), D);

/** Symmetric quantization of x[i] over groups `group(i)`, `levels` steps each side. */
function grouped(x: Float64Array, group: (i: number) => number, levels: number, pow2: boolean) {
  const mx = new Map<number, number>();
  x.forEach((v, i) => mx.set(group(i), Math.max(mx.get(group(i)) ?? 0, Math.abs(v))));
  return x.map((v, i) => {
    const m = mx.get(group(i))!;
    const step = pow2 ? 2 ** bfpExponentRef(m) : m / levels;
    return step > 0 ? Math.max(-levels, Math.min(levels, Math.round(v / step))) * step : 0;
  });
}

/** sign1 with a magnitude per channel (over the block's rows) instead of per row. */
const sign1Channel: Roundtrip = (x, D) => {
  const mu = new Float64Array(D), a = new Float64Array(D);
  for (let i = 0; i < x.length; i++) mu[i % D] += x[i] / 16;
  for (let i = 0; i < x.length; i++) a[i % D] += Math.abs(x[i] - mu[i % D]) / 16;
  return x.map((v, i) => mu[i % D] + (v >= mu[i % D] ? a[i % D] : -a[i % D]));
};

/** Each variant: its name, its bits per value at head dim D, and its roundtrip. */
const VARIANTS: [string, (D: number) => number, Roundtrip][] = [
  ["f16", () => 16, shipped("f16")],
  ["int8, scale per token (shipped)", (D) => 8 + 32 / D, shipped("int8")],
  [
    "int8, K scale per channel",
    (D) => 8 + 1 + 16 / D,
    (x, D, isV) => isV ? shipped("int8")(x, D, isV) : grouped(x, (i) => i % D, 127, false),
  ],
  ["bfp4, K per channel, V per token (shipped)", () => 4.5, shipped("bfp4")],
  ["bfp4, K and V per token", () => 4.5, (x) => grouped(x, (i) => Math.floor(i / 16), 7, true)],
  ["bfp4, K and V per channel", () => 4.5, (x, D) => grouped(x, (i) => i % D, 7, true)],
  ["sign1, magnitude per row (shipped)", (D) => 2 + 16 / D, shipped("sign1")],
  ["sign1, magnitude per channel", () => 3, sign1Channel],
];

/** Each layer's rotated q, k and v over `tokens`, from the float64 reference. */
function layerKv(m: ReferenceModel, tokens: number[]) {
  const cfg = m.config, w = m.weights;
  const { hiddenSize: H, headDim: D, nHeads, nKvHeads } = cfg;
  const x = tokens.map((t) => w.embed.slice(t * H, (t + 1) * H));
  const out: { q: Float64Array[]; k: Float64Array[]; v: Float64Array[] }[] = [];
  for (const layer of w.layers) {
    const hn = x.map((r) => rmsnorm(r, layer.inputNorm, cfg.rmsEps));
    const q = hn.map((r) => linear(r, layer.q, { bias: layer.qBias }));
    const k = hn.map((r) => linear(r, layer.k, { bias: layer.kBias }));
    const v = hn.map((r) => linear(r, layer.v, { bias: layer.vBias }));
    q.forEach((r, t) => rope(r, { nHeads, headDim: D, pos: t, invFreq: m.invFreq }));
    k.forEach((r, t) => rope(r, { nHeads: nKvHeads, headDim: D, pos: t, invFreq: m.invFreq }));
    out.push({ q, k, v });
    const attn = attention(q, k, v, { nHeads, nKvHeads, headDim: D });
    for (let t = 0; t < x.length; t++) {
      const o = linear(attn[t], layer.o, { bias: layer.oBias });
      for (let i = 0; i < H; i++) x[t][i] += o[i];
      mlpInto(x[t], layer, cfg.rmsEps);
    }
  }
  return out;
}

/** `rows` (whole blocks of 16) passed through `codec`, head by head. */
function through(rows: Float64Array[], codec: Roundtrip, D: number, isV: boolean) {
  const heads = rows[0].length / D, out = rows.map((r) => r.slice());
  for (let b = 0; b + 16 <= rows.length; b += 16) {
    for (let h = 0; h < heads; h++) {
      const blk = new Float64Array(16 * D);
      for (let t = 0; t < 16; t++) blk.set(rows[b + t].subarray(h * D, (h + 1) * D), t * D);
      const back = codec(blk, D, isV);
      for (let t = 0; t < 16; t++) out[b + t].set(back.subarray(t * D, (t + 1) * D), h * D);
    }
  }
  return out;
}

/** ‖a − b‖ / ‖b‖ over every row. */
function relErr(a: Float64Array[], b: Float64Array[]): number {
  let num = 0, den = 0;
  a.forEach((r, t) =>
    r.forEach((x, i) => {
      num += (x - b[t][i]) ** 2;
      den += b[t][i] ** 2;
    })
  );
  return Math.sqrt(num / den);
}

if (import.meta.main) {
  const { values: v } = parseArgs({
    args: Deno.args,
    options: { model: { type: "string" }, file: { type: "string" }, tokens: { type: "string" } },
  });
  const dir = v.model ?? DEFAULT_MODEL;
  const folder = await loadModelFolder(dir);
  const text = await Deno.readTextFile(v.file ?? `${DEFAULT_MODEL}/val_sample.txt`);
  const n = Number(v.tokens ?? 256);
  const tokens = TextTokenizer.load(folder).encode(text).slice(0, Math.floor(n / 16) * 16);
  const m = await ReferenceModel.load(folder);
  const cfg = m.config, D = cfg.headDim;
  const layers = layerKv(m, tokens);
  const shape = { nHeads: cfg.nHeads, nKvHeads: cfg.nKvHeads, headDim: D };
  console.log(`${folder.id}: ${tokens.length} tokens, ${layers.length} layers, head dim ${D}`);
  console.log("variant | bits/value | K rel. error | V rel. error | attention output rel. error");
  for (const [name, bits, codec] of VARIANTS) {
    let ek = 0, ev = 0, eo = 0;
    for (const { q, k, v } of layers) {
      const kc = through(k, codec, D, false), vc = through(v, codec, D, true);
      ek += relErr(kc, k) / layers.length;
      ev += relErr(vc, v) / layers.length;
      eo += relErr(attention(q, kc, vc, shape), attention(q, k, v, shape)) / layers.length;
    }
    const f = (x: number) => x.toExponential(2);
    console.log(`${name} | ${bits(D).toFixed(2)} | ${f(ek)} | ${f(ev)} | ${f(eo)}`);
  }
}
