/**
 * kernels/cross_check.wgsl against its float64 reference: `check_keep` copies the plain path's
 * rows, `check_compare` writes ‖verify − plain‖ / mean ‖h‖ of each running slot's row 0 (row
 * s · R) into the fingerprint ring's entry R, NO_CHECK for a done slot, and touches no other
 * entry; at awkward widths, rows per slot and scales; rows equal but for rounding give ~1e-7,
 * a perturbed one the perturbation's share. The fingerprints of a verification pass mark entry R
 * unchecked (kernels/fingerprint.wgsl), so a step without a check never reads a stale one.
 */
import assert from "node:assert/strict";
import { createStorage, readU32 } from "../gpu/device.ts";
import { run } from "../gpu/dispatch.ts";
import { checkValue, crossCheckDispatch, crossCheckRef, NO_CHECK } from "../kernels/cross_check.ts";
import { fingerprintDispatch } from "../kernels/fingerprint.ts";
import { SLOT_STATE_BYTES } from "../kernels/step.ts";
import { rng, testGpu } from "./util.ts";

for (const [hidden, R] of [[1, 2], [37, 3], [384, 5], [2048, 16]]) {
  Deno.test(`cross-check: the reference's distance, hidden ${hidden}, R ${R}`, async () => {
    const gpu = await testGpu();
    const r = rng(hidden + R);
    const slots = 7, stride = R + 3, ringOffset = 11;
    // The plain path's rows [slots, hidden], then the verification pass's [slots · R, hidden]:
    // row 0 of each slot is the plain row, perturbed by a slot-dependent share.
    const plain = new Float32Array(slots * hidden), verify = new Float32Array(slots * R * hidden);
    const shares = [0, 1e-6, 1e-3, 0.01, 0.05, 0.5, 3];
    for (let s = 0; s < slots; s++) {
      const scale = [1e-3, 1, 50][s % 3];
      for (let i = 0; i < hidden; i++) {
        const v = (r.next() * 2 - 1) * scale;
        plain[s * hidden + i] = v;
        verify[s * R * hidden + i] = v + shares[s] * scale * (r.next() * 2 - 1);
      }
      for (let j = 1; j < R; j++) {
        for (let i = 0; i < hidden; i++) verify[(s * R + j) * hidden + i] = r.next() * 9;
      }
    }
    const done = 4; // a done slot gets no check
    const state = new Uint32Array(slots * 4);
    state[done * 4] = 1;
    const ringLen = ringOffset + slots * stride + 4;
    const bufs = {
      x: createStorage(gpu, plain.byteLength, plain),
      plain: createStorage(gpu, plain.byteLength),
      slotState: createStorage(gpu, slots * SLOT_STATE_BYTES, state),
      fpRing: createStorage(gpu, ringLen * 4, new Uint32Array(ringLen).fill(7)),
    };
    const o = { slots, hidden, ringOffset, ringStride: stride };
    await run(gpu, [crossCheckDispatch(gpu, bufs, { ...o, entry: "check_keep", rowsPerSeq: 1 })]);
    const rows = { ...bufs, x: createStorage(gpu, verify.byteLength, verify) };
    await run(gpu, [
      crossCheckDispatch(gpu, rows, { ...o, entry: "check_compare", rowsPerSeq: R }),
    ]);
    const ring = await readU32(gpu, bufs.fpRing, ringLen);
    for (let s = 0; s < slots; s++) {
      const at = ringOffset + s * stride + R;
      if (s === done) {
        assert.equal(ring[at], NO_CHECK, `slot ${s}: done`);
        assert.equal(checkValue(ring[at]), undefined);
        continue;
      }
      const want = crossCheckRef(
        verify.subarray(s * R * hidden, (s * R + 1) * hidden),
        plain.subarray(s * hidden, (s + 1) * hidden),
      );
      const got = checkValue(ring[at])!;
      console.log(`hidden ${hidden} R ${R} slot ${s}: got ${got.toExponential(3)} want ${want}`);
      assert.ok(Math.abs(got - want) <= 1e-6 + 1e-4 * want, `slot ${s}: ${got} vs ${want}`);
    }
    ring.forEach((v, i) => {
      const entry = (i - ringOffset) % stride, s = Math.floor((i - ringOffset) / stride);
      if (i >= ringOffset && s < slots && entry === R) return;
      assert.equal(v, 7, `entry ${i} written`);
    });
  });
}

Deno.test("cross-check: a verification pass's fingerprints mark every entry R unchecked", async () => {
  const gpu = await testGpu();
  const R = 4, seqs = 3, stride = R + 2, hidden = 40;
  const x = Float32Array.from({ length: seqs * R * hidden }, (_, i) => Math.sin(i));
  const fpRing = createStorage(gpu, seqs * stride * 4, new Uint32Array(seqs * stride).fill(5));
  await run(gpu, [fingerprintDispatch(gpu, {
    x: createStorage(gpu, x.byteLength, x),
    fpRing,
    lastRow: createStorage(gpu, 4),
  }, { rows: seqs * R, hidden, ringOffset: 0, ringStride: stride, rowsPerSeq: R })]);
  const ring = await readU32(gpu, fpRing, seqs * stride);
  for (let s = 0; s < seqs; s++) {
    assert.equal(ring[s * stride + R], NO_CHECK, `seq ${s}`);
    assert.equal(ring[s * stride + R + 1], 5, `seq ${s}: past entry R`);
  }
});
