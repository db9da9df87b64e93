/**
 * Helpers of the attention kernel tests (tests/kernels_attention_test.ts,
 * tests/kernels_mask_test.ts): a paged cache on the GPU and back, pool comparisons, RoPE tables.
 */
import assert from "node:assert/strict";
import type { KvDtype } from "../gpu/dtype.ts";
import { createStorage, type Gpu, readBuffer, readF32 } from "../gpu/device.ts";
import type { PagedCacheRef } from "../kernels/reference.ts";
import { ropeInvFreq } from "../engine/model/config.ts";
import { assertClose } from "./util.ts";

/** Llama-style inverse frequencies, as f32. */
export function invFreqs(headDim: number, base = 10000): Float32Array {
  return Float32Array.from({ length: headDim / 2 }, (_, i) => base ** (-(2 * i) / headDim));
}

/** The cache's pools (as its dtype) and table on the GPU. */
export function uploadCache(gpu: Gpu, c: PagedCacheRef) {
  const pool = (x: Float32Array) => {
    const data = c.kvDtype === "f16" ? Float16Array.from(x) : x;
    return createStorage(gpu, data.byteLength, data);
  };
  return {
    kPool: pool(c.kPool),
    vPool: pool(c.vPool),
    blockTable: createStorage(gpu, c.blockTable.byteLength, c.blockTable),
  };
}

/** Reads `count` values of a pool of `dtype` back, widened to f32. */
export async function readPool(gpu: Gpu, pool: GPUBuffer, count: number, dtype: KvDtype) {
  if (dtype === "f32") return await readF32(gpu, pool, count);
  return Float32Array.from(new Float16Array(await readBuffer(gpu, pool, count * 2)));
}

export const f32 = (gpu: Gpu, a: ArrayLike<number>) => {
  const x = Float32Array.from(a);
  return createStorage(gpu, x.byteLength, x);
};
export const u32 = (gpu: Gpu, a: ArrayLike<number>) => {
  const x = Uint32Array.from(a);
  return createStorage(gpu, x.byteLength, x);
};

/** Pools compare: NaN (never written) must stay NaN, everything else within tolerance. */
export function assertPool(label: string, got: Float32Array, want: Float32Array) {
  const g: number[] = [], w: number[] = [];
  let nanBad = 0;
  for (let i = 0; i < want.length; i++) {
    if (Number.isNaN(want[i])) {
      if (!Number.isNaN(got[i])) nanBad++;
    } else {
      g.push(got[i]);
      w.push(want[i]);
    }
  }
  assertClose(label, g, w);
  assert.equal(nanBad, 0, `${label}: ${nanBad} elements written that should be untouched`);
}

/** Llama 3.1's inverse frequencies (rope scaling applied), as f32. */
export function llama3InvFreqs(headDim: number): Float32Array {
  return Float32Array.from(ropeInvFreq({
    headDim,
    ropeTheta: 500000,
    ropeScaling: {
      type: "llama3",
      factor: 8,
      lowFreqFactor: 1,
      highFreqFactor: 4,
      originalMaxPositions: 8192,
    },
  }));
}

/**
 * Several finished slots all write the trash row, in no fixed order: where the reference pool
 * holds one of them, take whichever candidate the GPU's element is closest to.
 */
export function acceptAnyTrashWriter(
  want: Float32Array,
  got: Float32Array,
  rows: number[],
  candidates: Float64Array[],
  D: number,
) {
  rows.forEach((o, h) => {
    for (let d = 0; d < D; d++) {
      let best = want[o + d];
      for (const c of candidates) {
        const x = c[h * D + d];
        if (Math.abs(got[o + d] - x) < Math.abs(got[o + d] - best)) best = x;
      }
      want[o + d] = best;
    }
  });
}
