/**
 * The GGUF container: metadata of every type (arrays too) through the test-side writer and back,
 * v2 and v3, other alignments, headers larger than the first read, tensor data where the infos
 * say; and headers strata refuses, naming the problem: not GGUF, big-endian, v1, a duplicate key,
 * a bad alignment or value type.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { parseGgufHeader, readGgufHeader } from "../engine/model/gguf_format.ts";
import { readTensor } from "../engine/model/safetensors.ts";
import { encodeGguf, type GgufEntry, type GgufSpec } from "../scripts/gguf_writer.ts";

/** One entry of each type, scalars and arrays. */
const ENTRIES: GgufEntry[] = [
  { key: "t.u8", type: "u8", value: 200 },
  { key: "t.i8", type: "i8", value: -5 },
  { key: "t.u16", type: "u16", value: 60000 },
  { key: "t.i16", type: "i16", value: -30000 },
  { key: "t.u32", type: "u32", value: 4_000_000_000 },
  { key: "t.i32", type: "i32", value: -2_000_000_000 },
  { key: "t.f32", type: "f32", value: 0.5 },
  { key: "t.bool", type: "bool", value: true },
  { key: "t.string", type: "string", value: "héllo ✓ 🙂" },
  { key: "t.u64", type: "u64", value: 2n ** 60n + 5n },
  { key: "t.u64small", type: "u64", value: 7 },
  { key: "t.i64", type: "i64", value: -3 },
  { key: "t.f64", type: "f64", value: 1 / 3 },
  { key: "a.u8", type: "array<u8>", value: Uint8Array.from([1, 2, 255]) },
  { key: "a.i16", type: "array<i16>", value: Int16Array.from([-1, 2]) },
  { key: "a.i32", type: "array<i32>", value: Int32Array.from([-7, 1, 3]) },
  { key: "a.f32", type: "array<f32>", value: Float32Array.from([0.25, -1e-5]) },
  { key: "a.f64", type: "array<f64>", value: Float64Array.from([Math.PI]) },
  { key: "a.u64", type: "array<u64>", value: BigUint64Array.from([1n, 2n ** 63n]) },
  { key: "a.bool", type: "array<bool>", value: [true, false, true] },
  { key: "a.string", type: "array<string>", value: ["a", "", "ü b"] },
  { key: "a.empty", type: "array<string>", value: [] },
  {
    key: "a.nested",
    type: "array<array<u8>>",
    value: [Uint8Array.from([1, 2]), Uint8Array.from([3])],
  },
];

Deno.test("metadata of every type, arrays included, v2 and v3, alignments 32 and 64", async () => {
  const dir = await Deno.makeTempDir({ prefix: "strata-gguf-" });
  try {
    for (const [version, alignment] of [[3, 32], [2, 64]]) {
      const data = Uint8Array.from({ length: 70 }, (_, i) => i);
      const spec: GgufSpec = {
        version,
        alignment,
        metadata: ENTRIES,
        tensors: [
          { name: "a", ggmlType: 0, dims: [3], data: data.subarray(0, 12) },
          { name: "b", ggmlType: 1, dims: [5, 7], data: data },
        ],
      };
      const file = join(dir, `v${version}.gguf`);
      await Deno.writeFile(file, encodeGguf(spec));
      const h = await readGgufHeader(file);
      assert.equal(h.version, version);
      assert.equal(h.alignment, alignment);
      for (const e of ENTRIES) {
        const want = e.key === "t.u64" ? e.value : e.type === "f32" ? Math.fround(0.5) : e.value;
        assert.deepEqual(h.metadata.get(e.key), want, e.key);
        assert.equal(h.types.get(e.key), e.type, e.key);
      }
      assert.deepEqual(h.metadata.get("a.f32"), Float32Array.from([0.25, -1e-5]));
      assert.equal(h.dataOffset % alignment, 0);
      const [a, b] = h.tensors;
      assert.deepEqual([a.dims, a.type, a.nbytes, b.dims, b.type, b.nbytes], [
        [3],
        "f32",
        12,
        [5, 7],
        "f16",
        70,
      ]);
      assert.equal(b.offset % alignment, 0);
      const info = { name: "b", dtype: "f16" as const, shape: [7, 5], file, offset: b.offset };
      assert.deepEqual(await readTensor({ ...info, nbytes: 70 }), data);
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("a header larger than the first read (200 000 token strings) is read whole", async () => {
  const tokens = Array.from({ length: 200_000 }, (_, i) => `token-${i}`);
  const file = await Deno.makeTempFile({ suffix: ".gguf" });
  try {
    await Deno.writeFile(
      file,
      encodeGguf({
        metadata: [{ key: "tokenizer.ggml.tokens", type: "array<string>", value: tokens }],
        tensors: [],
      }),
    );
    assert.ok((await Deno.stat(file)).size > 3 << 20);
    assert.deepEqual((await readGgufHeader(file)).metadata.get("tokenizer.ggml.tokens"), tokens);
  } finally {
    await Deno.remove(file);
  }
});

Deno.test("not GGUF, big-endian, v1, corrupt headers: refused naming the problem", () => {
  const good = encodeGguf({ metadata: ENTRIES.slice(0, 3), tensors: [] });
  const parse = (bytes: Uint8Array) => () => parseGgufHeader(bytes, bytes.byteLength, "x.gguf");
  assert.throws(
    parse(new TextEncoder().encode("GGML and more bytes")),
    /x\.gguf is not a GGUF file \(it does not start with "GGUF"\)/,
  );
  const be = good.slice();
  new DataView(be.buffer).setUint32(4, 3, false);
  assert.throws(parse(be), /x\.gguf is a big-endian GGUF file/);
  const v1 = good.slice();
  new DataView(v1.buffer).setUint32(4, 1, true);
  assert.throws(parse(v1), /x\.gguf is GGUF version 1; strata reads versions 2 and 3/);
  const twice = encodeGguf({ metadata: [ENTRIES[0], ENTRIES[0]], tensors: [] });
  assert.throws(parse(twice), /metadata key 't\.u8' appears twice/);
  const align = encodeGguf({
    metadata: [{ key: "general.alignment", type: "u32", value: 48 }],
    tensors: [],
  });
  assert.throws(parse(align), /general\.alignment must be a power of two; got 48/);
  const badType = good.slice();
  // The first entry's value type (after magic, version, two counts, the key "t.u8"): 99.
  new DataView(badType.buffer).setUint32(24 + 8 + 4, 99, true);
  assert.throws(parse(badType), /metadata value type 99 is not a GGUF type/);
});
