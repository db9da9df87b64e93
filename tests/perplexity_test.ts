/**
 * Scoring (`Engine.score`, teacher-forced log-probabilities in prefill chunks) against the
 * float64 reference forward, and `deno task perplexity` end to end on the default model.
 */
import assert from "node:assert/strict";
import { Engine } from "../engine/engine.ts";
import { loadModelFolder } from "../engine/model/folder.ts";
import { logSoftmax, ReferenceModel } from "../engine/model/reference_forward.ts";
import { TextTokenizer } from "../engine/model/tokenizer.ts";
import { sampling } from "../api/types.ts";
import { withTestModel } from "../scripts/make_test_model.ts";
import { rng, taskPermissions, testGpu } from "./util.ts";

const DEFAULT_MODEL = new URL("../models/strata-default", import.meta.url).pathname;
const SCRIPT = new URL("../scripts/perplexity.ts", import.meta.url).pathname;

/** Reference log-probability of every token after the first. */
function referenceScores(ref: ReferenceModel, ids: number[]): number[] {
  const logits = ref.forward(ids);
  return ids.slice(1).map((t, i) => logSoftmax(logits[i])[t]);
}

Deno.test("score: teacher-forced logprobs match the float64 reference across chunks", async () => {
  await testGpu();
  const model = { arch: "qwen2", dtype: "bf16", hidden: 64, heads: 4, kvHeads: 2 } as const;
  await withTestModel(model, async (dir) => {
    const engine = await Engine.load(dir, { maxSlots: 2, contextLength: 128, maxChunk: 32 });
    const ref = await ReferenceModel.load(await loadModelFolder(dir));
    const r = rng(3);
    for (const n of [2, 33, 97]) {
      const ids = Array.from({ length: n }, () => r.int(ref.config.vocabSize));
      const got = await engine.score(ids);
      const want = referenceScores(ref, ids);
      assert.equal(got.length, n - 1);
      let worst = 0;
      got.forEach((x, i) => (worst = Math.max(worst, Math.abs(x - want[i]))));
      assert.ok(worst < 1e-4, `${n} tokens: max |Δ logprob| ${worst}`);
    }
    // The engine serves as before, and scoring refuses to share it.
    const gen = engine.generate({
      promptIds: [1, 2, 3],
      sampling: sampling({ maxTokens: 3 }),
    });
    await assert.rejects(engine.score([1, 2]), /score needs an idle engine/);
    for await (const _ of gen) { /* drain */ }
    await assert.rejects(engine.score([1, 1e6]), /token id 1000000 is outside the vocabulary/);
  });
});

Deno.test("perplexity: the task's JSON line is exp of the reference's mean NLL", async () => {
  await testGpu();
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      ...taskPermissions("perplexity"),
      SCRIPT,
      "--context",
      "48",
      "--max-tokens",
      "96",
      "--json",
    ],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const stderr = new TextDecoder().decode(out.stderr);
  assert.equal(out.code, 0, stderr);
  const lines = new TextDecoder().decode(out.stdout).trim().split("\n");
  const got = JSON.parse(lines.at(-1)!);
  assert.equal(got.tokens, 2 * 47, "two windows of 48 tokens predict 47 each");
  // The same windows through the float64 reference.
  const folder = await loadModelFolder(DEFAULT_MODEL);
  const ref = await ReferenceModel.load(folder);
  const text = await Deno.readTextFile(`${DEFAULT_MODEL}/val_sample.txt`);
  const ids = TextTokenizer.load(folder).encode(text).slice(0, 96);
  const nll = [ids.slice(0, 48), ids.slice(48, 96)]
    .flatMap((w) => referenceScores(ref, w))
    .reduce((s, x) => s - x, 0) / got.tokens;
  assert.ok(Math.abs(Math.log(got.ppl) - nll) < 1e-5, `ppl ${got.ppl} vs exp(${nll})`);
  // Bad input: a clear error, exit 1.
  const bad = await new Deno.Command(Deno.execPath(), {
    args: ["run", ...taskPermissions("perplexity"), SCRIPT, "--context", "1"],
    stderr: "piped",
  }).output();
  assert.equal(bad.code, 1);
  assert.match(new TextDecoder().decode(bad.stderr), /--context must be an integer >= 2; got '1'/);
});
