/**
 * The speculation kernels against their references (kernels/speculate.ts `draftRef`,
 * `acceptRef`, `poolRef`) on seeded random slots: histories with repeats (so suffixes recur) at
 * awkward lengths, caps and budgets, done slots; pools holding guesses under the last token or
 * under a lookup draft's last token (chained), so the pool drafts where lookup finds nothing or
 * stops short, and lookup-only when the pool is off; EOS inside the accepted run, the budget
 * cutting it, every draft matching or none, and the guesses a rejected draft leaves in the pool.
 */
import assert from "node:assert/strict";
import { createStorage, readU32 } from "../gpu/device.ts";
import { run } from "../gpu/dispatch.ts";
import {
  acceptRef,
  draftRef,
  POOL_WORDS,
  poolInsertRef,
  poolRef,
  specDispatch,
} from "../kernels/speculate.ts";
import { NO_TOKEN, SLOT_STATE_BYTES } from "../kernels/step.ts";
import { rng, testGpu } from "./util.ts";

const V = 50, H = 300, TRASH = 9999, EOS = [7, 11];

interface Slot {
  hist: number[];
  len: number;
  done: boolean;
  remaining: number;
  stopAtEos: boolean;
  cap: number;
  pool: Uint32Array;
}

/** A history of `len + 1` tokens (below V - 8) made of short random phrases, some repeated. */
function history(r: ReturnType<typeof rng>, len: number): number[] {
  const phrases = Array.from(
    { length: 4 },
    () => Array.from({ length: 2 + r.int(5) }, () => r.int(V - 8)),
  );
  const h: number[] = [];
  while (h.length < len + 1) {
    if (r.next() < 0.1) h.push(r.int(V - 8));
    else h.push(...phrases[r.int(phrases.length)]);
  }
  return h.slice(0, len + 1);
}

/** A pool with guesses under some tokens, chained sometimes (a guess ends in another key). */
function pool(r: ReturnType<typeof rng>, keys: number[]): Uint32Array {
  const words = new Uint32Array(POOL_WORDS);
  for (const key of keys) {
    poolInsertRef(words, key, Array.from({ length: 1 + r.int(5) }, () => r.int(V)));
  }
  return words;
}

async function setup(slots: Slot[], rows: number, stride = rows + 1) {
  const gpu = await testGpu();
  const S = slots.length;
  const u32 = (n: number, data?: number[]) =>
    createStorage(gpu, n * 4, data ? Uint32Array.from(data) : undefined);
  const hist = new Uint32Array(S * H);
  slots.forEach((s, i) => hist.set(s.hist, i * H));
  const histBuf = createStorage(gpu, hist.byteLength, hist);
  const pools = new Uint32Array(S * POOL_WORDS);
  slots.forEach((s, i) => pools.set(s.pool, i * POOL_WORDS));
  const state = slots.flatMap((s) => [s.done ? 1 : 0, s.remaining, s.stopAtEos ? 1 : 0, 0]);
  const step = {
    seqLen: u32(S, slots.map((s) => s.len)),
    pos: u32(S),
    slotState: createStorage(gpu, S * SLOT_STATE_BYTES, Uint32Array.from(state)),
    nextTok: u32(S, slots.map((s) => s.hist[s.len])),
    sampled: u32(2 * S * rows),
    ring: u32(2 * S * stride),
    counts: u32(S * V),
    eos: u32(EOS.length, EOS),
    hist: histBuf,
  };
  const spec = {
    hist: histBuf,
    rowTok: u32(S * rows),
    rowPos: u32(S * rows),
    rowLen: u32(S * rows),
    rowSlot: u32(S * rows),
    cap: u32(S, slots.map((s) => s.cap)),
    pool: createStorage(gpu, pools.byteLength, pools),
    checkPos: u32(S),
    checkLen: u32(S),
  };
  const o = {
    slotBegin: 0,
    slotEnd: S,
    rows,
    histLen: H,
    trashPos: TRASH,
    vocab: V,
    nEos: 2,
    ringStride: stride,
  };
  return { gpu, step, spec, o };
}

/** Slots at awkward lengths; the pool keys some slots' last token, some a draft's last. */
function slotsFor(r: ReturnType<typeof rng>, rows: number, n: number): Slot[] {
  return Array.from({ length: n }, (_, i) => {
    const len = [1, 2, 3, 17, 64, 65, 130, 250, 299][i % 9];
    const hist = history(r, len);
    if (i % 4 === 1) hist[len] = V - 1 - r.int(5); // a token not seen before: lookup finds none
    const s: Slot = {
      hist,
      len,
      done: i % 7 === 6,
      remaining: 1 + r.int(12),
      stopAtEos: true,
      cap: i % 5 === 4 ? 0 : 1 + r.int(rows),
      pool: new Uint32Array(POOL_WORDS),
    };
    const lookup = draftRef({ ...s, rows, pool: undefined }).drafts;
    const keys = [hist[len], lookup.at(-1) ?? hist[len], r.int(V)];
    s.pool = pool(r, i % 3 === 2 ? [] : keys);
    return s;
  });
}

Deno.test("spec_begin drafts what draftRef drafts: lookup, then the pool", async () => {
  const r = rng(5);
  for (const rows of [2, 5, 9, 16]) {
    for (const withPool of [true, false]) {
      const slots = slotsFor(r, rows, 23);
      const { gpu, step, spec, o } = await setup(slots, rows);
      await run(gpu, [
        specDispatch(gpu, { step, spec }, { ...o, entry: "spec_begin", pool: withPool }),
      ]);
      const n = slots.length * rows;
      const [tok, pos, len] = await Promise.all(
        [spec.rowTok, spec.rowPos, spec.rowLen].map((b) => readU32(gpu, b, n)),
      );
      const checkPos = await readU32(gpu, spec.checkPos, slots.length);
      const checkLen = await readU32(gpu, spec.checkLen, slots.length);
      const heads = await readU32(gpu, spec.pool, slots.length * POOL_WORDS);
      let drafting = 0, pooled = 0, poolOnly = 0;
      slots.forEach((s, i) => {
        const want = s.done
          ? { drafts: [], pooled: 0 }
          : draftRef({ ...s, rows, pool: withPool ? s.pool : undefined });
        if (want.drafts.length > 0) drafting++;
        if (want.pooled > 0) pooled++;
        if (want.pooled > 0 && want.pooled === want.drafts.length) poolOnly++;
        for (let j = 0; j < rows; j++) {
          const at = `R${rows} pool ${withPool} slot ${i} (L ${s.len}) row ${j}`;
          const live = !s.done && j <= want.drafts.length;
          const t = j === 0 ? s.hist[s.len] : want.drafts[j - 1];
          assert.equal(tok[i * rows + j], live ? t : 0, `${at}: token`);
          assert.equal(pos[i * rows + j], live ? s.len + j : TRASH, `${at}: position`);
          assert.equal(len[i * rows + j], live ? s.len + j + 1 : 0, `${at}: length`);
        }
        assert.deepEqual(
          [checkPos[i], checkLen[i]],
          s.done ? [TRASH, 0] : [s.len, s.len + 1],
          `slot ${i}: the cross-check's row`,
        );
        if (!s.done) {
          const allowed = Math.min(s.cap, rows - 1);
          assert.equal(heads[i * POOL_WORDS], want.pooled | (allowed << 16), `slot ${i}: head`);
        }
      });
      assert.ok(drafting >= 6, `R${rows}: only ${drafting} slots drafted; the histories repeat`);
      if (withPool && rows > 2) {
        assert.ok(pooled >= 3 && poolOnly >= 1, `R${rows}: pool drafts ${pooled}/${poolOnly}`);
      }
      if (!withPool) assert.equal(pooled, 0);
    }
  }
});

Deno.test("spec_end accepts what acceptRef accepts, books it and keeps the guesses", async () => {
  const r = rng(9);
  const rows = 6, stride = rows + 2;
  for (let round = 0; round < 4; round++) {
    const slots = slotsFor(r, rows, 11).map((s, i) => ({
      ...s,
      done: i === 3,
      remaining: [1, 2, 3, 40][r.int(4)],
      stopAtEos: i % 2 === 0,
      cap: rows - 1,
    }));
    const { gpu, step, spec, o } = await setup(slots, rows, stride);
    // Drafts as spec_begin made them; samples that follow them for a random while, then not
    // (sometimes an EOS among them).
    const drafts = slots.map((s) => s.done ? [] : draftRef({ ...s, rows }).drafts);
    const sampled = slots.map((_, i) => {
      const keep = r.int(drafts[i].length + 1);
      return Array.from({ length: rows }, (_, j) => {
        if (j < keep) return drafts[i][j];
        return r.next() < 0.2 ? EOS[r.int(2)] : (drafts[i][j] ?? 0) + 1 + r.int(3);
      });
    });
    await run(gpu, [specDispatch(gpu, { step, spec }, { ...o, entry: "spec_begin" })]);
    const words = new Uint32Array(2 * slots.length * rows);
    sampled.forEach((row, i) => row.forEach((t, j) => (words[2 * (i * rows + j)] = t)));
    gpu.device.queue.writeBuffer(step.sampled, 0, words);
    await run(gpu, [specDispatch(gpu, { step, spec }, { ...o, entry: "spec_end" })]);
    const ring = await readU32(gpu, step.ring, 2 * slots.length * stride);
    const seqLen = await readU32(gpu, step.seqLen, slots.length);
    const next = await readU32(gpu, step.nextTok, slots.length);
    const state = await readU32(gpu, step.slotState, 4 * slots.length);
    const counts = await readU32(gpu, step.counts, slots.length * V);
    const hist = await readU32(gpu, spec.hist, slots.length * H);
    const pools = await readU32(gpu, spec.pool, slots.length * POOL_WORDS);
    slots.forEach((s, i) => {
      const at = `round ${round} slot ${i}`;
      const E = i * stride * 2;
      if (s.done) {
        for (let j = 0; j <= rows; j++) assert.equal(ring[E + 2 * j], NO_TOKEN, `${at}: done`);
        assert.equal(seqLen[i], s.len);
        return;
      }
      const { drafts: d, pooled } = draftRef({ ...s, rows });
      const want = acceptRef(sampled[i].slice(0, d.length + 1), d, {
        remaining: s.remaining,
        eos: EOS,
        stopAtEos: s.stopAtEos,
      });
      const a = want.tokens.length;
      for (let j = 0; j < rows; j++) {
        assert.equal(ring[E + 2 * j], j < a ? want.tokens[j] : NO_TOKEN, `${at}: ring ${j}`);
      }
      const allowed = Math.min(s.cap, rows - 1, s.remaining - 1);
      assert.deepEqual([ring[E + 2 * rows], ring[E + 2 * rows + 1]], [
        d.length | (pooled << 8) | (Math.min(s.cap, rows - 1) << 16),
        want.accepted,
      ], `${at}: drafted, pooled, allowed (${allowed}), accepted`);
      assert.equal(seqLen[i], s.len + a, `${at}: length`);
      assert.equal(next[i], want.tokens[a - 1], `${at}: next token`);
      assert.deepEqual(
        [...state.slice(4 * i, 4 * i + 3)],
        [want.done ? 1 : 0, s.remaining - a, s.stopAtEos ? 1 : 0],
        `${at}: state`,
      );
      want.tokens.forEach((t, j) => {
        // past the history's row nothing is kept (a context can be no longer)
        if (s.len + 1 + j < H) assert.equal(hist[i * H + s.len + 1 + j], t, `${at}: hist`);
      });
      const n = new Map<number, number>();
      for (const t of want.tokens) n.set(t, (n.get(t) ?? 0) + 1);
      for (const [t, c] of n) assert.equal(counts[i * V + t], (0x80000000 | c) >>> 0, `${at}: n`);
      const slotPool = pools.subarray(i * POOL_WORDS, (i + 1) * POOL_WORDS);
      if (want.guesses) {
        assert.deepEqual(poolRef(slotPool, want.guesses.key), want.guesses.tokens, `${at}: pool`);
      } else {
        assert.deepEqual(slotPool.subarray(1), s.pool.subarray(1), `${at}: pool unchanged`);
      }
    });
  }
});
