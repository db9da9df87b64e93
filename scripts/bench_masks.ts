/**
 * What a compiled mask costs the attention kernels, on TinyLlama's heads: prefill attention (a
 * chunk of `--tokens` queries after `--pos0` cached keys) and decode attention (`--batches` ×
 * `--contexts` keys, the engine's plan for that length) under each mask variant, µs per layer
 * (22 layers' dispatches per timed pass over a small pool, warm clocks, median of
 * `--iterations`; scripts/sweep_kernels.ts `timeCalls`).
 *
 *   deno run -A scripts/bench_masks.ts [--tokens 512] [--pos0 0,8192,32768,130560]
 *     [--batches 1,8] [--contexts 2048,8192,32768,131072] [--window 4096] [--kv-dtype f16]
 *     [--iterations 5] [--out FILE]
 *
 * Variants: `causal`; `all-visible` (a window wider than any context: the masked pipeline doing
 * the causal work, so against `causal` it is the mask's own cost); `window` (--window) and
 * `sinks` (4 sinks + the window less 4), whose time should stay flat past the window. Pools
 * larger than one binding wrap their tables around (some blocks read more than once).
 */
import { parseArgs } from "node:util";
import { createStorage, getGpu, type Gpu } from "../gpu/device.ts";
import { type KvDtype, parseKvDtype } from "../gpu/dtype.ts";
import type { Dispatch } from "../gpu/dispatch.ts";
import { attentionDispatch, chunkWords } from "../kernels/attention.ts";
import { attentionDecodeDispatches } from "../kernels/attention_decode.ts";
import { type AttentionMask, CAUSAL, maskLabel } from "../kernels/attention_mask.ts";
import { random, timeCalls } from "./sweep_kernels.ts";

const H = { nHeads: 32, nKvHeads: 4, headDim: 64 }, LAYERS = 2, BLOCK = 16, REPS = 22;

/** One timing: a kernel at a length under a mask. */
export interface MaskTiming {
  kernel: "prefill" | "decode";
  variant: string;
  mask: string;
  /** pos0 (prefill) or context (decode). */
  length: number;
  batch: number;
  us_per_layer: number;
  label: string;
}

function variants(window: number): [string, AttentionMask][] {
  return [
    ["causal", CAUSAL],
    ["all-visible", { kind: "window", window: 2 ** 30 }],
    ["window", { kind: "window", window }],
    ["sinks", { kind: "sinks", sinks: 4, window: window - 4 }],
  ];
}

/** K and V pools of `blocks` blocks (at most one binding), random, and a wrapped table. */
function pools(gpu: Gpu, want: number, kvDtype: KvDtype) {
  const blockElems = LAYERS * H.nKvHeads * BLOCK * H.headDim;
  const bytesPer = kvDtype === "f16" ? 2 : 4;
  const blocks = Math.min(want, Math.floor(gpu.maxBinding / (blockElems * bytesPer)));
  const floats = Math.ceil((blocks * blockElems * bytesPer) / 4);
  return { blocks, k: random(gpu, floats, 2), v: random(gpu, floats, 3) };
}

const USAGE = `usage: deno run -A scripts/bench_masks.ts [--tokens 512] [--pos0 0,8192,32768,130560]
  [--batches 1,8] [--contexts 2048,8192,32768,131072] [--window 4096] [--kv-dtype f16|f32]
  [--iterations 5] [--out FILE]

Prefill and decode attention under the causal, all-visible (the mask's own cost), window and
sinks + window masks, µs per layer on TinyLlama's heads (defaults shown). Needs a GPU with
timestamp queries for meaningful numbers; prints a table, --out writes JSON.`;

async function main(): Promise<void> {
  if (Deno.args.includes("--help") || Deno.args.includes("-h")) return console.log(USAGE);
  const { values: v } = parseArgs({
    options: {
      tokens: { type: "string", default: "512" },
      pos0: { type: "string", default: "0,8192,32768,130560" },
      batches: { type: "string", default: "1,8" },
      contexts: { type: "string", default: "2048,8192,32768,131072" },
      window: { type: "string", default: "4096" },
      "kv-dtype": { type: "string", default: "f16" },
      iterations: { type: "string", default: "5" },
      out: { type: "string" },
    },
  });
  const list = (s: string) => s.split(",").filter(Boolean).map(Number);
  const gpu = await getGpu();
  const kvDtype = parseKvDtype(v["kv-dtype"]);
  const T = Number(v.tokens), iterations = Number(v.iterations);
  const all: MaskTiming[] = [];
  const report = (t: MaskTiming) => {
    all.push(t);
    console.log(
      `${t.kernel.padEnd(7)} ${t.kernel === "prefill" ? "pos0" : "ctx "} ` +
        `${String(t.length).padStart(6)} batch ${String(t.batch).padStart(2)} ` +
        `${t.variant.padEnd(11)} ${t.us_per_layer.toFixed(1).padStart(9)} µs/layer  (${t.label})`,
    );
  };
  console.log(`bench_masks on ${gpu.adapterName}, kv ${kvDtype}, TinyLlama heads`);
  const vs = variants(Number(v.window));

  for (const pos0 of list(v.pos0!)) {
    const maxBlocks = Math.ceil((pos0 + T) / BLOCK) + 1;
    const p = pools(gpu, maxBlocks + 1, kvDtype);
    const table = Uint32Array.from({ length: maxBlocks }, (_, b) => 1 + (b % (p.blocks - 1)));
    const blockTable = createStorage(gpu, table.byteLength, table);
    const q = random(gpu, T * H.nHeads * H.headDim, 4);
    const out = createStorage(gpu, T * H.nHeads * H.headDim * 4);
    const chunk = createStorage(gpu, 16, chunkWords(0, pos0, T));
    for (const [variant, mask] of vs) {
      const calls: Dispatch[] = [];
      for (let rep = 0; rep < REPS; rep++) {
        calls.push(attentionDispatch(gpu, { q, kPool: p.k, vPool: p.v, blockTable, out, chunk }, {
          tokens: T,
          ...H,
          layer: rep % LAYERS,
          nLayers: LAYERS,
          maxBlocks,
          kvDtype,
          mask,
        }));
      }
      const us = await timeCalls(gpu, calls, iterations);
      report({
        kernel: "prefill",
        variant,
        mask: maskLabel(mask),
        length: pos0,
        batch: 1,
        us_per_layer: us,
        label: calls[0].label,
      });
    }
    for (const b of [p.k, p.v, blockTable, q, out, chunk]) b.destroy();
  }

  for (const S of list(v.batches!)) {
    for (const ctx of list(v.contexts!)) {
      const maxBlocks = Math.ceil(ctx / BLOCK) + 1;
      const p = pools(gpu, S * maxBlocks + 1, kvDtype);
      const table = Uint32Array.from(
        { length: S * maxBlocks },
        (_, i) => 1 + (i % (p.blocks - 1)),
      );
      const width = (H.nHeads + 2 * H.nKvHeads) * H.headDim;
      const buffers = {
        qkv: random(gpu, S * width, 5),
        pos: createStorage(gpu, S * 4, new Uint32Array(S).fill(ctx - 1)),
        invFreq: createStorage(
          gpu,
          (H.headDim / 2) * 4,
          Float32Array.from({ length: H.headDim / 2 }, (_, i) => 10000 ** (-(2 * i) / H.headDim)),
        ),
        kPool: p.k,
        vPool: p.v,
        blockTable: createStorage(gpu, table.byteLength, table),
        seqLen: createStorage(gpu, S * 4, new Uint32Array(S).fill(ctx)),
        out: createStorage(gpu, S * H.nHeads * H.headDim * 4),
      };
      for (const [variant, mask] of vs) {
        const calls: Dispatch[] = [];
        for (let rep = 0; rep < REPS; rep++) {
          calls.push(...attentionDecodeDispatches(gpu, buffers, {
            seqs: S,
            ...H,
            layer: rep % LAYERS,
            nLayers: LAYERS,
            maxBlocks,
            maxContext: ctx,
            kvDtype,
            mask,
          }));
        }
        const us = await timeCalls(gpu, calls, iterations, REPS);
        report({
          kernel: "decode",
          variant,
          mask: maskLabel(mask),
          length: ctx,
          batch: S,
          us_per_layer: us,
          label: calls[0].label + (calls.length > REPS ? " + combine" : ""),
        });
      }
      for (const b of Object.values(buffers)) b.destroy();
    }
  }
  if (v.out) await Deno.writeTextFile(v.out, JSON.stringify(all, null, 2) + "\n");
}

if (import.meta.main) {
  await main();
  Deno.exit(0);
}
