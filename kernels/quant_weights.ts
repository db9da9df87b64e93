/**
 * `--quantize` on the GPU (kernels/quant_weights.wgsl): a float weight already uploaded becomes
 * int8 or e4m3 codes with one f32 scale per row, in the layout of kernels/quant.ts, without the
 * weight ever leaving the GPU (the bench's random shapes exist only there; a 7B model quantizes
 * in well under a second).
 */
import { createStorage, type Gpu, isCpuAdapter } from "../gpu/device.ts";
import { isFloatFormat, WDTYPE } from "../gpu/dtype.ts";
import { bindGroup, type Dispatch, grid, params, uniform } from "../gpu/dispatch.ts";
import { pipeline } from "./pipeline.ts";
import { checkQuantShape, codeWords } from "./quant.ts";
import type { WeightBuffer } from "./weight.ts";

/**
 * The dispatch that quantizes `w` (f32, f16 or bf16) into the new weight it returns (codes and
 * scales allocated here; run the dispatch before using it).
 *
 * @throws Error when `w` is already quantized or its rows are not a multiple of 4 values.
 * @example
 * const { weight, dispatch } = quantizeWeightDispatch(gpu, w, "int8");
 * await run(gpu, [dispatch]);
 */
export function quantizeWeightDispatch(
  gpu: Gpu,
  w: WeightBuffer,
  format: "int8" | "e4m3",
): { weight: WeightBuffer; dispatch: Dispatch } {
  if (!isFloatFormat(w.dtype)) {
    throw new Error(`internal error: quantize ${w.rows}x${w.cols}: W is already ${w.dtype}`);
  }
  checkQuantShape(format, w.rows, w.cols);
  const label = w.buffer.label || `weight ${w.rows}x${w.cols}`;
  const buffer = createStorage(gpu, codeWords(format, w.rows, w.cols) * 4, undefined, label);
  const scales = createStorage(gpu, w.rows * 4, undefined, `${label} scales`);
  const WG = isCpuAdapter(gpu) ? 64 : 256;
  const groups = grid(w.rows);
  const pipe = pipeline(gpu, "quant_weights.wgsl", {
    constants: { WG, WDTYPE: WDTYPE[w.dtype], FMT: format === "int8" ? 0 : 1 },
  });
  const u = uniform(gpu, params([w.rows, w.cols, groups[0], 0]));
  return {
    weight: { buffer, dtype: format, rows: w.rows, cols: w.cols, scales },
    dispatch: {
      label: `quantize ${w.rows}x${w.cols} ${w.dtype} -> ${format}`,
      pipeline: pipe,
      bindGroup: bindGroup(gpu, pipe, [u, w.buffer, buffer, scales]),
      workgroups: groups,
    },
  };
}
