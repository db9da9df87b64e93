// Does reading the next matrix into L2 from extra workgroups of the dispatch before it hide that
// matrix's DRAM time? (A dispatch of its own does not: dispatches in one pass do not overlap;
// BENCHMARKS.md.) Per layer, A = a matvec of W1[l] (R1 x 2048 f16), optionally with extra
// workgroups that read the first MB of W2[l], then B = a matvec of W2[l] (11264 x 2048 f16,
// gate/up's size), each reading the other's output, so every dispatch waits for the one before.
// GPU µs per layer, 22 layers per timed pass (timed as in scripts/sweep_kernels.ts); also B on
// one W2 for every layer (L2-resident: what a perfect prefetch could reach).
//   deno run -A scripts/probe_prefetch.ts        (SMALL=1: tiny sizes, to try it on a CPU)
import { createStorage, getGpu } from "../gpu/device.ts";
import { bindGroup, type Dispatch } from "../gpu/dispatch.ts";
import { random, timeCalls } from "./sweep_kernels.ts";
import { helpFromComment } from "./help.ts";

helpFromComment(import.meta.url);

const gpu = await getGpu();
const small = Deno.env.get("SMALL") === "1";
const L = small ? 2 : 22, K = 2048, R2 = small ? 512 : 11264;
console.log(`adapter: ${gpu.adapterName}`);
const code = `
override R: u32 = 2048u;
override KV: u32 = 256u;
override MAIN: u32 = 256u;
@group(0) @binding(0) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read> pf: array<vec4<u32>>;
var<workgroup> part: array<f32, 256>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3u, @builtin(local_invocation_index) l: u32,
  @builtin(num_workgroups) nw: vec3u) {
  if (wid.x >= MAIN) {
    let n = (nw.x - MAIN) * 256u;
    let total = arrayLength(&pf);
    var a0 = vec4<u32>(0u); var a1 = vec4<u32>(0u); var a2 = vec4<u32>(0u); var a3 = vec4<u32>(0u);
    var i = (wid.x - MAIN) * 256u + l;
    loop { if (i + 3u * n >= total) { break; } a0 ^= pf[i]; a1 ^= pf[i + n]; a2 ^= pf[i + 2u * n]; a3 ^= pf[i + 3u * n]; i += 4u * n; }
    loop { if (i >= total) { break; } a0 ^= pf[i]; i += n; }
    let s = a0 ^ a1 ^ a2 ^ a3;
    if (s.x == 0x9e3779b9u && s.y == 0x7f4a7c15u && s.z == 0x85ebca6bu) { y[0] = 0.0; }
    return;
  }
  let r = l / 32u;
  let lane = l % 32u;
  let row = wid.x * 8u + r;
  var acc = 0.0;
  if (row < R) {
    for (var u = lane; u < KV; u += 32u) {
      let a = w[row * KV + u];
      acc += dot(vec4<f32>(unpack2x16float(a.x), unpack2x16float(a.y)), x[2u * u]) +
        dot(vec4<f32>(unpack2x16float(a.z), unpack2x16float(a.w)), x[2u * u + 1u]);
    }
  }
  part[l] = acc;
  workgroupBarrier();
  for (var s = 16u; s > 0u; s >>= 1u) { if (lane < s) { part[l] += part[l + s]; } workgroupBarrier(); }
  if (lane == 0u && row < R) { y[row] = part[l]; }
}`;
const d = gpu.device;
const module = d.createShaderModule({ code });
const pipes = new Map<string, GPUComputePipeline>();
const pipe = (R: number, main: number) => {
  const key = `${R}/${main}`;
  let p = pipes.get(key);
  if (!p) {
    p = d.createComputePipeline({
      layout: "auto",
      compute: { module, entryPoint: "main", constants: { R, KV: K / 8, MAIN: main } },
    });
    pipes.set(key, p);
  }
  return p;
};
const W2 = Array.from({ length: L }, (_, l) => random(gpu, (R2 * K) / 2, 100 + l));
const W1s = new Map<number, GPUBuffer[]>();
const W1 = (R1: number) => {
  let b = W1s.get(R1);
  if (!b) {
    W1s.set(
      R1,
      b = Array.from({ length: L }, (_, l) => random(gpu, (R1 * K) / 2, 1000 * R1 + l)),
    );
  }
  return b;
};
const yA = createStorage(gpu, Math.max(R2, K) * 4, undefined, "yA");
const yB = createStorage(gpu, Math.max(R2, K) * 4, undefined, "yB");
const dummy = createStorage(gpu, 256, undefined, "dummy");
const mv = (
  R: number,
  w: GPUBuffer,
  x: GPUBuffer,
  y: GPUBuffer,
  pf?: GPUBuffer,
  pfBytes = 0,
  pfWgs = 0,
): Dispatch => {
  const main = Math.ceil(R / 8);
  const p = pipe(R, main);
  return {
    label: "mv",
    pipeline: p,
    bindGroup: bindGroup(gpu, p, [
      w,
      { buffer: x, offset: 0, size: K * 4 },
      y,
      pf ? { buffer: pf, offset: 0, size: pfBytes } : dummy,
    ]),
    workgroups: [main + (pf ? pfWgs : 0), 1, 1],
  };
};
async function run(
  name: string,
  R1: number,
  pfMB: number,
  pfWgs: number,
  only?: "A" | "B",
  same = false,
) {
  const calls: Dispatch[] = [];
  const bytes = Math.min(R2 * K * 2, Math.floor((pfMB * 2 ** 20) / 16) * 16);
  for (let l = 0; l < L; l++) {
    if (only !== "B") calls.push(mv(R1, W1(R1)[l], yB, yA, pfMB ? W2[l] : undefined, bytes, pfWgs));
    if (only !== "A") calls.push(mv(R2, W2[same ? 0 : l], yA, yB));
  }
  const us = await timeCalls(gpu, calls, 7, L);
  console.log(`${name.padEnd(44)} ${us.toFixed(2).padStart(8)} µs/layer`);
}
for (const R1 of small ? [256] : [2048, 512]) {
  console.log(
    `-- A: ${R1}x${K} (${(R1 * K * 2 / 1e6).toFixed(1)} MB), B: ${R2}x${K} (${
      (R2 * K * 2 / 1e6).toFixed(1)
    } MB)`,
  );
  await run("A alone", R1, 0, 0, "A");
  await run("B alone", R1, 0, 0, "B");
  await run("A then B", R1, 0, 0);
  if (R1 === 2048 || small) await run("B alone, one W2 for all layers (L2)", R1, 0, 0, "B", true);
  for (const [mb, wgs] of [[8, 264], [16, 264], [24, 264], [46, 264], [16, 132], [16, 528]]) {
    await run(`A + prefetch ${mb} MB of B (${wgs} wgs), then B`, R1, small ? mb / 16 : mb, wgs);
  }
}
