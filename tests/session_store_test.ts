/** SessionStore on a real Deno KV file: round trip, chunks over 64 KiB, corruption fallback. */
import assert from "node:assert/strict";
import { join } from "node:path";
import { deflateSync } from "fflate";
import { SessionStore } from "../engine/session_store.ts";
import { rng } from "./util.ts";

function block(seed: number, bytes: number): Uint8Array {
  const r = rng(seed);
  // Half noise, half zeros: realistic compressibility, and several 60 KB parts per chunk.
  return Uint8Array.from({ length: bytes }, (_, i) => (i % 2 ? 0 : r.int(256)));
}

/** A test on a fresh store in a temporary folder, closed and removed afterwards. */
function withStore(test: (store: SessionStore) => Promise<void>): () => Promise<void> {
  return async () => {
    const dir = await Deno.makeTempDir({ prefix: "strata-store-" });
    const store = await SessionStore.open(join(dir, "s.sqlite"));
    try {
      await test(store);
    } finally {
      store.close();
      await Deno.remove(dir, { recursive: true });
    }
  };
}

Deno.test(
  "session store: blocks round-trip, and a corrupt chunk keeps the valid prefix",
  withStore(async (store) => {
    const blocks = [block(1, 300_000), block(2, 300_000), block(3, 300_000)];
    const meta = {
      id: "abc",
      model: "m",
      tokens: Uint32Array.from({ length: 40 }, (_, i) => i),
      computed: 39,
      createdAt: 1,
      updatedAt: 2,
    };
    await store.save(meta, blocks);
    const [m] = await store.list("m");
    assert.equal(m.id, "abc");
    assert.deepEqual([...m.tokens], [...meta.tokens]);
    assert.ok(m.blocks[0].parts > 1, "a 300 KB block must span several KV values");
    const back = await store.restore(m);
    assert.equal(back.blocks.length, 3);
    back.blocks.forEach((b, i) => assert.deepEqual(b, blocks[i]));
    assert.deepEqual(await store.list("other"), []);

    // Flip one byte of the second block's first part: restore stops before it.
    assert.equal(m.blocks[1].planes, 4, "f32 elements (no kv field)");
    const key = ["kvblock", m.blocks[1].hash, 4, 0];
    const part = (await store.kv.get<Uint8Array>(key)).value!;
    part[100] ^= 0xff;
    await store.kv.set(key, part);
    const partial = await store.restore(m);
    assert.equal(partial.blocks.length, 1);
    assert.deepEqual(partial.blocks[0], blocks[0]);

    await store.delete("abc");
    assert.deepEqual(await store.list(), []);
  }),
);

Deno.test(
  "session store: a later snapshot reuses chunks by reference and writes only new ones",
  withStore(async (store) => {
    const blocks = [block(4, 100_000), block(5, 100_000), block(6, 100_000)];
    const meta = { id: "s", model: "m", computed: 40, createdAt: 1, updatedAt: 2 };
    const tokens = Uint32Array.from({ length: 41 }, (_, i) => i);
    const first = await store.save({ ...meta, tokens }, blocks.slice(0, 2));
    assert.equal(first.length, 2);
    const chunks = async () => {
      let n = 0;
      for await (const _ of store.kv.list({ prefix: ["kvblock"] })) n++;
      return n;
    };
    const before = await chunks();
    // The next turn: the first block by reference, the second rewritten, a third new.
    const longer = Uint32Array.from({ length: 60 }, (_, i) => i);
    const second = await store.save(
      { ...meta, tokens: longer, computed: 59, updatedAt: 3 },
      [first[0], blocks[1], blocks[2]],
    );
    assert.deepEqual(second[0], first[0]);
    assert.deepEqual(second[1], first[1], "the same bytes name the same chunk");
    assert.equal(await chunks(), before + second[2].parts, "only the new block was written");
    const [m] = await store.list("m");
    assert.equal(m.computed, 59);
    const back = await store.restore(m);
    assert.equal(back.blocks.length, 3);
    back.blocks.forEach((b, i) => assert.deepEqual(b, blocks[i]));
  }),
);

Deno.test(
  "session store: chunks of earlier snapshots (whole blocks deflated) still restore",
  withStore(async (store) => {
    // What a snapshot wrote before blocks were packed in planes: ["chunk", hash, i] values of
    // the deflated block, and entries without `planes`.
    const old = block(7, 150_000), meta = { id: "o", model: "m", computed: 16 };
    const tokens = Uint32Array.from({ length: 17 }, (_, i) => i);
    const [entry] = await store.save({ ...meta, tokens, createdAt: 1, updatedAt: 2 }, [old]);
    const packed = deflateSync(old, { level: 1 });
    const parts = Math.ceil(packed.byteLength / 60_000);
    for (let i = 0; i < parts; i++) {
      await store.kv.set(["chunk", entry.hash, i], packed.subarray(i * 60_000, (i + 1) * 60_000));
    }
    const legacy = { hash: entry.hash, parts, bytes: old.byteLength };
    const [m] = await store.list();
    await store.kv.set(["session", "o"], { ...m, blocks: [legacy] });
    for await (const e of store.kv.list({ prefix: ["kvblock"] })) await store.kv.delete(e.key);
    const [back] = await store.list();
    assert.deepEqual(back.blocks, [legacy]);
    assert.deepEqual((await store.restore(back)).blocks, [old]);
    // A later turn refers to it; new blocks are packed in planes beside it.
    const next = block(8, 150_000);
    const longer = Uint32Array.from({ length: 33 }, (_, i) => i);
    const entries = await store.save(
      { ...meta, tokens: longer, computed: 32, createdAt: 1, updatedAt: 3 },
      [legacy, next],
    );
    assert.equal(entries[1].planes, 4);
    const [m2] = await store.list();
    assert.deepEqual((await store.restore(m2)).blocks, [old, next]);
  }),
);

Deno.test(
  "session store: a block of more values than one commit takes round-trips",
  withStore(async (store) => {
    // 1.2 MB of noise: ~20 values of 60 kB, written in two atomic commits (Deno KV takes 800 KiB).
    const r = rng(11);
    const big = Uint8Array.from({ length: 1_200_000 }, () => r.int(256));
    const meta = { id: "big", model: "m", computed: 16, createdAt: 1, updatedAt: 2 };
    const tokens = Uint32Array.from({ length: 17 }, (_, i) => i);
    const [entry] = await store.save({ ...meta, tokens }, [big]);
    assert.ok(entry.parts > 12, `${entry.parts} parts`);
    const [m] = await store.list();
    assert.deepEqual((await store.restore(m)).blocks, [big]);
  }),
);
