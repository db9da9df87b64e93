/**
 * The engine on GGUF files: an F16 GGUF of a random test model generates exactly what the HF
 * folder does (same tokens, logprobs within 1e-5), through the same tokenizer; a block-quantized
 * file is refused before anything goes to the GPU, until the quantized matmul exists.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { sampling } from "../api/types.ts";
import { Engine } from "../engine/engine.ts";
import { ropeInvFreq } from "../engine/model/config.ts";
import { loadModelFolder } from "../engine/model/folder.ts";
import { uploadWeights } from "../engine/model/weights.ts";
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

Deno.test("engine: quantized GGUF weights are refused until the quantized matmul exists", async () => {
  const gpu = await testGpu();
  await withTestModel({ seed: 32 }, async (dir) => {
    const file = join(dir, "model-q8_0.gguf");
    await writeGguf(dir, file, { type: "q8_0" });
    const folder = await loadModelFolder(file);
    await assert.rejects(
      uploadWeights(gpu, folder, { invFreq: ropeInvFreq(folder.config) }),
      /Q8_0 weights need the quantized matmul, not built yet: tensor token_embd\.weight \(model\.embed_tokens\.weight\) in .*model-q8_0\.gguf is Q8_0; load an F16, BF16 or F32 GGUF or the Hugging Face model for now/,
    );
    await assert.rejects(
      Engine.load(file),
      /Q8_0 weights need the quantized matmul, not built yet/,
    );
  });
});
