/**
 * Measures how fast WGSL can read GPU memory (kernels/read_bandwidth.wgsl): the denominator of
 * the bench's roofline. A few launch shapes are tried and the best kept, as a well-tuned decode
 * kernel would be. Timed with timestamp queries when the adapter has them, else with the wall
 * clock over enough dispatches that Deno's ≈10 ms completion polling does not matter.
 */
import { type Gpu, isCpuAdapter } from "../gpu/device.ts";
import { timePasses } from "../gpu/timing.ts";
import { bindGroup } from "../gpu/dispatch.ts";
import { pipeline } from "./pipeline.ts";

/** One launch shape of the read kernel. */
export interface ReadLaunch {
  /** Threads per workgroup. */
  wg: number;
  /** Independent 16-byte loads in flight per thread: 1, 2, 4 or 8. */
  unroll: number;
  workgroups: number;
}

/** Options for {@linkcode measureReadBandwidth}. */
export interface ReadBandwidthOptions {
  /** Bytes read per pass (default {@linkcode defaultReadBytes}). */
  bytes?: number;
  /** Timed dispatches per launch shape (default 20 on a GPU, 4 on a CPU adapter). */
  reps?: number;
  /** Launch shapes to try (default: a small sweep suited to the adapter). */
  launches?: ReadLaunch[];
  /** Force wall-clock timing even when timestamps are available. */
  wallClock?: boolean;
}

/** What {@linkcode measureReadBandwidth} found. */
export interface ReadBandwidth {
  /** Best read bandwidth, 10⁹ bytes per second. */
  gbPerS: number;
  bytes: number;
  method: "timestamp" | "wall";
  /** The launch shape that gave `gbPerS`. */
  launch: ReadLaunch;
}

/** 1 GiB on a GPU, 64 MiB on a CPU adapter; never more than one binding. */
export function defaultReadBytes(gpu: Gpu): number {
  const want = isCpuAdapter(gpu) ? 64 * 2 ** 20 : 2 ** 30;
  return Math.min(want, Math.floor(gpu.maxBinding / 16) * 16);
}

const GPU_LAUNCHES: ReadLaunch[] = [
  { wg: 256, unroll: 1, workgroups: 8192 },
  { wg: 256, unroll: 4, workgroups: 2048 },
  { wg: 256, unroll: 4, workgroups: 8192 },
  { wg: 256, unroll: 8, workgroups: 4096 },
  { wg: 128, unroll: 8, workgroups: 8192 },
];
// llvmpipe runs invocations as SIMD lanes on a few threads: many short workgroups beat a few
// long grid-stride loops there (measured 2-4x on a 2-core machine).
const CPU_LAUNCHES: ReadLaunch[] = [
  { wg: 256, unroll: 4, workgroups: 4096 },
  { wg: 64, unroll: 1, workgroups: 4096 },
];

/**
 * Reads a buffer of `bytes` repeatedly with each launch shape and returns the best bandwidth.
 *
 * @throws Error when `bytes` is not a positive multiple of 16 within one binding.
 * @example
 * const bw = await measureReadBandwidth(gpu);
 * console.log(`${bw.gbPerS.toFixed(0)} GB/s (${bw.method})`);
 */
export async function measureReadBandwidth(
  gpu: Gpu,
  options: ReadBandwidthOptions = {},
): Promise<ReadBandwidth> {
  const bytes = options.bytes ?? defaultReadBytes(gpu);
  if (!(bytes >= 16 && bytes % 16 === 0 && bytes <= gpu.maxBinding)) {
    throw new Error(
      `read bandwidth buffer must be a multiple of 16 bytes up to ${gpu.maxBinding}; got ${bytes}`,
    );
  }
  const cpu = isCpuAdapter(gpu);
  const launches = options.launches ?? (cpu ? CPU_LAUNCHES : GPU_LAUNCHES);
  const reps = options.reps ?? (cpu ? 4 : 20);
  const useTimestamps = gpu.hasTimestamps && !options.wallClock;
  const dev = gpu.device;
  const src = dev.createBuffer({ size: bytes, usage: GPUBufferUsage.STORAGE, label: "bw_src" });
  const sinkBytes = Math.max(...launches.map((l) => l.wg * l.workgroups * 16));
  const sink = dev.createBuffer({ size: sinkBytes, usage: GPUBufferUsage.STORAGE });
  let best: ReadBandwidth | undefined;
  try {
    for (const launch of launches) {
      const pipe = pipeline(gpu, "read_bandwidth.wgsl", {
        constants: { WG: launch.wg, UNROLL: launch.unroll },
      });
      const bg = bindGroup(gpu, pipe, [src, sink]);
      const body = (n: number) => (pass: GPUComputePassEncoder) => {
        pass.setPipeline(pipe);
        pass.setBindGroup(0, bg);
        for (let i = 0; i < n; i++) pass.dispatchWorkgroups(launch.workgroups);
      };
      await wallMs(gpu, body(1)); // compile and touch the pages
      let ms: number | undefined;
      if (useTimestamps) {
        const [ns] = await timePasses(gpu, [body(reps)]);
        if (ns > 0 && Number.isFinite(ns)) ms = ns / 1e6 / reps;
      }
      let method: ReadBandwidth["method"] = "timestamp";
      if (ms === undefined) {
        method = "wall";
        let n = reps, total = await wallMs(gpu, body(n));
        // Completion is only noticed every ≈10 ms: run long enough that it is noise.
        if (total < 200) total = await wallMs(gpu, body(n = Math.ceil((n * 250) / total)));
        ms = total / n;
      }
      const gbPerS = bytes / ms / 1e6;
      if (!best || gbPerS > best.gbPerS) best = { gbPerS, bytes, method, launch };
    }
  } finally {
    src.destroy();
    sink.destroy();
  }
  return best!;
}

/** Wall time of one submitted pass, until the queue reports it done. */
async function wallMs(gpu: Gpu, body: (pass: GPUComputePassEncoder) => void): Promise<number> {
  const enc = gpu.device.createCommandEncoder();
  const pass = enc.beginComputePass();
  body(pass);
  pass.end();
  const t0 = performance.now();
  gpu.device.queue.submit([enc.finish()]);
  await gpu.device.queue.onSubmittedWorkDone();
  return performance.now() - t0;
}
