/**
 * ggml block types: the dequantization reference against a per-element reading of ggml's block
 * structs (written independently, as bit fields), on seeded random blocks; hand-made blocks with
 * known values; the test-side quantizers within each type's error; byte arithmetic; and the q/k
 * row permutation of llama.cpp's converter, undone exactly and equivalent to switching RoPE
 * layouts.
 */
import assert from "node:assert/strict";
import { QUANT_BLOCKS, type QuantType } from "../gpu/dtype.ts";
import { permuteRows } from "../engine/model/gguf_names.ts";
import { dequantizeRef, rowBytes, storageBytes } from "../engine/model/gguf_quant.ts";
import { quantize } from "../scripts/gguf_quantize.ts";
import { rng } from "./util.ts";

const TYPES: QuantType[] = ["q8_0", "q4_0", "q4_k", "q6_k"];

const f16 = (bytes: Uint8Array, at: number) =>
  new Float16Array(new Uint16Array([bytes[at] | (bytes[at + 1] << 8)]).buffer)[0];
const i8 = (b: number) => (b << 24) >> 24;

/** Offsets of each type's f16 fields within a block. */
const HALVES: Record<QuantType, number[]> = {
  q8_0: [0],
  q4_0: [0],
  q4_k: [0, 2],
  q6_k: [208],
};

/**
 * Element e of a block, read straight from ggml-common.h's struct comments: one formula per
 * element, no loops shared with engine/model/gguf_quant.ts.
 */
function specValue(type: QuantType, b: Uint8Array, e: number): number {
  switch (type) {
    case "q8_0": // { half d; int8 qs[32]; }
      return f16(b, 0) * i8(b[2 + e]);
    case "q4_0": // { half d; u8 qs[16]; } element j low nibble of qs[j], j+16 high nibble
      return f16(b, 0) * ((e < 16 ? b[2 + e] & 15 : b[2 + e - 16] >> 4) - 8);
    case "q4_k": {
      // { half d; half dmin; u8 scales[12]; u8 qs[128]; }: 8 sub-blocks of 32. Sub-block s < 4:
      // scale = scales[s] bits 0–5, min = scales[s+4] bits 0–5. s ≥ 4: scale low 4 bits in the
      // low nibble of scales[s+4], high 2 bits in bits 6–7 of scales[s-4]; min low 4 bits in the
      // high nibble of scales[s+4], high 2 bits in bits 6–7 of scales[s].
      const s = e >> 5, sc = b.subarray(4, 16);
      const scale = s < 4 ? sc[s] & 63 : (sc[s + 4] & 15) + 16 * (sc[s - 4] >> 6);
      const min = s < 4 ? sc[s + 4] & 63 : (sc[s + 4] >> 4) + 16 * (sc[s] >> 6);
      // qs: 4 groups of 32 bytes; group g holds sub-block 2g in low nibbles, 2g+1 in high ones.
      const byte = b[16 + 32 * (s >> 1) + (e & 31)];
      const q = s % 2 === 0 ? byte & 15 : byte >> 4;
      return f16(b, 0) * scale * q - f16(b, 2) * min;
    }
    case "q6_k": {
      // { u8 ql[128]; u8 qh[64]; int8 scales[16]; half d; }: element e has scale scales[e/16];
      // in half n = e/128, quarter k, lane l: low 4 bits from ql[64n + l + 32(k odd)] (low
      // nibble for k < 2), high 2 bits from bits 2k, 2k+1 of qh[32n + l].
      const n = e >> 7, k = (e >> 5) & 3, l = e & 31;
      const lowByte = b[64 * n + l + 32 * (k & 1)];
      const low = k < 2 ? lowByte & 15 : lowByte >> 4;
      const high = (b[128 + 32 * n + l] >> (2 * k)) & 3;
      return f16(b, 208) * i8(b[192 + (e >> 4)]) * ((low | (high << 4)) - 32);
    }
  }
}

/** Random blocks whose f16 fields are finite (random bits could be NaN or Inf). */
function randomBlocks(type: QuantType, blocks: number, seed: number): Uint8Array {
  const r = rng(seed), b = QUANT_BLOCKS[type];
  const bytes = Uint8Array.from({ length: blocks * b.bytes }, () => r.int(256));
  for (let i = 0; i < blocks; i++) {
    for (const at of HALVES[type]) {
      const h = new Uint8Array(new Float16Array([r.uniform(1, 2)[0]]).buffer);
      bytes.set(h, i * b.bytes + at);
    }
  }
  return bytes;
}

for (const type of TYPES) {
  Deno.test(`${type}: dequantizeRef reads ggml's block layout (random blocks)`, () => {
    const b = QUANT_BLOCKS[type], blocks = 7;
    const bytes = randomBlocks(type, blocks, 100 + TYPES.indexOf(type));
    const got = dequantizeRef(bytes, type, blocks * b.elements);
    for (let i = 0; i < blocks; i++) {
      const block = bytes.subarray(i * b.bytes, (i + 1) * b.bytes);
      for (let e = 0; e < b.elements; e++) {
        const want = specValue(type, block, e);
        assert.equal(got[i * b.elements + e], want, `block ${i} element ${e}`);
      }
    }
  });
}

Deno.test("hand-made blocks give the values ggml's structs say", () => {
  // q8_0: d = 0.5, qs = -3 at element 5
  const q8 = new Uint8Array(34);
  q8.set([0x00, 0x38]); // 0.5 as f16
  q8[2 + 5] = 0xfd;
  assert.equal(dequantizeRef(q8, "q8_0", 32)[5], -1.5);
  // q4_0: d = 2, qs[3] = 0xa1: element 3 = 2·(1 − 8) = −14, element 19 = 2·(10 − 8) = 4
  const q4 = new Uint8Array(18);
  q4.set([0x00, 0x40]);
  q4[2 + 3] = 0xa1;
  const v4 = dequantizeRef(q4, "q4_0", 32);
  assert.deepEqual([v4[3], v4[19], v4[0]], [-14, 4, -16]);
  // q4_k: d = 1, dmin = 0.5; sub-block 5: scale 37 = 0b100101 (low 5 in scales[9] low nibble,
  // high 2 = 0b10 in scales[1] bits 6–7), min 20 = 0b010100 (low 4 in scales[9] high nibble,
  // high 2 = 0b01 in scales[5] bits 6–7); element 5·32 + 7 is the high nibble of qs[64 + 7].
  const qk = new Uint8Array(144);
  qk.set([0x00, 0x3c, 0x00, 0x38]);
  qk[4 + 9] = 0x45;
  qk[4 + 1] = 0x80;
  qk[4 + 5] = 0x40;
  qk[16 + 64 + 7] = 0xc0;
  assert.equal(dequantizeRef(qk, "q4_k", 256)[5 * 32 + 7], 37 * 12 - 0.5 * 20);
  // q6_k: d = 0.25, element 200 = half 1, quarter 2, lane 8: scale scales[12] = −3, low nibble
  // = high nibble of ql[64 + 8] = 0x9, high bits = bits 4–5 of qh[32 + 8] = 0b11 → q = 57 − 32.
  const q6 = new Uint8Array(210);
  q6.set([0x00, 0x34], 208);
  q6[192 + 12] = 0xfd;
  q6[64 + 8] = 0x90;
  q6[128 + 32 + 8] = 0x30;
  assert.equal(dequantizeRef(q6, "q6_k", 256)[200], 0.25 * -3 * 25);
});

/** Seeded Gaussian values (Box–Muller on the test RNG). */
function gaussian(n: number, seed: number): Float64Array {
  const r = rng(seed);
  return Float64Array.from({ length: n }, () => {
    return Math.sqrt(-2 * Math.log(1 - r.next())) * Math.cos(2 * Math.PI * r.next());
  });
}

/**
 * Each type's error bound, per block: the step size of its grid (and the rounding of its f16
 * scales). q8_0: half a step of amax/127; q4_0: one step of amax/8 (the largest value in the
 * other direction clamps to 7 steps); q4_k: a sub-block's range over 15 levels, its scale and min
 * rounded to 6 bits of the block's largest; q6_k: a 16-value sub-block's step amax/32, its scale
 * rounded to 8 bits of the largest.
 */
const BOUND: Record<QuantType, (amax: number) => number> = {
  q8_0: (amax) => amax / 127 / 2 + amax * 2 ** -10,
  q4_0: (amax) => amax / 8 + amax * 2 ** -9,
  q4_k: (amax) => (2 * amax) / 15,
  q6_k: (amax) => amax / 32,
};

/** RMS error over RMS value, measured for Gaussian rows, with headroom. */
const RELATIVE_RMS: Record<QuantType, number> = { q8_0: 0.006, q4_0: 0.12, q4_k: 0.1, q6_k: 0.025 };

for (const type of TYPES) {
  Deno.test(`${type}: dequant(quantize(x)) stays within the type's error`, () => {
    const cols = QUANT_BLOCKS[type].elements * 3;
    for (const [rows, scale, seed] of [[1, 1, 1], [5, 0.02, 2], [3, 40, 3]]) {
      const x = gaussian(rows * cols, seed).map((v) => v * scale);
      x[7] = 0; // a zero in a block
      const back = dequantizeRef(quantize(x, type, cols), type, x.length);
      const n = QUANT_BLOCKS[type].elements;
      let se = 0, sx = 0;
      for (let i = 0; i < x.length; i += n) {
        const block = x.subarray(i, i + n);
        const amax = Math.max(...block.map(Math.abs));
        for (let j = 0; j < n; j++) {
          const err = Math.abs(back[i + j] - block[j]);
          assert.ok(err <= BOUND[type](amax), `${type} [${i + j}]: |err| ${err}, amax ${amax}`);
          se += err * err;
          sx += block[j] * block[j];
        }
      }
      const rel = Math.sqrt(se / sx);
      console.log(
        `${type} ${rows}x${cols} scale ${scale}: rms error / rms value ${rel.toFixed(4)}`,
      );
      assert.ok(rel <= RELATIVE_RMS[type], `${type}: relative rms error ${rel}`);
    }
    // All zeros stay zeros; a row of one repeated value comes back close to it.
    assert.ok(
      dequantizeRef(quantize(new Float64Array(cols), type, cols), type, cols).every((v) => v === 0),
    );
    const flat = dequantizeRef(quantize(new Float64Array(cols).fill(0.3), type, cols), type, cols);
    assert.ok(flat.every((v) => Math.abs(v - 0.3) <= 0.3 / 8), `${type}: ${flat[0]}`);
  });
}

Deno.test("bytes per row and per tensor; rows that are not whole blocks are refused", () => {
  assert.equal(rowBytes("q8_0", 96), 3 * 34);
  assert.equal(rowBytes("q4_0", 64), 2 * 18);
  assert.equal(rowBytes("q4_k", 512), 2 * 144);
  assert.equal(rowBytes("q6_k", 256), 210);
  assert.equal(rowBytes("bf16", 7), 14);
  assert.equal(storageBytes("q4_k", [768, 5]), 5 * 3 * 144);
  assert.equal(storageBytes("f32", [3, 4, 2]), 96);
  assert.throws(
    () => storageBytes("q4_k", [300, 2], "tensor 'blk.0.attn_q.weight'"),
    /tensor 'blk\.0\.attn_q\.weight' has rows of 300 values, but Q4_K stores rows in blocks of 256/,
  );
});

/** convert_hf_to_gguf.py's permute, as the index arithmetic of its reshape and swapaxes. */
function converterPermute(w: Float64Array, rows: number, cols: number, heads: number) {
  // w.reshape(heads, 2, rows / heads / 2, cols).swapaxes(1, 2).reshape(rows, cols)
  const half = rows / heads / 2, out = new Float64Array(w.length);
  for (let h = 0; h < heads; h++) {
    for (let i = 0; i < half; i++) {
      for (let j = 0; j < 2; j++) {
        const src = (h * 2 + j) * half + i, dst = (h * half + i) * 2 + j;
        out.set(w.subarray(src * cols, (src + 1) * cols), dst * cols);
      }
    }
  }
  return out;
}

Deno.test("q/k permutation: the converter's reshape, undone exactly, for any storage type", () => {
  for (const [heads, headDim, cols] of [[3, 6, 5], [2, 64, 32], [1, 2, 1]]) {
    const rows = heads * headDim;
    const w = gaussian(rows * cols, rows);
    const asBytes = (x: Float64Array) => new Uint8Array(x.buffer);
    const permuted = permuteRows(asBytes(w), rows, { heads, inverse: false });
    assert.deepEqual(permuted, asBytes(converterPermute(w, rows, cols, heads)));
    assert.deepEqual(permuteRows(permuted, rows, { heads, inverse: true }), asBytes(w));
  }
  // Quantized rows move whole: un-permuting Q4_K bytes = quantizing the HF rows.
  const w = gaussian(8 * 256, 9);
  const gguf = quantize(converterPermute(w, 8, 256, 2), "q4_k", 256);
  assert.deepEqual(permuteRows(gguf, 8, { heads: 2, inverse: true }), quantize(w, "q4_k", 256));
});

Deno.test("q/k permutation: interleaved RoPE on permuted rows = rotate-half RoPE on HF rows", () => {
  // Why llama.cpp permutes: its `llama` RoPE rotates pairs (2i, 2i+1), HF's rotates (i, i + D/2).
  const heads = 2, D = 8, cols = 4, rows = heads * D, pos = 5;
  const w = gaussian(rows * cols, 4), x = gaussian(cols, 5);
  const project = (m: Float64Array) =>
    Float64Array.from(
      { length: rows },
      (_, r) => x.reduce((s, v, k) => s + v * m[r * cols + k], 0),
    );
  const angle = (i: number) => pos * 10000 ** (-2 * i / D);
  const hf = project(w), gg = project(converterPermute(w, rows, cols, heads));
  const rotHalf = new Float64Array(rows), interleaved = new Float64Array(rows);
  for (let h = 0; h < heads; h++) {
    for (let i = 0; i < D / 2; i++) {
      const c = Math.cos(angle(i)), s = Math.sin(angle(i)), b = h * D;
      rotHalf[b + i] = hf[b + i] * c - hf[b + i + D / 2] * s;
      rotHalf[b + i + D / 2] = hf[b + i + D / 2] * c + hf[b + i] * s;
      interleaved[b + 2 * i] = gg[b + 2 * i] * c - gg[b + 2 * i + 1] * s;
      interleaved[b + 2 * i + 1] = gg[b + 2 * i + 1] * c + gg[b + 2 * i] * s;
    }
  }
  const back = new Float64Array(
    permuteRows(new Uint8Array(interleaved.buffer), rows, { heads, inverse: true }).buffer,
  );
  for (let r = 0; r < rows; r++) assert.ok(Math.abs(back[r] - rotHalf[r]) < 1e-12, `row ${r}`);
});
