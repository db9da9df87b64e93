/**
 * Tile sweep of the causal prefill attention kernel (kernels/attention.ts) on TinyLlama heads:
 * one chunk of `--tokens` queries after `pos0` cached keys, 22 layers' dispatches per timed pass
 * (a pool of 4 layers), right after ≈ 30 ms of the same work (warm clocks), median of
 * `--iterations`. Prints µs per layer and the attention FLOP rate.
 *
 *   deno run -A scripts/sweep_prefill_attention.ts [--tokens 256] [--pos0 0,256]
 *     [--variants '[{}, {"tileRows": 64, "tileKeys": 32}, {"unroll": false}]'] [--iterations 5]
 *
 * A variant is a partial `AttentionOptions`; `{"unroll": false}` compiles the kernel's
 * `// @unroll` loops as plain loops.
 */
import { parseArgs } from "node:util";
import { createStorage, getGpu } from "../gpu/device.ts";
import type { Dispatch } from "../gpu/dispatch.ts";
import { attentionDispatch, type AttentionOptions, chunkWords } from "../kernels/attention.ts";
import { random, timeCalls } from "./sweep_kernels.ts";
import { helpFromComment } from "./help.ts";

helpFromComment(import.meta.url);

const { values: v } = parseArgs({
  options: {
    tokens: { type: "string", default: "256" },
    pos0: { type: "string", default: "0,256" },
    variants: { type: "string", default: "[{}]" },
    iterations: { type: "string", default: "5" },
  },
});
const gpu = await getGpu();
console.log(`prefill attention sweep on ${gpu.adapterName}`);
const T = Number(v.tokens), nHeads = 32, nKvHeads = 4, D = 64, layers = 4, BLOCK = 16;
for (const pos0 of v.pos0!.split(",").map(Number)) {
  const maxBlocks = Math.ceil((pos0 + T) / BLOCK) + 1;
  const poolFloats = (maxBlocks + 1) * layers * nKvHeads * BLOCK * D;
  const kPool = random(gpu, poolFloats, 2), vPool = random(gpu, poolFloats, 3);
  const q = random(gpu, T * nHeads * D, 4);
  const out = createStorage(gpu, T * nHeads * D * 4, undefined, "out");
  const table = Uint32Array.from({ length: maxBlocks }, (_, b) => 1 + b);
  const blockTable = createStorage(gpu, table.byteLength, table, "table");
  const chunk = createStorage(gpu, 16, chunkWords(0, pos0, T), "chunk");
  // Score and P.V multiply-adds over the causal triangle (and the cached keys).
  const pairs = T * pos0 + (T * (T + 1)) / 2;
  const flops = 2 * 2 * nHeads * D * pairs;
  for (const variant of JSON.parse(v.variants!) as Partial<AttentionOptions>[]) {
    const calls: Dispatch[] = [];
    try {
      for (let rep = 0; rep < 22; rep++) {
        calls.push(attentionDispatch(gpu, { q, kPool, vPool, blockTable, out, chunk }, {
          tokens: T,
          nHeads,
          nKvHeads,
          headDim: D,
          layer: rep % layers,
          nLayers: layers,
          maxBlocks,
          ...variant,
        }));
      }
      const us = await timeCalls(gpu, calls, Number(v.iterations));
      console.log(
        `T=${T} pos0=${String(pos0).padEnd(5)} ${JSON.stringify(variant).padEnd(36)} ` +
          `${us.toFixed(1).padStart(8)} µs/layer ${(flops / us / 1e6).toFixed(1).padStart(6)} ` +
          `TFLOP/s (${calls[0].label})`,
      );
    } catch (e) {
      console.log(`T=${T} pos0=${pos0} ${JSON.stringify(variant)}: ${(e as Error).message}`);
    }
  }
  for (const b of [kPool, vPool, q, out, blockTable]) b.destroy();
}
