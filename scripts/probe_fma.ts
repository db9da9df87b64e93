/**
 * Peak multiply-add rate reachable from WGSL: f32 (vec4<f32>) and, when the device has
 * shader-f16, f16 (vec4<f16>); 8 accumulators per thread whose chains feed each other (so the
 * compiler cannot fold them), 512 multiply-adds per loop trip. On the H200 (2026-11-30): f32
 * 58.4 TFLOP/s, f16 116.1 — the ceiling the matmul kernels' TFLOP/s compare against.
 *
 *   deno run -A scripts/probe_fma.ts        (TRIPS=n: loop trips per thread, default 512)
 */
import { createStorage, getGpu } from "../gpu/device.ts";
import { timePasses } from "../gpu/timing.ts";
import { helpFromComment } from "./help.ts";

helpFromComment(import.meta.url);

const gpu = await getGpu();
const body = (t: string, e: string) => `
@group(0) @binding(0) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(1) var<uniform> u: vec4<u32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let s = ${t}(${e}(0.5 + f32(gid.x) * 1e-9));
  let a = ${t}(${e}(u.y) * 1e-3);
  let b = ${t}(0.001);
  var c0 = s; var c1 = s + b; var c2 = s + 2.0 * b; var c3 = s + 3.0 * b;
  var c4 = s + 4.0 * b; var c5 = s + 5.0 * b; var c6 = s + 6.0 * b; var c7 = s + 7.0 * b;
  for (var i = 0u; i < u.x; i++) {
${
  Array.from({ length: 16 }, () =>
    "    c0 = c0 * c1 + b; c1 = c1 * c2 + b; c2 = c2 * c3 + b; c3 = c3 * c4 + b;\n    c4 = c4 * c5 + b; c5 = c5 * c6 + b; c6 = c6 * c7 + b; c7 = c7 * c0 + a;")
    .join("\n")
}
  }
  let r = c0 + c1 + c2 + c3 + c4 + c5 + c6 + c7;
  if (r.x == 12345.0) { out[gid.x] = vec4<f32>(r); }
}`;
const trips = Number(Deno.env.get("TRIPS") ?? 512), groups = 132 * 64;
const outBuf = createStorage(gpu, groups * 256 * 16, undefined, "out");
const u = gpu.device.createBuffer({
  size: 16,
  usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
});
gpu.device.queue.writeBuffer(u, 0, new Uint32Array([trips, 1, 0, 0]));
const kinds: [string, string, string][] = [["f32", "vec4<f32>", "f32"]];
if (gpu.hasF16) kinds.push(["f16", "vec4<f16>", "f16"]);
for (const [name, t, e] of kinds) {
  const code = (name === "f16" ? "enable f16;\n" : "") + body(t, e);
  const module = gpu.device.createShaderModule({ code });
  const pipe = gpu.device.createComputePipeline({
    layout: "auto",
    compute: { module, entryPoint: "main" },
  });
  const bg = gpu.device.createBindGroup({
    layout: pipe.getBindGroupLayout(0),
    entries: [{ binding: 0, resource: { buffer: outBuf } }, {
      binding: 1,
      resource: { buffer: u },
    }],
  });
  const pass = (p: GPUComputePassEncoder) => {
    p.setPipeline(pipe);
    p.setBindGroup(0, bg);
    p.dispatchWorkgroups(groups);
  };
  const ns = await timePasses(gpu, new Array(20).fill(pass));
  const best = Math.min(...ns.slice(5));
  const fma = groups * 256 * trips * 16 * 8 * 4;
  console.log(
    `${name}: ${(best / 1e3).toFixed(1)} µs, ${(2 * fma / best / 1e3).toFixed(1)} TFLOP/s`,
  );
}
