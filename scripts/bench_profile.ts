/**
 * Where a decode step's (or a prefill chunk's) GPU time goes: every dispatch in its own compute
 * pass with timestamps, summed per kernel label over the layers (`bench --profile`). One pass per dispatch
 * removes overlap between neighbours and adds a little per-pass cost, so the step is also timed
 * as one pass for comparison.
 */
import type { Engine } from "../engine/engine.ts";
import { timePasses } from "../gpu/timing.ts";
import { type Dispatch, encode } from "../gpu/dispatch.ts";

/** GPU time of one kernel label, summed over its dispatches in the step. */
export interface KernelTime {
  /** The dispatch label without its layer number. */
  label: string;
  /** Dispatches with this label in one step. */
  count: number;
  /** Median over iterations of their summed time (µs). */
  us: number;
}

/** {@linkcode profileDecodeStep}'s and {@linkcode profilePrefill}'s result. */
export interface StepProfile {
  /** Batch slots the step advances (1 for a prefill chunk). */
  slots: number;
  /** Tokens in each slot's KV cache during the step (a prefill: the chunk's tokens). */
  context: number;
  /** Set for a prefill chunk. */
  prefill?: boolean;
  dispatches: number;
  /** Largest first. */
  kernels: KernelTime[];
  /** Sum over dispatches, each timed alone (µs). */
  sumUs: number;
  /** The whole step in one pass (µs): what the engine actually pays on the GPU. */
  onePassUs: number;
  /** Per step, with eight consecutive steps in one pass (decode only; µs). */
  eightStepsUs?: number;
}

/** Options for {@linkcode profileDecodeStep}. */
export interface ProfileOptions {
  /** Batch slots the step advances (slots [0, slots)). */
  slots: number;
  /** KV length each slot's attention reads. */
  context: number;
  /** Timed repetitions; medians are reported (default 5). */
  iterations?: number;
}

/**
 * Times one decode step of `engine` dispatch by dispatch. Run it only while the engine is idle:
 * with every slot finished, step_begin routes the KV writes to the trash block and step_end
 * records nothing, so the step changes no request's state. Each slot's `seqLen` is set to
 * `context` so attention reads a realistic length through the slot's last block table.
 *
 * @throws Error when the device has no `timestamp-query`.
 * @example
 * const p = await profileDecodeStep(engine, { slots: 1, context: 256 });
 * console.log(formatProfile(p));
 */
export async function profileDecodeStep(
  engine: Engine,
  options: ProfileOptions,
): Promise<StepProfile> {
  const { slots, context } = options;
  const dispatches = engine.profileDecodeStep(slots, context);
  const p = await profileDispatches(engine, dispatches, options.iterations);
  // Eight steps as the engine encodes a submission (ring rows k = 0..7), after a warm pass.
  const eight = Array.from({ length: 8 }, (_, k) => engine.profileDecodeStep(slots, context, k))
    .flat();
  const body = (pass: GPUComputePassEncoder) => encode(pass, eight);
  const runs: number[] = [];
  for (let i = 0; i < (options.iterations ?? 5); i++) {
    runs.push((await timePasses(engine.gpu, [body, body]))[1] / 8000);
  }
  return { slots, context, ...p, eightStepsUs: median(runs) };
}

/** Options for {@linkcode profilePrefill}. */
export interface PrefillProfileOptions {
  /** Prompt tokens in the chunk (at most the engine's `maxChunk`). */
  tokens: number;
  /** Timed repetitions; medians are reported (default 5). */
  iterations?: number;
}

/**
 * Times one prefill chunk of `tokens` tokens at position 0 of slot 0, dispatch by dispatch. Run
 * it only while the engine is idle: slot 0's block table is pointed at the trash block first, so
 * the chunk's KV writes land where no request reads; the next admission rewrites the table.
 *
 * @throws Error when the device has no `timestamp-query` or `tokens` exceeds `maxChunk`.
 */
export async function profilePrefill(
  engine: Engine,
  options: PrefillProfileOptions,
): Promise<StepProfile> {
  const T = options.tokens;
  const dispatches = engine.profilePrefill(T);
  return {
    slots: 1,
    context: T,
    prefill: true,
    ...await profileDispatches(engine, dispatches, options.iterations),
  };
}

async function profileDispatches(
  engine: Engine,
  dispatches: Dispatch[],
  iterations = 5,
): Promise<Omit<StepProfile, "slots" | "context">> {
  const gpu = engine.gpu;
  const alone = dispatches.map((x) => (pass: GPUComputePassEncoder) => encode(pass, [x]));
  const whole = (pass: GPUComputePassEncoder) => encode(pass, dispatches);
  await timePasses(gpu, [...alone, whole]); // warm-up
  const each: number[][] = dispatches.map(() => []);
  const onePass: number[] = [];
  for (let it = 0; it < iterations; it++) {
    const ns = await timePasses(gpu, [...alone, whole]);
    dispatches.forEach((_, i) => each[i].push(ns[i] / 1000));
    onePass.push(ns[dispatches.length] / 1000);
  }
  const byLabel = new Map<string, { count: number; runs: number[] }>();
  dispatches.forEach((x, i) => {
    const label = x.label.replace(/\s+L\d+\b/g, "");
    let k = byLabel.get(label);
    if (!k) byLabel.set(label, k = { count: 0, runs: new Array(iterations).fill(0) });
    k.count++;
    each[i].forEach((us, it) => (k.runs[it] += us));
  });
  const kernels = [...byLabel].map(([label, k]) => ({ label, count: k.count, us: median(k.runs) }))
    .sort((a, b) => b.us - a.us);
  return {
    dispatches: dispatches.length,
    kernels,
    sumUs: kernels.reduce((s, k) => s + k.us, 0),
    onePassUs: median(onePass),
  };
}

function median(v: number[]): number {
  const s = [...v].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

/** The per-kernel table of one profile. */
export function formatProfile(p: StepProfile): string {
  const w = Math.max(6, ...p.kernels.map((k) => k.label.length)) + 2;
  const row = (label: string, count: string, us: number, pct: string) =>
    `${label.padEnd(w)}${count.padStart(5)}${us.toFixed(1).padStart(12)}${pct.padStart(8)}`;
  const what = p.prefill
    ? `one prefill chunk of ${p.context} tokens`
    : `one decode step, batch ${p.slots}, context ${p.context}`;
  return [
    `GPU time of ${what} (${p.dispatches} dispatches, one timed pass each)`,
    `${"kernel".padEnd(w)}${"n".padStart(5)}${"µs".padStart(12)}${"%".padStart(8)}`,
    ...p.kernels.map((k) =>
      row(k.label, String(k.count), k.us, `${((100 * k.us) / p.sumUs).toFixed(1)}`)
    ),
    row("sum of dispatches", "", p.sumUs, "100.0"),
    row("whole step, one pass", "", p.onePassUs, ""),
    ...(p.eightStepsUs ? [row("per step, 8 steps in one pass", "", p.eightStepsUs, "")] : []),
  ].join("\n");
}
