/**
 * Where a decode step's GPU time goes: every dispatch of one step in its own compute pass with
 * timestamps, summed per kernel label over the layers (`bench --profile`). One pass per dispatch
 * removes overlap between neighbours and adds a little per-pass cost, so the step is also timed
 * as one pass for comparison.
 */
import type { Engine } from "../engine/engine.ts";
import { timePasses } from "../engine/gpu_timing.ts";
import { encode } from "../kernels/dispatch.ts";

/** GPU time of one kernel label, summed over its dispatches in the step. */
export interface KernelTime {
  /** The dispatch label without its layer number. */
  label: string;
  /** Dispatches with this label in one step. */
  count: number;
  /** Median over iterations of their summed time (µs). */
  us: number;
}

/** {@linkcode profileDecodeStep}'s result. */
export interface StepProfile {
  slots: number;
  /** Tokens in each slot's KV cache during the step. */
  context: number;
  dispatches: number;
  /** Largest first. */
  kernels: KernelTime[];
  /** Sum over dispatches, each timed alone (µs). */
  sumUs: number;
  /** The whole step in one pass (µs): what the engine actually pays on the GPU. */
  onePassUs: number;
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
  const iterations = options.iterations ?? 5;
  const d = engine.decoder, gpu = engine.gpu;
  gpu.device.queue.writeBuffer(d.step.seqLen, 0, new Uint32Array(slots).fill(context));
  const dispatches = d.decodeStep(slots, 0, 0, false);
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
    slots,
    context,
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
  return [
    `GPU time of one decode step, batch ${p.slots}, context ${p.context} ` +
    `(${p.dispatches} dispatches, one timed pass each)`,
    `${"kernel".padEnd(w)}${"n".padStart(5)}${"µs".padStart(12)}${"%".padStart(8)}`,
    ...p.kernels.map((k) =>
      row(k.label, String(k.count), k.us, `${((100 * k.us) / p.sumUs).toFixed(1)}`)
    ),
    row("sum of dispatches", "", p.sumUs, "100.0"),
    row("whole step, one pass", "", p.onePassUs, ""),
  ].join("\n");
}
