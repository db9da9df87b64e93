/**
 * `deno task bench --speculate`: what speculative decoding gives, per length group. In one run:
 *
 * - **The cost of verifying k drafts on a big shape** (default tinyllama-1.1b, random weights:
 *   they cost what trained ones do): the GPU time of a verification pass of k + 1 live rows
 *   against a plain step (M = k + 1 rows against M = 1), k = 1..drafts, batch 1, at each length
 *   group's context; eight steps at a time as a submission runs them.
 * - **Acceptance on a trained model** (default models/strata-default), for each length group (a
 *   prompt of about `--contexts` tokens each; with the new tokens it stays in its group) and
 *   three kinds of text: copy-heavy (a passage, then its start again: the model repeats it),
 *   repetitive (a formula said over and over) and free (an opening after unrelated text), at
 *   T = 0 and 0.8. Each prompt is decoded by an engine that never speculates (plain), one that
 *   always verifies at full depth (on), the same with drafts from prompt lookup alone (lookup),
 *   one that decides (auto, with the costs it measures here), and one that decides with the big
 *   shape's costs at that context (auto*): the tokens must be equal; acceptance, tokens per
 *   verification step and decode tok/s of each.
 * - **The combination**: the tok/s the big shape would decode at, against plain decoding, with
 *   the trained model's acceptance: plain steps and verification passes of R rows weighted by
 *   their measured cost (cross-checks count a plain step each), for on and auto*.
 *
 * Table on stdout (with the targets), progress on stderr, `--out` JSON.
 *
 *   deno task bench --speculate [--model DIR] [--shape NAME] [--drafts N] [--new-tokens N]
 *                   [--contexts A,B,C] [--out FILE]
 */
import { parseArgs } from "node:util";
import { sampling, type SamplingOptions } from "../api/types.ts";
import { Engine, type EngineOptions } from "../engine/engine.ts";
import { status } from "../engine/model/progress.ts";
import { syntheticModel } from "../engine/model/synthetic.ts";
import { getGpu, type Gpu } from "../gpu/device.ts";
import { type Dispatch, encode, run } from "../gpu/dispatch.ts";
import { timePasses } from "../gpu/timing.ts";
import { DEFAULT_MODEL } from "./bench_options.ts";

export const SPEC_USAGE = `deno task bench --speculate: acceptance, tokens per step and tok/s of
speculative decoding against plain decoding per length group, and the cost of a verification pass

  --model DIR       the trained model whose acceptance is measured (default models/strata-default)
  --shape NAME      the shape whose verification cost is measured (default tinyllama-1.1b;
                    "none" skips it and the combination, e.g. on a CPU adapter)
  --drafts N        drafts per verification step, k (default 4; the cost is measured for 1..k)
  --new-tokens N    tokens per generation (default 64)
  --contexts LIST   prompt tokens of each length group's prompts (default 60,300,700: the
                    groups < 128, 128-511 and 512+ tokens; prompt and output stay in the group)
  (the cost: eight steps of batch 1 at each group's context plus half the new tokens, timed on
  the GPU, a plain step against k + 1 rows)
  --out FILE        write the results as JSON
  --help            this text

Targets (issue 27, H200, 1.1B shape): the verify step for k = 4 costs <= 1.3x a plain step;
the combination gives >= 1.6x plain tok/s on copy-heavy text and never below 0.97x on free text.`;

const KINDS = ["copy-heavy", "repetitive", "free"] as const;
type Kind = typeof KINDS[number];

/** Text the prompts are cut from: the default model's held-out sample, and three set pieces. */
const SAMPLE = new URL("../models/strata-default/val_sample.txt", import.meta.url).pathname;
const PASSAGE = "Behold, a sower went forth to sow; and when he sowed, some seeds fell by the " +
  "way side, and the fowls came and devoured them up: some fell upon stony places, where they " +
  "had not much earth: and forthwith they sprung up, because they had no deepness of earth.";
const FORMULA = "And the LORD spake unto Moses, saying, Speak unto the children of Israel, " +
  "and say unto them. ";
const OPENING = "Once upon a time, in a land far away, there lived";

/** `text`'s tokens without the BOS the tokenizer puts first: a piece of a longer prompt. */
function piece(engine: Engine, text: string): number[] {
  const ids = engine.encode(text), bos = engine.tokenizer.bosId;
  return ids[0] === bos ? ids.slice(1) : ids;
}

/**
 * The three kinds of prompt, each `tokens` long: copy-heavy, unrelated text (the held-out
 * sample) then a passage, a break and the passage's start again (the model goes on copying);
 * repetitive, a formula over and over; free, unrelated text then a fresh opening.
 */
function prompts(engine: Engine, sample: number[], tokens: number): Record<Kind, number[]> {
  const bos = engine.tokenizer.bosId === undefined ? [] : [engine.tokenizer.bosId];
  const cue = piece(engine, "\n\n"), opening = piece(engine, OPENING);
  const passage = piece(engine, PASSAGE), room = Math.max(0, tokens - bos.length - cue.length);
  const start = Math.min(16, Math.floor(room / 5)), copied = Math.min(passage.length, room - start);
  const filler = (n: number) => [...sample.slice(0, n), ...(n > 0 ? cue : [])];
  const formula = piece(engine, FORMULA.repeat(Math.ceil(tokens / 10)));
  const before = Math.max(0, room - copied - start - cue.length);
  return {
    "copy-heavy": [
      ...bos,
      ...filler(before),
      ...passage.slice(0, copied),
      ...cue,
      ...passage.slice(0, start),
    ],
    repetitive: [...bos, ...formula.slice(0, tokens - bos.length)],
    free: [...bos, ...filler(Math.max(0, room - opening.length)), ...opening],
  };
}

/** One generation as the bench measured it. */
export interface Decoded {
  ids: number[];
  /** Decode tok/s: tokens after the first over the time after the first. */
  tokS: number;
  steps: number;
  drafted: number;
  accepted: number;
  pooled: number;
  checks: number;
  byRows: number[];
}

async function decode(engine: Engine, promptIds: number[], s: SamplingOptions): Promise<Decoded> {
  const gen = engine.generate({ promptIds, sampling: s });
  const ids: number[] = [];
  let first = 0;
  for await (const t of gen) {
    if (ids.length === 0) first = performance.now();
    ids.push(t.id);
  }
  const end = performance.now(), sp = (await gen.result).speculation;
  return {
    ids,
    tokS: (ids.length - 1) / ((end - first) / 1000),
    steps: sp?.steps ?? 0,
    drafted: sp?.drafted ?? 0,
    accepted: sp?.accepted ?? 0,
    pooled: sp?.pooled ?? 0,
    checks: sp?.checks ?? 0,
    byRows: sp?.byRows ?? [],
  };
}

/**
 * How much faster than plain decoding a run is at step costs `ratio(R)` (plain steps cost 1): the
 * tokens after the first over the plain steps, the passes weighted by their cost, and a plain
 * step per cross-check.
 */
export function modeledSpeedup(d: Decoded, ratio: (rows: number) => number): number {
  const decoded = d.ids.length - 1;
  const plainSteps = decoded - d.steps - d.accepted;
  const passes = d.byRows.reduce((n, count, R) => (count ? n + count * ratio(R) : n), 0);
  return decoded / (plainSteps + passes + d.checks);
}

/** The options of {@linkcode runSpeculationBench}. */
export interface SpeculationBenchOptions {
  model?: string;
  /** Shape for the cost; null to skip. */
  shape?: string | null;
  drafts?: number;
  newTokens?: number;
  /** Prompt tokens of each length group's prompts. */
  contexts?: number[];
}

/** A verification pass's cost at one context. */
export interface Cost {
  context: number;
  k: number;
  plain_ms: number;
  verify_ms: number;
  ratio: number;
}

/** Runs every part; see the module doc. */
export async function runSpeculationBench(o: SpeculationBenchOptions = {}) {
  const drafts = o.drafts ?? 4, newTokens = o.newTokens ?? 64;
  const contexts = o.contexts ?? [60, 300, 700];
  const gpu = await getGpu();
  const model = o.model ?? DEFAULT_MODEL;
  const keysAt = (c: number) => c + Math.floor(newTokens / 2);
  let cost: Cost[] = [];
  const shape = o.shape === null ? null : o.shape ?? "tinyllama-1.1b";
  if (shape !== null) {
    status(`bench --speculate: verification cost on ${shape}`);
    const weights = await syntheticModel(gpu, shape, { tokenizerDir: DEFAULT_MODEL });
    cost = await verifyCost(gpu, weights, { drafts, contexts: contexts.map(keysAt) });
  }
  const ratioAt = (c: number) => (R: number) =>
    cost.find((x) => x.context === keysAt(c) && x.k === R - 1)?.ratio ?? NaN;
  status(`bench --speculate: acceptance on ${model}`);
  const base: EngineOptions = { gpu, maxSlots: 2, kvBlocks: 160, drafts };
  const engines: Record<string, Engine> = {
    plain: await Engine.load(model, { ...base, drafts: undefined }),
    on: await Engine.load(model, { ...base, speculate: "on" }),
    lookup: await Engine.load(model, { ...base, speculate: "on", speculation: { pool: false } }),
    auto: await Engine.load(model, { ...base, speculate: "auto" }),
  };
  const sample = piece(engines.plain, await Deno.readTextFile(SAMPLE));
  const room = engines.plain.contextLength - newTokens - drafts;
  if (contexts.some((c) => c > room)) {
    throw new Error(`--contexts: ${model} holds ${room} prompt tokens beside the new ones`);
  }
  const runs = [];
  for (const context of contexts) {
    const group = engines.on.speculationStats().groups!.find((g) => groupHolds(g.name, context))
      ?.name ?? "";
    // auto*: decides with the big shape's costs at this context.
    const costs = cost.length
      ? Array.from({ length: drafts + 2 }, (_, R) => (R < 2 ? 1 : ratioAt(context)(R)))
      : undefined;
    const big = costs
      ? await Engine.load(model, { ...base, speculate: "auto", speculation: { costs } })
      : undefined;
    for (const [kind, promptIds] of Object.entries(prompts(engines.plain, sample, context))) {
      for (const temperature of [0, 0.8]) {
        status(
          `bench --speculate: ${group} (${promptIds.length} tokens), ${kind}, T=${temperature}`,
        );
        const s = sampling({ maxTokens: newTokens, stopAtEos: false, temperature, seed: 7n });
        const all = { ...engines, ...(big ? { big } : {}) };
        // Warm once per group (kernels compiled, the pacer's costs measured at this length).
        if (kind === KINDS[0] && temperature === 0) {
          for (const e of Object.values(all)) await decode(e, promptIds, s);
        }
        const d: Record<string, Decoded> = {};
        for (const [name, e] of Object.entries(all)) d[name] = await decode(e, promptIds, s);
        const same = Object.values(d).every((x) =>
          JSON.stringify(x.ids) === JSON.stringify(d.plain.ids)
        );
        const perStep = (x: Decoded) => x.steps > 0 ? (x.steps + x.accepted) / x.steps : 1;
        runs.push({
          group,
          context: promptIds.length,
          kind,
          temperature,
          identical: same,
          acceptance: d.on.drafted > 0 ? d.on.accepted / d.on.drafted : 0,
          tokens_per_step: perStep(d.on),
          lookup_tokens_per_step: perStep(d.lookup),
          pool_share: d.on.drafted > 0 ? d.on.pooled / d.on.drafted : 0,
          plain_tok_s: d.plain.tokS,
          on_tok_s: d.on.tokS,
          auto_tok_s: d.auto.tokS,
          auto_verified_steps: d.auto.steps,
          big_verified_steps: d.big?.steps ?? null,
          speedup_on: cost.length ? modeledSpeedup(d.on, ratioAt(context)) : null,
          speedup_auto: d.big ? modeledSpeedup(d.big, ratioAt(context)) : null,
        });
      }
    }
  }
  return {
    adapter: gpu.adapterName,
    model,
    shape,
    drafts,
    new_tokens: newTokens,
    contexts,
    cost,
    runs,
    targets: targets(cost, runs, drafts),
  };
}

/** Whether the group named `name` ("<128", "128-511", "512+") holds a context of `c` tokens. */
function groupHolds(name: string, c: number): boolean {
  const [lo, hi] = name.startsWith("<")
    ? [0, Number(name.slice(1))]
    : name.endsWith("+")
    ? [Number(name.slice(0, -1)), Infinity]
    : name.split("-").map((v, i) => Number(v) + i);
  return c >= lo && c < hi;
}

/** The targets against what was measured (null where the cost was not). */
function targets(
  cost: Cost[],
  runs: { kind: string; speedup_auto: number | null }[],
  drafts: number,
) {
  const at4 = cost.filter((c) => c.k === Math.min(4, drafts)).map((c) => c.ratio);
  const of = (kind: string) =>
    runs.filter((r) => r.kind === kind && r.speedup_auto !== null).map((r) => r.speedup_auto!);
  const copy = of("copy-heavy"), free = of("free");
  return {
    verify_k4_max_ratio: at4.length ? Math.max(...at4) : null,
    copy_heavy_min_speedup: copy.length ? Math.min(...copy) : null,
    free_min_speedup: free.length ? Math.min(...free) : null,
  };
}

/**
 * Milliseconds per step on `model` at batch 1, plain and verifying k = 1..drafts drafts, at each
 * of `contexts` keys: eight steps encoded as a submission encodes them, timed on the GPU
 * (timestamp queries; the wall clock around a whole submission where the adapter has none).
 */
async function verifyCost(
  gpu: Gpu,
  model: Awaited<ReturnType<typeof syntheticModel>>,
  o: { drafts: number; contexts: number[] },
): Promise<Cost[]> {
  const steps = 8, contextLength = Math.max(...o.contexts) + 64;
  const time = async (engine: Engine, build: (k: number) => Dispatch[]) => {
    const all = Array.from({ length: steps }, (_, k) => build(k)).flat();
    const body = (pass: GPUComputePassEncoder) => encode(pass, all);
    const runs: number[] = [];
    for (let i = 0; i < 6; i++) {
      if (gpu.hasTimestamps) runs.push((await timePasses(gpu, [body]))[0] / 1e6 / steps);
      else {
        const t = performance.now();
        await run(gpu, all);
        runs.push((performance.now() - t) / steps);
      }
    }
    engine.profileDone(1);
    return runs.sort((a, b) => a - b)[runs.length >> 1]; // median, the first run warms
  };
  const opts = { gpu, maxSlots: 1, contextLength };
  const plainEngine = Engine.create(gpu, model, opts);
  const spec = Engine.create(gpu, model, { ...opts, speculate: "on", drafts: o.drafts });
  const out: Cost[] = [];
  for (const context of o.contexts) {
    const plain = await time(plainEngine, (k) => plainEngine.profileDecodeStep(1, context, k));
    for (let k = 1; k <= o.drafts; k++) {
      const v = await time(spec, (j) => spec.profileVerifyStep(1, context, j, k + 1));
      out.push({ context, k, plain_ms: plain, verify_ms: v, ratio: v / plain });
    }
  }
  return out;
}

/** The result as a table. */
export function formatSpeculation(r: Awaited<ReturnType<typeof runSpeculationBench>>): string {
  const f = (x: number | null, d = 1) => x === null || !Number.isFinite(x) ? "-" : x.toFixed(d);
  const lines = [
    `strata bench --speculate: ${r.model} on ${r.adapter}, ${r.drafts} drafts, ` +
    `${r.new_tokens} tokens`,
    "",
    "group    prompt  kind        T    same  accept  tok/step  lookup  pool  " +
    "plain tok/s  on tok/s  auto tok/s  on*    auto*",
  ];
  for (const k of r.runs) {
    lines.push(
      `${k.group.padEnd(8)} ${String(k.context).padStart(6)}  ${k.kind.padEnd(10)}  ` +
        `${f(k.temperature)}  ${(k.identical ? "yes" : "NO").padEnd(4)}  ` +
        `${f(k.acceptance, 3).padStart(6)}  ${f(k.tokens_per_step, 2).padStart(8)}  ` +
        `${f(k.lookup_tokens_per_step, 2).padStart(6)}  ${f(k.pool_share, 2).padStart(4)}  ` +
        `${f(k.plain_tok_s).padStart(11)}  ${f(k.on_tok_s).padStart(8)}  ` +
        `${f(k.auto_tok_s).padStart(10)}  ${f(k.speedup_on, 2).padStart(5)}  ` +
        `${f(k.speedup_auto, 2).padStart(5)}`,
    );
  }
  lines.push(
    "",
    "tok/step: tokens per verification step (on); lookup: the same with drafts from prompt " +
      "lookup alone;",
    "pool: share of drafts from the n-gram pool; * : the big shape's tok/s against plain " +
      "decoding at this acceptance",
    "(on: always verifying k drafts; auto: deciding with the big shape's costs)",
  );
  if (r.cost.length) {
    lines.push("", `verification cost on ${r.shape} (a pass of k + 1 rows against a plain step)`);
    for (const c of r.cost) {
      lines.push(
        `  ${String(c.context).padStart(5)} keys  k=${c.k}  plain ${f(c.plain_ms, 3)} ms  ` +
          `verify ${f(c.verify_ms, 3)} ms  ${f(c.ratio, 2)}x`,
      );
    }
    const t = r.targets, mark = (ok: boolean) => ok ? "met" : "MISSED";
    lines.push(
      "",
      "targets (issue 27):",
      `  verify step, k=${Math.min(4, r.drafts)}: ${f(t.verify_k4_max_ratio, 2)}x a plain step ` +
        `at most (<= 1.30: ` +
        `${mark(t.verify_k4_max_ratio! <= 1.3)})`,
      `  copy-heavy, auto*: ${f(t.copy_heavy_min_speedup, 2)}x plain tok/s at least (>= 1.60: ` +
        `${mark(t.copy_heavy_min_speedup! >= 1.6)})`,
      `  free text, auto*: ${f(t.free_min_speedup, 2)}x plain tok/s at least (>= 0.97: ` +
        `${mark(t.free_min_speedup! >= 0.97)})`,
    );
  }
  return lines.join("\n");
}

/** The CLI (`deno task bench --speculate ...`). */
export async function speculationMain(args: string[]): Promise<void> {
  const { values: v } = parseArgs({
    args: args.filter((a) => a !== "--speculate"),
    options: {
      model: { type: "string" },
      shape: { type: "string" },
      drafts: { type: "string" },
      "new-tokens": { type: "string" },
      contexts: { type: "string" },
      out: { type: "string" },
      help: { type: "boolean" },
    },
  });
  if (v.help) return console.log(SPEC_USAGE);
  const int = (name: string, s: string | undefined) => {
    if (s === undefined) return undefined;
    const n = Number(s);
    if (!Number.isInteger(n) || n < 1) {
      throw new Error(`--${name} must be an integer >= 1; got '${s}'`);
    }
    return n;
  };
  const contexts = v.contexts?.split(",").map((c) => int("contexts", c.trim())!);
  if (contexts?.some((c) => c < 8 || c > 960)) {
    throw new Error(`--contexts must be token counts from 8 to 960; got '${v.contexts}'`);
  }
  const r = await runSpeculationBench({
    model: v.model,
    shape: v.shape === "none" ? null : v.shape,
    drafts: int("drafts", v.drafts),
    newTokens: int("new-tokens", v["new-tokens"]),
    contexts,
  });
  console.log(formatSpeculation(r));
  if (v.out) await Deno.writeTextFile(v.out, JSON.stringify(r, null, 2) + "\n");
}
