/**
 * `deno task bench --constrained`: what constrained decoding costs. In one run, on one engine:
 * the decode tok/s of `json_schema` requests against unconstrained ones, alone (batch 1), in a
 * batch of N of one kind, and mixed (half of each in one batch); and the schema's compile time
 * (the first compile, which also builds the vocabulary's byte trie; a compile of another schema
 * after it; a cached one). The goal: constrained ≥ 0.9× unconstrained.
 *
 * Both kinds sample at temperature 0.8 with the same seeds; the unconstrained one never stops at
 * EOS, the constrained one stops only when its JSON is complete (random weights rarely close a
 * string, so on a --shape both run to --new-tokens; the rate is over the tokens after the first).
 * Table on stdout, progress on stderr (TTY only), `--out` JSON.
 *
 *   deno task bench --constrained [--model DIR | --shape NAME] [--batch N] [--new-tokens N]
 *                   [--prompt-len N] [--repeat N] [--out FILE]
 */
import { parseArgs } from "node:util";
import { type ConstraintSpec, type GenerateRequest, sampling } from "../api/types.ts";
import { Engine } from "../engine/engine.ts";
import { status } from "../engine/model/progress.ts";
import { syntheticModel } from "../engine/model/synthetic.ts";
import { getGpu, isCpuAdapter } from "../gpu/device.ts";
import { DEFAULT_MODEL } from "./bench_options.ts";
import { decodeRate, type Timed } from "./bench_report.ts";

export const CONSTRAINED_USAGE = `usage: deno task bench --constrained [flags]

Decode tok/s of json_schema-constrained requests against unconstrained ones on the same engine
in the same run: alone, in a batch of N of one kind, and mixed (N/2 of each in one batch); and
the schema's compile time. Table on stdout, progress on stderr (TTY only).

  --model DIR        model folder (default models/strata-default)
  --shape NAME       a synthetic shape instead (tinyllama-1.1b, llama-7b, tiny: random weights
                     on the GPU, the default model's tokenizer and so its 8192-token vocabulary)
  --batch N          the batch size (default 8)
  --new-tokens N     tokens per request, at least the schema's shortest output (53 tokens
                     in the default vocabulary) (default 256; CPU adapter 64)
  --prompt-len N     prompt tokens (default 128; CPU adapter 16)
  --repeat N         runs of each measurement, the median is reported (default 3; CPU 1)
  --out FILE         also write the results as JSON
  -h, --help         this text

Environment:
  DENO_WEBGPU_BACKEND  wgpu's backend, vulkan or gl (unset: Vulkan when present, else GL)`;

/** The schema measured: a record with free strings, a format, an array and a nested object. */
export const BENCH_SCHEMA = {
  type: "object",
  properties: {
    name: { type: "string" },
    age: { type: "integer" },
    email: { type: "string", format: "email" },
    tags: { type: "array", items: { type: "string" } },
    address: {
      type: "object",
      properties: { street: { type: "string" }, city: { type: "string" } },
      required: ["street", "city"],
      additionalProperties: false,
    },
  },
  required: ["name", "age", "email", "tags", "address"],
  additionalProperties: false,
};

/** The options of {@linkcode runConstrainedBench}. */
export interface ConstrainedBenchOptions {
  model?: string;
  shape?: string;
  batch?: number;
  newTokens?: number;
  promptLen?: number;
  repeat?: number;
}

/** One row: a batch composition and the decode rates of its kinds. */
export interface ConstrainedRow {
  batch: string;
  /** Decode tok/s over all sequences of the kind (per sequence = / count). */
  free_tok_s: number | null;
  constrained_tok_s: number | null;
  /** Per-sequence constrained rate ÷ per-sequence free rate. */
  ratio: number | null;
  /** Mean tokens per constrained sequence (shorter when the JSON closed early). */
  constrained_tokens: number | null;
}

/** Runs `requests` together; each one's token arrival times. */
async function together(engine: Engine, requests: GenerateRequest[]): Promise<Timed[]> {
  return await Promise.all(requests.map(async (req) => {
    const arrivals: number[] = [];
    for await (const _ of engine.generate(req)) arrivals.push(performance.now());
    return { arrivals } as Timed;
  }));
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1];

/** Measures everything; see the module doc. */
export async function runConstrainedBench(o: ConstrainedBenchOptions = {}) {
  const gpu = await getGpu();
  const cpu = isCpuAdapter(gpu);
  const batch = o.batch ?? 8;
  const newTokens = o.newTokens ?? (cpu ? 64 : 256);
  const promptLen = o.promptLen ?? (cpu ? 16 : 128);
  const repeat = o.repeat ?? (cpu ? 1 : 3);
  const options = { gpu, maxSlots: batch, contextLength: promptLen + newTokens + 16 };
  status(`bench --constrained: loading ${o.shape ?? o.model ?? DEFAULT_MODEL}`);
  const engine = o.shape
    ? Engine.create(
      gpu,
      await syntheticModel(gpu, o.shape, { tokenizerDir: DEFAULT_MODEL }),
      options,
    )
    : await Engine.load(o.model ?? DEFAULT_MODEL, options);

  status("bench --constrained: compiling the schema");
  const spec: ConstraintSpec = { type: "json_schema", schema: BENCH_SCHEMA };
  const timed = async (s: ConstraintSpec) => {
    const t = performance.now();
    const c = await engine.compileConstraint(s);
    return { c, ms: performance.now() - t };
  };
  const first = await timed(spec);
  const other = await timed({
    type: "json_schema",
    schema: {
      ...BENCH_SCHEMA,
      properties: { ...BENCH_SCHEMA.properties, zip: { type: "string" } },
    },
  });
  const cached = await timed(spec);
  const constraint = first.c;
  if (newTokens < constraint.minTokens) {
    throw new Error(
      `--new-tokens must be at least ${constraint.minTokens}, the schema's shortest output in ` +
        `this vocabulary; got ${newTokens}`,
    );
  }

  const vocab = Math.min(engine.config.vocabSize, engine.tokenizer.vocabSize);
  let seed = 1;
  // A different prompt each request (the prefix cache would skip prefill), below the vocabulary.
  const prompt = () =>
    Array.from({ length: promptLen }, (_, i) => 1 + (seed * 7919 + i * 104729) % (vocab - 1));
  const request = (constrained: boolean, maxTokens = newTokens): GenerateRequest => {
    const s = sampling({
      maxTokens,
      temperature: 0.8,
      seed: BigInt(seed++),
      ...(constrained ? {} : { stopAtEos: false }),
    });
    return { promptIds: prompt(), sampling: s, ...(constrained ? { constraint } : {}) };
  };
  status("bench --constrained: warming up");
  await together(engine, [request(true, constraint.minTokens), request(false, 8)]);

  const kinds = [
    { batch: "1", free: 1, constrained: 0 },
    { batch: "1", free: 0, constrained: 1 },
    { batch: `${batch}`, free: batch, constrained: 0 },
    { batch: `${batch}`, free: 0, constrained: batch },
    { batch: `${batch} mixed`, free: batch - (batch >> 1), constrained: batch >> 1 },
  ];
  const rates = new Map<string, { free: number[]; constrained: number[]; tokens: number[] }>();
  for (let r = 0; r < repeat; r++) {
    for (const [i, k] of kinds.entries()) {
      status(
        `bench --constrained: run ${r + 1}/${repeat}, ${i + 1}/${kinds.length} (batch ${k.batch})`,
      );
      const reqs = [
        ...Array.from({ length: k.constrained }, () => request(true)),
        ...Array.from({ length: k.free }, () => request(false)),
      ];
      const runs = await together(engine, reqs);
      const row = rates.get(k.batch) ?? { free: [], constrained: [], tokens: [] };
      if (k.constrained > 0) {
        const c = runs.slice(0, k.constrained);
        row.constrained.push(decodeRate(c) / k.constrained);
        row.tokens.push(c.reduce((s, x) => s + x.arrivals.length, 0) / c.length);
      }
      if (k.free > 0) row.free.push(decodeRate(runs.slice(k.constrained)) / k.free);
      rates.set(k.batch, row);
    }
  }
  const rows: ConstrainedRow[] = [...rates].map(([b, x]) => {
    const n = b.endsWith("mixed") ? { f: batch - (batch >> 1), c: batch >> 1 } : { f: +b, c: +b };
    const free = x.free.length ? median(x.free) : null;
    const con = x.constrained.length ? median(x.constrained) : null;
    return {
      batch: b,
      free_tok_s: free === null ? null : free * n.f,
      constrained_tok_s: con === null ? null : con * n.c,
      ratio: free && con ? con / free : null,
      constrained_tokens: x.tokens.length ? median(x.tokens) : null,
    };
  });
  return {
    adapter: gpu.adapterName,
    model: o.shape ? `shape ${o.shape}` : o.model ?? DEFAULT_MODEL,
    vocab: engine.config.vocabSize,
    new_tokens: newTokens,
    prompt_len: promptLen,
    repeat,
    compile_ms: { first: first.ms, another: other.ms, cached: cached.ms },
    min_tokens: constraint.minTokens,
    rows,
  };
}

/** The result as a table. */
export function formatConstrained(r: Awaited<ReturnType<typeof runConstrainedBench>>): string {
  const f = (x: number | null, d = 1) => (x === null ? "-" : x.toFixed(d));
  const lines = [
    `strata bench --constrained: ${r.model} (vocab ${r.vocab}) on ${r.adapter}, prompt ` +
    `${r.prompt_len}, ${r.new_tokens} new tokens, median of ${r.repeat}`,
    "",
    "batch      free tok/s  constrained tok/s  per-sequence ratio  constrained tokens",
  ];
  for (const row of r.rows) {
    lines.push(
      `${row.batch.padEnd(9)}  ${f(row.free_tok_s).padStart(10)}  ${
        f(row.constrained_tok_s).padStart(17)
      }  ${f(row.ratio, 3).padStart(18)}  ${f(row.constrained_tokens, 0).padStart(18)}`,
    );
  }
  const c = r.compile_ms;
  lines.push(
    "",
    `schema compile: first ${f(c.first)} ms (with the vocabulary's trie), another schema ` +
      `${f(c.another)} ms, cached ${f(c.cached, 2)} ms; the shortest output takes ` +
      `${r.min_tokens} tokens`,
    "(rows 1 and N: each kind alone, so the ratio compares two runs; mixed: both kinds in one " +
      "batch)",
  );
  return lines.join("\n");
}

/** The CLI (`deno task bench --constrained ...`). */
export async function constrainedMain(args: string[]): Promise<void> {
  const { values: v } = parseArgs({
    args: args.filter((a) => a !== "--constrained"),
    options: {
      model: { type: "string" },
      shape: { type: "string" },
      batch: { type: "string" },
      "new-tokens": { type: "string" },
      "prompt-len": { type: "string" },
      repeat: { type: "string" },
      out: { type: "string" },
      help: { type: "boolean", short: "h" },
    },
  });
  if (v.help) return console.log(CONSTRAINED_USAGE);
  const int = (name: string, s: string | undefined, min = 1) => {
    if (s === undefined) return undefined;
    const n = Number(s);
    if (!Number.isInteger(n) || n < min) {
      throw new Error(`--${name} must be an integer >= ${min}; got '${s}'`);
    }
    return n;
  };
  if (v.model && v.shape) throw new Error("--model and --shape exclude each other; give one");
  const r = await runConstrainedBench({
    model: v.model,
    shape: v.shape,
    batch: int("batch", v.batch, 2),
    newTokens: int("new-tokens", v["new-tokens"], 4),
    promptLen: int("prompt-len", v["prompt-len"]),
    repeat: int("repeat", v.repeat),
  });
  console.log(formatConstrained(r));
  if (v.out) await Deno.writeTextFile(v.out, JSON.stringify(r, null, 2) + "\n");
}
