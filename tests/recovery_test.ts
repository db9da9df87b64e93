/**
 * No lasting degradation: an engine (in its worker, as `serve` runs it) is overloaded — a burst
 * of requests far past its slots, on a machine made busy — then left idle; its time to first
 * token and decode speed then come back to those of a fresh engine beside it, measured turn about.
 * Whatever it learnt about timing under load (the pacer's estimates) must not stick.
 */
import assert from "node:assert/strict";
import { sampling } from "../api/types.ts";
import { WorkerEngine } from "../engine/worker/host.ts";
import { withTestModel } from "../scripts/make_test_model.ts";
import { testGpu } from "./util.ts";

const MODEL = { arch: "llama", dtype: "f16", hidden: 128, heads: 4, kvHeads: 2 } as const;

/** Time to first token and decode tok/s of one request. */
async function probe(engine: WorkerEngine, first: number) {
  const promptIds = Array.from({ length: 40 }, (_, i) => first + i);
  const t0 = performance.now();
  const gen = engine.generate({
    promptIds,
    sampling: sampling({ maxTokens: 24, stopAtEos: false }),
  });
  let t1 = 0, n = 0;
  for await (const _ of gen) if (n++ === 0) t1 = performance.now();
  const t2 = performance.now();
  return { ttft: t1 - t0, tokS: (n - 1) / ((t2 - t1) / 1000) };
}

const median = (v: number[]) => [...v].sort((a, b) => a - b)[v.length >> 1];

Deno.test("recovery: after an overload and a rest, TTFT and tok/s are a fresh engine's", async () => {
  await testGpu();
  await withTestModel(MODEL, async (dir) => {
    const opts = { maxSlots: 4, maxQueued: 64, contextLength: 256 };
    const used = await WorkerEngine.load({ dir }, opts);
    const fresh = await WorkerEngine.load({ dir }, opts);
    try {
      // Both warm: kernels compiled, a first estimate of each kind of work.
      await probe(used, 3);
      await probe(fresh, 3);
      // The overload: 40 requests at once on 4 slots, with the CPU (the adapter) kept busy.
      let busy = true;
      const spin = (async () => {
        while (busy) {
          const until = performance.now() + 20;
          while (performance.now() < until) { /* hog the thread */ }
          await new Promise((r) => setTimeout(r, 0));
        }
      })();
      const burst = Array.from({ length: 40 }, async (_, i) => {
        const gen = used.generate({
          promptIds: Array.from({ length: 30 + (i % 7) * 9 }, (_, j) => 1 + ((i * 13 + j) % 200)),
          sampling: sampling({ maxTokens: 16 + (i % 5) * 4, stopAtEos: false }),
        });
        for await (const _ of gen) { /* drain */ }
      });
      await Promise.all(burst);
      busy = false;
      await spin;
      await new Promise((r) => setTimeout(r, 1000)); // idle
      const a = { ttft: [] as number[], tokS: [] as number[] },
        b = { ttft: [] as number[], tokS: [] as number[] };
      for (let round = 0; round < 5; round++) {
        const x = await probe(used, 50 + round), y = await probe(fresh, 50 + round);
        a.ttft.push(x.ttft), a.tokS.push(x.tokS), b.ttft.push(y.ttft), b.tokS.push(y.tokS);
      }
      const report = `used TTFT ${a.ttft.map((v) => v.toFixed(0))} ms, ${
        a.tokS.map((v) => v.toFixed(1))
      } tok/s; fresh ${b.ttft.map((v) => v.toFixed(0))} ms, ${
        b.tokS.map((v) => v.toFixed(1))
      } tok/s`;
      console.log(report);
      assert.ok(median(a.ttft) <= 2 * median(b.ttft) + 20, `TTFT did not recover: ${report}`);
      assert.ok(median(a.tokS) >= 0.5 * median(b.tokS), `tok/s did not recover: ${report}`);
    } finally {
      await used.close();
      await fresh.close();
    }
  });
});
