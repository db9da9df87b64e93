/**
 * `deno task bench --constrained`: what constrained decoding costs. In one run, on one engine:
 * the decode tok/s of `json_schema` requests against unconstrained ones, alone (batch 1), in a
 * batch of N of one kind, and mixed (half of each in one batch); and the schema's compile time
 * (the first compile, which also builds the vocabulary's byte trie; a compile of another schema
 * after it; a cached one). The goal: constrained ≥ 0.9× unconstrained.
 *
 * Both kinds sample at temperature 0.8; the unconstrained one never stops at EOS, the constrained
 * one stops only when its JSON is complete (random weights rarely close a string, so on a --shape
 * both run to --new-tokens; the rate is over the tokens after the first ones). Every constrained
 * output is checked against the schema. Table on stdout, progress on stderr (TTY only), `--out`
 * JSON.
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
import { validate } from "../engine/grammar/validate.ts";

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
  DENO_WEBGPU_BACKEND  wgpu's backend, vulkan or gl (unset: Vulkan when present, else GL)
  XDG_RUNTIME_DIR      wgpu's loaders want one; set to /tmp when unset

Examples:
  deno task bench --constrained                                  # the default model
  deno task bench --constrained --shape tinyllama-1.1b --out constrained.json`;

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

/** Runs `requests` together; each one's token arrival times and text. */
async function together(
  engine: Engine,
  requests: GenerateRequest[],
): Promise<(Timed & { text: string })[]> {
  return await Promise.all(requests.map(async (req) => {
    const arrivals: number[] = [];
    let text = "";
    for await (const t of engine.generate(req)) {
      arrivals.push(performance.now());
      text += t.text;
    }
    return { arrivals, text } as Timed & { text: string };
  }));
}

/** Whether `text` is JSON valid against the bench's schema. */
function validJson(text: string): boolean {
  try {
    return validate(BENCH_SCHEMA, JSON.parse(text)).length === 0;
  } catch {
    return false;
  }
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

  // Each kind alone at batch 1 and N, and a mixed batch of N/2 of each; tok/s of all tokens
  // after the first ones (bench_report.ts decodeRate), median over the repeats.
  const half = batch >> 1;
  const kinds = [
    { name: "free 1", free: 1, constrained: 0 },
    { name: "constrained 1", free: 0, constrained: 1 },
    { name: `free ${batch}`, free: batch, constrained: 0 },
    { name: `constrained ${batch}`, free: 0, constrained: batch },
    { name: "mixed", free: batch - half, constrained: half },
  ];
  const rates = new Map<string, number[]>(), tokens = new Map<string, number[]>();
  let outputs = 0, valid = 0;
  for (let r = 0; r < repeat; r++) {
    for (const [i, k] of kinds.entries()) {
      status(`bench --constrained: run ${r + 1}/${repeat}, ${i + 1}/${kinds.length} (${k.name})`);
      const reqs = [
        ...Array.from({ length: k.constrained }, () => request(true)),
        ...Array.from({ length: k.free }, () => request(false)),
      ];
      const runs = await together(engine, reqs);
      rates.set(k.name, [...rates.get(k.name) ?? [], decodeRate(runs)]);
      const c = runs.slice(0, k.constrained);
      outputs += c.length;
      valid += c.filter((x) => validJson(x.text)).length;
      const mean = c.reduce((s, x) => s + x.arrivals.length, 0) / Math.max(c.length, 1);
      tokens.set(k.name, [...tokens.get(k.name) ?? [], mean]);
    }
  }
  const rate = (name: string) => median(rates.get(name)!);
  const row = (n: number) => {
    const free = rate(`free ${n}`), constrained = rate(`constrained ${n}`);
    return {
      batch: n,
      free_tok_s: free,
      constrained_tok_s: constrained,
      ratio: constrained / free,
      constrained_tokens: median(tokens.get(`constrained ${n}`)!),
    };
  };
  const batched = row(batch);
  return {
    adapter: gpu.adapterName,
    model: o.shape ? `shape ${o.shape}` : o.model ?? DEFAULT_MODEL,
    vocab: engine.config.vocabSize,
    new_tokens: newTokens,
    prompt_len: promptLen,
    repeat,
    compile_ms: { first: first.ms, another: other.ms, cached: cached.ms },
    min_tokens: constraint.minTokens,
    /** Constrained outputs, and how many of them parsed and validated (all, or it is a bug). */
    outputs,
    valid,
    alone: row(1),
    batched,
    mixed: {
      constrained: half,
      free: batch - half,
      tok_s: rate("mixed"),
      ratio: rate("mixed") / batched.free_tok_s,
    },
  };
}

/** The result as a table. */
export function formatConstrained(r: Awaited<ReturnType<typeof runConstrainedBench>>): string {
  const f = (x: number, d = 1) => x.toFixed(d);
  const line = (label: string, free: number, con: number, ratio: number, tokens: string) =>
    `${label.padEnd(13)}  ${f(free).padStart(10)}  ${f(con).padStart(17)}  ${
      f(ratio, 3).padStart(6)
    }  ${tokens.padStart(18)}`;
  const { alone: a, batched: b, mixed: m } = r;
  const c = r.compile_ms;
  return [
    `strata bench --constrained: ${r.model} (vocab ${r.vocab}) on ${r.adapter}, prompt ` +
    `${r.prompt_len}, ${r.new_tokens} new tokens, median of ${r.repeat}`,
    "",
    "               free tok/s  constrained tok/s   ratio  constrained tokens",
    line("alone", a.free_tok_s, a.constrained_tok_s, a.ratio, f(a.constrained_tokens, 0)),
    line(
      `batch of ${b.batch}`,
      b.free_tok_s,
      b.constrained_tok_s,
      b.ratio,
      f(b.constrained_tokens, 0),
    ),
    line(`mixed ${m.constrained}+${m.free}`, b.free_tok_s, m.tok_s, m.ratio, "*"),
    "",
    `* a batch of ${m.constrained} constrained and ${m.free} unconstrained requests: its tok/s ` +
    `(both kinds) against the unconstrained batch of ${b.batch}`,
    `schema compile: first ${f(c.first)} ms (with the vocabulary's trie), another schema ` +
    `${f(c.another)} ms, cached ${f(c.cached, 2)} ms; the shortest output takes ` +
    `${r.min_tokens} tokens`,
    `constrained outputs valid against the schema: ${r.valid} of ${r.outputs}`,
  ].join("\n");
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
