/**
 * The speculation kernels against their references (kernels/speculate.ts `draftRef`,
 * `acceptRef`) on seeded random slots: histories with repeats (so suffixes recur) at awkward
 * lengths, depths, caps and budgets, done slots, EOS inside the accepted run, the budget cutting
 * it, and every draft matching or none.
 */
import assert from "node:assert/strict";
import { createStorage, readU32 } from "../gpu/device.ts";
import { run } from "../gpu/dispatch.ts";
import { acceptRef, draftRef, specDispatch } from "../kernels/speculate.ts";
import { NO_TOKEN, SLOT_STATE_BYTES } from "../kernels/step.ts";
import { rng, testGpu } from "./util.ts";

const V = 50, H = 300, TRASH = 9999, EOS = [7, 11];

interface Slot {
  hist: number[];
  len: number;
  done: boolean;
  remaining: number;
  stopAtEos: boolean;
  depth: number;
  cap: number;
}

/** A history of `len + 1` tokens made of short random phrases, some repeated. */
function history(r: ReturnType<typeof rng>, len: number): number[] {
  const phrases = Array.from(
    { length: 4 },
    () => Array.from({ length: 2 + r.int(5) }, () => r.int(V)),
  );
  const h: number[] = [];
  while (h.length < len + 1) {
    if (r.next() < 0.1) h.push(r.int(V));
    else h.push(...phrases[r.int(phrases.length)]);
  }
  return h.slice(0, len + 1);
}

async function setup(slots: Slot[], rows: number) {
  const gpu = await testGpu();
  const S = slots.length;
  const u32 = (n: number, data?: number[]) =>
    createStorage(gpu, n * 4, data ? Uint32Array.from(data) : undefined);
  const hist = new Uint32Array(S * H);
  slots.forEach((s, i) => hist.set(s.hist, i * H));
  const histBuf = createStorage(gpu, hist.byteLength, hist);
  const state = slots.flatMap((s) => [s.done ? 1 : 0, s.remaining, s.stopAtEos ? 1 : 0, s.depth]);
  const step = {
    seqLen: u32(S, slots.map((s) => s.len)),
    pos: u32(S),
    slotState: createStorage(gpu, S * SLOT_STATE_BYTES, Uint32Array.from(state)),
    nextTok: u32(S, slots.map((s) => s.hist[s.len])),
    sampled: u32(2 * S * rows),
    ring: u32(2 * S * (rows + 1)),
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
  };
  const o = { slotBegin: 0, slotEnd: S, rows, histLen: H, trashPos: TRASH, vocab: V, nEos: 2 };
  return { gpu, step, spec, o };
}

Deno.test("spec_begin drafts what draftRef drafts, for every slot", async () => {
  const r = rng(5);
  for (const rows of [2, 5, 9]) {
    const slots: Slot[] = Array.from({ length: 13 }, (_, i) => ({
      hist: [],
      len: [1, 2, 3, 17, 64, 65, 130, 250, 299][i % 9],
      done: i % 7 === 6,
      remaining: 1 + r.int(12),
      stopAtEos: true,
      depth: 1 + r.int(rows),
      cap: i % 5 === 4 ? 0 : 1 + r.int(rows),
    }));
    for (const s of slots) s.hist = history(r, s.len);
    const { gpu, step, spec, o } = await setup(slots, rows);
    await run(gpu, [specDispatch(gpu, { step, spec }, { ...o, entry: "spec_begin" })]);
    const tok = await readU32(gpu, spec.rowTok, slots.length * rows);
    const pos = await readU32(gpu, spec.rowPos, slots.length * rows);
    const len = await readU32(gpu, spec.rowLen, slots.length * rows);
    let drafting = 0;
    slots.forEach((s, i) => {
      const want = s.done ? [] : draftRef({ ...s, rows });
      if (want.length > 0) drafting++;
      for (let j = 0; j < rows; j++) {
        const at = `R${rows} slot ${i} (L ${s.len}) row ${j}`;
        const live = !s.done && j <= want.length;
        const t = j === 0 ? s.hist[s.len] : want[j - 1];
        assert.equal(tok[i * rows + j], live ? t : 0, `${at}: token`);
        assert.equal(pos[i * rows + j], live ? s.len + j : TRASH, `${at}: position`);
        assert.equal(len[i * rows + j], live ? s.len + j + 1 : 0, `${at}: length`);
      }
    });
    assert.ok(drafting >= 4, `R${rows}: only ${drafting} slots drafted; the histories repeat`);
  }
});

Deno.test("spec_end accepts what acceptRef accepts, and books it", async () => {
  const r = rng(9);
  const rows = 6;
  for (let round = 0; round < 4; round++) {
    const slots: Slot[] = Array.from({ length: 11 }, (_, i) => ({
      hist: [],
      len: 20 + r.int(200),
      done: i === 3,
      remaining: [1, 2, 3, 40][r.int(4)],
      stopAtEos: i % 2 === 0,
      depth: 1 + r.int(rows - 1),
      cap: rows - 1,
    }));
    for (const s of slots) s.hist = history(r, s.len);
    const { gpu, step, spec, o } = await setup(slots, rows);
    // Drafts as spec_begin made them; samples that follow them for a random while, then not
    // (sometimes an EOS among them).
    const drafts = slots.map((s) => s.done ? [] : draftRef({ ...s, rows }));
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
    const ring = await readU32(gpu, step.ring, 2 * slots.length * (rows + 1));
    const seqLen = await readU32(gpu, step.seqLen, slots.length);
    const next = await readU32(gpu, step.nextTok, slots.length);
    const state = await readU32(gpu, step.slotState, 4 * slots.length);
    const counts = await readU32(gpu, step.counts, slots.length * V);
    const hist = await readU32(gpu, spec.hist, slots.length * H);
    slots.forEach((s, i) => {
      const at = `round ${round} slot ${i}`;
      const E = (i * (rows + 1)) * 2;
      if (s.done) {
        for (let j = 0; j <= rows; j++) assert.equal(ring[E + 2 * j], NO_TOKEN, `${at}: done`);
        assert.equal(seqLen[i], s.len);
        return;
      }
      const want = acceptRef(sampled[i].slice(0, drafts[i].length + 1), drafts[i], {
        remaining: s.remaining,
        eos: EOS,
        stopAtEos: s.stopAtEos,
        depth: s.depth,
        rows,
      });
      const a = want.tokens.length;
      for (let j = 0; j < rows; j++) {
        assert.equal(ring[E + 2 * j], j < a ? want.tokens[j] : NO_TOKEN, `${at}: ring ${j}`);
      }
      assert.deepEqual([ring[E + 2 * rows], ring[E + 2 * rows + 1]], [
        drafts[i].length,
        want.accepted,
      ], `${at}: drafted, accepted`);
      assert.equal(seqLen[i], s.len + a, `${at}: length`);
      assert.equal(next[i], want.tokens[a - 1], `${at}: next token`);
      assert.deepEqual(
        [...state.slice(4 * i, 4 * i + 4)],
        [want.done ? 1 : 0, s.remaining - a, s.stopAtEos ? 1 : 0, want.depth],
        `${at}: state`,
      );
      want.tokens.forEach((t, j) => assert.equal(hist[i * H + s.len + 1 + j], t, `${at}: hist`));
      const n = new Map<number, number>();
      for (const t of want.tokens) n.set(t, (n.get(t) ?? 0) + 1);
      for (const [t, c] of n) assert.equal(counts[i * V + t], (0x80000000 | c) >>> 0, `${at}: n`);
    });
  }
});
