/**
 * Quantized projections at load (engine/model/weights.ts calls these): `--quantize` of a float
 * model on the GPU, and a GGUF file's block-quantized tensors repacked into the GPU layout of
 * kernels/quant.ts (the same values: the matmuls dequantize them, nothing is widened to 16 bits).
 */
import { type Gpu } from "../../gpu/device.ts";
import { run } from "../../gpu/dispatch.ts";
import {
  isQuantized,
  type QuantizeMode,
  type QuantType,
  type StorageType,
} from "../../gpu/dtype.ts";
import {
  concatPacked,
  interleavePacked,
  type PackedQuant,
  packGguf,
  rowMultiple,
  slicePacked,
} from "../../kernels/quant.ts";
import { quantizeWeightDispatch } from "../../kernels/quant_weights.ts";
import { type ProductSample, productSample } from "../../kernels/quant_x.ts";
import {
  type FloatWeight,
  uploadQuantWeight,
  type WeightBuffer,
  weightBytes,
} from "../../kernels/weight.ts";
import { ggmlName } from "./gguf_format.ts";
import { readTensor, type TensorInfo } from "./safetensors.ts";

/** A projection as loaded: what the forward runs, and the monitor's means to check it. */
export interface LoadedProjection {
  /** The weight the forward pass runs by default (quantized when the model is). */
  run: WeightBuffer;
  /** Its float copy, kept for the monitor's fallback (`--quantize` with the fallback on). */
  precise?: FloatWeight;
  /** Rows of the float weight beside the quantized one: the monitor's error sample. */
  sample?: ProductSample;
}

/**
 * `w` quantized on the GPU to `mode`, with the monitor's sample of its rows; `keep` keeps `w`
 * as the fallback, otherwise it is destroyed once quantized. A weight whose rows are not a
 * multiple of 4 values stays as it is (and unmonitored).
 */
export async function quantizeLoaded(
  gpu: Gpu,
  w: FloatWeight,
  mode: Exclude<QuantizeMode, "none">,
  keep: boolean,
): Promise<LoadedProjection> {
  if (w.cols % rowMultiple(mode) !== 0) return { run: w };
  const q = quantizeWeightDispatch(gpu, w, mode);
  const s = productSample(gpu, w, q.weight);
  await run(gpu, [q.dispatch, s.dispatch]);
  if (!keep) w.buffer.destroy();
  return { run: q.weight, precise: keep ? w : undefined, sample: s.sample };
}

/** A GGUF tensor's blocks in the GPU layout of its type. */
async function packTensor(t: TensorInfo & { dtype: QuantType }): Promise<PackedQuant> {
  return packGguf(await readTensor(t), t.dtype, t.shape[0], t.shape[1]);
}

/** Whether a tensor is block-quantized. */
export function quantizedTensor(t: TensorInfo): t is TensorInfo & { dtype: QuantType } {
  return isQuantized(t.dtype);
}

/**
 * The rows of `infos` (one GGUF type each, the same columns) as one weight: one buffer pair when
 * they share a type, else one part per run of a type (`WeightBuffer.parts`), each with its bias
 * from `biases` when the projection has one.
 *
 * @throws Error when float and quantized tensors are mixed in one projection.
 */
export async function ggufMatrix(
  gpu: Gpu,
  infos: TensorInfo[],
  o: { label: string; biases?: Float32Array[]; onRead: (bytes: number) => void },
): Promise<WeightBuffer> {
  const types = infos.map((t) => t.dtype);
  if (!infos.every(quantizedTensor)) {
    throw new Error(
      `${o.label} mixes float and quantized tensors (${types.map(typeName).join(", ")}); ` +
        `strata runs a projection's rows in one kind: convert the file with one type per matrix`,
    );
  }
  const cols = infos[0].shape[1];
  // Runs of one type: q, k and v of Q4_K_M are often Q4_K, Q4_K, Q6_K.
  const runs: { type: QuantType; items: number[] }[] = [];
  infos.forEach((t, i) => {
    const last = runs.at(-1);
    if (last && last.type === t.dtype) last.items.push(i);
    else runs.push({ type: t.dtype, items: [i] });
  });
  const parts: { w: WeightBuffer; bias?: GPUBuffer }[] = [];
  for (const r of runs) {
    const packed: PackedQuant[] = [];
    for (const i of r.items) {
      packed.push(await packTensor(infos[i]));
      o.onRead(infos[i].nbytes);
    }
    const rows = r.items.map((i) => infos[i].shape[0]);
    const w = uploadQuantWeight(gpu, concatPacked(packed, r.type, rows, cols), {
      rows: rows.reduce((a, b) => a + b, 0),
      cols,
      dtype: r.type,
      label: o.label,
    });
    let bias: GPUBuffer | undefined;
    if (o.biases && runs.length > 1) {
      const v = Float32Array.from(r.items.flatMap((i) => [...o.biases![i]]));
      bias = gpu.device.createBuffer({ size: Math.max(16, v.byteLength), usage: STORAGE });
      gpu.device.queue.writeBuffer(bias, 0, v);
    }
    parts.push({ w, bias });
  }
  if (parts.length === 1) return parts[0].w;
  const rows = infos.reduce((n, t) => n + t.shape[0], 0);
  return { ...parts[0].w, rows, parts };
}

const STORAGE = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC;

/**
 * A GGUF layer's gate and up projections (one quantized type) interleaved row by row, as
 * `swiglu` matmuls read them.
 *
 * @throws Error when gate and up are of different types.
 */
export async function ggufGateUp(
  gpu: Gpu,
  gate: TensorInfo,
  up: TensorInfo,
  o: { label: string; onRead: (bytes: number) => void },
): Promise<WeightBuffer> {
  if (!quantizedTensor(gate) || !quantizedTensor(up) || gate.dtype !== up.dtype) {
    throw new Error(
      `${o.label}: gate_proj is ${typeName(gate.dtype)} but up_proj is ${typeName(up.dtype)}; ` +
        `strata runs them as one interleaved matrix, so they must be of one quantized type`,
    );
  }
  const [rows, cols] = gate.shape;
  const g = await packTensor(gate), u = await packTensor(up);
  o.onRead(gate.nbytes + up.nbytes);
  return uploadQuantWeight(gpu, interleavePacked(g, u, gate.dtype, rows, cols), {
    rows: 2 * rows,
    cols,
    dtype: gate.dtype,
    label: o.label,
  });
}

/** A quantized LM head split into row chunks that each fit one binding. */
export async function ggufLmHead(
  gpu: Gpu,
  t: TensorInfo & { dtype: QuantType },
  onRead: (bytes: number) => void,
): Promise<WeightBuffer[]> {
  const [rows, cols] = t.shape;
  const per = Math.max(
    1,
    Math.floor(gpu.maxBinding / weightBytes({ dtype: t.dtype, rows: 1, cols })),
  );
  const all = await packTensor(t);
  onRead(t.nbytes);
  const out: WeightBuffer[] = [];
  for (let r0 = 0; r0 < rows; r0 += per) {
    const n = Math.min(per, rows - r0);
    const part = slicePacked(all, t.dtype, { rows, cols, r0, n });
    out.push(uploadQuantWeight(gpu, part, { rows: n, cols, dtype: t.dtype, label: "lm_head" }));
  }
  return out;
}

/** GGUF's name of a storage type (Q4_K, F16). */
export function typeName(t: StorageType): string {
  return ggmlName(t);
}
