/** SessionStore on a real Deno KV file: round trip, chunks over 64 KiB, corruption fallback. */
import assert from "node:assert/strict";
import { join } from "node:path";
import { deflateSync } from "fflate";
import { SessionStore } from "../engine/sessions/store.ts";
import { rng } from "./util.ts";

function block(seed: number, bytes: number): Uint8Array {
  const r = rng(seed);
  // Half noise, half zeros: realistic compressibility, and several 60 KB parts per chunk.
  return Uint8Array.from({ length: bytes }, (_, i) => (i % 2 ? 0 : r.int(256)));
}

/** A test given a store path in a temporary folder, removed afterwards. */
function withPath(test: (path: string) => Promise<void>): () => Promise<void> {
  return async () => {
    const dir = await Deno.makeTempDir({ prefix: "strata-store-" });
    try {
      await test(join(dir, "s.sqlite"));
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  };
}

/** A test on a fresh store in a temporary folder, closed and removed afterwards. */
function withStore(test: (store: SessionStore) => Promise<void>): () => Promise<void> {
  return withPath(async (path) => {
    const store = await SessionStore.open(path);
    try {
      await test(store);
    } finally {
      store.close();
    }
  });
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

/** Chunk records by tier, and which chunks have values in Deno KV or a file. */
async function tiers(store: SessionStore) {
  const out = { kv: new Set<string>(), fs: new Set<string>(), values: new Set<string>() };
  for await (const e of store.kv.list<{ tier: "kv" | "fs" }>({ prefix: ["kvmeta"] })) {
    out[e.value.tier].add(String(e.key[1]));
  }
  for await (const e of store.kv.list({ prefix: ["kvblock"] })) out.values.add(String(e.key[1]));
  return out;
}

/** Names of the chunk files in the cold folder (empty when there is none). */
async function files(store: SessionStore): Promise<string[]> {
  try {
    return (await Array.fromAsync(Deno.readDir(store.coldDir!))).map((e) => e.name).sort();
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) return [];
    throw e;
  }
}

const session = (id: string, updatedAt: number, n: number) => ({
  id,
  model: "m",
  tokens: Uint32Array.from({ length: 16 * n + 1 }, (_, i) => i),
  computed: 16 * n,
  createdAt: 1,
  updatedAt,
});

Deno.test(
  "session store: over the warm budget, the oldest sessions' chunks move to files and restore bit for bit",
  withPath(async (path) => {
    const blocks = Array.from({ length: 6 }, (_, i) => block(20 + i, 120_000));
    let store = await SessionStore.open(path);
    assert.equal(store.coldDir, `${path}.cold`);
    const ids = ["old", "mid", "new"];
    const saved = [];
    for (const [i, id] of ids.entries()) {
      saved.push(await store.save(session(id, 10 + i, 2), blocks.slice(2 * i, 2 * i + 2)));
    }
    await store.maintain();
    const all = store.warmUsed;
    assert.deepEqual(await files(store), [], "under the default budget everything stays warm");
    store.close();

    // Reopened with room for a little more than two sessions' chunks: the oldest one moves.
    store = await SessionStore.open(path, { warmBytes: Math.ceil(all * 0.7) });
    try {
      await store.maintain();
      const t = await tiers(store);
      const hashes = saved.map((entries) => entries.map((e) => e.hash));
      assert.deepEqual([...t.fs].sort(), [...hashes[0]].sort(), "the oldest session went cold");
      for (const h of [...hashes[1], ...hashes[2]]) assert.ok(t.kv.has(h) && t.values.has(h));
      for (const h of hashes[0]) assert.ok(!t.values.has(h), "its values left Deno KV");
      assert.deepEqual(await files(store), hashes[0].map((h) => `${h}-4.kvb`).sort());
      assert.ok(store.warmUsed <= store.warmBytes);
      assert.equal(store.tierOf(saved[0][0]), "fs");
      assert.equal(store.tierOf(saved[2][1]), "kv");
      for (const m of await store.list()) {
        const i = ids.indexOf(m.id);
        assert.deepEqual((await store.restore(m)).blocks, blocks.slice(2 * i, 2 * i + 2));
      }

      // A new session with a cold block's bytes refers to the file instead of writing it again.
      const entries = await store.save(session("again", 20, 2), [blocks[0], block(30, 120_000)]);
      assert.deepEqual(entries[0], saved[0][0]);
      assert.ok(!(await tiers(store)).values.has(entries[0].hash));
      const [m] = await store.list();
      assert.equal(m.id, "again");
      assert.deepEqual((await store.restore(m)).blocks, [blocks[0], block(30, 120_000)]);

      // A cold file that went bad stops the restore there, as a bad value does.
      const file = join(store.coldDir!, `${saved[0][1].hash}-4.kvb`);
      const bytes = await Deno.readFile(file);
      bytes[bytes.length - 1] ^= 0xff;
      await Deno.writeFile(file, bytes);
      const old = (await store.list()).find((s) => s.id === "old")!;
      assert.deepEqual((await store.restore(old)).blocks, [blocks[0]]);
    } finally {
      store.close();
    }
  }),
);

Deno.test(
  "session store: chunks no snapshot refers to are deleted in both tiers after the grace period",
  withPath(async (path) => {
    const [x, y, z] = [block(40, 90_000), block(41, 90_000), block(42, 90_000)];
    let store = await SessionStore.open(path, { graceMs: 0, warmBytes: 0 });
    try {
      const a = await store.save(session("a", 1, 2), [x, y]);
      const b = await store.save(session("b", 2, 2), [y, z]);
      await store.maintain();
      let t = await tiers(store);
      assert.equal(t.fs.size, 3, "a budget of 0 sends every chunk to a file");
      assert.equal(t.values.size, 0);
      await store.delete("a");
      await store.maintain();
      t = await tiers(store);
      assert.deepEqual([...t.fs].sort(), [b[0].hash, b[1].hash].sort(), "x went, y is b's too");
      assert.deepEqual(await files(store), [`${b[0].hash}-4.kvb`, `${b[1].hash}-4.kvb`].sort());
      assert.equal(store.tierOf(a[0]), undefined);
      const [m] = await store.list();
      assert.deepEqual((await store.restore(m)).blocks, [y, z]);
      // Leftovers of a move or a deletion that stopped half way go too: a temporary file, and
      // the file of a chunk without a record.
      await Deno.writeFile(join(store.coldDir!, `${a[0].hash}-4.kvb.1234.tmp`), x);
      await Deno.writeFile(join(store.coldDir!, `${a[0].hash}-4.kvb`), x);
      await store.maintain();
      assert.deepEqual(await files(store), [`${b[0].hash}-4.kvb`, `${b[1].hash}-4.kvb`].sort());
    } finally {
      store.close();
    }

    // Within the grace period an unreferenced chunk stays: a snapshot writes its chunks before
    // its manifest, and a collection must not take them in between.
    store = await SessionStore.open(path, { warmBytes: 0 });
    try {
      const [c] = await store.save(session("c", 3, 1), [block(43, 90_000)]);
      await store.delete("c");
      await store.maintain();
      assert.ok((await tiers(store)).fs.has(c.hash));
      assert.ok((await files(store)).includes(`${c.hash}-4.kvb`));
    } finally {
      store.close();
    }
  }),
);

Deno.test(
  "session store: a store written before chunk records gets them, and its orphans are collected",
  withPath(async (path) => {
    let store = await SessionStore.open(path);
    const kept = block(50, 90_000), orphan = block(51, 90_000);
    const [k] = await store.save(session("k", 1, 1), [kept]);
    const [o] = await store.save(session("o", 2, 1), [orphan]);
    // What an older version left: the same values, no records, a deleted session's chunk.
    await store.kv.delete(["session", "o"]);
    for await (const e of store.kv.list({ prefix: ["kvmeta"] })) await store.kv.delete(e.key);
    await store.kv.delete(["strata", "chunk-records"]);
    store.close();

    store = await SessionStore.open(path, { graceMs: 0 });
    try {
      const t = await tiers(store);
      assert.deepEqual([...t.kv].sort(), [k.hash, o.hash].sort(), "records made at open");
      assert.equal(store.tierOf(k), "kv");
      await store.maintain();
      assert.deepEqual([...(await tiers(store)).values], [k.hash]);
      const [m] = await store.list();
      assert.deepEqual((await store.restore(m)).blocks, [kept]);
    } finally {
      store.close();
    }
  }),
);

/**
 * Runs tests/store_child.ts on the store at `path` and kills it (SIGKILL) a random few ms after
 * its `lines`-th line. Returns the lines it printed.
 */
async function killChild(args: string[], lines: number, r: ReturnType<typeof rng>) {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", new URL("./store_child.ts", import.meta.url).pathname, ...args],
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  let text = "";
  while (text.split("\n").length <= lines) {
    const { value, done } = await reader.read();
    if (done) break;
    text += value;
  }
  await new Promise((resolve) => setTimeout(resolve, r.int(40)));
  child.kill("SIGKILL");
  await child.status;
  reader.cancel().catch(() => {});
  return text.trim().split("\n");
}

/**
 * What must hold after any crash: every manifest restores all its blocks; and after a pass
 * without grace period, the records are exactly the chunks manifests refer to, each whole in its
 * tier, and the cold folder holds their files and nothing else.
 */
async function assertConsistent(path: string) {
  const store = await SessionStore.open(path, { graceMs: 0, warmBytes: 100_000 });
  try {
    const manifests = await store.list();
    for (const m of manifests) {
      const back = await store.restore(m);
      assert.equal(back.blocks.length, m.blocks.length, `session ${m.id} lost blocks`);
    }
    await store.maintain();
    const used = new Set(manifests.flatMap((m) => m.blocks.map((b) => b.hash)));
    const t = await tiers(store);
    assert.deepEqual([...t.kv, ...t.fs].sort(), [...used].sort());
    assert.deepEqual([...t.values].sort(), [...t.kv].sort(), "values of warm chunks only");
    assert.deepEqual(await files(store), [...t.fs].map((h) => `${h}-4.kvb`).sort());
    for (const m of manifests) {
      assert.equal((await store.restore(m)).blocks.length, m.blocks.length);
    }
    return { sessions: manifests.length, warm: t.kv.size, cold: t.fs.size };
  } finally {
    store.close();
  }
}

Deno.test(
  "session store: killed while writing, moving and deleting, it restarts whole",
  withPath(async (path) => {
    const r = rng(60);
    for (let round = 0; round < 4; round++) {
      const lines = await killChild(["write", path, String(round)], 6 + r.int(10), r);
      assert.ok(lines.length >= 6, lines.join("\n"));
      const state = await assertConsistent(path);
      assert.equal(state.sessions, 5);
      assert.ok(state.cold > 0 && state.warm > 0, JSON.stringify(state));
    }
    const lines = await killChild(["collect", path], 2, r);
    assert.ok(lines[0].startsWith("deleted"), lines.join("\n"));
    const state = await assertConsistent(path);
    assert.ok(state.sessions < 5, JSON.stringify(state));
  }),
);

Deno.test(
  "session store: a manifest over one value's 64 KiB goes in parts, reads back whole, and its " +
    "old bodies are collected after the grace period",
  withPath(async (path) => {
    const store = await SessionStore.open(path, { graceMs: 0 });
    try {
      // 40 000 token ids alone are 160 KB: one Deno KV value refused the manifest before.
      const long = (n: number, seed: number) => {
        const r = rng(seed);
        return Uint32Array.from({ length: n }, () => r.int(32_000));
      };
      const meta = { id: "long", model: "m", computed: 0, createdAt: 1, updatedAt: 2 };
      const first = { ...meta, tokens: long(40_000, 1), turns: [] };
      await store.save(first, []);
      const head = (await store.kv.get<{ body?: { parts: number } }>(["session", "long"])).value!;
      assert.ok(head.body && head.body.parts >= 3, JSON.stringify(head));
      assert.equal("tokens" in head, false, "the head holds no token ids");
      const [m] = await store.list("m");
      assert.deepEqual(m.tokens, first.tokens);

      // The next turn's manifest replaces it; a pass collects the old body, keeps the new one.
      const second = { ...meta, tokens: long(40_016, 2), updatedAt: 3 };
      await store.save(second, []);
      await store.maintain();
      const bodies = [];
      for await (const e of store.kv.list({ prefix: ["mbodymeta"] })) bodies.push(e.key[1]);
      assert.equal(bodies.length, 1);
      assert.deepEqual((await store.list("m"))[0].tokens, second.tokens);

      // A part gone: the session is skipped (and said so), not restored from a broken body.
      const ref = (await store.kv.get<{ body: { hash: string } }>(["session", "long"])).value!;
      await store.kv.delete(["mbody", ref.body.hash, 1]);
      const errors: unknown[] = [], error = console.error;
      console.error = (...a: unknown[]) => errors.push(a.join(" "));
      try {
        assert.deepEqual(await store.list("m"), []);
      } finally {
        console.error = error;
      }
      assert.match(String(errors[0]), /session 'long' has a missing or corrupt manifest body/);

      // Deleted: its body goes with the next pass.
      await store.delete("long");
      await store.maintain();
      for await (const e of store.kv.list({ prefix: ["mbody"] })) assert.fail(`left: ${e.key}`);
      for await (const e of store.kv.list({ prefix: ["mbodymeta"] })) assert.fail(`left: ${e.key}`);
    } finally {
      store.close();
    }
  }),
);
