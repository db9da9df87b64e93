/**
 * engine/kv/window.ts: which blocks a mask never reads again, and their release through
 * SequenceBlocks.dropBlocks (trash entries that later releases skip), without a device.
 */
import assert from "node:assert/strict";
import { BlockPool, SequenceBlocks } from "../engine/kv/blocks.ts";
import { deadBlocks, releaseDead } from "../engine/kv/window.ts";
import { type AttentionMask, maskLo } from "../kernels/attention_mask.ts";
import { visibleRef } from "../kernels/reference.ts";

const W = (window: number): AttentionMask => ({ kind: "window", window });

Deno.test("dead blocks: every key of them invisible from every later query, none missed", () => {
  const masks: AttentionMask[] = [
    { kind: "causal" },
    W(1),
    W(37),
    W(64),
    { kind: "sinks", sinks: 4, window: 40 },
    { kind: "sinks", sinks: 20, window: 17 },
    { kind: "chunked", chunk: 50 },
    { kind: "chunked", chunk: 32 },
  ];
  for (const mask of masks) {
    for (let q = 0; q < 300; q += 7) {
      const { from, to } = deadBlocks(mask, q);
      // Dead: no query at q or later (to q + 400) sees a key of them.
      for (let b = from; b < to; b++) {
        for (let k = 16 * b; k < 16 * b + 16; k++) {
          for (let p = q; p < q + 400; p += 13) {
            assert.ok(!visibleRef(mask, p, k), `${mask.kind} q ${q}: key ${k} seen from ${p}`);
          }
        }
      }
      // Nothing missed: every other block wholly below q holds a key some later query sees,
      // or lies among the sinks.
      for (let b = 0; 16 * b + 16 <= q; b++) {
        if (b >= from && b < to) continue;
        const seen = Array.from({ length: 16 }, (_, i) => 16 * b + i).some((k) =>
          visibleRef(mask, q, k) || (mask.kind === "sinks" && k < mask.sinks)
        );
        assert.ok(seen, `${mask.kind} q ${q}: block ${b} is dead but kept`);
      }
    }
  }
  assert.deepEqual(deadBlocks(W(100), 500), { from: 0, to: 25 });
  assert.equal(maskLo(W(100), 500), 401);
  assert.deepEqual(deadBlocks({ kind: "sinks", sinks: 4, window: 100 }, 500), { from: 1, to: 25 });
  assert.deepEqual(deadBlocks({ kind: "causal" }, 5000), { from: 0, to: 0 });
});

Deno.test("releaseDead gives blocks back once; truncate and free skip them", () => {
  const pool = new BlockPool(40);
  const seq = new SequenceBlocks(pool);
  seq.appendPrompt(Array.from({ length: 300 }, (_, i) => i % 50));
  seq.reserve(320); // 20 blocks
  seq.markComputed(300);
  assert.equal(pool.usedCount, 20);
  const mask = { kind: "sinks" as const, sinks: 5, window: 40 };
  // From query 299 the window starts at 260: blocks 1..15 (keys 16..255) are dead, block 0
  // holds the sinks.
  assert.equal(releaseDead(seq, mask, 299), 15);
  assert.equal(pool.usedCount, 5);
  assert.deepEqual(seq.table.slice(1, 16), new Array(15).fill(pool.trash));
  assert.equal(releaseDead(seq, mask, 299), 0, "nothing twice");
  assert.equal(releaseDead(seq, mask, 310), 0, "block 16: key 271 is seen from 310");
  assert.equal(releaseDead(seq, mask, 311), 1, "block 16 once the window starts at 272");
  assert.equal(seq.tokens.length, 300, "the tokens stay");
  seq.truncate(100); // keeps blocks 0..6, of which 1..6 were dropped: only 7.. are released
  assert.equal(pool.usedCount, 1);
  seq.free();
  assert.equal(pool.usedCount, 0);
  assert.equal(pool.blocks[pool.trash].refCount, 1, "the trash block is never released");
  // The released prompt blocks keep their content: a new sequence finds them by hash.
  const again = new SequenceBlocks(pool);
  assert.equal(again.appendPrompt(Array.from({ length: 300 }, (_, i) => i % 50)), 288);
});

Deno.test("a 131 072-token prompt appends, drops its KV and keeps its tokens (no argument spread)", () => {
  // Spreading this many ids into push() overflows V8's stack (bench_long at 128k died so).
  const pool = new BlockPool(4);
  const seq = new SequenceBlocks(pool);
  const ids = Array.from({ length: 131_072 }, (_, i) => i % 1000);
  assert.equal(seq.appendPrompt(ids), 0);
  assert.equal(seq.tokens.length, ids.length);
  seq.dropKv();
  assert.equal(seq.tokens.length, ids.length);
  assert.equal(seq.tokens[131_071], 71);
});
