/**
 * kernels/fingerprint.wgsl against its float64 reference: every bit whose projection is not
 * within rounding of zero equals the reference's, at awkward widths and scales, for plain,
 * verification (R rows per sequence) and prefill (the row last_row names) layouts; the same rows
 * give the same fingerprints in any batch; different rows differ in about half the bits.
 */
import assert from "node:assert/strict";
import { createStorage, readU32 } from "../gpu/device.ts";
import { run } from "../gpu/dispatch.ts";
import {
  fingerprintDispatch,
  fingerprintDistance,
  fingerprintRef,
  projectionsRef,
} from "../kernels/fingerprint.ts";
import { NO_CHECK } from "../kernels/cross_check.ts";
import { rng, testGpu } from "./util.ts";

/** Bits where the reference is decided: the projection is well away from zero. */
function decided(row: Float32Array): number {
  const p = projectionsRef(row);
  const norm = Math.sqrt(row.reduce((a, v) => a + v * v, 0));
  let mask = 0;
  p.forEach((v, j) => {
    if (Math.abs(v) > 1e-4 * norm) mask |= 1 << j;
  });
  return mask >>> 0;
}

for (const hidden of [1, 37, 300, 2048]) {
  Deno.test(`fingerprint: the reference's bits, hidden ${hidden}, plain / verification / prefill`, async () => {
    const gpu = await testGpu();
    const r = rng(hidden);
    const rows = 12, R = 3, stride = R + 1, ringOffset = 5;
    const x = new Float32Array(rows * hidden);
    for (let i = 0; i < rows; i++) {
      const scale = [1e-3, 1, 40][i % 3];
      for (let k = 0; k < hidden; k++) x[i * hidden + k] = (r.next() * 2 - 1) * scale;
    }
    const ringLen = ringOffset + (rows / R + 2) * stride + 8;
    const bufs = {
      x: createStorage(gpu, x.byteLength, x),
      fpRing: createStorage(gpu, ringLen * 4),
      lastRow: createStorage(gpu, 4, Uint32Array.of(7)),
    };
    await run(gpu, [
      fingerprintDispatch(gpu, bufs, {
        rows,
        hidden,
        ringOffset,
        ringStride: stride,
        rowsPerSeq: R,
      }),
    ]);
    const got = await readU32(gpu, bufs.fpRing, ringLen);
    const row = (i: number) => x.subarray(i * hidden, (i + 1) * hidden);
    for (let i = 0; i < rows; i++) {
      const e = ringOffset + ((i / R) | 0) * stride + (i % R);
      const m = decided(row(i));
      assert.equal((got[e] & m) >>> 0, (fingerprintRef(row(i)) & m) >>> 0, `row ${i}`);
    }
    // the entry after each sequence's R rows (its cross-check's) is marked unchecked
    for (let s = 0; s < rows / R; s++) {
      assert.equal(got[ringOffset + s * stride + R], NO_CHECK);
    }
    // prefill: row 7 into slot 2's entry of a plain ring (stride 1)
    const pre = { ...bufs, fpRing: createStorage(gpu, 64) };
    await run(gpu, [
      fingerprintDispatch(gpu, pre, {
        rows,
        hidden,
        ringOffset: 3,
        ringStride: 1,
        prefill: { slot: 2 },
      }),
    ]);
    const one = await readU32(gpu, pre.fpRing, 16);
    const m = decided(row(7));
    assert.equal((one[5] & m) >>> 0, (fingerprintRef(row(7)) & m) >>> 0);
    assert.equal(one.filter((v) => v !== 0).length <= 1, true, "only the slot's entry written");
  });
}

Deno.test("fingerprint: bit-for-bit the same in any batch; unrelated rows differ in about half", async () => {
  const gpu = await testGpu();
  const r = rng(5), hidden = 384;
  const rows = Array.from(
    { length: 9 },
    () => Float32Array.from({ length: hidden }, () => r.next() - 0.5),
  );
  const fps = async (order: number[]) => {
    const x = new Float32Array(order.length * hidden);
    order.forEach((k, i) => x.set(rows[k], i * hidden));
    const bufs = {
      x: createStorage(gpu, x.byteLength, x),
      fpRing: createStorage(gpu, order.length * 4),
      lastRow: createStorage(gpu, 4),
    };
    await run(gpu, [fingerprintDispatch(gpu, bufs, {
      rows: order.length,
      hidden,
      ringOffset: 0,
      ringStride: 1,
    })]);
    const got = await readU32(gpu, bufs.fpRing, order.length);
    return new Map(order.map((k, i) => [k, got[i]]));
  };
  const a = await fps([0, 1, 2, 3, 4, 5, 6, 7, 8]);
  const b = await fps([8, 3, 5, 0]);
  for (const k of [8, 3, 5, 0]) assert.equal(b.get(k), a.get(k));
  let total = 0, pairs = 0;
  for (let i = 0; i < 9; i++) {
    for (let j = i + 1; j < 9; j++) {
      total += fingerprintDistance(a.get(i)!, a.get(j)!);
      pairs++;
    }
  }
  const mean = total / pairs;
  assert.ok(mean > 10 && mean < 22, `mean distance ${mean}`);
});
