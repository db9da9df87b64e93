/**
 * The `naive` matmul (kernels/matmul_naive.wgsl): the plain statement of the contract, one
 * invocation per output and a serial loop over K, any weight format (quantized codes decoded one
 * at a time). It serves few-row products whose K the vectorised kernels cannot take (not a
 * multiple of their 16-byte units), and checks them.
 */
import type { Gpu } from "../gpu/device.ts";
import { type Dispatch, grid } from "../gpu/dispatch.ts";
import { at, dummy, type MatmulLaunch, matmulPipeline, matmulUniform } from "./matmul_common.ts";

/** Outputs per workgroup (the WGSL's `WG`): they share one row of x and reduce its Σx² once. */
const NAIVE_GROUP = 64;

/** The `naive` dispatch of `launch`. */
export function naiveDispatch(gpu: Gpu, launch: MatmulLaunch): Dispatch {
  const { label, x, w, y, bias, nw, m, n } = launch;
  const groups = grid(m * Math.ceil(n / NAIVE_GROUP));
  const pipe = matmulPipeline(gpu, "matmul_naive.wgsl", launch);
  const u = matmulUniform(gpu, launch, { groupsX: groups[0] });
  return {
    label,
    pipeline: pipe,
    bindGroup: gpu.device.createBindGroup({
      layout: pipe.getBindGroupLayout(0),
      entries: [u, x, w.buffer, bias, nw, y].map((b, i) => at(i, b))
        .concat([at(7, w.scales ?? dummy(gpu))]),
    }),
    workgroups: groups,
  };
}
