/**
 * Launch-shape sweep of the decode kernels on real layer shapes: every projection of a synthetic
 * model (QKV + norm, o +=, gate/up + norm + SwiGLU, down +=, LM head + norm) at several M, and
 * decode attention at several batch sizes and contexts. Each timing is one pass over the
 * projection of every layer (distinct weights, as in a real step, so W is not L2-resident),
 * right after ≈ 30 ms of the same work (so the GPU runs at its load clocks), median of
 * `--iterations`; the table gives µs per call and the weight read rate.
 *
 *   deno run -A scripts/sweep_kernels.ts [--shape tinyllama-1.1b] [--m 1,8,32]
 *     [--variants '[{}, {"path": "tiled"}]'] [--contexts 640,2048] [--batches 1,8,32]
 *     [--attn-variants '[{}]'] [--quantize none,int8,e4m3] [--out FILE]
 *
 * A variant is a partial `MatmulOptions` (kernels/matmul.ts) or a partial attention-decode
 * options object (kernels/attention_decode.ts), merged over what the engine would pass. The
 * kernels' `// @unroll` loops compiled as plain loops against their expansion (the default):
 *
 *   deno run -A scripts/sweep_kernels.ts --m 1,4,8,11,16 --variants '[{}, {"unroll": false}]'
 *     --batches 1,8,32 --contexts 640,2048 --attn-variants '[{}, {"unroll": false}]'
 */
import { parseArgs } from "node:util";
import { createStorage, getGpu, type Gpu } from "../gpu/device.ts";
import { timePasses } from "../gpu/timing.ts";
import { shapeConfig, syntheticWeights } from "../engine/model/synthetic.ts";
import { type Dispatch, encode, run } from "../gpu/dispatch.ts";
import { matmulDispatches, type MatmulOptions } from "../kernels/matmul.ts";
import type { WeightBuffer } from "../kernels/weight.ts";
import { attentionDecodeDispatches } from "../kernels/attention_decode.ts";
import { fillRandomDispatch } from "../kernels/fill_random.ts";
import { quantizeWeightDispatch } from "../kernels/quant_weights.ts";
import { weightBytes } from "../kernels/weight.ts";
import { parseQuantize, type QuantizeMode } from "../gpu/dtype.ts";
import type { LayerWeights } from "../engine/model/weights.ts";

/** One timed configuration. */
export interface SweepRow {
  kernel: string;
  m: number;
  variant: string;
  usPerCall: number;
  gbPerS?: number;
}

/**
 * GPU µs per call of `calls` encoded in one pass (a call being `calls.length / per` dispatches). The GPU drops its clocks while the host
 * compiles pipelines, so every timed pass follows ≈ 30 ms of the same work in the same
 * submission (measured after a first untimed run sizes it).
 */
export async function timeCalls(
  gpu: Gpu,
  calls: Dispatch[],
  iterations: number,
  per = calls.length,
): Promise<number> {
  const body = (pass: GPUComputePassEncoder) => encode(pass, calls);
  const [first] = await timePasses(gpu, [body]);
  const warm = Math.min(200, Math.ceil(30e6 / Math.max(first, 1)));
  const ns: number[] = [];
  for (let i = 0; i < iterations; i++) {
    const all = await timePasses(gpu, new Array(warm + 1).fill(body));
    ns.push(all[warm]);
  }
  ns.sort((a, b) => a - b);
  return ns[ns.length >> 1] / 1000 / per;
}

/** A storage buffer of `floats` uniform random f32 in [-1, 1), filled on the GPU. */
export function random(gpu: Gpu, floats: number, seed: number): GPUBuffer {
  const b = createStorage(gpu, floats * 4, undefined, "sweep random");
  const d = fillRandomDispatch(gpu, b, { count: floats, dtype: "f32", scale: 1, seed });
  const enc = gpu.device.createCommandEncoder();
  const pass = enc.beginComputePass();
  encode(pass, [d]);
  pass.end();
  gpu.device.queue.submit([enc.finish()]);
  return b;
}

const USAGE = `usage: deno run -A scripts/sweep_kernels.ts [flags]

GPU µs per call of every projection of a synthetic model (QKV + norm, o +=, gate/up + norm +
SwiGLU, down +=, LM head + norm) at each M and launch variant, and of decode attention at each
batch and context; one line per timing on stdout (µs, GB/s of weights read, the dispatches).

  --shape NAME          tinyllama-1.1b (default), llama-7b or tiny
  --m LIST              rows of x (default 1,8,32; "" times attention only)
  --variants JSON       partial MatmulOptions merged over the engine's, e.g.
                        '[{}, {"path": "tiled"}, {"q8": {"bm": 64, "bn": 128}}]', or for int8
                        decode '[{"small": {"xq": false}}, {}]' (W decoded in registers
                        against x quantized per 16 k, the default)
  --quantize LIST       weight formats of the projections: none (f16), int8, e4m3, comma-
                        separated (default none); the LM head stays f16
  --batches LIST        decode attention batch sizes (default 1,8,32)
  --contexts LIST       decode attention contexts (default 640,2048)
  --attn-variants JSON  partial attention-decode options (default '[{}]')
  --iterations N        timed passes per point, median taken (default 5)
  --out FILE            also write the rows as JSON
  -h, --help            this text`;

async function main(): Promise<void> {
  const { values: v } = parseArgs({
    options: {
      help: { type: "boolean", short: "h" },
      quantize: { type: "string", default: "none" },
      shape: { type: "string", default: "tinyllama-1.1b" },
      m: { type: "string", default: "1,8,32" },
      variants: { type: "string", default: "[{}]" },
      batches: { type: "string", default: "1,8,32" },
      contexts: { type: "string", default: "640,2048" },
      "attn-variants": { type: "string", default: "[{}]" },
      iterations: { type: "string", default: "5" },
      out: { type: "string" },
    },
  });
  if (v.help) return console.log(USAGE);
  const list = (s: string) => s.split(",").filter(Boolean).map(Number);
  const modes = v.quantize!.split(",").map((q) => parseQuantize(q.trim()));
  const iterations = Number(v.iterations);
  const gpu = await getGpu();
  const cfg = shapeConfig(v.shape!);
  console.error(`sweep: ${v.shape} on ${gpu.adapterName}`);
  const w = await syntheticWeights(gpu, cfg, { dtype: "f16" });
  const { hiddenSize: H, intermediateSize: F, nHeads, nKvHeads, headDim: D } = cfg;
  const eps = cfg.rmsEps;
  const rows: SweepRow[] = [];
  const ms = list(v.m);
  const maxM = Math.max(1, ...ms); // --m "" times attention only
  const x = random(gpu, maxM * Math.max(H, F), 1);
  const y = createStorage(gpu, maxM * Math.max(2 * F, cfg.vocabSize, 3 * H) * 4, undefined, "y");
  // The projections in each format asked for (quantized on the GPU from the f16 ones).
  const sets = new Map<QuantizeMode, LayerWeights[]>();
  for (const mode of modes) sets.set(mode, await quantizedLayers(gpu, w.layers, mode));
  let proj = w.layers; // the projections of the format being swept
  const projections: [string, (l: number) => WeightBuffer, Partial<MatmulOptions>, boolean][] = [
    ["qkv +norm", (l) => proj[l].qkv, {}, true],
    ["o +=", (l) => proj[l].o, { accumulate: true }, false],
    ["gate/up +norm swiglu", (l) => proj[l].gateUp, { swiglu: true }, true],
    ["down +=", (l) => proj[l].down, { accumulate: true }, false],
  ];
  for (const [mode, set] of sets) {
    for (const variantText of JSON.parse(v.variants!) as Partial<MatmulOptions>[]) {
      proj = set;
      const variant = (mode === "none" ? "" : `${mode} `) + JSON.stringify(variantText);
      for (const m of ms) {
        for (const [kernel, weight, extra, norm] of projections) {
          rows.push(
            await row(kernel, m, variant, () =>
              w.layers.map((layer, l) =>
                matmulDispatches(gpu, {
                  x,
                  w: weight(l),
                  y,
                  ...(norm ? { normWeight: layer.attnNorm } : {}),
                }, { m, eps, ...extra, ...variantText })
              ), weight(0)),
          );
        }
        rows.push(
          await row(
            "lm head +norm",
            m,
            variant,
            () =>
              w.lmHead.map((chunk) =>
                matmulDispatches(gpu, { x, w: chunk, y, normWeight: w.norm }, {
                  m,
                  eps,
                  ...variantText,
                })
              ),
            w.lmHead[0],
          ),
        );
      }
    }
  }

  async function row(
    kernel: string,
    m: number,
    variant: string,
    build: () => Dispatch[][],
    wb: WeightBuffer,
  ): Promise<SweepRow> {
    try {
      const each = build(); // a variant may be invalid for this shape: reported, not fatal
      const calls = each.flat();
      const us = await timeCalls(gpu, calls, iterations, each.length);
      const bytes = weightBytes(wb);
      const r = { kernel, m, variant, usPerCall: us, gbPerS: bytes / us / 1e3 };
      console.log(
        `${kernel.padEnd(22)} M=${String(m).padEnd(3)} ${variant.padEnd(40)} ` +
          `${us.toFixed(1).padStart(8)} µs ${r.gbPerS.toFixed(0).padStart(6)} GB/s ` +
          `(${each[0].map((c) => c.label).join(" + ")})`,
      );
      return r;
    } catch (e) {
      console.log(`${kernel} M=${m} ${variant}: ${(e as Error).message}`);
      return { kernel, m, variant, usPerCall: NaN };
    }
  }

  // Decode attention over a pool of 4 layers, every slot at `context` keys.
  const layers = 4, BLOCK = 16;
  for (const attnText of JSON.parse(v["attn-variants"]!) as Record<string, unknown>[]) {
    const variant = JSON.stringify(attnText);
    for (const S of list(v.batches)) {
      for (const context of list(v.contexts)) {
        const perSeq = Math.ceil(context / BLOCK);
        const maxBlocks = perSeq + 1;
        const blocks = S * perSeq + 1;
        const poolFloats = blocks * layers * nKvHeads * BLOCK * D;
        if (poolFloats * 4 > gpu.maxBinding) continue;
        const kPool = random(gpu, poolFloats, 2), vPool = random(gpu, poolFloats, 3);
        // The QKV matmul's output: attention rotates q and k and writes k, v at `pos`.
        const qkv = random(gpu, S * (nHeads + 2 * nKvHeads) * D, 4);
        const pos = createStorage(gpu, S * 4, new Uint32Array(S).fill(context - 1), "pos");
        const invFreq = random(gpu, D / 2, 5);
        const out = createStorage(gpu, S * nHeads * D * 4, undefined, "attn out");
        const table = new Uint32Array(S * maxBlocks);
        for (let s = 0; s < S; s++) {
          for (let b = 0; b < perSeq; b++) table[s * maxBlocks + b] = 1 + s * perSeq + b;
        }
        const blockTable = createStorage(gpu, table.byteLength, undefined, "table");
        gpu.device.queue.writeBuffer(blockTable, 0, table);
        const seqLen = createStorage(gpu, S * 4, undefined, "seq_len");
        gpu.device.queue.writeBuffer(seqLen, 0, new Uint32Array(S).fill(context));
        const calls: Dispatch[] = [];
        for (let rep = 0; rep < 22; rep++) {
          calls.push(
            ...attentionDecodeDispatches(gpu, {
              qkv,
              pos,
              invFreq,
              kPool,
              vPool,
              blockTable,
              seqLen,
              out,
            }, {
              seqs: S,
              nHeads,
              nKvHeads,
              headDim: D,
              layer: rep % layers,
              nLayers: layers,
              maxBlocks,
              maxContext: context,
              ...attnText,
            }),
          );
        }
        try {
          const us = (await timeCalls(gpu, calls, iterations)) * calls.length / 22;
          const kvBytes = S * context * nKvHeads * D * 2 * 4;
          rows.push({ kernel: `attention ctx ${context}`, m: S, variant, usPerCall: us });
          console.log(
            `attention ctx ${String(context).padEnd(5)} S=${String(S).padEnd(3)} ` +
              `${variant.padEnd(40)} ${us.toFixed(1).padStart(8)} µs/layer ` +
              `${(kvBytes / us / 1e3).toFixed(0).padStart(6)} GB/s (${
                calls.length / 22
              } dispatches)`,
          );
        } catch (e) {
          console.log(`attention ctx ${context} S=${S} ${variant}: ${(e as Error).message}`);
        }
        for (const b of [kPool, vPool, qkv, pos, invFreq, out, blockTable, seqLen]) b.destroy();
      }
    }
  }
  if (v.out) await Deno.writeTextFile(v.out, JSON.stringify({ adapter: gpu.adapterName, rows }));
}

/** `layers` with their projections quantized to `mode` on the GPU (as loaded for none). */
async function quantizedLayers(
  gpu: Gpu,
  layers: LayerWeights[],
  mode: QuantizeMode,
): Promise<LayerWeights[]> {
  if (mode === "none") return layers;
  const out: LayerWeights[] = [];
  for (const l of layers) {
    const q = { ...l };
    for (const p of ["qkv", "o", "gateUp", "down"] as const) {
      const { weight, dispatch } = quantizeWeightDispatch(gpu, l[p], mode);
      await run(gpu, [dispatch]);
      q[p] = weight;
    }
    out.push(q);
  }
  return out;
}

if (import.meta.main) await main();
