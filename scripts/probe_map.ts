// How Deno's mapAsync behaves: does the call block the calling thread until the GPU is idle
// (Deno polls the device with Maintain::wait inside the op), and how long until its promise
// resolves? On the H200 (Deno 2.9.6): the call blocks for the whole queued job, the promise
// resolves ~11 ms later. engine/engine.ts schedules around it, and gpu/readback.ts reads a
// primed buffer as soon as the call returns (the last lines: "early").
//   deno run -A scripts/probe_map.ts
import { getGpu } from "../gpu/device.ts";
import { helpFromComment } from "./help.ts";

helpFromComment(import.meta.url);

const gpu = await getGpu();
const d = gpu.device;
const code = `@group(0) @binding(0) var<storage, read_write> o: array<f32>;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3u) {
  var f = o[g.x];
  for (var i = 0u; i < 200000u; i++) { f = fma(f, 0.999, 0.001); }
  o[g.x] = f;
}`;
const pl = d.createComputePipeline({
  layout: "auto",
  compute: { module: d.createShaderModule({ code }), entryPoint: "main" },
});
const buf = d.createBuffer({ size: 4096, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC });
const bg = d.createBindGroup({
  layout: pl.getBindGroupLayout(0),
  entries: [{ binding: 0, resource: { buffer: buf } }],
});
function job(n: number): GPUCommandBuffer {
  const e = d.createCommandEncoder();
  const p = e.beginComputePass();
  for (let i = 0; i < n; i++) {
    p.setPipeline(pl);
    p.setBindGroup(0, bg);
    p.dispatchWorkgroups(1);
  }
  p.end();
  return e.finish();
}
function staging(): GPUBuffer {
  return d.createBuffer({ size: 16, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
}
/** Submits a job, then a copy of its first 16 bytes into `s`. */
function jobInto(s: GPUBuffer): void {
  d.queue.submit([job(4)]);
  const e = d.createCommandEncoder();
  e.copyBufferToBuffer(buf, 0, s, 0, 16);
  d.queue.submit([e.finish()]);
}
// Warm up.
d.queue.submit([job(1)]);
await d.queue.onSubmittedWorkDone();
const now = () => performance.now();
for (let rep = 0; rep < 3; rep++) {
  const s = staging();
  const t0 = now();
  jobInto(s);
  const t1 = now();
  const p = s.mapAsync(GPUMapMode.READ);
  const t2 = now();
  await p;
  const t3 = now();
  console.log(
    `one job: submit ${(t1 - t0).toFixed(2)} ms; mapAsync() returned after ${
      (t2 - t1).toFixed(2)
    } ms; promise after ${(t3 - t1).toFixed(2)} ms`,
  );
  s.unmap();
  s.destroy();
}
// Two jobs: map the first's staging, then submit a second job: does the second wait?
for (let rep = 0; rep < 3; rep++) {
  const s1 = staging(), s2 = staging();
  const t0 = now();
  jobInto(s1);
  const p1 = s1.mapAsync(GPUMapMode.READ);
  const t1 = now();
  jobInto(s2);
  const t2 = now();
  await p1;
  const t3 = now();
  const p2 = s2.mapAsync(GPUMapMode.READ);
  const t4 = now();
  await p2;
  const t5 = now();
  console.log(
    `two jobs: map1() ${(t1 - t0).toFixed(2)}; submit2 at ${(t2 - t0).toFixed(2)}; p1 at ${
      (t3 - t0).toFixed(2)
    }; map2() returned at ${(t4 - t0).toFixed(2)}; p2 at ${(t5 - t0).toFixed(2)} ms`,
  );
  for (const s of [s1, s2]) {
    s.unmap();
    s.destroy();
  }
}
// onSubmittedWorkDone alone.
{
  const t0 = now();
  d.queue.submit([job(4)]);
  await d.queue.onSubmittedWorkDone();
  console.log(`onSubmittedWorkDone after ${(now() - t0).toFixed(2)} ms`);
}
// A primed buffer (one mapping of it resolved) read as soon as mapAsync returns.
{
  const s = staging();
  await s.mapAsync(GPUMapMode.READ);
  s.unmap();
  for (let rep = 0; rep < 3; rep++) {
    const t0 = now();
    jobInto(s);
    const p = s.mapAsync(GPUMapMode.READ);
    const t1 = now();
    const v = new Float32Array(s.getMappedRange(0, 16).slice(0));
    s.unmap();
    const t2 = now();
    await p;
    console.log(
      `early: mapAsync() returned after ${(t1 - t0).toFixed(2)} ms; data (${
        v[0].toFixed(3)
      }) read at ${(t2 - t0).toFixed(2)} ms; the promise resolved at ${(now() - t0).toFixed(2)} ms`,
    );
  }
}
