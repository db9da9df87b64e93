/**
 * The KV codecs (kernels/kv_codec.wgsl) against their float64 references (kernels/reference_kv.ts),
 * and the attention kernels reading codec blocks: seeded random pools at awkward sizes (head dims
 * 40, 64, 96, 128; odd layer and kv-head counts; one block and many), f32 and f16 pools.
 */
import assert from "node:assert/strict";
import type { KvDtype } from "../gpu/dtype.ts";
import { createStorage, type Gpu, readBuffer, readF32 } from "../gpu/device.ts";
import { run } from "../gpu/dispatch.ts";
import {
  codecBlockBytes,
  codecHeadWords,
  codecRegion,
  hotBlockBytes,
  type KvCodec,
  kvCodecDispatch,
  type KvCodecRegion,
  pairsBuffer,
} from "../kernels/kv_codec.ts";
import {
  codecErrorBound,
  decodeBlockRef,
  decodeHeadRef,
  encodeBlockRef,
} from "../kernels/reference_kv.ts";
import { attentionDispatch, chunkWords } from "../kernels/attention.ts";
import { attentionDecodeDispatches } from "../kernels/attention_decode.ts";
import {
  attentionDecodeRef,
  attentionRef,
  type PagedCacheRef,
  pagedCacheRef,
  pagedKvRef,
} from "../kernels/reference.ts";
import { assertClose, compare, type Rng, rng, testGpu } from "./util.ts";
import { f32, invFreqs, u32 } from "./attention_util.ts";

type Codec = Exclude<KvCodec, "none">;

/**
 * Random hot values of a block, `[heads, 16, D]`: K with a few channels 20x the rest (the
 * outliers real keys have), an all-zero row in head 0 (zero scales and exponents), rounded to
 * the pool's dtype.
 */
function blockValues(r: Rng, heads: number, D: number, isV: boolean, dtype: KvDtype) {
  const x = r.uniform(heads * 16 * D, 2);
  const round = dtype === "f16" ? Math.f16round : Math.fround;
  for (let i = 0; i < x.length; i++) {
    const c = i % D;
    if (!isV && c % 13 === 5) x[i] *= 20;
    if (i >= 3 * D && i < 4 * D) x[i] = 0; // head 0, row 3
    x[i] = round(x[i]);
  }
  return x;
}

/** Pool bytes: `hot` hot blocks of `values` (as `dtype`), then the codec region's words. */
function poolBytes(values: Float64Array, dtype: KvDtype, codecWords: Uint32Array): Uint8Array {
  const hot = dtype === "f16" ? Float16Array.from(values) : Float32Array.from(values);
  const out = new Uint8Array(hot.byteLength + codecWords.byteLength);
  out.set(new Uint8Array(hot.buffer), 0);
  out.set(new Uint8Array(codecWords.buffer), hot.byteLength);
  return out;
}

interface CodecCase {
  codec: Codec;
  dtype: KvDtype;
  headDim: number;
  nLayers: number;
  nKvHeads: number;
  /** Blocks encoded (and decoded) in one dispatch. */
  items: number;
}

for (
  const c of [
    { codec: "f16", dtype: "f32", headDim: 64, nLayers: 3, nKvHeads: 1, items: 1 },
    { codec: "f16", dtype: "f32", headDim: 40, nLayers: 1, nKvHeads: 3, items: 4 },
    { codec: "int8", dtype: "f32", headDim: 96, nLayers: 1, nKvHeads: 3, items: 5 },
    { codec: "int8", dtype: "f16", headDim: 128, nLayers: 2, nKvHeads: 1, items: 2 },
    { codec: "bfp4", dtype: "f32", headDim: 64, nLayers: 3, nKvHeads: 2, items: 3 },
    { codec: "bfp4", dtype: "f16", headDim: 40, nLayers: 1, nKvHeads: 1, items: 1 },
    { codec: "bfp4", dtype: "f32", headDim: 128, nLayers: 1, nKvHeads: 3, items: 2 },
    { codec: "sign1", dtype: "f32", headDim: 96, nLayers: 2, nKvHeads: 1, items: 3 },
    { codec: "sign1", dtype: "f16", headDim: 64, nLayers: 1, nKvHeads: 3, items: 1 },
    { codec: "sign1", dtype: "f32", headDim: 40, nLayers: 3, nKvHeads: 1, items: 2 },
  ] as CodecCase[]
) {
  const { codec, dtype, headDim: D, nLayers, nKvHeads, items } = c;
  const name =
    `kv codec ${codec} from ${dtype}: ${nLayers}x${nKvHeads} heads x${D}, ${items} blocks`;
  Deno.test(name, async () => {
    const gpu = await testGpu();
    const r = rng(31 * D + items);
    const heads = nLayers * nKvHeads, elems = heads * 16 * D, hot = items + 2;
    const region = codecRegion({ nLayers, nKvHeads, headDim: D }, { codec, dtype, hot });
    const W = heads * region.headWords;
    // Hot block h + 1 is encoded into codec block `hot + items - 1 - h` (reversed order); block 0
    // and the last hot block are not part of it. The codec region starts as garbage.
    const pairs = Array.from({ length: items }, (_, h) => [h + 1, hot + items - 1 - h] as const);
    const values = { k: new Float64Array(hot * elems), v: new Float64Array(hot * elems) };
    for (const s of ["k", "v"] as const) {
      for (let b = 0; b < hot; b++) {
        values[s].set(blockValues(r, heads, D, s === "v", dtype), b * elems);
      }
    }
    const garbage = new Uint32Array(items * W).fill(0xdeadbeef);
    const pool = (s: "k" | "v") => {
      const bytes = poolBytes(values[s], dtype, garbage);
      return createStorage(gpu, bytes.byteLength, bytes);
    };
    const kPool = pool("k"), vPool = pool("v");
    const shape = { nLayers, nKvHeads, headDim: D, items, dtype, region };
    const out = createStorage(gpu, items * 2 * hotBlockBytes(shape, dtype));
    const buffers = { pairs: pairsBuffer(gpu, pairs), kPool, vPool, out };
    await run(gpu, [
      kvCodecDispatch(gpu, "encode", buffers, shape),
      kvCodecDispatch(gpu, "decode", {
        ...buffers,
        pairs: pairsBuffer(gpu, pairs.map(([, to], i) => [to, i])),
      }, shape),
    ]);
    const hotBytes = hot * hotBlockBytes(shape, dtype);
    const decodedOut = new Float64Array(
      dtype === "f16"
        ? new Float16Array(await readBuffer(gpu, out, 2 * items * elems * 2))
        : new Float32Array(await readBuffer(gpu, out, 2 * items * elems * 4)),
    );
    for (const [s, buf] of [["k", kPool], ["v", vPool]] as const) {
      const isV = s === "v";
      const words = new Uint32Array(await readBuffer(gpu, buf, items * W * 4, hotBytes));
      let same = 0, tieFlips = 0;
      for (const [i, [from, to]] of pairs.entries()) {
        const x = values[s].subarray(from * elems, (from + 1) * elems);
        const got = words.subarray((to - hot) * W, (to - hot + 1) * W);
        const want = encodeBlockRef(codec, isV, x, { heads, headDim: D });
        for (let w = 0; w < W; w++) same += got[w] === want[w] ? 1 : 0;
        const dGot = decodeBlockRef(codec, isV, got, { heads, headDim: D });
        const dWant = decodeBlockRef(codec, isV, want, { heads, headDim: D });
        // The GPU's codes against the reference's: equal but where a value sits on a tie.
        const cmp = compare(`${s} block ${i} decoded vs reference`, dGot, dWant, 1e-6, 1e-6);
        for (let e = 0; e < dGot.length; e++) {
          if (Math.abs(dGot[e] - dWant[e]) > 1e-6 + 1e-6 * Math.abs(dWant[e])) tieFlips++;
        }
        assert.ok(cmp.maxAbs < 0.5 || codec === "sign1", `${s}: ${cmp.report}`);
        // Every value within its quantization bound of the original.
        for (let h = 0; h < heads; h++) {
          const at = h * 16 * D;
          const bound = codecErrorBound(codec, isV, x.subarray(at, at + 16 * D), D);
          for (let e = 0; e < 16 * D; e++) {
            const err = Math.abs(dGot[at + e] - x[at + e]);
            assert.ok(
              err <= bound[e] * 1.001 + 1e-7,
              `${s} block ${i} head ${h} elem ${e}: ${err} > ${bound[e]}`,
            );
          }
        }
        // `decode` wrote the hot form of what the codec holds (rounded to the pool's dtype).
        const o = (2 * i + (isV ? 1 : 0)) * elems;
        const round = dtype === "f16" ? Math.f16round : Math.fround;
        assertClose(
          `${s} block ${i} decode`,
          decodedOut.subarray(o, o + elems),
          dGot.map(round),
          1e-7,
          1e-7,
        );
      }
      console.log(`${s}: ${same}/${items * W} words as the reference's, ${tieFlips} values apart`);
      assert.ok(tieFlips <= Math.max(2, items * elems * 1e-3), `${s}: ${tieFlips} values differ`);
    }
  });
}

/** A paged cache with some blocks re-encoded, as the GPU and the reference see it. */
interface CodecCache {
  /** The reference's cache: encoded blocks hold their decoded values, the table is unchanged. */
  ref: PagedCacheRef;
  kPool: GPUBuffer;
  vPool: GPUBuffer;
  /** The GPU's table: encoded logical blocks point at codec blocks. */
  blockTable: GPUBuffer;
  region: KvCodecRegion;
}

/**
 * Re-encodes, with the reference encoder, every logical block of each slot that lies wholly
 * below `keep[s]` keys; on the GPU their hot blocks become NaN (so reading them would show).
 */
function encodeCache(gpu: Gpu, cache: PagedCacheRef, codec: Codec, keep: number[]): CodecCache {
  const { nLayers, nKvHeads, headDim: D, numBlocks, maxBlocks, kvDtype } = cache;
  const heads = nLayers * nKvHeads, elems = heads * 16 * D;
  const region = codecRegion({ nLayers, nKvHeads, headDim: D }, {
    codec,
    dtype: kvDtype,
    hot: numBlocks,
  });
  const W = heads * region.headWords;
  const table = cache.blockTable.slice();
  const ref = { ...cache, kPool: cache.kPool.slice(), vPool: cache.vPool.slice() };
  const gpuPool = { k: cache.kPool.slice(), v: cache.vPool.slice() };
  const words: { k: Uint32Array[]; v: Uint32Array[] } = { k: [], v: [] };
  keep.forEach((n, s) => {
    for (let lb = 0; (lb + 1) * 16 <= n; lb++) {
      const b = table[s * maxBlocks + lb], at = b * elems;
      for (const side of ["k", "v"] as const) {
        const isV = side === "v", src = side === "k" ? cache.kPool : cache.vPool;
        const w = encodeBlockRef(codec, isV, src.subarray(at, at + elems), { heads, headDim: D });
        words[side].push(w);
        (side === "k" ? ref.kPool : ref.vPool).set(
          decodeBlockRef(codec, isV, w, { heads, headDim: D }),
          at,
        );
        gpuPool[side].fill(NaN, at, at + elems);
      }
      table[s * maxBlocks + lb] = numBlocks + words.k.length - 1;
    }
  });
  const upload = (side: "k" | "v") => {
    const all = new Uint32Array(Math.max(1, words[side].length) * W);
    words[side].forEach((w, i) => all.set(w, i * W));
    const bytes = poolBytes(Float64Array.from(gpuPool[side]), kvDtype, all);
    return createStorage(gpu, bytes.byteLength, bytes);
  };
  return {
    ref,
    kPool: upload("k"),
    vPool: upload("v"),
    blockTable: createStorage(gpu, table.byteLength, table),
    region,
  };
}

interface AttnCase {
  codec: Codec;
  nHeads: number;
  nKvHeads: number;
  headDim: number;
  kvDtype?: KvDtype;
}

const ATTN: AttnCase[] = [
  { codec: "f16", nHeads: 8, nKvHeads: 2, headDim: 64 },
  { codec: "int8", nHeads: 8, nKvHeads: 2, headDim: 64 },
  { codec: "int8", nHeads: 4, nKvHeads: 1, headDim: 96, kvDtype: "f16" },
  { codec: "bfp4", nHeads: 6, nKvHeads: 3, headDim: 128 },
  { codec: "sign1", nHeads: 8, nKvHeads: 2, headDim: 64 },
  { codec: "bfp4", nHeads: 4, nKvHeads: 2, headDim: 40, kvDtype: "f16" },
];

for (const c of ATTN) {
  const { codec, nHeads, nKvHeads, headDim: D } = c;
  const kv = c.kvDtype ? ` kv ${c.kvDtype}` : "";
  Deno.test(`attention prefill over ${codec} blocks ${nHeads}/${nKvHeads}x${D}${kv}`, async () => {
    const gpu = await testGpu();
    const r = rng(91 + D);
    const nLayers = 3, layer = 1, slot = 1, pos0 = 53, T = 21, len = pos0 + T;
    const maxBlocks = Math.ceil(len / 16) + 1;
    const cache = pagedCacheRef(r.next, {
      seqLens: [9, len, 40],
      nLayers,
      nKvHeads,
      headDim: D,
      maxBlocks,
      kvDtype: c.kvDtype,
    });
    // Slot 1's blocks below key 48 are codec blocks (the chunk's queries see hot keys from 48).
    const cc = encodeCache(gpu, cache, codec, [0, 48, 40]);
    const q = Float32Array.from(r.uniform(T * nHeads * D, 3));
    const out = createStorage(gpu, T * nHeads * D * 4);
    const chunk = createStorage(gpu, 16, chunkWords(slot, pos0, T));
    const d = attentionDispatch(gpu, { q: f32(gpu, q), ...cc, out, chunk }, {
      tokens: T,
      nHeads,
      nKvHeads,
      headDim: D,
      layer,
      nLayers,
      maxBlocks,
      kvDtype: c.kvDtype,
      codec: cc.region,
    });
    await run(gpu, [d]);
    const want = attentionRef(q, {
      ...pagedKvRef(cc.ref, { slot, layer, len }),
      qPos: Array.from({ length: T }, (_, i) => pos0 + i),
      nHeads,
      nKvHeads,
      headDim: D,
    });
    assertClose(d.label, await readF32(gpu, out, T * nHeads * D), want);
  });

  Deno.test(`attention decode over ${codec} blocks ${nHeads}/${nKvHeads}x${D}${kv}`, async () => {
    const gpu = await testGpu();
    const r = rng(17 + D);
    const nLayers = 2, layer = 1;
    const seqLens = [70, 17, 1, 130], S = seqLens.length;
    const maxBlocks = Math.ceil(Math.max(...seqLens) / 16) + 1;
    const pos = seqLens.map((len) => len - 1);
    const cache = pagedCacheRef(r.next, {
      seqLens: pos,
      capacity: seqLens,
      nLayers,
      nKvHeads,
      headDim: D,
      maxBlocks,
      kvDtype: c.kvDtype,
    });
    // Everything but the last 16 keys before the new one is re-encoded.
    const cc = encodeCache(gpu, cache, codec, pos.map((p) => p - 16));
    const qkv = Float32Array.from(r.uniform(S * (nHeads + 2 * nKvHeads) * D, 2));
    const invFreq = invFreqs(D);
    const out = createStorage(gpu, S * nHeads * D * 4);
    for (const splitSize of [undefined, 32]) {
      const ds = attentionDecodeDispatches(gpu, {
        qkv: f32(gpu, qkv),
        pos: u32(gpu, pos),
        invFreq: f32(gpu, invFreq),
        kPool: cc.kPool,
        vPool: cc.vPool,
        blockTable: cc.blockTable,
        seqLen: u32(gpu, seqLens),
        out,
      }, {
        seqs: S,
        nHeads,
        nKvHeads,
        headDim: D,
        layer,
        nLayers,
        maxBlocks,
        maxContext: 160,
        splitSize,
        kvDtype: c.kvDtype,
        codec: cc.region,
      });
      await run(gpu, ds);
      const want = attentionDecodeRef(cc.ref, qkv, {
        pos,
        seqLen: seqLens,
        invFreq,
        nHeads,
        layer,
      });
      assertClose(
        `${ds[0].label} (${ds.length} dispatches)`,
        await readF32(gpu, out, S * nHeads * D),
        want.out,
      );
    }
  });
}

Deno.test("kv codec layouts: words per head block and bytes per block", () => {
  assert.equal(codecHeadWords("f16", 64), 512);
  assert.equal(codecHeadWords("int8", 64), 272);
  assert.equal(codecHeadWords("bfp4", 64), 144); // 4.5 bits per value
  assert.equal(codecHeadWords("bfp4", 40), 92); // 80 + 10 K / 12 V exponent words
  assert.equal(codecHeadWords("sign1", 96), 104);
  const tiny = { nLayers: 22, nKvHeads: 4, headDim: 64 };
  assert.equal(hotBlockBytes(tiny, "f32") / codecBlockBytes(tiny, "bfp4"), 64 / 9);
  assert.throws(() => codecHeadWords("int8", 18), /multiple of 4/);
  assert.throws(() => codecRegion(tiny, { codec: "f16", dtype: "f16", hot: 4 }), /f32 pool/);
  // A head block of zeros decodes to zeros in every codec.
  for (const codec of ["f16", "int8", "bfp4", "sign1"] as const) {
    const w = new Uint32Array(codecHeadWords(codec, 64));
    if (codec === "bfp4") new Uint8Array(w.buffer).fill(1, 8 * 64, 9 * 64);
    assert.ok(decodeHeadRef(codec, false, w, 64).every((x) => x === 0), codec);
  }
});
