/**
 * The attention masks compiled into prefill and decode attention (kernels/attention_mask.ts)
 * against the float64 references, every kind at awkward sizes: windows that are not a multiple of
 * a block or a tile, prompts crossing the window, sinks spanning blocks, chunks across tiles,
 * ragged decode batches. The blocks no query of the launch can see are pointed at the all-NaN
 * block 0, as a freed block would be: a kernel that reads one fails.
 */
import assert from "node:assert/strict";
import type { KvDtype } from "../gpu/dtype.ts";
import { createStorage, readF32 } from "../gpu/device.ts";
import { run } from "../gpu/dispatch.ts";
import { attentionDispatch, chunkWords } from "../kernels/attention.ts";
import {
  attentionDecodeDispatches,
  attentionDecodeScratchBytes,
  decodePlan,
} from "../kernels/attention_decode.ts";
import {
  attendedKeys,
  type AttentionMask,
  bucketFor,
  checkMask,
  lengthBuckets,
  maskConstants,
  maskLabel,
  maskLo,
} from "../kernels/attention_mask.ts";
import {
  attentionDecodeRef,
  attentionRef,
  type PagedCacheRef,
  pagedCacheRef,
  pagedKvRef,
  pagedOffsetRef,
  visibleRef,
} from "../kernels/reference.ts";
import { ropeKvDispatch } from "../kernels/rope_kv.ts";
import { assertClose, rng, testGpu } from "./util.ts";
import { assertPool, f32, invFreqs, readPool, u32, uploadCache } from "./attention_util.ts";

/**
 * Points every table entry of `slot` whose 16 keys no query at positions `queries` sees at the
 * NaN block 0 (what a freed block may hold); returns how many it poisoned.
 */
function poisonUnseen(
  cache: PagedCacheRef,
  slot: number,
  len: number,
  queries: number[],
  mask: AttentionMask,
): number {
  let n = 0;
  for (let b = 0; b * 16 < len; b++) {
    let seen = false;
    for (let k = b * 16; k < Math.min(len, b * 16 + 16) && !seen; k++) {
      seen = queries.some((q) => visibleRef(mask, q, k));
    }
    if (!seen) {
      cache.blockTable[slot * cache.maxBlocks + b] = 0;
      n++;
    }
  }
  return n;
}

const W = (window: number): AttentionMask => ({ kind: "window", window });
const SINKS = (sinks: number, window: number): AttentionMask => ({ kind: "sinks", sinks, window });
const CHUNK = (chunk: number): AttentionMask => ({ kind: "chunked", chunk });
const TINY_HEADS = { nHeads: 32, nKvHeads: 4, headDim: 64 }; // TinyLlama's heads: GQA 8

Deno.test("attention mask: definitions, constants, labels, refusals", () => {
  // visibleRef from the definitions; maskLo is the first visible key past the sinks.
  assert.ok(visibleRef(W(4), 10, 7) && !visibleRef(W(4), 10, 6) && !visibleRef(W(4), 10, 11));
  assert.ok(visibleRef(SINKS(2, 3), 10, 1) && !visibleRef(SINKS(2, 3), 10, 2));
  assert.ok(visibleRef(CHUNK(8), 15, 8) && !visibleRef(CHUNK(8), 15, 7));
  for (const m of [W(5), SINKS(3, 5), CHUNK(6), { kind: "causal" } as AttentionMask]) {
    for (let p = 0; p < 40; p++) {
      const lo = maskLo(m, p);
      for (let j = 0; j <= p; j++) {
        const sink = m.kind === "sinks" && j < m.sinks;
        assert.equal(visibleRef(m, p, j), j >= lo || sink, `${maskLabel(m)} p ${p} j ${j}`);
      }
    }
  }
  assert.deepEqual(maskConstants({ kind: "causal" }), {});
  assert.deepEqual(maskConstants(SINKS(4, 100)), { MASK_KIND: 2, MASK_WINDOW: 100, MASK_SINKS: 4 });
  assert.deepEqual(maskConstants(CHUNK(64)), { MASK_KIND: 3, MASK_CHUNK: 64 });
  assert.throws(() => checkMask(W(0)), /window must be an integer >= 1; got 0/);
  assert.throws(() => checkMask(SINKS(0, 8)), /sinks must be an integer >= 1; got 0/);
  assert.throws(() => checkMask(CHUNK(1.5)), /chunk must be an integer >= 1; got 1.5/);
  // Buckets: by keys attended, the last one made for the most a query attends.
  assert.deepEqual(lengthBuckets(131072), [2048, 8192, 32768, 131072]);
  assert.deepEqual(lengthBuckets(2048), [2048]);
  assert.deepEqual(lengthBuckets(5000), [2048, 5000]);
  assert.deepEqual(lengthBuckets(131072, W(4096)), [2048, 4096]);
  assert.deepEqual(lengthBuckets(131072, SINKS(4, 1020)), [1024]);
  assert.equal(attendedKeys(CHUNK(8192), 100000), 8192);
  assert.equal(bucketFor([2048, 8192, 20000], 2049), 8192);
  assert.equal(bucketFor([2048, 8192, 20000], 2048), 2048);
  assert.equal(bucketFor([2048, 8192, 20000], 30000), 20000);
});

interface PrefillCase {
  heads: { nHeads: number; nKvHeads: number; headDim: number };
  tokens: number;
  pos0: number;
  mask: AttentionMask;
  tileRows?: number;
  tileKeys?: number;
  maxTileBytes?: number;
  kvDtype?: KvDtype;
  unroll?: boolean;
}

const H8 = { nHeads: 8, nKvHeads: 2, headDim: 64 };
for (
  const c of [
    // A window that is not a multiple of a block; the prompt crosses it.
    { heads: H8, tokens: 40, pos0: 0, mask: W(37) },
    { heads: H8, tokens: 70, pos0: 150, mask: W(100) },
    // The engine's chunk: 256 tokens after 256 cached, GQA 8, a window of 3 blocks.
    { heads: TINY_HEADS, tokens: 256, pos0: 256, mask: W(48) },
    // Tiny windows and forced tiles: 12 rows (a row tile spans several windows), 64-key tiles
    // over four blocks, 8 x 8 (two tiles per block).
    { heads: { nHeads: 4, nKvHeads: 1, headDim: 16 }, tokens: 33, pos0: 47, mask: W(5) },
    {
      heads: { nHeads: 4, nKvHeads: 1, headDim: 16 },
      tokens: 33,
      pos0: 47,
      mask: W(5),
      tileRows: 12,
      tileKeys: 16,
    },
    {
      heads: { nHeads: 6, nKvHeads: 2, headDim: 8 },
      tokens: 70,
      pos0: 90,
      mask: W(29),
      tileRows: 4,
      tileKeys: 64,
    },
    { heads: H8, tokens: 40, pos0: 60, mask: W(21), tileRows: 8, tileKeys: 8 },
    { heads: H8, tokens: 17, pos0: 3, mask: W(1) }, // each query sees itself only
    // A window wider than the context: the causal answer, through the masked pipeline.
    { heads: H8, tokens: 40, pos0: 5, mask: W(4096) },
    // Sinks + window: 4 sinks; 20 sinks over two blocks and a tile of 64 keys that straddles
    // their end; sinks past the window's start (they overlap).
    { heads: H8, tokens: 60, pos0: 90, mask: SINKS(4, 29) },
    {
      heads: { nHeads: 6, nKvHeads: 2, headDim: 8 },
      tokens: 70,
      pos0: 130,
      mask: SINKS(20, 24),
      tileRows: 4,
      tileKeys: 64,
    },
    { heads: H8, tokens: 30, pos0: 10, mask: SINKS(30, 12) },
    // Chunked: chunks of 50 across tiles and blocks, of 16 aligned with them, and of 7.
    { heads: H8, tokens: 120, pos0: 30, mask: CHUNK(50) },
    { heads: TINY_HEADS, tokens: 37, pos0: 29, mask: CHUNK(16) },
    { heads: { nHeads: 2, nKvHeads: 1, headDim: 18 }, tokens: 45, pos0: 3, mask: CHUNK(7) },
    // An f16 cache, GL's small tiles, the marked loops as loops.
    { heads: TINY_HEADS, tokens: 37, pos0: 29, mask: W(20), kvDtype: "f16" },
    { heads: H8, tokens: 40, pos0: 45, mask: SINKS(3, 17), maxTileBytes: 2560 },
    { heads: H8, tokens: 23, pos0: 50, mask: W(33), unroll: false },
  ] as PrefillCase[]
) {
  const { nHeads, nKvHeads, headDim: D } = c.heads;
  const T = c.tokens, pos0 = c.pos0;
  const extra = (c.tileRows ? ` tile ${c.tileRows}x${c.tileKeys}` : "") +
    (c.maxTileBytes ? ` tile <= ${c.maxTileBytes} B` : "") +
    (c.kvDtype ? ` kv ${c.kvDtype}` : "") + (c.unroll === false ? " plain loops" : "");
  const name = `attention prefill ${maskLabel(c.mask)} ${nHeads}/${nKvHeads}x${D} T=${T} ` +
    `pos0=${pos0}${extra}`;
  Deno.test(name, async () => {
    const gpu = await testGpu();
    const r = rng(3 * T + D + pos0);
    const nLayers = 2, layer = 1, slot = 1, len = pos0 + T;
    const maxBlocks = Math.ceil(len / 16) + 1;
    const cache = pagedCacheRef(r.next, {
      seqLens: [9, len, 30],
      nLayers,
      nKvHeads,
      headDim: D,
      maxBlocks,
      kvDtype: c.kvDtype,
    });
    const qPos = Array.from({ length: T }, (_, i) => pos0 + i);
    const poisoned = poisonUnseen(cache, slot, len, qPos, c.mask);
    const q = Float32Array.from(r.uniform(T * nHeads * D, 3));
    const gc = uploadCache(gpu, cache);
    const out = createStorage(gpu, T * nHeads * D * 4, new Float32Array(T * nHeads * D).fill(NaN));
    const chunk = createStorage(gpu, 16, chunkWords(slot, pos0, T));
    const forced = c.tileRows
      ? { tileRows: c.tileRows, tileKeys: c.tileKeys, maxTileBytes: 8192 }
      : { maxTileBytes: c.maxTileBytes };
    const d = attentionDispatch(gpu, { q: f32(gpu, q), ...gc, out, chunk }, {
      tokens: T,
      nHeads,
      nKvHeads,
      headDim: D,
      layer,
      nLayers,
      maxBlocks,
      kvDtype: c.kvDtype,
      unroll: c.unroll,
      mask: c.mask,
      ...forced,
    });
    await run(gpu, [d]);
    const want = attentionRef(q, {
      ...pagedKvRef(cache, { slot, layer, len }),
      qPos,
      nHeads,
      nKvHeads,
      headDim: D,
      mask: c.mask,
    });
    const got = await readF32(gpu, out, T * nHeads * D);
    assertClose(`${d.label} (${poisoned} blocks poisoned)`, got, want);
  });
}

Deno.test("attention prefill: the poisoned blocks are there to be avoided", async () => {
  // The same launch without the mask reads the poisoned blocks and comes out NaN: the mask
  // tests above would catch a kernel that reads a block no query sees.
  const gpu = await testGpu();
  const r = rng(99);
  const { nHeads, nKvHeads, headDim: D } = H8, T = 40, pos0 = 100, len = pos0 + T;
  const maxBlocks = Math.ceil(len / 16) + 1;
  const cache = pagedCacheRef(r.next, {
    seqLens: [len],
    nLayers: 1,
    nKvHeads,
    headDim: D,
    maxBlocks,
  });
  const qPos = Array.from({ length: T }, (_, i) => pos0 + i);
  assert.ok(poisonUnseen(cache, 0, len, qPos, W(30)) >= 4);
  const gc = uploadCache(gpu, cache);
  const out = createStorage(gpu, T * nHeads * D * 4);
  const chunk = createStorage(gpu, 16, chunkWords(0, pos0, T));
  const shape = { tokens: T, nHeads, nKvHeads, headDim: D, layer: 0, nLayers: 1, maxBlocks };
  const q = f32(gpu, r.uniform(T * nHeads * D, 3));
  await run(gpu, [attentionDispatch(gpu, { q, ...gc, out, chunk }, shape)]);
  assert.ok((await readF32(gpu, out, T * nHeads * D)).every(Number.isNaN));
  await run(gpu, [attentionDispatch(gpu, { q, ...gc, out, chunk }, { ...shape, mask: W(30) })]);
  assert.ok(!(await readF32(gpu, out, T * nHeads * D)).some(Number.isNaN));
});

interface DecodeCase {
  heads: { nHeads: number; nKvHeads: number; headDim: number };
  seqLens: number[];
  done?: number[];
  mask: AttentionMask;
  maxContext: number;
  splitSize?: number;
  threads?: number;
  maxTileBytes?: number;
  kvDtype?: KvDtype;
  unroll?: boolean;
}

const SINGLE = 1 << 30;
const RAGGED = [640, 1, 0, 77, 129, 16, 17, 300];
for (
  const c of [
    // A ragged batch under a window of 37: the plan's launch, one pass, splits.
    { heads: TINY_HEADS, seqLens: RAGGED, done: [3], mask: W(37), maxContext: 640 },
    {
      heads: TINY_HEADS,
      seqLens: RAGGED,
      done: [3],
      mask: W(37),
      maxContext: 640,
      splitSize: SINGLE,
    },
    { heads: TINY_HEADS, seqLens: RAGGED, mask: W(37), maxContext: 640, splitSize: 16 },
    // 64 threads (16-key chunks) in 8 splits, 128 threads (32-key chunks) in 5.
    {
      heads: TINY_HEADS,
      seqLens: RAGGED,
      done: [3],
      mask: SINKS(4, 50),
      maxContext: 640,
      splitSize: 80,
      threads: 64,
    },
    {
      heads: TINY_HEADS,
      seqLens: RAGGED,
      mask: SINKS(20, 30),
      maxContext: 640,
      splitSize: SINGLE,
      threads: 64,
    },
    { heads: TINY_HEADS, seqLens: RAGGED, mask: SINKS(70, 100), maxContext: 640 },
    {
      heads: TINY_HEADS,
      seqLens: RAGGED,
      done: [3],
      mask: CHUNK(100),
      maxContext: 640,
      splitSize: 128,
      threads: 128,
    },
    { heads: TINY_HEADS, seqLens: RAGGED, mask: CHUNK(64), maxContext: 640 },
    { heads: H8, seqLens: [1, 17, 130, 0], mask: W(1), maxContext: 160, splitSize: 32 },
    // A window wider than every slot: the causal answer through the masked pipeline.
    { heads: H8, seqLens: [1, 17, 130, 0], mask: W(4096), maxContext: 160, splitSize: 32 },
    // Long: 4096 keys under windows of 1000 and 4 sinks + 1000.
    { heads: TINY_HEADS, seqLens: [4096, 3000], mask: W(1000), maxContext: 4096 },
    { heads: TINY_HEADS, seqLens: [4096], mask: SINKS(4, 1000), maxContext: 4096, splitSize: 64 },
    // Head dim 128, MQA; an f16 cache; GL's small tiles; the marked loops as loops.
    {
      heads: { nHeads: 16, nKvHeads: 1, headDim: 128 },
      seqLens: [300, 5],
      done: [1],
      mask: W(70),
      maxContext: 300,
    },
    {
      heads: TINY_HEADS,
      seqLens: RAGGED,
      done: [3],
      mask: W(37),
      maxContext: 640,
      kvDtype: "f16",
    },
    {
      heads: TINY_HEADS,
      seqLens: [640, 1, 0, 77, 300],
      mask: SINKS(5, 40),
      maxContext: 640,
      maxTileBytes: 2560,
    },
    {
      heads: TINY_HEADS,
      seqLens: RAGGED,
      mask: W(37),
      maxContext: 640,
      splitSize: 80,
      unroll: false,
    },
  ] as DecodeCase[]
) {
  const { nHeads, nKvHeads, headDim: D } = c.heads;
  const { seqLens } = c;
  const S = seqLens.length;
  const extra =
    (c.splitSize === SINGLE ? " single pass" : c.splitSize ? ` split ${c.splitSize}` : "") +
    (c.threads ? ` threads <= ${c.threads}` : "") +
    (c.maxTileBytes ? ` tile <= ${c.maxTileBytes} B` : "") + (c.done ? ` done ${c.done}` : "") +
    (c.kvDtype ? ` kv ${c.kvDtype}` : "") + (c.unroll === false ? " plain loops" : "");
  const name = `attention decode ${maskLabel(c.mask)} ${nHeads}/${nKvHeads}x${D} lens ${seqLens}` +
    ` ctx ${c.maxContext}${extra}`;
  Deno.test(name, async () => {
    const gpu = await testGpu();
    const r = rng(17 + D + S);
    const nLayers = 2, layer = 1;
    const maxBlocks = Math.ceil(Math.max(...seqLens) / 16) + 1;
    const trashPos = (maxBlocks - 1) * 16;
    const finished = seqLens.map((len, s) => len === 0 || (c.done ?? []).includes(s));
    const pos = seqLens.map((len, s) => finished[s] ? trashPos : len - 1);
    const cache = pagedCacheRef(r.next, {
      seqLens: seqLens.map((len, s) => finished[s] ? len : len - 1),
      capacity: seqLens,
      nLayers,
      nKvHeads,
      headDim: D,
      maxBlocks,
      kvDtype: c.kvDtype,
    });
    let poisoned = 0;
    seqLens.forEach((len, s) => {
      if (len > 0) poisoned += poisonUnseen(cache, s, len, [len - 1], c.mask);
    });
    const kvDtype = cache.kvDtype;
    const qkv = Float32Array.from(r.uniform(S * (nHeads + 2 * nKvHeads) * D, 2));
    const invFreq = invFreqs(D);
    const gc = uploadCache(gpu, cache);
    const out = createStorage(gpu, S * nHeads * D * 4, new Float32Array(S * nHeads * D).fill(NaN));
    const shape = {
      seqs: S,
      nHeads,
      nKvHeads,
      headDim: D,
      layer,
      nLayers,
      maxBlocks,
      maxContext: c.maxContext,
      splitSize: c.splitSize,
      threads: c.threads,
      maxTileBytes: c.maxTileBytes,
      kvDtype,
      unroll: c.unroll,
      mask: c.mask,
    };
    // Its own scratch, full of NaN: splits past a slot's visits must never be read.
    const bytes = attentionDecodeScratchBytes(shape);
    const scratch = bytes
      ? createStorage(gpu, bytes, new Float32Array(bytes / 4).fill(NaN))
      : undefined;
    const ds = attentionDecodeDispatches(gpu, {
      qkv: f32(gpu, qkv),
      pos: u32(gpu, pos),
      invFreq: f32(gpu, invFreq),
      ...gc,
      seqLen: u32(gpu, seqLens),
      out,
      scratch,
    }, shape);
    await run(gpu, ds);
    const want = attentionDecodeRef(cache, qkv, {
      pos,
      seqLen: seqLens,
      invFreq,
      nHeads,
      layer,
      mask: c.mask,
    });
    const got = await readF32(gpu, out, S * nHeads * D);
    const n = nHeads * D;
    for (let s = 0; s < S; s++) {
      const label = `${ds[0].label}${ds.length > 1 ? " + combine" : ""} slot ${s} len ` +
        `${seqLens[s]}${finished[s] ? " done" : ""} (${poisoned} blocks poisoned)`;
      assertClose(label, got.subarray(s * n, (s + 1) * n), want.out.subarray(s * n, (s + 1) * n));
    }
    // Every running slot's new K and V in its place (the trash row: whichever finished slot).
    const kGot = await readPool(gpu, gc.kPool, want.kPool.length, kvDtype);
    const vGot = await readPool(gpu, gc.vPool, want.vPool.length, kvDtype);
    const rows = (x: Float32Array) =>
      Float32Array.from(
        seqLens.flatMap((_, s) =>
          finished[s] ? [] : Array.from({ length: nKvHeads }, (_, h) => {
            const o = pagedOffsetRef(cache, { slot: s, layer, pos: pos[s], head: h });
            return [...x.subarray(o, o + D)];
          }).flat()
        ),
      );
    assertPool("new k rows", rows(kGot), rows(want.kPool));
    assertPool("new v rows", rows(vGot), rows(want.vPool));
  });
}

for (const kvDtype of ["f32", "f16"] as KvDtype[]) {
  Deno.test(`attention decode, verification pass under a window of 9, kv ${kvDtype}`, async () => {
    // Speculation's rows (rowsPerSeq): rope_kv writes every row's K and V, then each row
    // attends, under the mask, the keys up to its own position.
    const gpu = await testGpu();
    const r = rng(41);
    const { nHeads, nKvHeads, headDim: D } = H8, R = 4, nLayers = 1, layer = 0;
    const mask = W(9);
    const lens = [40, 3, 75];
    const S = lens.length, rows = S * R;
    const maxBlocks = Math.ceil((Math.max(...lens) + R) / 16) + 1;
    const cache = pagedCacheRef(r.next, {
      seqLens: lens,
      capacity: lens.map((l) => l + R),
      nLayers,
      nKvHeads,
      headDim: D,
      maxBlocks,
      kvDtype,
    });
    lens.forEach((l, s) => poisonUnseen(cache, s, l + R, [l], mask));
    const rowSlot = Array.from({ length: rows }, (_, i) => Math.floor(i / R));
    const pos = rowSlot.map((s, i) => lens[s] + (i % R));
    const seqLen = pos.map((p) => p + 1);
    const qkv = Float32Array.from(r.uniform(rows * (nHeads + 2 * nKvHeads) * D, 2));
    const invFreq = invFreqs(D);
    const gc = uploadCache(gpu, cache);
    const out = createStorage(gpu, rows * nHeads * D * 4);
    const qkvBuf = f32(gpu, qkv), posBuf = u32(gpu, pos), freqBuf = f32(gpu, invFreq);
    const heads = { nHeads, nKvHeads, headDim: D, layer, nLayers, maxBlocks, kvDtype };
    await run(gpu, [
      ropeKvDispatch(gpu, {
        qkv: qkvBuf,
        q: createStorage(gpu, rows * nHeads * D * 4),
        kPool: gc.kPool,
        vPool: gc.vPool,
        pos: posBuf,
        tokSeq: u32(gpu, rowSlot),
        blockTable: gc.blockTable,
        invFreq: freqBuf,
      }, { tokens: rows, ...heads }),
      ...attentionDecodeDispatches(gpu, {
        qkv: qkvBuf,
        pos: posBuf,
        invFreq: freqBuf,
        ...gc,
        seqLen: u32(gpu, seqLen),
        out,
      }, { seqs: rows, maxContext: 80, splitSize: 16, rowsPerSeq: R, mask, ...heads }),
    ]);
    const virtual = { ...cache, blockTable: new Uint32Array(rows * maxBlocks) };
    rowSlot.forEach((s, i) => {
      virtual.blockTable.set(
        cache.blockTable.subarray(s * maxBlocks, (s + 1) * maxBlocks),
        i * maxBlocks,
      );
    });
    const want = attentionDecodeRef(virtual, qkv, { pos, seqLen, invFreq, nHeads, layer, mask });
    const got = await readF32(gpu, out, rows * nHeads * D);
    assertClose(`verify rows under ${maskLabel(mask)}`, got, want.out);
  });
}

Deno.test("attention decode: the poisoned blocks are there to be avoided", async () => {
  // Causal decode over a window's poisoned cache reads NaN; the windowed launch does not.
  const gpu = await testGpu();
  const r = rng(98);
  const { nHeads, nKvHeads, headDim: D } = H8, lens = [200, 90], S = 2;
  const maxBlocks = Math.ceil(200 / 16) + 1;
  const cache = pagedCacheRef(r.next, {
    seqLens: lens.map((l) => l - 1),
    capacity: lens,
    nLayers: 1,
    nKvHeads,
    headDim: D,
    maxBlocks,
  });
  lens.forEach((l, s) => poisonUnseen(cache, s, l, [l - 1], W(40)));
  const gc = uploadCache(gpu, cache);
  const out = createStorage(gpu, S * nHeads * D * 4);
  const buffers = {
    qkv: f32(gpu, r.uniform(S * (nHeads + 2 * nKvHeads) * D, 2)),
    pos: u32(gpu, lens.map((l) => l - 1)),
    invFreq: f32(gpu, invFreqs(D)),
    ...gc,
    seqLen: u32(gpu, lens),
    out,
  };
  const shape = { seqs: S, nHeads, nKvHeads, headDim: D, layer: 0, nLayers: 1, maxBlocks };
  await run(gpu, attentionDecodeDispatches(gpu, buffers, { ...shape, maxContext: 200 }));
  assert.ok((await readF32(gpu, out, S * nHeads * D)).every(Number.isNaN));
  await run(
    gpu,
    attentionDecodeDispatches(gpu, buffers, { ...shape, maxContext: 200, mask: W(40) }),
  );
  assert.ok(!(await readF32(gpu, out, S * nHeads * D)).some(Number.isNaN));
});

Deno.test("attention decode plan: a window plans for the window, not the context", () => {
  const shape = { seqs: 1, nHeads: 32, nKvHeads: 4, headDim: 64 };
  const windowed = decodePlan({ ...shape, maxContext: 131072, mask: W(2048) });
  assert.deepEqual(windowed, decodePlan({ ...shape, maxContext: 2048 }));
  assert.deepEqual(windowed, { splits: 32, rowGroups: 2, threads: 256 });
  assert.deepEqual(decodePlan({ ...shape, maxContext: 131072 }), {
    splits: 64,
    rowGroups: 1,
    threads: 256,
  });
});
