// GPU time per dispatch of tiny kernels, 22 dependent dispatches per timed pass (timed as in
// scripts/sweep_kernels.ts, after ≈ 30 ms of warm-up): launch and drain, workgroup memory,
// barriers, chains of dependent loads, and what a loop trip costs next to the same work in
// straight-line code (on the H200 a trip costs ~30 ns: naga bounds every
// loop, and the decode attention kernel lost half its time to loops of 8-64 trips).
//   deno run -A scripts/probe_dispatch.ts
import { createStorage, getGpu, type Gpu } from "../gpu/device.ts";
import type { Dispatch } from "../gpu/dispatch.ts";
import { timeCalls } from "./sweep_kernels.ts";
import { helpFromComment } from "./help.ts";

helpFromComment(import.meta.url);

async function time(gpu: Gpu, name: string, code: string, wgs: number): Promise<void> {
  const d = gpu.device;
  const pl = d.createComputePipeline({
    layout: "auto",
    compute: { module: d.createShaderModule({ code }), entryPoint: "main" },
  });
  const a = createStorage(gpu, 1 << 20, new Uint32Array(1 << 18), "a");
  const o = createStorage(gpu, 1 << 20, undefined, "o");
  const bg = d.createBindGroup({
    layout: pl.getBindGroupLayout(0),
    entries: [{ binding: 0, resource: { buffer: a } }, { binding: 1, resource: { buffer: o } }],
  });
  const call: Dispatch = { label: name, pipeline: pl, bindGroup: bg, workgroups: [wgs, 1, 1] };
  const us = await timeCalls(gpu, new Array(22).fill(call), 7);
  console.log(`${name.padEnd(48)} ${us.toFixed(2).padStart(7)} µs/dispatch`);
}

const head = `@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read_write> o: array<u32>;
`;
const gpu = await getGpu();
console.log(`adapter: ${gpu.adapterName}`);
const tiny = (extra: string, body: string) =>
  `${head}${extra}
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) w: vec3u, @builtin(local_invocation_index) l: u32) {
  var v = a[l];
${body}
  o[w.x * 256u + l] = o[w.x * 256u + l] + v;
}`;
const unrolled = (n: number) =>
  Array.from({ length: n }, () => "  f = fma(f, 0.999, 0.001);").join("\n");
const probes: [string, string, string][] = [
  [
    "loop 512 x 1 fma",
    "",
    `var f = f32(l);
  for (var i = 0u; i < 512u; i++) { f = fma(f, 0.999, 0.001); }
  v += u32(f);`,
  ],
  [
    "straight 512 fma",
    "",
    `var f = f32(l);
${unrolled(512)}
  v += u32(f);`,
  ],
  [
    "loop 64 x 8 fma",
    "",
    `var f = f32(l);
  for (var i = 0u; i < 64u; i++) {
${unrolled(8)}
  }
  v += u32(f);`,
  ],
  [
    "loop 512 x 1 fma, bound from buffer",
    "",
    `var f = f32(l);
  let n = a[1000] + 512u;
  for (var i = 0u; i < n; i++) { f = fma(f, 0.999, 0.001); }
  v += u32(f);`,
  ],
  [
    "loop 64 shared loads",
    "var<workgroup> sm: array<f32, 256>;",
    `sm[l] = f32(l); workgroupBarrier();
  var f = 0.0;
  for (var i = 0u; i < 64u; i++) { f += sm[i]; }
  v += u32(f);`,
  ],
  [
    "straight 64 shared loads",
    "var<workgroup> sm: array<f32, 256>;",
    `sm[l] = f32(l); workgroupBarrier();
  var f = 0.0;
${Array.from({ length: 64 }, (_, i) => `  f += sm[${i}u];`).join("\n")}
  v += u32(f);`,
  ],
];
for (const [name, extra, body] of probes) await time(gpu, name, tiny(extra, body), 40);
