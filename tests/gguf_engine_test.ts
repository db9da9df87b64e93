/**
 * The engine on GGUF files: an F16 GGUF of a random test model generates exactly what the HF
 * folder does (same tokens, logprobs within 1e-5), through the same tokenizer. Block-quantized
 * files: tests/quant_engine_test.ts.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { sampling } from "../api/types.ts";
import { Engine } from "../engine/engine.ts";
import { withTestModel } from "../scripts/make_test_model.ts";
import { writeGguf } from "../scripts/write_gguf.ts";
import { testGpu } from "./util.ts";

async function generate(engine: Engine, promptIds: number[]) {
  const gen = engine.generate({
    promptIds,
    sampling: sampling({ maxTokens: 12, stopAtEos: false }),
  });
  const tokens: number[] = [], logprobs: number[] = [];
  for await (const t of gen) {
    tokens.push(t.id);
    logprobs.push(t.logprob);
  }
  await gen.result;
  return { tokens, logprobs };
}

Deno.test("engine: an F16 GGUF generates what its HF folder generates", async () => {
  await testGpu();
  const model = { dtype: "f16" as const, hidden: 64, heads: 4, kvHeads: 2, seed: 31 };
  await withTestModel(model, async (dir) => {
    const file = join(dir, "model-f16.gguf");
    await writeGguf(dir, file, { type: "f16" });
    const opts = { maxSlots: 2, contextLength: 64, maxChunk: 32 };
    const hf = await Engine.load(dir, opts), gg = await Engine.load(file, opts);
    const text = "The farmer walks to the market and tells a story.";
    const prompt = hf.tokenizer.encode(text);
    assert.deepEqual(gg.tokenizer.encode(text), prompt);
    let worst = 0;
    for (const ids of [prompt, prompt.slice(0, 3), [prompt[0]]]) {
      const a = await generate(hf, ids), b = await generate(gg, ids);
      assert.deepEqual(b.tokens, a.tokens);
      a.logprobs.forEach((lp, i) => (worst = Math.max(worst, Math.abs(lp - b.logprobs[i]))));
    }
    console.log(`F16 GGUF vs HF folder: max |Δ logprob| ${worst}`);
    assert.ok(worst <= 1e-5, `|Δ logprob| ${worst}`);
    assert.equal(gg.tokenizer.decode(prompt), hf.tokenizer.decode(prompt));
  });
});
