/** engine/sessions/block_pack.ts: byte planes round-trip for f32 and f16 blocks; damage is refused. */
import assert from "node:assert/strict";
import { deflateSync } from "fflate";
import { packBlock, unpackBlock } from "../engine/sessions/block_pack.ts";
import { rng } from "./util.ts";

/** K/V-like values: normal-ish magnitudes; `zeros`: a share of them zero (unwritten rows). */
function values(seed: number, n: number, zeros = 0): Float32Array {
  const r = rng(seed), out = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    out[i] = r.next() < zeros ? 0 : (r.next() * 2 - 1) * Math.exp(r.next() * 2);
  }
  return out;
}

Deno.test("kv codec: f32 and f16 blocks round-trip, and the high plane is what shrinks", () => {
  for (const zeros of [0, 0.3]) {
    const f32 = new Uint8Array(values(1, 40_000, zeros).buffer);
    const f16 = new Uint8Array(new Float16Array(values(2, 30_001, zeros)).buffer); // odd count
    for (const [raw, width] of [[f32, 4], [f16, 2]] as const) {
      const packed = packBlock(raw, width);
      assert.deepEqual(unpackBlock(packed, { width, bytes: raw.byteLength }), raw);
      assert.ok(packed.byteLength < raw.byteLength, `${packed.byteLength} of ${raw.byteLength}`);
      if (zeros === 0) {
        // Without zeros to find, smaller than the whole block deflated: the interleaved noise
        // bytes hide the high bytes' redundancy.
        const whole = deflateSync(raw, { level: 1 }).byteLength;
        assert.ok(packed.byteLength < whole, `planes ${packed.byteLength}, whole ${whole}`);
      }
    }
  }
  const f32 = new Uint8Array(values(3, 1_000).buffer);
  // A length that is not a whole number of elements: one plane, the block deflated.
  const odd = f32.subarray(0, 403);
  assert.deepEqual(unpackBlock(packBlock(odd, 4), { width: 4, bytes: 403 }), odd);
  const empty = new Uint8Array(0);
  assert.deepEqual(unpackBlock(packBlock(empty, 4), { width: 4, bytes: 0 }), empty);
});

Deno.test("kv codec: a chunk of the wrong length or width throws", () => {
  const raw = new Uint8Array(values(4, 8_000).buffer), bytes = raw.byteLength;
  const packed = packBlock(raw, 4);
  const cut = packed.subarray(0, packed.byteLength - 1);
  assert.throws(() => unpackBlock(cut, { width: 4, bytes }), /cannot be \d+ bytes long/);
  assert.throws(() => unpackBlock(packed, { width: 2, bytes }), /cannot be \d+ bytes long/);
  assert.throws(() => unpackBlock(packed.subarray(0, 3), { width: 4, bytes }), /needs 4 bytes/);
});
