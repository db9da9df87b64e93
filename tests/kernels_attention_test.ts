/**
 * rope_kv, attention (prefill) and attention_decode (RoPE and KV write included) against the
 * float64 references, on seeded random paged caches with shuffled physical blocks and NaN wherever
 * no valid token lives.
 */
import assert from "node:assert/strict";
import type { KvDtype } from "../gpu/dtype.ts";
import { createStorage, type Gpu, readF32 } from "../gpu/device.ts";
import { attentionDispatch, attentionTile, chunkWords } from "../kernels/attention.ts";
import {
  attentionDecodeDispatches,
  attentionDecodeGeometry,
  attentionDecodeScratchBytes,
  decodePlan,
} from "../kernels/attention_decode.ts";
import { type Dispatch, run } from "../gpu/dispatch.ts";
import {
  attentionDecodeRef,
  attentionRef,
  kvRound,
  pagedCacheRef,
  pagedKvRef,
  pagedOffsetRef,
  ropeKvRef,
} from "../kernels/reference.ts";
import { ropeKvDispatch } from "../kernels/rope_kv.ts";
import { assertClose, rng, testGpu } from "./util.ts";
import {
  acceptAnyTrashWriter,
  assertPool,
  f32,
  invFreqs,
  llama3InvFreqs,
  readPool,
  u32,
  uploadCache,
} from "./attention_util.ts";

interface RopeCase {
  nHeads: number;
  nKvHeads: number;
  headDim: number;
  /** (slot, position) of each token; positions ≥ 16·maxBlocks test the no-write guard. */
  toks: [number, number][];
  kvDtype?: KvDtype;
}

for (
  const c of [
    { nHeads: 8, nKvHeads: 2, headDim: 64, toks: [[0, 5], [2, 16], [1, 0], [0, 6], [2, 17]] },
    { nHeads: 4, nKvHeads: 1, headDim: 24, toks: [[1, 31], [0, 100003], [1, 32], [0, 262143]] },
    { nHeads: 2, nKvHeads: 2, headDim: 128, toks: [[0, 47], [0, 15], [1, 4097]] },
    // An f16 cache: two elements per word, head dims 64 and 18 (odd pairs per half).
    { nHeads: 8, nKvHeads: 2, headDim: 64, toks: [[0, 5], [2, 16], [1, 63]], kvDtype: "f16" },
    { nHeads: 2, nKvHeads: 1, headDim: 18, toks: [[1, 31], [0, 2], [2, 70]], kvDtype: "f16" },
  ] as RopeCase[]
) {
  const { nHeads, nKvHeads, headDim: D } = c;
  const kvDtype = c.kvDtype ?? "f32";
  const kvName = c.kvDtype ? ` kv ${c.kvDtype}` : "";
  Deno.test(`rope_kv ${nHeads}/${nKvHeads}x${D} T=${c.toks.length}${kvName}`, async () => {
    const gpu = await testGpu();
    const r = rng(11 + D);
    const nLayers = 3, layer = 1, maxBlocks = 4;
    const cache = pagedCacheRef(r.next, {
      seqLens: [3, 20, 17],
      capacity: [64, 64, 64],
      nLayers,
      nKvHeads,
      headDim: D,
      maxBlocks,
      kvDtype,
    });
    const T = c.toks.length, width = (nHeads + 2 * nKvHeads) * D;
    const qkv = r.uniform(T * width, 2);
    const pos = c.toks.map(([, p]) => p), tokSeq = c.toks.map(([s]) => s);
    const invFreq = invFreqs(D);
    const gc = uploadCache(gpu, cache);
    const q = createStorage(gpu, T * nHeads * D * 4);
    await run(gpu, [
      ropeKvDispatch(gpu, {
        qkv: f32(gpu, qkv),
        q,
        ...gc,
        pos: u32(gpu, pos),
        tokSeq: u32(gpu, tokSeq),
        invFreq: f32(gpu, invFreq),
      }, { tokens: T, nHeads, nKvHeads, headDim: D, layer, nLayers, maxBlocks, kvDtype }),
    ]);
    const want = ropeKvRef(Float32Array.from(qkv), { pos, invFreq, nHeads, nKvHeads, headDim: D });
    assertClose("rope q", await readF32(gpu, q, T * nHeads * D), want.q);
    const kWant = cache.kPool.slice(), vWant = cache.vPool.slice();
    const round = kvRound(kvDtype);
    c.toks.forEach(([slot, p], t) => {
      if (p >= 16 * maxBlocks) return;
      for (let h = 0; h < nKvHeads; h++) {
        const o = pagedOffsetRef(cache, { slot, layer, pos: p, head: h });
        for (let d = 0; d < D; d++) {
          kWant[o + d] = round(want.k[(t * nKvHeads + h) * D + d]);
          vWant[o + d] = round(want.v[(t * nKvHeads + h) * D + d]);
        }
      }
    });
    assertPool("rope k pool", await readPool(gpu, gc.kPool, kWant.length, kvDtype), kWant);
    assertPool("rope v pool", await readPool(gpu, gc.vPool, vWant.length, kvDtype), vWant);
  });
}

interface PrefillCase {
  nHeads: number;
  nKvHeads: number;
  headDim: number;
  tokens: number;
  pos0: number;
  scale?: number;
  tokenOffset?: number;
  /** Caps workgroup memory: smaller tiles than the adapter's default (as on GL). */
  maxTileBytes?: number;
  /** Forces the tile (with a `maxTileBytes` that lets it fit everywhere). */
  tileRows?: number;
  tileKeys?: number;
  kvDtype?: KvDtype;
  /** Rows the launch is built for (default `tokens`); rows past `tokens` must stay untouched. */
  capacity?: number;
  /** False: the kernel's `// @unroll` loops compiled as loops. */
  unroll?: boolean;
}

const TINY_HEADS = { nHeads: 32, nKvHeads: 4, headDim: 64 }; // TinyLlama's heads: GQA 8
for (
  const c of [
    { nHeads: 8, nKvHeads: 2, headDim: 64, tokens: 40, pos0: 0 },
    { nHeads: 8, nKvHeads: 2, headDim: 64, tokens: 40, pos0: 5, maxTileBytes: 2560 },
    { nHeads: 8, nKvHeads: 2, headDim: 64, tokens: 1, pos0: 0 },
    { nHeads: 4, nKvHeads: 1, headDim: 128, tokens: 7, pos0: 21, tokenOffset: 3 },
    { nHeads: 3, nKvHeads: 3, headDim: 24, tokens: 1, pos0: 37, scale: 0.3 },
    { nHeads: 3, nKvHeads: 3, headDim: 128, tokens: 19, pos0: 16 },
    { nHeads: 4, nKvHeads: 2, headDim: 64, tokens: 520, pos0: 13 },
    // GQA 8: odd T, pos0 mid-block; then few queries over many cached keys.
    { ...TINY_HEADS, tokens: 37, pos0: 29 },
    { ...TINY_HEADS, tokens: 9, pos0: 200 },
    // The engine's prefill chunk: 256 tokens after 256 cached.
    { ...TINY_HEADS, tokens: 256, pos0: 256 },
    // 2080 rows: a long chunk, so 64 x 32 tiles where they fit (lavapipe at head dim 24), with
    // a ragged last row tile.
    { nHeads: 16, nKvHeads: 2, headDim: 24, tokens: 260, pos0: 7 },
    // GQA 2 at head dim 80 (20 vec4: dim groups that do not divide the threads); MHA at 32.
    { nHeads: 8, nKvHeads: 4, headDim: 80, tokens: 23, pos0: 50 },
    { nHeads: 4, nKvHeads: 4, headDim: 32, tokens: 45, pos0: 3 },
    // Head dim 18: the last vec4 of each row is half padding.
    { nHeads: 2, nKvHeads: 1, headDim: 18, tokens: 11, pos0: 4 },
    { nHeads: 8, nKvHeads: 2, headDim: 256, tokens: 5, pos0: 30, maxTileBytes: 9000 },
    // Forced tiles: 64 keys (four blocks per tile, ragged last tile), 12 rows (3 row groups),
    // 8 x 8 (two tiles per block).
    { nHeads: 6, nKvHeads: 2, headDim: 8, tokens: 70, pos0: 9, tileRows: 4, tileKeys: 64 },
    { nHeads: 4, nKvHeads: 1, headDim: 16, tokens: 33, pos0: 47, tileRows: 12, tileKeys: 16 },
    { nHeads: 8, nKvHeads: 2, headDim: 64, tokens: 40, pos0: 5, tileRows: 8, tileKeys: 8 },
    // An f16 cache: GQA 8 after cached keys, and head dim 18 (rows of 9 words).
    { ...TINY_HEADS, tokens: 37, pos0: 29, kvDtype: "f16" },
    { nHeads: 2, nKvHeads: 1, headDim: 18, tokens: 11, pos0: 4, kvDtype: "f16" },
    // Launches built for more rows than the chunk has (the engine builds one per size class).
    { ...TINY_HEADS, tokens: 37, pos0: 29, capacity: 64 },
    { nHeads: 4, nKvHeads: 2, headDim: 64, tokens: 1, pos0: 70, capacity: 512 },
    { nHeads: 8, nKvHeads: 2, headDim: 64, tokens: 40, pos0: 5, capacity: 41, tokenOffset: 2 },
    // The marked loops compiled as loops (what the GPU sweep measures against their expansion).
    { ...TINY_HEADS, tokens: 37, pos0: 29, unroll: false },
    { nHeads: 8, nKvHeads: 2, headDim: 80, tokens: 23, pos0: 50, unroll: false },
  ] as PrefillCase[]
) {
  const { nHeads, nKvHeads, headDim: D, tokens: T, pos0 } = c;
  const name = `attention prefill ${nHeads}/${nKvHeads}x${D} T=${T} pos0=${pos0}`;
  const extra = (c.tokenOffset ? ` offset ${c.tokenOffset}` : "") +
    (c.maxTileBytes ? ` tile <= ${c.maxTileBytes} B` : "") +
    (c.tileRows ? ` tile ${c.tileRows}x${c.tileKeys}` : "") +
    (c.kvDtype ? ` kv ${c.kvDtype}` : "") +
    (c.capacity ? ` launch for ${c.capacity}` : "") + (c.unroll === false ? " plain loops" : "");
  Deno.test(name + extra, async () => {
    const gpu = await testGpu();
    const r = rng(7 * T + D);
    const nLayers = 2, layer = 1, slot = 1, len = pos0 + T, cap = c.capacity ?? T;
    const maxBlocks = Math.ceil(Math.max(len, cap) / 16) + 1;
    const cache = pagedCacheRef(r.next, {
      seqLens: [9, len, 30],
      nLayers,
      nKvHeads,
      headDim: D,
      maxBlocks,
      kvDtype: c.kvDtype,
    });
    const row0 = c.tokenOffset ?? 0, rows = row0 + cap;
    // Peaky softmax (|scores| of several units), so the max and rescaling really matter.
    const q = Float32Array.from(r.uniform(rows * nHeads * D, 3));
    const gc = uploadCache(gpu, cache);
    // Prefilled with NaN: every output element of the chunk's rows must be written.
    const out = createStorage(
      gpu,
      rows * nHeads * D * 4,
      new Float32Array(rows * nHeads * D).fill(NaN),
    );
    const chunk = createStorage(gpu, 16, chunkWords(slot, pos0, T));
    const opts = { tokens: cap, nHeads, nKvHeads, headDim: D, layer, nLayers, maxBlocks };
    const forced = c.tileRows
      ? { tileRows: c.tileRows, tileKeys: c.tileKeys, maxTileBytes: 8192 }
      : {};
    const d = attentionDispatch(gpu, { q: f32(gpu, q), ...gc, out, chunk }, {
      ...opts,
      scale: c.scale,
      tokenOffset: c.tokenOffset,
      maxTileBytes: c.maxTileBytes,
      kvDtype: c.kvDtype,
      unroll: c.unroll,
      ...forced,
    });
    await run(gpu, [d]);
    const qPos = Array.from({ length: T }, (_, i) => pos0 + i);
    const want = attentionRef(q.subarray(row0 * nHeads * D), {
      ...pagedKvRef(cache, { slot, layer, len }),
      qPos,
      nHeads,
      nKvHeads,
      headDim: D,
      scale: c.scale,
    });
    const got = await readF32(gpu, out, T * nHeads * D, row0 * nHeads * D * 4);
    assertClose(`${d.label} wg ${d.workgroups}`, got, want);
    if (cap > T) {
      const past = await readF32(gpu, out, (cap - T) * nHeads * D, (row0 + T) * nHeads * D * 4);
      assert.ok(past.every(Number.isNaN), "a row past the chunk's was written");
    }
  });
}

interface DecodeCase {
  nHeads: number;
  nKvHeads: number;
  headDim: number;
  /** Keys each slot attends after the step, its new token included (0: an empty slot). */
  seqLens: number[];
  /**
   * Finished slots: the step writes their token at the trash position, and they attend their
   * `seqLen` old keys (as step_begin leaves them). Slots with `seqLen` 0 are always finished.
   */
  done?: number[];
  maxContext: number;
  /** Forces the split count (`1 << 30`: a single pass); default: the plan's. */
  splitSize?: number;
  /** Workgroups per kv head at least; default: the plan's. */
  minRowGroups?: number;
  /** Threads of `main` at most; default: the plan's. */
  threads?: number;
  ownScratch?: boolean;
  maxTileBytes?: number;
  /** Llama 3.1's rope scaling (theta 500000, factor 8) instead of plain theta 10000. */
  llama3?: boolean;
  kvDtype?: KvDtype;
  /** False: the kernels' `// @unroll` loops compiled as loops. */
  unroll?: boolean;
}

const SINGLE = 1 << 30;
// Three splits of 16 keys at head dim 24, three slots.
const THREE_SPLITS = {
  nHeads: 4,
  nKvHeads: 1,
  headDim: 24,
  seqLens: [33, 5, 50],
  maxContext: 40,
  splitSize: 16,
};
const RAGGED = [640, 1, 0, 77, 129, 16, 17, 300];
// GQA 8 at head dim 128, four slots around the 16-key block edges, slot 0 finished.
const HEADS_128 = {
  nHeads: 16,
  nKvHeads: 2,
  headDim: 128,
  seqLens: [1, 16, 17, 129],
  done: [0],
  maxContext: 256,
};
for (
  const c of [
    {
      nHeads: 8,
      nKvHeads: 2,
      headDim: 64,
      seqLens: [1, 17, 130, 0],
      maxContext: 160,
      splitSize: 32,
    },
    // Small tiles (as on GL): fewer rows than q heads per kv head, so several workgroups per
    // (slot, kv head) each write the new token before reading it.
    {
      nHeads: 8,
      nKvHeads: 2,
      headDim: 64,
      seqLens: [1, 17, 130, 0],
      maxContext: 160,
      splitSize: 32,
      maxTileBytes: 2560,
    },
    { nHeads: 4, nKvHeads: 4, headDim: 128, seqLens: [130, 1, 17], done: [2], maxContext: 200 },
    // Three splits, yet every slot fits one chunk: splits 1 and 2 of the NaN scratch stay unread.
    { ...THREE_SPLITS, ownScratch: true },
    // GQA 8, batch 8, ragged: one pass over up to 10 chunks, then 8 splits; one finished slot.
    { ...TINY_HEADS, seqLens: RAGGED, done: [3], maxContext: 640, splitSize: SINGLE },
    { ...TINY_HEADS, seqLens: RAGGED, done: [3], maxContext: 2048, llama3: true },
    // Batch 1, long contexts: 32 and 64 splits of one chunk; a slot far past maxContext.
    { ...TINY_HEADS, seqLens: [2001], maxContext: 2048, llama3: true },
    { ...TINY_HEADS, seqLens: [4096], maxContext: 4096 },
    { ...TINY_HEADS, seqLens: [1500, 3], maxContext: 512, ownScratch: true },
    // Small tiles: one q head per workgroup (8 workgroups per kv head), 32-key chunks.
    {
      ...TINY_HEADS,
      seqLens: [640, 1, 0, 77, 300],
      done: [4],
      maxContext: 640,
      maxTileBytes: 2560,
    },
    // Group 5, and 10 q heads per kv head as two row groups; the new key is the last of chunk 0
    // (len 64) or the first of chunk 1 (len 65).
    { nHeads: 10, nKvHeads: 2, headDim: 64, seqLens: [200, 64, 65], maxContext: 256 },
    {
      nHeads: 10,
      nKvHeads: 2,
      headDim: 64,
      seqLens: [200, 64, 65],
      maxContext: 256,
      splitSize: 64,
    },
    // MQA, 16 q heads: two row groups over five splits.
    { nHeads: 16, nKvHeads: 1, headDim: 128, seqLens: [300, 5], done: [1], maxContext: 300 },
    { ...HEADS_128, splitSize: 32, llama3: true },
    { nHeads: 4, nKvHeads: 2, headDim: 256, seqLens: [100, 37], maxContext: 128, splitSize: 64 },
    // An f16 cache: GQA 8 ragged in a single pass and split, head dim 24 (a pair straddles vec4s).
    {
      ...TINY_HEADS,
      seqLens: RAGGED,
      done: [3],
      maxContext: 640,
      splitSize: SINGLE,
      kvDtype: "f16",
    },
    { ...TINY_HEADS, seqLens: [640, 1, 0, 77, 300], done: [4], maxContext: 640, kvDtype: "f16" },
    { ...THREE_SPLITS, kvDtype: "f16" },
    // Plans of small and middling batches: 2 q heads per workgroup over 10 splits (batch 1 at
    // 640 keys), two row groups in one pass (48 slots at 640).
    { ...TINY_HEADS, seqLens: RAGGED, done: [3], maxContext: 640, splitSize: 64, minRowGroups: 4 },
    { ...TINY_HEADS, seqLens: RAGGED, maxContext: 640, splitSize: SINGLE, minRowGroups: 2 },
    // Smaller workgroups, as the plan picks from 8 slots up: 128 threads (32-key chunks) in 5
    // splits, 64 threads (16-key chunks) in 8, one pass, and more splits than a short slot has
    // chunks; an f16 cache; head dims 128 and 256 (a P·V thread holds 8 and 16 keys).
    { ...TINY_HEADS, seqLens: RAGGED, done: [3], maxContext: 640, splitSize: 128, threads: 128 },
    { ...TINY_HEADS, seqLens: RAGGED, done: [3], maxContext: 640, splitSize: 80, threads: 64 },
    { ...TINY_HEADS, seqLens: RAGGED, maxContext: 640, splitSize: SINGLE, threads: 64 },
    {
      ...TINY_HEADS,
      seqLens: [640, 1, 0, 77, 300],
      done: [4],
      maxContext: 640,
      splitSize: 16,
      threads: 64,
      kvDtype: "f16",
    },
    { ...HEADS_128, splitSize: 48, threads: 64 },
    { nHeads: 4, nKvHeads: 2, headDim: 256, seqLens: [100, 37], maxContext: 128, threads: 128 },
    // The marked loops compiled as loops (what the GPU sweep measures against their expansion):
    // one pass, and splits with their combine.
    {
      ...TINY_HEADS,
      seqLens: RAGGED,
      done: [3],
      maxContext: 640,
      splitSize: SINGLE,
      unroll: false,
    },
    { ...TINY_HEADS, seqLens: RAGGED, done: [3], maxContext: 640, splitSize: 80, unroll: false },
  ] as DecodeCase[]
) {
  const { nHeads, nKvHeads, headDim: D, seqLens } = c;
  const S = seqLens.length;
  const split = c.splitSize === SINGLE
    ? " single pass"
    : c.splitSize
    ? ` split ${c.splitSize}`
    : "";
  const extra = split + (c.minRowGroups ? ` row groups >= ${c.minRowGroups}` : "") +
    (c.threads ? ` threads <= ${c.threads}` : "") +
    (c.maxTileBytes ? ` tile <= ${c.maxTileBytes} B` : "") +
    (c.done ? ` done ${c.done}` : "") + (c.llama3 ? " llama3" : "") +
    (c.kvDtype ? ` kv ${c.kvDtype}` : "") + (c.unroll === false ? " plain loops" : "");
  const name = `attention decode ${nHeads}/${nKvHeads}x${D} lens ${seqLens} ctx ${c.maxContext}`;
  Deno.test(name + extra, async () => {
    const gpu = await testGpu();
    const r = rng(5 + D + S);
    const nLayers = 2, layer = 1;
    const maxBlocks = Math.ceil(Math.max(...seqLens) / 16) + 1;
    const trashPos = (maxBlocks - 1) * 16; // table column maxBlocks - 1: the trash block 0
    const finished = seqLens.map((len, s) => len === 0 || (c.done ?? []).includes(s));
    const pos = seqLens.map((len, s) => finished[s] ? trashPos : len - 1);
    // A running slot's new position is NaN in the cache: the kernel must write it before use.
    const cache = pagedCacheRef(r.next, {
      seqLens: seqLens.map((len, s) => finished[s] ? len : len - 1),
      capacity: seqLens,
      nLayers,
      nKvHeads,
      headDim: D,
      maxBlocks,
      kvDtype: c.kvDtype,
    });
    const kvDtype = cache.kvDtype;
    const width = (nHeads + 2 * nKvHeads) * D;
    const qkv = Float32Array.from(r.uniform(S * width, 2));
    const invFreq = c.llama3 ? llama3InvFreqs(D) : invFreqs(D);
    const gc = uploadCache(gpu, cache);
    // Prefilled with NaN: the seqLen-0 slot must come out as zeros, not stale values.
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
      minRowGroups: c.minRowGroups,
      threads: c.threads,
      maxTileBytes: c.maxTileBytes,
      kvDtype,
      unroll: c.unroll,
    };
    // An own scratch full of NaN: splits past a slot's end must never be read.
    const bytes = attentionDecodeScratchBytes(shape);
    const scratch = c.ownScratch
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

    const want = attentionDecodeRef(cache, qkv, { pos, seqLen: seqLens, invFreq, nHeads, layer });
    const got = await readF32(gpu, out, S * nHeads * D);
    const n = nHeads * D;
    for (let s = 0; s < S; s++) {
      const label = `${ds[0].label} slot ${s} len ${seqLens[s]}${finished[s] ? " done" : ""}`;
      assertClose(label, got.subarray(s * n, (s + 1) * n), want.out.subarray(s * n, (s + 1) * n));
    }
    // The pools: every new token in its place, the finished slots' in the trash row, nothing
    // else touched.
    const kGot = await readPool(gpu, gc.kPool, want.kPool.length, kvDtype);
    const vGot = await readPool(gpu, gc.vPool, want.vPool.length, kvDtype);
    const writers = seqLens.flatMap((_, s) => finished[s] ? [s] : []);
    if (writers.length > 1) {
      const rot = ropeKvRef(qkv, { pos, invFreq, nHeads, nKvHeads, headDim: D });
      const rows = Array.from(
        { length: nKvHeads },
        (_, head) => pagedOffsetRef(cache, { slot: writers[0], layer, pos: trashPos, head }),
      );
      const round = kvRound(kvDtype);
      const of = (x: Float64Array) =>
        writers.map((s) => x.subarray(s * nKvHeads * D, (s + 1) * nKvHeads * D).map(round));
      acceptAnyTrashWriter(want.kPool, kGot, rows, of(rot.k), D);
      acceptAnyTrashWriter(want.vPool, vGot, rows, of(rot.v), D);
    }
    assertPool("decode k pool", kGot, want.kPool);
    assertPool("decode v pool", vGot, want.vPool);
  });
}

for (const kvDtype of ["f32", "f16"] as KvDtype[]) {
  Deno.test(`attention decode writes the KV that rope_kv writes, trash included, kv ${kvDtype}`, async () => {
    const gpu = await testGpu();
    const r = rng(77);
    const nHeads = 8, nKvHeads = 2, D = 64, nLayers = 2, layer = 0, maxBlocks = 6;
    const seqLens = [17, 1, 65, 40], pos = [16, 0, 64, 80]; // slot 3 finished: the trash position
    const cache = pagedCacheRef(r.next, {
      seqLens: [16, 0, 64, 40],
      capacity: seqLens,
      nLayers,
      nKvHeads,
      headDim: D,
      maxBlocks,
      kvDtype,
    });
    const qkv = f32(gpu, r.uniform(4 * (nHeads + 2 * nKvHeads) * D, 2));
    const invFreq = f32(gpu, llama3InvFreqs(D));
    const heads = { nHeads, nKvHeads, headDim: D, layer, nLayers, maxBlocks, kvDtype };
    const a = uploadCache(gpu, cache), b = uploadCache(gpu, cache);
    const out = createStorage(gpu, 4 * nHeads * D * 4);
    await run(gpu, [
      ropeKvDispatch(gpu, {
        qkv,
        q: createStorage(gpu, 4 * nHeads * D * 4),
        ...a,
        pos: u32(gpu, pos),
        tokSeq: u32(gpu, [0, 1, 2, 3]),
        invFreq,
      }, { tokens: 4, ...heads }),
      ...attentionDecodeDispatches(gpu, {
        qkv,
        pos: u32(gpu, pos),
        invFreq,
        ...b,
        seqLen: u32(gpu, seqLens),
        out,
      }, { seqs: 4, ...heads, maxContext: 96, splitSize: 32 }),
    ]);
    const elems = cache.kPool.length;
    const read = (pool: GPUBuffer) => readPool(gpu, pool, elems, kvDtype);
    const [ka, kb] = [await read(a.kPool), await read(b.kPool)];
    const [va, vb] = [await read(a.vPool), await read(b.vPool)];
    // Same f32 arithmetic (rope_common.wgsl) on the same inputs: equal up to FMA contraction.
    assertPool("k pool vs rope_kv", kb, ka);
    assertPool("v pool vs rope_kv", vb, va);
    const trash = pagedOffsetRef(cache, { slot: 3, layer, pos: 80, head: 1 });
    assert.ok(!Number.isNaN(kb[trash]) && kb[trash] === ka[trash], "trash row written");
  });
}

Deno.test("attention decode: the launch plan on the shapes it was fitted on", async () => {
  const gpu = await testGpu();
  const b = createStorage(gpu, 16);
  const buffers = {
    qkv: b,
    pos: b,
    invFreq: b,
    kPool: b,
    vPool: b,
    blockTable: b,
    seqLen: b,
    out: b,
  };
  const shapeOf = (seqs: number, maxContext: number, extra = {}) => ({
    seqs,
    nHeads: 32,
    nKvHeads: 4,
    headDim: 64,
    layer: 0,
    nLayers: 22,
    maxBlocks: 1,
    maxContext,
    ...extra,
  });
  const plan = (seqs: number, maxContext: number, extra = {}) => {
    const shape = shapeOf(seqs, maxContext, extra);
    const ds = attentionDecodeDispatches(gpu, buffers, shape);
    const bytes = attentionDecodeScratchBytes(shape);
    assert.equal(bytes === 0, ds.length === 1, `${ds[0].label}: ${bytes} bytes of scratch`);
    return ds.map((d) => d.label.replace(/^.* L0 \S+ /, "")).join(" + ");
  };
  assert.equal(plan(64, 4096), "4 splits + combine");
  assert.equal(plan(1, 256), "single pass");
  assert.equal(plan(1, 2048), "32 splits + combine");
  assert.equal(plan(1, 8192), "64 splits + combine");
  assert.equal(plan(20, 640), "8 splits + combine");
  assert.equal(plan(1, 2048, { splitSize: 1 << 30 }), "single pass");
  assert.equal(
    plan(1, 2048, { headDim: 256, nHeads: 8, nKvHeads: 4, splitSize: 16 }),
    "16 splits + combine",
  );
  assert.throws(() => plan(1, 64, { headDim: 66 }), /head dim/);
  assert.throws(() => plan(1, 64, { splitSize: 0 }), /splitSize/);
  // Workgroups per kv head, as the plan asks and the memory budget allows (on GL the budget
  // alone may ask more).
  const rowGroups = (seqs: number, maxContext: number, extra = {}) =>
    attentionDecodeDispatches(gpu, buffers, shapeOf(seqs, maxContext, extra))[0].workgroups[1] / 4;
  assert.ok(rowGroups(1, 2048) >= 2 && rowGroups(4, 640) >= 2);
  for (const [seqs, maxContext, groups] of [[1, 640, 4], [8, 768, 2], [32, 2048, 1]]) {
    assert.equal(
      rowGroups(seqs, maxContext),
      rowGroups(seqs, maxContext, { minRowGroups: groups }),
      `${seqs} slots at ${maxContext}`,
    );
  }
});

Deno.test("attention decode plan: the H200 sweep's best launches", () => {
  // Threads / row groups / splits that the sweeps measured fastest (BENCHMARKS.md, 2026-12-01)
  // and the model picks; at 32 slots and 768 keys the row holds the model's pick, 0.6 µs per
  // layer off the best (35.8 against 35.2 µs for 128 threads in 5 splits).
  const best: [number, number, string][] = [
    [1, 640, "128/4/20"],
    [4, 640, "128/2/20"],
    [8, 640, "128/1/20"],
    [24, 640, "64/1/10"],
    [32, 640, "128/1/5"],
    [48, 640, "64/1/5"],
    [64, 640, "64/1/4"],
    [1, 2048, "256/2/32"],
    [4, 2048, "128/1/32"],
    [8, 2048, "64/1/32"],
    [16, 2048, "64/1/16"],
    [24, 2048, "64/1/10"],
    [32, 2048, "64/1/8"],
    [64, 2048, "64/1/4"],
    [1, 768, "128/4/24"],
    [8, 768, "128/2/12"],
    [20, 768, "128/1/8"],
    [40, 768, "128/1/4"],
    [32, 768, "64/1/8"],
    [2, 1024, "128/2/32"],
    [28, 1024, "64/1/8"],
    [56, 1024, "64/1/4"],
    [48, 1536, "64/1/5"],
    [1, 4096, "256/1/64"],
    [8, 4096, "64/1/32"],
    [32, 4096, "64/1/8"],
  ];
  for (const [seqs, maxContext, want] of best) {
    const p = decodePlan({ seqs, nHeads: 32, nKvHeads: 4, headDim: 64, maxContext });
    assert.equal(`${p.threads}/${p.rowGroups}/${p.splits}`, want, `${seqs} slots at ${maxContext}`);
  }
  // Short contexts keep one pass of 256 threads; what is given is kept.
  const tiny = { seqs: 1, nHeads: 32, nKvHeads: 4, headDim: 64, maxContext: 256 };
  assert.deepEqual(decodePlan(tiny), { splits: 1, rowGroups: 4, threads: 256 });
  assert.equal(decodePlan({ ...tiny, maxContext: 2048, threads: 64 }).threads, 64);
  assert.equal(decodePlan({ ...tiny, maxContext: 2048, splitSize: 100 }).splits, 21);
  assert.throws(() => decodePlan({ ...tiny, threads: 96 }), /threads/);
  // Partials stay within a 128 MiB binding (without that cap, 64 q heads of 128 at 256 slots and
  // 32 768 keys took 20 splits: 165 MiB).
  for (const [nHeads, nKvHeads, headDim] of [[32, 4, 64], [64, 8, 128], [32, 8, 128]]) {
    for (const seqs of [64, 128, 256, 512]) {
      for (const maxContext of [8192, 32768]) {
        const big = { seqs, nHeads, nKvHeads, headDim, maxContext };
        assert.ok(attentionDecodeScratchBytes(big) <= 128 * 2 ** 20, JSON.stringify(big));
      }
    }
  }
});

Deno.test("attention decode geometry: rows per workgroup, and the least row groups asked", () => {
  const h200 = { adapterName: "NVIDIA H200", maxWorkgroupStorage: 49152, hasF16: true } as Gpu;
  const geo = (group: number, minRowGroups?: number) => {
    const g = attentionDecodeGeometry(h200, { headDim: 64, group, minRowGroups });
    return `${g.rows} rows x ${g.rowGroups} / ${g.wg}`;
  };
  assert.equal(geo(8), "8 rows x 1 / 256");
  assert.equal(geo(8, 2), "4 rows x 2 / 256");
  assert.equal(geo(7, 2), "4 rows x 2 / 256"); // 4 + 3
  assert.equal(geo(16), "8 rows x 2 / 256");
  assert.equal(geo(1, 2), "1 rows x 1 / 256"); // never more groups than q heads
  const small = (threads: number) => {
    const g = attentionDecodeGeometry(h200, { headDim: 64, group: 8, threads });
    return `${g.rows} rows x ${g.keys} keys / ${g.wg}`;
  };
  assert.equal(small(128), "8 rows x 32 keys / 128");
  assert.equal(small(64), "8 rows x 16 keys / 64");
});

Deno.test("rope_kv -> prefill attention -> decode attention, end to end", async () => {
  const gpu = await testGpu();
  const r = rng(2024);
  const nHeads = 8, nKvHeads = 2, D = 64, nLayers = 2, layer = 1, maxBlocks = 4;
  const width = (nHeads + 2 * nKvHeads) * D;
  const heads = { nHeads, nKvHeads, headDim: D, layer, nLayers, maxBlocks };
  // Slot 0 has 10 cached tokens and prefills 20 more; slot 1 has 33 cached.
  const cache = pagedCacheRef(r.next, {
    seqLens: [10, 33],
    capacity: [31, 34],
    nLayers,
    nKvHeads,
    headDim: D,
    maxBlocks,
  });
  const gc = uploadCache(gpu, cache);
  const invFreq = invFreqs(D, 500000);
  const gInv = f32(gpu, invFreq);
  const T = 20, pos0 = 10;
  const qkv = Float32Array.from(r.uniform(T * width, 2));
  const q = createStorage(gpu, T * nHeads * D * 4), out = createStorage(gpu, T * nHeads * D * 4);
  const pos = Array.from({ length: T }, (_, i) => pos0 + i);
  const step: Dispatch[] = [
    ropeKvDispatch(gpu, {
      qkv: f32(gpu, qkv),
      q,
      ...gc,
      pos: u32(gpu, pos),
      tokSeq: u32(gpu, new Array(T).fill(0)),
      invFreq: gInv,
    }, { tokens: T, ...heads }),
    attentionDispatch(gpu, { q, ...gc, out, chunk: u32(gpu, [...chunkWords(0, pos0, T)]) }, {
      tokens: T,
      ...heads,
    }),
  ];
  // Then one decode step (RoPE and KV write inside): slot 0 at position 30, slot 1 at 33.
  const dq = Float32Array.from(r.uniform(2 * width, 2));
  const dPos = [30, 33];
  const od = createStorage(gpu, 2 * nHeads * D * 4);
  step.push(...attentionDecodeDispatches(gpu, {
    qkv: f32(gpu, dq),
    pos: u32(gpu, dPos),
    invFreq: gInv,
    ...gc,
    seqLen: u32(gpu, [31, 34]),
    out: od,
  }, { seqs: 2, ...heads, maxContext: 64, splitSize: 16 }));
  await run(gpu, step);

  // Reference: the cache with the new k/v written in, then attention over it.
  const kvOf = (
    slot: number,
    len: number,
    news: [number, number, Float64Array, Float64Array][],
  ) => {
    const kv = pagedKvRef(cache, { slot, layer, len });
    for (const [row, p, k, v] of news) {
      kv.k.set(k.subarray(row * nKvHeads * D, (row + 1) * nKvHeads * D), p * nKvHeads * D);
      kv.v.set(v.subarray(row * nKvHeads * D, (row + 1) * nKvHeads * D), p * nKvHeads * D);
    }
    return kv;
  };
  const pre = ropeKvRef(qkv, { pos, invFreq, nHeads, nKvHeads, headDim: D });
  const dec = ropeKvRef(dq, { pos: dPos, invFreq, nHeads, nKvHeads, headDim: D });
  const prefillNews = pos.map((p, t) =>
    [t, p, pre.k, pre.v] as [number, number, Float64Array, Float64Array]
  );
  const kv0 = kvOf(0, 31, [...prefillNews, [0, 30, dec.k, dec.v]]);
  const kv1 = kvOf(1, 34, [[1, 33, dec.k, dec.v]]);
  const sh = { nHeads, nKvHeads, headDim: D };
  assertClose(
    "e2e prefill",
    await readF32(gpu, out, T * nHeads * D),
    attentionRef(pre.q, { ...kv0, qPos: pos, ...sh }),
  );
  const n = nHeads * D;
  const got = await readF32(gpu, od, 2 * n);
  assertClose(
    "e2e decode slot 0",
    got.subarray(0, n),
    attentionRef(dec.q.subarray(0, n), { ...kv0, qPos: [30], ...sh }),
  );
  assertClose(
    "e2e decode slot 1",
    got.subarray(n),
    attentionRef(dec.q.subarray(n), { ...kv1, qPos: [33], ...sh }),
  );
});

Deno.test("attention tile: big tiles on GPUs, small ones where GL compiles slowly", async () => {
  const gpu = await testGpu();
  const tile = (headDim: number, maxBytes: number, maxPrefetch = 8, wantRows = 4096) => {
    const t = attentionTile(gpu, { headDim, wantRows, maxBytes, maxPrefetch });
    const [tr, tc, d4] = [t.rows / 4, t.keys / 4, Math.ceil(headDim / 4)];
    const fits = t.bytes <= maxBytes && t.wg <= 256 && t.wg % tr === 0 && t.wg >= tr * tc &&
      Math.ceil((t.keys * d4) / t.wg) <= maxPrefetch && Math.ceil(d4 / (t.wg / tr)) <= 4;
    assert.ok(fits, JSON.stringify(t));
    return `${t.rows}x${t.keys}/${t.wg}`;
  };
  // rows x keys / threads for head dims 24, 64, 80, 128, 256 under 48 KiB (H200), 32 KiB
  // (llvmpipe), and GL's budget and prefetch; long chunks (>= 2048 rows) try 64 x 32 first.
  const dims = [24, 64, 80, 128, 256];
  assert.deepEqual(
    dims.map((d) => tile(d, 49152)),
    ["64x32/128", "64x32/128", "64x32/128", "32x32/128", "16x16/128"],
  );
  assert.deepEqual(
    dims.map((d) => tile(d, 49152, 8, 1024)),
    ["32x64/128", "32x64/128", "32x64/160", "32x32/128", "16x16/128"],
  );
  assert.deepEqual(
    dims.map((d) => tile(d, 32768)),
    ["64x32/128", "32x32/64", "32x32/80", "16x32/128", "8x16/128"],
  );
  assert.deepEqual(dims.slice(0, 4).map((d) => tile(d, 4608, 2)), [
    "8x16/48",
    "4x8/64",
    "4x8/80",
    "4x4/64",
  ]);
  assert.equal(tile(64, 49152, 8, 5), "8x64/128");
  const forced = attentionTile(gpu, {
    headDim: 64,
    wantRows: 4096,
    rows: 64,
    keys: 16,
    maxBytes: 49152,
    maxPrefetch: 8,
  });
  assert.equal(`${forced.rows}x${forced.keys}/${forced.wg}`, "64x16/64");
  const here = attentionTile(gpu, { headDim: 128, wantRows: 1024 });
  console.log(`headDim 128 on this adapter: ${JSON.stringify(here)}`);
  assert.throws(() => attentionTile(gpu, { headDim: 4096, wantRows: 1 }), /workgroup memory/);
  assert.throws(() => attentionTile(gpu, { headDim: 64, wantRows: 64, keys: 12 }), /tileKeys/);
  assert.throws(() => attentionTile(gpu, { headDim: 64, wantRows: 64, rows: 6 }), /tileRows/);
});

for (const kvDtype of ["f32", "f16"] as KvDtype[]) {
  Deno.test(`attention decode, verification pass: R rows per sequence, kv ${kvDtype}`, async () => {
    // Speculation's verify step: rope_kv writes the K and V of every row (the last sampled
    // token and its drafts, at L..L+d), then decode attention runs each row as a query of its
    // own over its sequence's table, row j attending L + j + 1 keys; dead rows (past d) write
    // at the trash position and attend nothing.
    const gpu = await testGpu();
    const r = rng(31);
    const nHeads = 8, nKvHeads = 2, D = 64, R = 5, nLayers = 2, layer = 1;
    const lens = [20, 3, 47, 16]; // L per sequence (tokens in cache before the step)
    const drafts = [4, 2, 0, 3]; // d per sequence: rows 0..d live
    const S = lens.length, rows = S * R;
    const maxBlocks = Math.ceil((Math.max(...lens) + R) / 16) + 1;
    const trashPos = (maxBlocks - 1) * 16;
    const cache = pagedCacheRef(r.next, {
      seqLens: lens,
      capacity: lens.map((l) => l + R),
      nLayers,
      nKvHeads,
      headDim: D,
      maxBlocks,
      kvDtype,
    });
    const live = (s: number, j: number) => j <= drafts[s];
    const pos = Array.from({ length: rows }, (_, i) => {
      const s = Math.floor(i / R), j = i % R;
      return live(s, j) ? lens[s] + j : trashPos;
    });
    const seqLen = Array.from({ length: rows }, (_, i) => {
      const s = Math.floor(i / R), j = i % R;
      return live(s, j) ? lens[s] + j + 1 : 0;
    });
    const rowSlot = Array.from({ length: rows }, (_, i) => Math.floor(i / R));
    const width = (nHeads + 2 * nKvHeads) * D;
    const qkv = Float32Array.from(r.uniform(rows * width, 2));
    const invFreq = invFreqs(D);
    const gc = uploadCache(gpu, cache);
    const out = createStorage(
      gpu,
      rows * nHeads * D * 4,
      new Float32Array(rows * nHeads * D).fill(NaN),
    );
    const qkvBuf = f32(gpu, qkv), posBuf = u32(gpu, pos), freqBuf = f32(gpu, invFreq);
    const heads = { nHeads, nKvHeads, headDim: D, layer, nLayers, maxBlocks, kvDtype };
    const write = ropeKvDispatch(gpu, {
      qkv: qkvBuf,
      q: createStorage(gpu, rows * nHeads * D * 4),
      kPool: gc.kPool,
      vPool: gc.vPool,
      pos: posBuf,
      tokSeq: u32(gpu, rowSlot),
      blockTable: gc.blockTable,
      invFreq: freqBuf,
    }, { tokens: rows, ...heads });
    const attend = attentionDecodeDispatches(gpu, {
      qkv: qkvBuf,
      pos: posBuf,
      invFreq: freqBuf,
      ...gc,
      seqLen: u32(gpu, seqLen),
      out,
    }, { seqs: rows, maxContext: Math.max(...lens) + R, rowsPerSeq: R, ...heads });
    await run(gpu, [write, ...attend]);
    // The reference: every row as a decode slot whose table is its sequence's.
    const virtual = { ...cache, blockTable: new Uint32Array(rows * maxBlocks) };
    for (let i = 0; i < rows; i++) {
      virtual.blockTable.set(
        cache.blockTable.subarray(rowSlot[i] * maxBlocks, (rowSlot[i] + 1) * maxBlocks),
        i * maxBlocks,
      );
    }
    const want = attentionDecodeRef(virtual, qkv, { pos, seqLen, invFreq, nHeads, layer });
    const got = await readF32(gpu, out, rows * nHeads * D);
    const n = nHeads * D;
    for (let i = 0; i < rows; i++) {
      const label = `${attend[0].label} seq ${rowSlot[i]} row ${i % R} len ${seqLen[i]}`;
      assertClose(label, got.subarray(i * n, (i + 1) * n), want.out.subarray(i * n, (i + 1) * n));
    }
    // Every live row's K and V in its place (the trash row holds whichever dead row wrote last).
    const kGot = await readPool(gpu, gc.kPool, want.kPool.length, kvDtype);
    const vGot = await readPool(gpu, gc.vPool, want.vPool.length, kvDtype);
    for (let i = 0; i < rows; i++) {
      if (pos[i] === trashPos) continue;
      for (let h = 0; h < nKvHeads; h++) {
        const o = pagedOffsetRef(virtual, { slot: i, layer, pos: pos[i], head: h });
        assertPool(`row ${i} head ${h} k`, kGot.subarray(o, o + D), want.kPool.subarray(o, o + D));
        assertPool(`row ${i} head ${h} v`, vGot.subarray(o, o + D), want.vPool.subarray(o, o + D));
      }
    }
  });
}
