/**
 * `deno task perplexity`: how well a model predicts a text. The text is tokenized, cut into
 * windows of `--context` tokens, and each window is scored on the GPU from scratch (every token
 * given the ones before it in its window: `Engine.score`); perplexity is exp of the mean negative
 * log-likelihood over every predicted token. Progress on stderr (a terminal only); the last line
 * of stdout is `{"tokens": N, "ppl": x}` with `--json`. With `--kv-codec`, what scoring reads
 * is what decoding would: each window is scored a block (16 tokens) at a time and the blocks
 * behind the hot window are re-encoded in between (docs/kv_codecs.md).
 *
 *   deno task perplexity [--model DIR] [--file TEXT] [--context N] [--max-tokens N]
 *                        [--max-chunk N] [--kv-dtype f32|f16] [--kv-codec C] [--kv-hot N]
 *                        [--quantize int8|e4m3|none] [--json]
 */
import { parseArgs } from "node:util";
import { Engine } from "../engine/engine.ts";
import { status } from "../engine/model/progress.ts";
import { parseKvDtype, parseQuantize } from "../gpu/dtype.ts";
import { parseKvCodec } from "../kernels/kv_codec.ts";

const DEFAULT_MODEL = new URL("../models/strata-default", import.meta.url).pathname;
const DEFAULT_FILE = new URL("../models/strata-default/val_sample.txt", import.meta.url).pathname;

const HELP = `deno task perplexity: perplexity of a model on a text

  --model DIR        model folder (default: the embedded models/strata-default; env STRATA_MODEL)
  --file TEXT        text file (default: models/strata-default/val_sample.txt, 40 KB of the
                     default model's held-out validation text)
  --context N        tokens per window, each scored from scratch (default: the model's
                     context length, at most 1024)
  --max-tokens N     score at most the first N tokens of the text (default: all)
  --max-chunk N      prompt tokens per forward pass (default: the engine's, 256 on a CPU
                     adapter, 512 on a GPU); 16 or fewer score through the decode kernel
                     (small: int8 with x rounded per 16 k) instead of the prefill ones
  --kv-dtype f32|f16 element type of the KV cache (default f32; env STRATA_KV_DTYPE)
  --kv-codec C       none (default), f16, int8, bfp4 or sign1: blocks older than the newest
                     --kv-hot tokens are re-encoded on the GPU and read as they are
                     (docs/kv_codecs.md); each window is then scored 16 tokens at a time, the
                     blocks behind the hot window re-encoded in between, as decoding would
                     (env STRATA_KV_CODEC)
  --kv-hot N         tokens kept at full precision with a codec (default 128; env
                     STRATA_KV_HOT)
  --quantize MODE    int8 or e4m3: quantize the layers' projections at load (one scale per row;
                     prefill runs int8 x int8); none (default) keeps them as loaded. The
                     precision monitor may run a layer at 16 bits: the result line says so
  --json             print {"tokens": N, "ppl": x, ...} as the last line of stdout (also the
                     quantize mode, kv_dtype, kv_codec, kv_hot and the window)
  --help             this text

Prints the perplexity, the mean negative log-likelihood (nats per token) and bits per byte.`;

/** A positive integer flag, or undefined when absent. */
function positive(name: string, v: string | undefined): number | undefined {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 2) {
    throw new Error(`--${name} must be an integer >= 2; got '${v}'`);
  }
  return n;
}

/** Perplexity of `ids` scored in windows of `context` tokens; what each window predicts. */
export async function perplexity(
  engine: Engine,
  ids: number[],
  o: { context: number; onWindow?: (done: number, total: number) => void },
): Promise<{ tokens: number; nll: number; ppl: number }> {
  let nll = 0, tokens = 0;
  for (let p = 0; p < ids.length - 1; p += o.context) {
    const window = ids.slice(p, p + o.context);
    if (window.length < 2) break;
    const lp = await engine.score(window);
    for (const x of lp) nll -= x;
    tokens += lp.length;
    o.onWindow?.(Math.min(p + o.context, ids.length), ids.length);
  }
  return { tokens, nll: nll / tokens, ppl: Math.exp(nll / tokens) };
}

/** ", KV int8 behind the newest 64 tokens (600 blocks re-encoded)" (nothing without a codec). */
function codecNote(engine: Engine): string {
  const kv = engine.kvStats();
  return kv.codec === "none" ? "" : `, KV ${kv.codec} behind the newest ${kv.hotTokens} tokens ` +
    `(${kv.codecBlocks.reencoded} blocks re-encoded)`;
}

/** ", int8 weights, 2 of 8 layers at 16 bits" (nothing for an unquantized model). */
function precisionNote(engine: Engine): string {
  const p = engine.precisionStats();
  if (p.mode === "none") return "";
  const back = p.layers.filter((l) => l.fellBack).length;
  return `, ${p.mode} weights, ${back} of ${p.layers.length} layers at 16 bits`;
}

if (import.meta.main) {
  try {
    const { values: v } = parseArgs({
      args: Deno.args,
      options: {
        model: { type: "string" },
        file: { type: "string" },
        context: { type: "string" },
        "max-tokens": { type: "string" },
        "max-chunk": { type: "string" },
        "kv-dtype": { type: "string" },
        "kv-codec": { type: "string" },
        "kv-hot": { type: "string" },
        quantize: { type: "string" },
        json: { type: "boolean" },
        help: { type: "boolean" },
      },
    });
    if (v.help) {
      console.log(HELP);
      Deno.exit(0);
    }
    const model = v.model ?? (Deno.env.get("STRATA_MODEL") || DEFAULT_MODEL);
    const file = v.file ?? DEFAULT_FILE;
    const text = await Deno.readTextFile(file).catch((e) => {
      throw new Error(`cannot read --file ${file}: ${e.message}`);
    });
    const context = positive("context", v.context);
    const maxTokens = positive("max-tokens", v["max-tokens"]);
    const maxChunk = positive("max-chunk", v["max-chunk"]);
    const env = (k: string) => Deno.env.get(k) || undefined;
    const kvCodec = parseKvCodec(v["kv-codec"] ?? env("STRATA_KV_CODEC"));
    const hot = v["kv-hot"] ?? env("STRATA_KV_HOT");
    const kvHot = hot === undefined ? undefined : Number(hot);
    if (kvHot !== undefined && !(Number.isInteger(kvHot) && kvHot >= 0)) {
      throw new Error(`--kv-hot must be an integer >= 0; got '${hot}'`);
    }
    const engine = await Engine.load(model, {
      maxSlots: 1,
      contextLength: context,
      maxChunk,
      kvDtype: parseKvDtype(v["kv-dtype"] ?? env("STRATA_KV_DTYPE")),
      kvCodec,
      ...(kvHot !== undefined ? { kvHot } : {}),
      quantize: parseQuantize(v.quantize),
    });
    const window = context ?? Math.min(engine.contextLength, 1024);
    const ids = engine.tokenizer.encode(text).slice(0, maxTokens);
    status(`perplexity: ${ids.length} tokens of ${file}, windows of ${window}, ${engine.modelId}`);
    const t0 = performance.now();
    const r = await perplexity(engine, ids, {
      context: window,
      onWindow: (done, total) => status(`perplexity: ${done}/${total} tokens`),
    });
    // Bits per byte of what was scored (the whole text unless --max-tokens cut it).
    const scored = maxTokens === undefined ? text : engine.decode(ids);
    const bytes = new TextEncoder().encode(scored).byteLength;
    const bpb = (r.nll * r.tokens) / Math.LN2 / bytes;
    console.log(
      `perplexity ${r.ppl.toFixed(4)} (${r.tokens} tokens predicted, mean NLL ${
        r.nll.toFixed(4)
      } nats, ${bpb.toFixed(4)} bits/byte, ${((performance.now() - t0) / 1000).toFixed(1)} s, ` +
        `${engine.adapterName}${precisionNote(engine)}${codecNote(engine)})`,
    );
    if (v.json) {
      const quantize = engine.weights.quant.mode, kv = engine.kvStats();
      console.log(JSON.stringify({
        tokens: r.tokens,
        ppl: r.ppl,
        quantize,
        kv_dtype: kv.dtype,
        kv_codec: kv.codec,
        kv_hot: kv.hotTokens,
        kv_reencoded: kv.codecBlocks.reencoded,
        context: window,
      }));
    }
  } catch (e) {
    console.error(`perplexity: ${e instanceof Error ? e.message : e}`);
    Deno.exit(1);
  }
}
