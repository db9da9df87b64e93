/**
 * Does a sequence decode the same alone as in a batch? On a GPU the batch size picks the matmul
 * kernels and their K splits (`small` at batch 1; `rows` and `tiled` for larger batches, see
 * kernels/matmul.ts) and decode attention's launch (kernels/attention_decode.ts), so batch 1 and
 * a batch of 32 or 48 add their products in different orders.
 * Greedy tokens may then part at a near-tie; until they do, the logprobs of the chosen tokens
 * must agree to float rounding. Prints one JSON line: sequences compared, how many kept every
 * token, steps compared before a parting, and the largest |Δ logprob| over those steps.
 *
 *   deno run -A scripts/batch_check.ts --model DIR [--batch 32] [--tokens 24] [--kv-dtype f32|f16]
 *     [--context 256] [--prompt-max 120]
 *
 * `--context` is the engine's context length, which picks decode attention's launch plan (one
 * pass up to 256 keys; splits of 256-, 128- or 64-thread workgroups above, see
 * kernels/attention_decode.ts); prompts are 1..`--prompt-max` tokens long.
 *
 * scripts/gpu_check.sh runs it on the random TinyLlama-shape model of its HF comparison.
 */
import { parseArgs } from "node:util";
import { Engine } from "../engine/engine.ts";
import { sampling } from "../api/types.ts";
import { promptMaker } from "./bench.ts";
import { parseKvDtype } from "../gpu/dtype.ts";
import { helpFromComment } from "./help.ts";

helpFromComment(import.meta.url);

const { values: v } = parseArgs({
  options: {
    model: { type: "string" },
    batch: { type: "string", default: "32" },
    tokens: { type: "string", default: "24" },
    "kv-dtype": { type: "string", default: "f32" },
    context: { type: "string", default: "256" },
    "prompt-max": { type: "string", default: "120" },
  },
});
if (!v.model) throw new Error("batch_check: --model DIR is required");
const batch = Number(v.batch), tokens = Number(v.tokens);
const context = Number(v.context), promptMax = Number(v["prompt-max"]);
if (![batch, tokens, context, promptMax].every((n) => Number.isInteger(n) && n >= 1)) {
  throw new Error(
    `batch_check: --batch, --tokens, --context and --prompt-max must be integers >= 1`,
  );
}
if (promptMax + tokens > context) {
  throw new Error(`batch_check: --prompt-max + --tokens must fit --context (${context})`);
}
const kvDtype = parseKvDtype(v["kv-dtype"]);
const engine = await Engine.load(v.model, { maxSlots: batch, contextLength: context, kvDtype });
const vocab = engine.config.vocabSize;
// Ragged prompts of 1..promptMax tokens, so the batch's slots sit at different positions.
const prompts = Array.from(
  { length: batch },
  (_, i) => promptMaker(vocab, 1 + ((i * 37) % promptMax), 1000 + i)(),
);
const run = async (ids: number[]) => {
  const gen = engine.generate({
    promptIds: ids,
    sampling: sampling({ maxTokens: tokens, stopAtEos: false }),
  });
  const out: { id: number; logprob: number }[] = [];
  for await (const t of gen) out.push({ id: t.id, logprob: t.logprob });
  return out;
};
const alone = [];
for (const p of prompts) alone.push(await run(p));
const together = await Promise.all(prompts.map(run));
let identical = 0, steps = 0, worst = 0;
for (let i = 0; i < batch; i++) {
  let j = 0;
  for (; j < tokens; j++) {
    worst = Math.max(worst, Math.abs(alone[i][j].logprob - together[i][j].logprob));
    steps++;
    if (alone[i][j].id !== together[i][j].id) break;
  }
  if (j === tokens) identical++;
}
console.log(JSON.stringify({
  model: v.model,
  adapter: engine.gpu.adapterName,
  batch,
  kv_dtype: kvDtype,
  context,
  tokens,
  identical_sequences: identical,
  steps_compared: steps,
  max_abs_dlogprob: worst,
}));
