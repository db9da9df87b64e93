/**
 * `deno task bench --kv-codec none,int8,...`: the whole bench once per KV codec, each with a fresh
 * engine, in one process, then the codecs side by side: prefill and decode speed, and how many
 * tokens the GPU pool holds (docs/kv_codecs.md). The pool's hot blocks are the same in every
 * run; a codec adds its codec blocks on top.
 */
import type { EngineLike } from "../api/types.ts";
import { status } from "../engine/model/progress.ts";
import type { BenchFlags, BenchOptions } from "./bench_options.ts";
import { formatTable } from "./bench_report.ts";
import type { BenchResult } from "./bench_result.ts";

/** The KV codec fields of a bench result, from the engine after its runs. */
export function kvCodecResult(engine: EngineLike) {
  const kv = engine.kvStats();
  return {
    kv_codec: kv.codec,
    kv_hot: kv.hotTokens,
    kv_reencoded: kv.codecBlocks.reencoded,
    kv_capacity_tokens: kv.capacity.tokens,
    kv_tokens_per_gb: kv.capacity.tokensPerGb,
  };
}

/** The codecs' results side by side, one row each. */
export function formatCodecs(results: BenchResult[]): string {
  const batch = results[0].batch;
  const head = [
    "codec",
    "hot",
    "prefill tok/s",
    "TTFT ms",
    ...batch.map((b) => `decode b${b} tok/s`),
    "re-encoded",
    "pool tokens",
    "tokens/GB",
  ];
  const rows = results.map((r) => [
    r.kv_codec,
    r.kv_codec === "none" ? "-" : `${r.kv_hot}`,
    r.prefill_tok_s.toFixed(0),
    r.ttft_ms.toFixed(1),
    ...batch.map((b) => r.decode_tok_s[b].toFixed(1)),
    `${r.kv_reencoded}`,
    `${r.kv_capacity_tokens}`,
    r.kv_tokens_per_gb.toFixed(0),
  ]);
  const w = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)));
  const line = (cells: string[]) => cells.map((c, i) => c.padStart(w[i])).join("  ");
  return [
    `KV codecs, prompt ${results[0].prompt_len} + ${results[0].new_tokens} new tokens per request`,
    line(head),
    ...rows.map(line),
  ].join("\n");
}

/** Runs `bench` once per codec of `flags.codecs`, prints each table and the comparison. */
export async function codecsMain(
  flags: BenchFlags,
  bench: (o: BenchOptions) => Promise<BenchResult>,
): Promise<void> {
  const results: BenchResult[] = [];
  for (const kvCodec of flags.codecs) {
    const { kvHot, ...rest } = flags.options;
    const r = await bench({ ...rest, kvCodec, ...(kvCodec !== "none" ? { kvHot } : {}) });
    console.log(formatTable(r) + "\n");
    results.push(r);
  }
  console.log(formatCodecs(results));
  if (flags.out) {
    await Deno.writeTextFile(flags.out, JSON.stringify({ runs: results }, null, 2) + "\n");
    status(`bench: wrote ${flags.out}`);
  }
}
