/**
 * ReadbackPool: reads return exactly what the GPU wrote, early once a buffer is primed, through
 * the mapping promise otherwise, and buffers are reused only after their mapping settled.
 */
import assert from "node:assert/strict";
import { ReadbackPool } from "../gpu/readback.ts";
import { createStorage, type Gpu } from "../gpu/device.ts";
import { rng, testGpu } from "./util.ts";

/** Copies `data` through a storage buffer into `dst` (taken from a pool) and submits it. */
function submitCopy(gpu: Gpu, data: Uint32Array, dst: GPUBuffer): void {
  const src = createStorage(gpu, data.byteLength, data);
  const enc = gpu.device.createCommandEncoder();
  enc.copyBufferToBuffer(src, 0, dst, 0, data.byteLength);
  gpu.device.queue.submit([enc.finish()]);
}

function randomWords(n: number, seed: number): Uint32Array {
  const r = rng(seed);
  return Uint32Array.from({ length: n }, () => Math.floor(r.next() * 2 ** 32));
}

Deno.test("readback: primed buffers are read as soon as mapAsync returns, with the right bytes", async () => {
  const gpu = await testGpu();
  const pool = new ReadbackPool(gpu.device, 4 * 1000, 0);
  // First use of each buffer: no mapping of it has resolved yet, so the read awaits the promise.
  const first = [pool.take(), pool.take()];
  const a = randomWords(1000, 1), b = randomWords(77, 2);
  submitCopy(gpu, a, first[0]);
  submitCopy(gpu, b, first[1]);
  const got = await Promise.all([pool.read(first[0], a.byteLength), pool.read(first[1], 77 * 4)]);
  assert.deepEqual(new Uint32Array(got[0]), a);
  assert.deepEqual(new Uint32Array(got[1]), b);
  assert.deepEqual(pool.stats, { early: 0, awaited: 2 });
  // Now primed: every read of 5 rounds lands early (wgpu has mapped the buffer when the call
  // returns on Deno 2.9.6), and each returns its own data, sized as asked.
  for (let round = 0; round < 5; round++) {
    const sizes = [1000, 1, 333];
    const bufs = sizes.map(() => pool.take());
    const datas = sizes.map((n, i) => randomWords(n, 10 * round + i));
    datas.forEach((d, i) => submitCopy(gpu, d, bufs[i]));
    const reads = bufs.map((buf, i) => pool.read(buf, datas[i].byteLength));
    const out = await Promise.all(reads);
    out.forEach((o, i) => assert.deepEqual(new Uint32Array(o), datas[i], `round ${round} #${i}`));
    await pool.idle(); // early reads lend their buffer until the mapping promise settles
  }
  assert.equal(pool.stats.awaited, 2 + 1, "one new buffer in round 0 (two were primed)");
  assert.equal(pool.stats.early, 14);
  pool.destroy();
});

Deno.test("readback: a buffer not mapped yet is read through the promise, not early", async () => {
  const gpu = await testGpu();
  const pool = new ReadbackPool(gpu.device, 64, 0);
  const real = pool.take();
  pool.give(real);
  // A pooled buffer seen through a runtime whose mapAsync requests the mapping later (as a
  // spec-following one may): getMappedRange right after the call finds it unmapped.
  const late = new Proxy(real, {
    get(t, k) {
      if (k === "mapAsync") {
        return (mode: number, off?: number, size?: number) =>
          new Promise((r) => setTimeout(r, 5)).then(() => t.mapAsync(mode, off, size));
      }
      const v = Reflect.get(t, k, t);
      return typeof v === "function" ? v.bind(t) : v;
    },
  });
  for (let i = 0; i < 3; i++) {
    const data = randomWords(16, 3 + i);
    submitCopy(gpu, data, real);
    assert.deepEqual(new Uint32Array(await pool.read(late, 64)), data);
  }
  // The first read primed it; the next two tried early, found it unmapped and waited.
  assert.deepEqual(pool.stats, { early: 0, awaited: 3 });
  // Reads larger than the pool's buffers are a caller's bug.
  assert.throws(() => pool.read(pool.take(), 68), /internal error: read of 68 > 64 bytes/);
  pool.destroy();
});
