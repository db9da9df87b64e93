/**
 * GPU time of compute passes from timestamp queries (`timestamp-query`): each pass gets a
 * timestamp at its beginning and end, resolved and read back once for the whole batch. Used by
 * the bench (read bandwidth, per-kernel profile); never on the serving path (a readback costs
 * ≥ 10 ms in Deno).
 */
import type { Gpu } from "./device.ts";

/** Records the work of one timed pass into the open pass. */
export type PassBody = (pass: GPUComputePassEncoder) => void;

/** Passes per query set (two timestamps each; WebGPU allows 4096 queries per set). */
const MAX_PASSES = 2048;

/**
 * Encodes one compute pass per body, all in one submission, and returns the GPU time of each
 * in nanoseconds.
 *
 * @throws Error when the device was created without `timestamp-query`.
 * @example
 * const [ns] = await timePasses(gpu, [(pass) => encode(pass, dispatches)]);
 */
export async function timePasses(gpu: Gpu, bodies: PassBody[]): Promise<number[]> {
  if (!gpu.hasTimestamps) {
    throw new Error(`${gpu.adapterName} has no timestamp-query: time with the wall clock instead`);
  }
  const dev = gpu.device;
  const out: number[] = [];
  for (let start = 0; start < bodies.length; start += MAX_PASSES) {
    const chunk = bodies.slice(start, start + MAX_PASSES);
    const count = chunk.length * 2;
    const querySet = dev.createQuerySet({ type: "timestamp", count });
    const resolved = dev.createBuffer({
      size: count * 8,
      usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC,
    });
    const staging = dev.createBuffer({
      size: count * 8,
      usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
    });
    const enc = dev.createCommandEncoder();
    chunk.forEach((body, i) => {
      const pass = enc.beginComputePass({
        timestampWrites: {
          querySet,
          beginningOfPassWriteIndex: 2 * i,
          endOfPassWriteIndex: 2 * i + 1,
        },
      });
      body(pass);
      pass.end();
    });
    enc.resolveQuerySet(querySet, 0, count, resolved, 0);
    enc.copyBufferToBuffer(resolved, 0, staging, 0, count * 8);
    dev.queue.submit([enc.finish()]);
    await staging.mapAsync(GPUMapMode.READ);
    const ts = new BigUint64Array(staging.getMappedRange().slice(0));
    staging.unmap();
    for (let i = 0; i < chunk.length; i++) out.push(Number(ts[2 * i + 1] - ts[2 * i]));
    staging.destroy();
    resolved.destroy();
    querySet.destroy();
  }
  return out;
}
