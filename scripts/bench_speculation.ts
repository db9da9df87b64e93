/**
 * `deno task bench --speculate`: what speculative decoding gives. Two parts, in one run:
 *
 * - **Acceptance on a trained model** (default: models/strata-default): three prompt kinds —
 *   copy-heavy (a passage, then its start again: the model repeats it), repetitive (a formula
 *   said over and over) and free (a fresh opening) — each decoded by an engine that never
 *   speculates and by one that always verifies ("on"), and one that decides ("auto"): the
 *   tokens must be equal; acceptance, tokens per verification step and decode tok/s of each.
 * - **The cost of verifying k drafts on a big shape** (default tinyllama-1.1b, random weights):
 *   the GPU time of a verification pass of k + 1 live rows against a plain step, k = 1..drafts,
 *   eight steps at a time as a submission runs them (random weights cost what trained ones do).
 *
 * The combination: the speedup the acceptance of each kind would give at that cost,
 * tokens per step ÷ (verify step ÷ plain step). Table on stdout, progress on stderr, `--out` JSON.
 *
 *   deno task bench --speculate [--model DIR] [--shape NAME] [--drafts N] [--new-tokens N]
 *                   [--out FILE]
 */
import { parseArgs } from "node:util";
import { sampling, type SamplingOptions } from "../api/types.ts";
import { Engine } from "../engine/engine.ts";
import { status } from "../engine/model/progress.ts";
import { syntheticModel } from "../engine/model/synthetic.ts";
import { getGpu } from "../gpu/device.ts";
import { type Dispatch, encode, run } from "../gpu/dispatch.ts";
import { timePasses } from "../gpu/timing.ts";
import { DEFAULT_MODEL } from "./bench_options.ts";

export const SPEC_USAGE = `deno task bench --speculate: acceptance, tokens per step and tok/s of
speculative decoding against plain decoding, and the cost of a verification pass

  --model DIR       the trained model whose acceptance is measured (default models/strata-default)
  --shape NAME      the shape whose verification cost is measured (default tinyllama-1.1b;
                    "none" skips it, e.g. on a CPU adapter)
  --drafts N        drafts per verification step, k (default 4; the cost is measured for 1..k)
  --new-tokens N    tokens per generation (default 128)
  (the cost: eight steps of batch 1 at 640 keys, timed on the GPU, plain against k + 1 rows)
  --out FILE        write the results as JSON
  --help            this text`;

/** The three kinds of text the acceptance is measured on. */
function prompts(engine: Engine): Record<string, number[]> {
  const passage = "Behold, a sower went forth to sow; and when he sowed, some seeds fell by the " +
    "way side, and the fowls came and devoured them up: some fell upon stony places, where they " +
    "had not much earth: and forthwith they sprung up, because they had no deepness of earth.";
  const formula = "And the LORD spake unto Moses, saying, Speak unto the children of Israel, " +
    "and say unto them. ";
  return {
    "copy-heavy": engine.encode(`${passage}\n\n${passage.slice(0, 60)}`),
    repetitive: engine.encode(formula.repeat(4) + "And the LORD spake"),
    free: engine.encode("Once upon a time, in a land far away, there lived"),
  };
}

interface Decoded {
  ids: number[];
  /** Decode tok/s: tokens after the first over the time after the first. */
  tokS: number;
  steps: number;
  drafted: number;
  accepted: number;
}

async function decode(engine: Engine, promptIds: number[], s: SamplingOptions): Promise<Decoded> {
  const gen = engine.generate({ promptIds, sampling: s });
  const ids: number[] = [];
  let first = 0;
  for await (const t of gen) {
    if (ids.length === 0) first = performance.now();
    ids.push(t.id);
  }
  const end = performance.now(), r = await gen.result;
  const sp = r.speculation ?? { steps: 0, drafted: 0, accepted: 0 };
  return { ids, tokS: (ids.length - 1) / ((end - first) / 1000), ...sp };
}

/** The options of {@linkcode runSpeculationBench}. */
export interface SpeculationBenchOptions {
  model?: string;
  /** Shape for the cost; null to skip. */
  shape?: string | null;
  drafts?: number;
  newTokens?: number;
}

/** Runs both parts; see the module doc. */
export async function runSpeculationBench(o: SpeculationBenchOptions = {}) {
  const drafts = o.drafts ?? 4, newTokens = o.newTokens ?? 128;
  const gpu = await getGpu();
  const model = o.model ?? DEFAULT_MODEL;
  status(`bench --speculate: acceptance on ${model}`);
  const engines = {
    plain: await Engine.load(model, { gpu, maxSlots: 2 }),
    on: await Engine.load(model, { gpu, maxSlots: 2, speculate: "on", drafts }),
    auto: await Engine.load(model, { gpu, maxSlots: 2, speculate: "auto", drafts }),
  };
  const kinds = [];
  for (const [kind, promptIds] of Object.entries(prompts(engines.plain))) {
    for (const temperature of [0, 0.8]) {
      const s = sampling({ maxTokens: newTokens, stopAtEos: false, temperature, seed: 7n });
      await decode(engines.plain, promptIds, s); // warm: kernels compiled, pacer measured
      await decode(engines.on, promptIds, s);
      await decode(engines.auto, promptIds, s);
      status(`bench --speculate: ${kind}, T=${temperature}`);
      const plain = await decode(engines.plain, promptIds, s);
      const on = await decode(engines.on, promptIds, s);
      const auto = await decode(engines.auto, promptIds, s);
      const same = JSON.stringify(on.ids) === JSON.stringify(plain.ids) &&
        JSON.stringify(auto.ids) === JSON.stringify(plain.ids);
      kinds.push({
        kind,
        temperature,
        identical: same,
        acceptance: on.drafted > 0 ? on.accepted / on.drafted : 0,
        tokens_per_step: on.steps > 0 ? (on.steps + on.accepted) / on.steps : 1,
        plain_tok_s: plain.tokS,
        on_tok_s: on.tokS,
        auto_tok_s: auto.tokS,
        auto_verified_steps: auto.steps,
      });
    }
  }
  let cost: { k: number; plain_ms: number; verify_ms: number; ratio: number }[] = [];
  if (o.shape !== null) {
    const shape = o.shape ?? "tinyllama-1.1b";
    status(`bench --speculate: verification cost on ${shape}`);
    const weights = await syntheticModel(gpu, shape, { tokenizerDir: DEFAULT_MODEL });
    cost = await verifyCost(gpu, weights, { drafts, newTokens });
  }
  const verify = cost.find((c) => c.k === drafts);
  const combined = kinds.map((k) => ({
    kind: k.kind,
    temperature: k.temperature,
    speedup: verify ? k.tokens_per_step / verify.ratio : null,
  }));
  return { adapter: gpu.adapterName, model, drafts, new_tokens: newTokens, kinds, cost, combined };
}

/**
 * Milliseconds per step, plain and verifying k = 1..drafts drafts, on `model`, at batch 1 and a
 * context of 640 keys: eight steps encoded as a submission encodes them, timed on the GPU
 * (timestamp queries; the wall clock around a whole submission where the adapter has none).
 */
async function verifyCost(
  gpu: Awaited<ReturnType<typeof getGpu>>,
  model: Awaited<ReturnType<typeof syntheticModel>>,
  o: { drafts: number; newTokens: number },
) {
  const context = 640, steps = 8;
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
  const opts = { gpu, maxSlots: 1, contextLength: 1024 };
  const plainEngine = Engine.create(gpu, model, opts);
  const plain = await time(plainEngine, (k) => plainEngine.profileDecodeStep(1, context, k));
  const out = [];
  for (let k = 1; k <= o.drafts; k++) {
    const e = Engine.create(gpu, model, { ...opts, speculate: "on", drafts: k });
    const v = await time(e, (j) => e.profileVerifyStep(1, context, j));
    out.push({ k, plain_ms: plain, verify_ms: v, ratio: v / plain });
  }
  return out;
}

/** The result as a table. */
export function formatSpeculation(r: Awaited<ReturnType<typeof runSpeculationBench>>): string {
  const f = (x: number, d = 1) => x.toFixed(d);
  const lines = [
    `strata bench --speculate: ${r.model} on ${r.adapter}, ${r.drafts} drafts, ${r.new_tokens} tokens`,
    "",
    "kind         T    same  acceptance  tok/step  plain tok/s  on tok/s  auto tok/s  speedup*",
  ];
  r.kinds.forEach((k, i) => {
    const sp = r.combined[i].speedup;
    lines.push(
      `${k.kind.padEnd(12)} ${f(k.temperature)}  ${(k.identical ? "yes" : "NO").padEnd(4)}  ` +
        `${f(k.acceptance, 3).padStart(10)}  ${f(k.tokens_per_step, 2).padStart(8)}  ` +
        `${f(k.plain_tok_s).padStart(11)}  ${f(k.on_tok_s).padStart(8)}  ${
          f(k.auto_tok_s).padStart(10)
        }` +
        `  ${sp === null ? "-" : f(sp, 2).padStart(7)}`,
    );
  });
  if (r.cost.length) {
    lines.push("", "verification cost (step time of k + 1 rows against a plain step)");
    for (const c of r.cost) {
      lines.push(
        `  k=${c.k}  plain ${f(c.plain_ms, 3)} ms  verify ${f(c.verify_ms, 3)} ms  ${
          f(c.ratio, 2)
        }x`,
      );
    }
    lines.push(
      "",
      "* tokens per step on the trained model ÷ the cost of k drafts on the big shape",
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
  const r = await runSpeculationBench({
    model: v.model,
    shape: v.shape === "none" ? null : v.shape,
    drafts: int("drafts", v.drafts),
    newTokens: int("new-tokens", v["new-tokens"]),
  });
  console.log(formatSpeculation(r));
  if (v.out) await Deno.writeTextFile(v.out, JSON.stringify(r, null, 2) + "\n");
}
