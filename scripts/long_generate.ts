/**
 * Greedy generation after a long seeded random prompt, printed as `generate --json` prints it
 * (one JSON line: prompt_ids, tokens, logprobs, ...), for scripts/hf_compare.py `check`: a
 * prompt of 32k tokens does not fit one command-line argument (`--prompt-ids`), so this builds it.
 *
 *   deno run -A scripts/long_generate.ts --model DIR --prompt-len N [--max-tokens 32] [--seed 1]
 *     [--context-length N] [--kv-dtype f32|f16] [--max-chunk N] [--kv-blocks N]
 *     [--attention-sinks SINKS,WINDOW]
 *
 * Prompt ids are drawn uniformly from [3, the tokenizer's vocabulary) (past the usual special
 * ids); EOS does not stop the generation, so every run yields --max-tokens tokens.
 */
import { parseArgs } from "node:util";
import { Engine, type EngineOptions } from "../engine/engine.ts";
import { parseKvDtype } from "../gpu/dtype.ts";
import { sampling } from "../api/types.ts";
import { rng } from "./rng.ts";
import { helpFromComment } from "./help.ts";

helpFromComment(import.meta.url);

async function main(): Promise<void> {
  const { values: v } = parseArgs({
    options: {
      model: { type: "string" },
      "prompt-len": { type: "string" },
      "max-tokens": { type: "string", default: "32" },
      seed: { type: "string", default: "1" },
      "context-length": { type: "string" },
      "kv-dtype": { type: "string" },
      "max-chunk": { type: "string" },
      "kv-blocks": { type: "string" },
      "attention-sinks": { type: "string" },
    },
  });
  const int = (flag: string, s: string | undefined) => {
    if (s === undefined) return undefined;
    const n = Number(s);
    if (!Number.isInteger(n) || n < 1) {
      throw new Error(`--${flag} must be an integer ≥ 1; got '${s}'`);
    }
    return n;
  };
  if (!v.model || !v["prompt-len"]) throw new Error("give --model DIR and --prompt-len N");
  const len = int("prompt-len", v["prompt-len"])!, maxTokens = int("max-tokens", v["max-tokens"])!;
  const sinks = v["attention-sinks"]?.split(",").map((s) => int("attention-sinks", s.trim())!);
  if (sinks && sinks.length !== 2) throw new Error("--attention-sinks takes SINKS,WINDOW");
  const options: EngineOptions = {
    maxSlots: 1,
    contextLength: int("context-length", v["context-length"]) ?? len + maxTokens,
    kvDtype: parseKvDtype(v["kv-dtype"]),
    maxChunk: int("max-chunk", v["max-chunk"]),
    kvBlocks: int("kv-blocks", v["kv-blocks"]),
    ...(sinks ? { attentionSinks: { sinks: sinks[0], window: sinks[1] } } : {}),
  };
  const engine = await Engine.load(v.model, options);
  const r = rng(Number(v.seed));
  const vocab = Math.min(engine.config.vocabSize, engine.tokenizer.vocabSize);
  const promptIds = Array.from({ length: len }, () => 3 + r.int(vocab - 3));
  const gen = engine.generate({ promptIds, sampling: sampling({ maxTokens, stopAtEos: false }) });
  const tokens: number[] = [], logprobs: number[] = [];
  for await (const t of gen) {
    tokens.push(t.id);
    logprobs.push(t.logprob);
  }
  const result = await gen.result;
  console.log(JSON.stringify({
    model: engine.modelId,
    adapter: engine.adapterName,
    context_length: engine.contextLength,
    kv_dtype: engine.kvDtype,
    mask: engine.runner.forward.mask,
    prompt_ids: promptIds,
    tokens,
    logprobs,
    finish_reason: result.finishReason,
    ttft_ms: result.ttftMs,
  }));
}

if (import.meta.main) {
  try {
    await main();
    Deno.exit(0);
  } catch (e) {
    console.error(`long_generate: ${(e as Error).message}`);
    Deno.exit(1);
  }
}
