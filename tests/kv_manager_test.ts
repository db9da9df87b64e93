/**
 * The block manager's policy without a GPU (engine/kv/manager.ts): predicted reuse from turn
 * gaps, the order in which idle sessions leave the GPU and blocks leave their tier, holders
 * losing the rest of their chain when a block goes, states and tiers; the spill breaker
 * (engine/kv/breaker.ts) and the prompt SimHash (engine/kv/simhash.ts).
 */
import assert from "node:assert/strict";
import {
  BlockManager,
  evictionOrder,
  nextUse,
  recordGap,
  stateOf,
  type TierBlock,
  tierOf,
} from "../engine/kv/manager.ts";
import { SpillBreaker } from "../engine/kv/breaker.ts";
import { hamming, promptSimhash, SIMILAR_BITS } from "../engine/kv/simhash.ts";

function block(hash: bigint, o: Partial<TierBlock> = {}): TierBlock {
  return {
    hash,
    tokens: [Number(hash)],
    bytes: 100,
    file: false,
    host: new Uint8Array(new SharedArrayBuffer(100)),
    accesses: 1,
    lastAccess: 0,
    holders: new Set(),
    pins: 0,
    ...o,
  };
}

Deno.test("manager: a session's next turn is predicted from the gaps between its turns", () => {
  let s = recordGap(undefined, 1000);
  assert.deepEqual(s, { turns: 1, gapMs: 1000 });
  s = recordGap(s, 3000);
  assert.deepEqual(s, { turns: 2, gapMs: 2000 }, "a moving average, half weight on the latest");
  // Due 2 s after its last turn ended; once overdue, as long again as it has been idle.
  assert.equal(nextUse(10_000, s, 10_500), 12_000);
  assert.equal(nextUse(10_000, s, 15_000), 20_000);
  assert.equal(nextUse(10_000, undefined, 10_400), 10_800, "no history: least recently used");
});

Deno.test("manager: idle sessions leave the GPU predicted-last first, then by IO", () => {
  const now = 100_000;
  const order = (s: Parameters<typeof evictionOrder>[0]) => evictionOrder(s, now).map((x) => x.id);
  // a comes back every second (due soon); b has been idle a minute with no pattern; c is b's
  // twin but its KV is mostly below already (fewer blocks to copy): it goes first.
  assert.deepEqual(
    order([
      { id: "a", lastUse: now - 500, reuse: { turns: 5, gapMs: 1000 }, toCopy: 1 },
      { id: "b", lastUse: now - 60_000, toCopy: 10 },
      { id: "c", lastUse: now - 59_000, toCopy: 2 },
    ]),
    ["c", "b", "a"],
  );
  // Without tiers (nothing to copy, no history) it is least recently used first.
  assert.deepEqual(
    order([
      { id: "x", lastUse: now - 10, toCopy: 0 },
      { id: "y", lastUse: now - 5000, toCopy: 0 },
      { id: "z", lastUse: now - 300, toCopy: 0 },
    ]),
    ["y", "z", "x"],
  );
});

Deno.test("manager: blocks leave a tier prefix-cache first, then predicted-last", () => {
  const m = new BlockManager(), now = 50_000;
  for (const h of [1n, 2n, 3n, 4n, 5n, 6n]) m.add(block(h, { lastAccess: now - Number(h) }));
  m.get(5n)!.accesses = 3; // a shared prefix taken again: kept over ones taken once
  m.hold("soon", [1n, 2n], now - 100, { turns: 4, gapMs: 200 });
  m.hold("late", [3n], now - 40_000);
  m.get(6n)!.pins = 1; // a restore waits for it
  const order = m.victims(now, () => true).map((b) => b.hash);
  assert.deepEqual(order, [4n, 5n, 3n, 2n, 1n]);
  assert.deepEqual(m.victims(now, (b) => b.hash !== 4n).map((b) => b.hash)[0], 5n);
  // A shared block is needed as soon as its soonest holder.
  m.hold("later", [1n], now - 30_000);
  assert.equal(m.predictedReuse(m.get(1n)!, now), now + 100);
});

Deno.test("manager: a block that goes takes the rest of its holders' chains with it", () => {
  const m = new BlockManager();
  for (const h of [1n, 2n, 3n]) m.add(block(h));
  m.hold("s", [1n, 2n, 3n], 0);
  m.hold("t", [1n], 0);
  assert.equal(m.heldTokens("s", 16), 48);
  assert.deepEqual(m.remove(2n), ["s"]);
  assert.equal(m.heldTokens("s", 16), 16, "blocks after it cannot be reached by hash");
  assert.equal(m.get(3n)!.holders.size, 0, "3 stays, held by none (a prefix cache entry)");
  assert.deepEqual([...m.get(1n)!.holders].sort(), ["s", "t"]);
  m.release("s");
  assert.deepEqual([...m.get(1n)!.holders], ["t"]);
  assert.equal(m.find(1n, [2]), undefined, "a hash hit with other tokens is a miss");
  assert.throws(() => m.add(block(1n)), /already below the GPU/);
});

Deno.test("manager: states and tiers", () => {
  const landing = Promise.resolve(true);
  assert.equal(stateOf(block(1n, { pins: 1 })), "active");
  assert.equal(stateOf(block(1n, { landing })), "pending-evict");
  assert.equal(stateOf(block(1n, { writing: Promise.resolve() })), "pending-evict");
  assert.equal(stateOf(block(1n)), "inactive");
  assert.equal(tierOf(block(1n)), "host");
  assert.equal(tierOf(block(1n, { host: undefined, landing })), "host");
  assert.equal(tierOf(block(1n, { host: undefined, file: true })), "file");
  const m = new BlockManager();
  m.add(block(1n, { pins: 1 }));
  m.add(block(2n, { host: undefined, file: true }));
  m.add(block(3n, { landing }));
  assert.deepEqual(m.counts(), { host: 2, file: 1, active: 1, inactive: 1, pendingEvict: 1 });
});

Deno.test("breaker: a spill over the limit pauses spills for a while, with the reason", () => {
  const b = new SpillBreaker({ limitMs: 200, pauseMs: 30_000 });
  assert.equal(b.record(199, "a spill", 1000), false);
  assert.equal(b.paused(1000), false);
  assert.equal(b.record(250.4, "a spill of 3 blocks", 2000), true);
  assert.equal(b.paused(2000), true);
  assert.equal(b.paused(31_999), true);
  assert.equal(b.paused(32_000), false);
  b.skip();
  assert.deepEqual(b.state(5000), {
    paused: true,
    reason: "a spill of 3 blocks took 250 ms (limit 200 ms): spills paused for 30 s",
    trips: 1,
    skipped: 1,
  });
  assert.deepEqual(b.state(40_000), { paused: false, trips: 1, skipped: 1 });
});

Deno.test("simhash: prompts that share most of their text are near, unrelated ones are not", () => {
  let s = 7;
  const rand = () => (s = (s * 1103515245 + 12345) % 2 ** 31) % 30000;
  const doc = Array.from({ length: 600 }, rand);
  const q = (n: number) => Array.from({ length: n }, rand);
  const a = promptSimhash([...doc, ...q(20)]), b = promptSimhash([...doc, ...q(20)]);
  const c = promptSimhash(Array.from({ length: 620 }, rand));
  assert.ok(hamming(a, b) <= SIMILAR_BITS, `same document: ${hamming(a, b)} bits`);
  assert.ok(hamming(a, c) > 2 * SIMILAR_BITS, `unrelated: ${hamming(a, c)} bits`);
  assert.equal(promptSimhash([...doc]), promptSimhash([...doc]), "deterministic");
  assert.equal(promptSimhash([]), 0n);
  assert.equal(hamming(0n, 0xffn), 8);
  assert.ok(promptSimhash([5, 6]) !== promptSimhash([6, 5]), "short prompts hash whole");
});
