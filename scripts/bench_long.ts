/**
 * Long-context bench: prefill and decode speed of the engine at each prompt length (one length
 * bucket of decode attention each, kernels/attention_mask.ts), causal or under a sliding window
 * or sinks + window, on a synthetic shape (random weights on the GPU). A fresh engine per length,
 * sized for it: one `--batch` of prompts of that length, a KV pool of f16 by default (a 128k
 * TinyLlama context in f32 does not fit one binding; docs/long_context.md).
 *
 *   deno run -A scripts/bench_long.ts [--shape tinyllama-1.1b] [--prompt-len 8192,32768,131072]
 *     [--new-tokens 64] [--batch 1] [--kv-dtype f16] [--window N] [--sinks N] [--max-chunk N]
 *     [--out FILE]
 *
 * `--window N` runs the shape as a Mistral with `sliding_window` N; `--sinks S` with it, the
 * engine's sinks + window streaming mode (attentionSinks) instead. One round per length: `batch`
 * prompts at once; prefill tok/s is their tokens over the time to the last first token (with
 * batch 1: the prompt over its time to first token, every chunk and the first sample); decode
 * tok/s counts the batch's tokens after the first ones (scripts/bench_report.ts `decodeRate`).
 */
import { parseArgs } from "node:util";
import { Engine, type EngineOptions } from "../engine/engine.ts";
import { getGpu } from "../gpu/device.ts";
import { parseKvDtype } from "../gpu/dtype.ts";
import { syntheticModel } from "../engine/model/synthetic.ts";
import type { GpuModel } from "../engine/model/gpu_model.ts";
import { sampling } from "../api/types.ts";
import { decodeRate, type Timed } from "./bench_report.ts";
import { DEFAULT_MODEL } from "./bench_options.ts";
import { promptMaker } from "./bench.ts";
import { maskLabel } from "../kernels/attention_mask.ts";

/** One prompt length's numbers. */
export interface LongResult {
  prompt_len: number;
  batch: number;
  mask: string;
  /** Decode attention's length buckets of this engine (tops, keys attended). */
  buckets: number[];
  ttft_ms: number;
  prefill_tok_s: number;
  decode_tok_s: number;
  /** KV blocks held once the first tokens arrived (the window's release shows here). */
  kv_blocks_at_first_token: number;
  kv_blocks_reserved: number;
}

const USAGE = `usage: deno run -A scripts/bench_long.ts [--shape tinyllama-1.1b]
  [--prompt-len 8192,32768,131072] [--new-tokens 64] [--batch 1] [--kv-dtype f16|f32]
  [--window N] [--sinks N] [--max-chunk N] [--out FILE]`;

/** One request's token arrivals, and the KV blocks in use when its first token came. */
async function timedRun(engine: Engine, promptIds: number[], maxTokens: number) {
  const t0 = performance.now(), arrivals: number[] = [];
  let atFirst = 0;
  const gen = engine.generate({ promptIds, sampling: sampling({ maxTokens, stopAtEos: false }) });
  for await (const _ of gen) {
    arrivals.push(performance.now());
    if (arrivals.length === 1) atFirst = engine.kvStats().gpu.used;
  }
  await gen.result;
  return { t0, arrivals, atFirst } as Timed & { atFirst: number };
}

async function main(): Promise<void> {
  const { values: v } = parseArgs({
    options: {
      shape: { type: "string", default: "tinyllama-1.1b" },
      "prompt-len": { type: "string", default: "8192,32768,131072" },
      "new-tokens": { type: "string", default: "64" },
      batch: { type: "string", default: "1" },
      "kv-dtype": { type: "string", default: "f16" },
      window: { type: "string" },
      sinks: { type: "string" },
      "max-chunk": { type: "string" },
      out: { type: "string" },
      help: { type: "boolean", short: "h" },
    },
  });
  if (v.help) return console.log(USAGE);
  const int = (flag: string, s: string) => {
    const n = Number(s);
    if (!Number.isInteger(n) || n < 1) {
      throw new Error(`--${flag} must be an integer ≥ 1; got '${s}'`);
    }
    return n;
  };
  const lengths = v["prompt-len"]!.split(",").map((s) => int("prompt-len", s.trim()));
  const newTokens = int("new-tokens", v["new-tokens"]!), batch = int("batch", v.batch!);
  if (newTokens < 2) {
    throw new Error("--new-tokens must be at least 2 (decode is timed between tokens)");
  }
  const kvDtype = parseKvDtype(v["kv-dtype"]);
  const window = v.window === undefined ? undefined : int("window", v.window);
  const sinks = v.sinks === undefined ? undefined : int("sinks", v.sinks);
  if (sinks !== undefined && window === undefined) throw new Error("--sinks needs --window");
  const gpu = await getGpu();
  const base = await syntheticModel(gpu, v.shape!, { dtype: "f16", tokenizerDir: DEFAULT_MODEL });
  // A window without sinks: the shape as a Mistral (the model's own mask).
  const model: GpuModel = window !== undefined && sinks === undefined
    ? {
      ...base,
      config: {
        ...base.config,
        arch: "mistral",
        architecture: "MistralForCausalLM",
        slidingWindow: window,
      },
    }
    : base;
  const vocab = Math.min(model.config.vocabSize, model.tokenizer.vocabSize);
  const results: LongResult[] = [];
  console.log(`bench_long on ${gpu.adapterName}: ${v.shape}, kv ${kvDtype}, batch ${batch}`);
  for (const len of lengths) {
    const opts: EngineOptions = {
      maxSlots: batch,
      contextLength: len + newTokens,
      kvDtype,
      kvBlocks: batch * (Math.ceil((len + newTokens) / 16) + 1) + 2,
      ...(v["max-chunk"] ? { maxChunk: int("max-chunk", v["max-chunk"]) } : {}),
      ...(sinks !== undefined ? { attentionSinks: { sinks, window: window! } } : {}),
    };
    const engine = Engine.create(gpu, model, opts);
    const prompts = promptMaker(vocab, len, 0x10c + len);
    // Pipelines compile on first use: a full chunk and a partial one, at this batch.
    await Promise.all(
      Array.from({ length: batch }, () => timedRun(engine, prompts().slice(0, 700), 4)),
    );
    // One round: `batch` prompts at once; with batch 1 the time to the first token is the
    // prompt's prefill alone.
    const runs = await Promise.all(
      Array.from({ length: batch }, () => timedRun(engine, prompts(), newTokens)),
    );
    const firsts = runs.map((x) => x.arrivals[0] - x.t0);
    const ttft = Math.min(...firsts);
    const r: LongResult = {
      prompt_len: len,
      batch,
      mask: maskLabel(engine.runner.forward.mask),
      buckets: engine.runner.forward.buckets,
      ttft_ms: ttft,
      prefill_tok_s: (batch * len) / (Math.max(...firsts) / 1000),
      decode_tok_s: decodeRate(runs),
      kv_blocks_at_first_token: runs[0].atFirst,
      kv_blocks_reserved: batch * Math.ceil((len + newTokens) / 16),
    };
    results.push(r);
    console.log(
      `prompt ${String(len).padStart(6)}  ${r.mask.padEnd(10)} prefill ` +
        `${r.prefill_tok_s.toFixed(0).padStart(7)} tok/s (ttft ${ttft.toFixed(0)} ms)  decode ` +
        `${r.decode_tok_s.toFixed(1).padStart(7)} tok/s at batch ${batch}  KV blocks at the ` +
        `first token ${r.kv_blocks_at_first_token} of ${r.kv_blocks_reserved}  buckets ${r.buckets}`,
    );
  }
  if (v.out) {
    await Deno.writeTextFile(
      v.out,
      JSON.stringify({ adapter: gpu.adapterName, kvDtype, results }, null, 2) + "\n",
    );
  }
}

if (import.meta.main) {
  try {
    await main();
    Deno.exit(0); // the GPU device keeps the event loop alive
  } catch (e) {
    console.error(`bench_long: ${(e as Error).message}`);
    Deno.exit(1);
  }
}
