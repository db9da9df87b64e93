/**
 * The tiers below the GPU in the engine, on a random test model with a pool so small that one
 * long request evicts every idle session and overwrites all its GPU blocks: the session's next
 * turn comes back from host memory, from real spill files, or from the snapshot store (real Deno
 * KV), with greedy tokens identical to an engine whose pool never evicted and the restored tokens
 * reported as cached. A corrupt or missing spill file falls back to prefilling; prefixes are found
 * by hash below the GPU within a tenant only; the breaker pauses spills after a slow one.
 */
import assert from "node:assert/strict";
import { Engine, type EngineOptions } from "../engine/engine.ts";
import { sampling, type SamplingOptions } from "../api/types.ts";
import { SessionStore } from "../engine/sessions/store.ts";
import { makeTestModel } from "../scripts/make_test_model.ts";
import { testGpu } from "./util.ts";

const dir = await Deno.makeTempDir({ prefix: "strata_tiers_" });
globalThis.addEventListener("unload", () => Deno.removeSync(dir, { recursive: true }));
const model = `${dir}/model`;
await makeTestModel(model, { arch: "llama", dtype: "f16", hidden: 64, heads: 2, kvHeads: 1 });

/**
 * One slot; 9 usable blocks of 16 tokens, exactly what the long request takes (120 + 24
 * tokens), so every block an evicted session had on the GPU is overwritten.
 */
const TINY: EngineOptions = {
  maxSlots: 1,
  contextLength: 144,
  kvBlocks: 10,
  // The breaker has a test of its own: a loaded CPU machine must not trip it in the others.
  kvSpillLimitMs: 60_000,
};

const greedy = (maxTokens: number): SamplingOptions => sampling({ maxTokens, stopAtEos: false });
/** `n` token ids drawn from `seed` (a different prompt per seed: nothing cached across them). */
const ids = (n: number, seed: number) =>
  Array.from({ length: n }, (_, i) => 3 + ((seed * 31 + i * 7 + ((i * i * seed) >> 3)) % 90));

async function run(
  engine: Engine,
  promptIds: number[],
  o: { session?: string; tenant?: string; max?: number } = {},
) {
  const gen = engine.generate({
    promptIds,
    sampling: greedy(o.max ?? 8),
    sessionId: o.session,
    tenant: o.tenant,
  });
  const tokens: number[] = [];
  for await (const t of gen) tokens.push(t.id);
  return { tokens, cached: (await gen.result).cachedTokens };
}

/** The long request: 120 + 24 tokens, the whole pool (a fresh prompt each time). */
let longs = 1000;
const long = (engine: Engine, tenant?: string) =>
  run(engine, ids(120, longs++), { max: 24, tenant });

/**
 * Session `s{seed}`'s two turns (a 40-token prompt, 8 tokens, then 8 more prompt tokens), with
 * the long request between them and `between` after it; the second turn's result.
 */
async function twoTurns(
  engine: Engine,
  seed: number,
  o: { tenant?: string; between?: () => Promise<void> } = {},
) {
  const session = `s${seed}`, first = ids(40, seed);
  const said = await run(engine, first, { session, tenant: o.tenant });
  await long(engine, o.tenant);
  await engine.flushSnapshots(); // spills landed (and written to files)
  await o.between?.();
  const second = [...first, ...said.tokens, ...ids(8, seed + 500)];
  return await run(engine, second, { session, tenant: o.tenant });
}

/** The same two turns on an engine with room for everything: what an evicted one must say. */
const roomyEngine = await (async () => {
  await testGpu();
  return await Engine.load(model, { maxSlots: 1, contextLength: 144 });
})();
async function roomy(seed: number): Promise<number[]> {
  const session = `s${seed}`, first = ids(40, seed);
  const said = await run(roomyEngine, first, { session });
  const next = await run(roomyEngine, [...first, ...said.tokens, ...ids(8, seed + 500)], {
    session,
  });
  assert.equal(next.cached, 47, "the roomy engine kept the session on the GPU");
  return next.tokens;
}

Deno.test("tiers: a session evicted to host memory comes back with its tokens cached", async () => {
  const engine = await Engine.load(model, { ...TINY, kvHostBytes: 1 << 20 });
  const r = await twoTurns(engine, 1);
  assert.deepEqual(r.tokens, await roomy(1));
  // 47 tokens were computed: their two whole blocks went down and came back.
  assert.equal(r.cached, 32);
  const t = engine.kvStats().tiers!;
  assert.equal(t.restored.host, 2);
  assert.equal(t.spilled.blocks, 2);
  assert.ok(t.profile && t.profile.recomputeTokensPerS > 0, "the profile was measured");
});

Deno.test("tiers: through spill files, with a corrupt and a missing file falling back", async () => {
  const spill = await Deno.makeTempDir({ dir, prefix: "spill_" });
  const engine = await Engine.load(model, {
    ...TINY,
    kvHostBytes: 0,
    kvSpillDir: spill,
    kvTierPolicy: "always",
  });
  const files = async () =>
    (await Array.fromAsync(Deno.readDir(spill))).map((e) => `${spill}/${e.name}`).sort();
  const ok = await twoTurns(engine, 2, {
    between: async () => assert.equal((await files()).length, 2, "one file per whole block"),
  });
  assert.deepEqual(ok.tokens, await roomy(2));
  assert.equal(ok.cached, 32);
  assert.equal(engine.kvStats().tiers!.restored.file, 2);
  assert.equal(engine.kvStats().tiers!.host.bytes, 0, "host memory keeps nothing (budget 0)");

  // A flipped byte in each record: the checksum catches it; the whole turn is prefilled.
  const corrupt = await twoTurns(engine, 3, {
    between: async () => {
      for (const path of await files()) {
        const bytes = await Deno.readFile(path);
        bytes[bytes.length - 3] ^= 0x40;
        await Deno.writeFile(path, bytes);
      }
    },
  });
  assert.deepEqual(corrupt.tokens, await roomy(3), "the session is not corrupted");
  assert.equal(corrupt.cached, 0);
  // Both reads were in flight together (the prefetch distance is at least 4).
  assert.equal(engine.kvStats().tiers!.failed, 2, "both records read as corrupt");

  // Missing files: the same.
  const missing = await twoTurns(engine, 4, {
    between: async () => {
      for (const path of await files()) await Deno.remove(path);
    },
  });
  assert.deepEqual(missing.tokens, await roomy(4));
  assert.equal(missing.cached, 0);
  // And it goes on: a session evicted now comes back from its files.
  const again = await twoTurns(engine, 5);
  assert.deepEqual(again.tokens, await roomy(5));
  assert.equal(again.cached, 32);
});

Deno.test("tiers: a prompt's prefix comes back from host memory within its tenant only", async () => {
  const engine = await Engine.load(model, { ...TINY, kvHostBytes: 1 << 20 });
  const first = ids(40, 6);
  await run(engine, first, { session: "a/s", tenant: "a" });
  await long(engine, "a");
  await engine.flushSnapshots();
  const prompt = [...first.slice(0, 32), ...ids(5, 7)];
  const other = await run(engine, prompt, { tenant: "b" });
  assert.equal(other.cached, 0, "tenant b finds nothing of tenant a's blocks");
  assert.equal(engine.kvStats().tiers!.restored.host, 0);
  const own = await run(engine, prompt, { tenant: "a" });
  assert.equal(own.cached, 32, "tenant a's request finds the session's blocks below the GPU");
  assert.equal(engine.kvStats().tiers!.restored.host, 2);
});

Deno.test("tiers: from the snapshot store (Deno KV) when nothing else holds the session", async () => {
  const store = await SessionStore.open(`${dir}/store.sqlite`);
  try {
    const engine = await Engine.load(model, { ...TINY, store, kvTierPolicy: "always" });
    const r = await twoTurns(engine, 8);
    assert.deepEqual(r.tokens, await roomy(8));
    assert.equal(r.cached, 32);
    const t = engine.kvStats().tiers!;
    assert.equal(t.restored.kv, 2);
    assert.equal(t.spilled.blocks, 0, "no host memory or files: nothing spilled");
    assert.ok(t.profile?.kv, "the profile measured the store");
    await engine.flushSnapshots();
  } finally {
    store.close();
  }
});

Deno.test("tiers: a slow spill pauses spills, and evicted sessions then drop their KV", async () => {
  // Every spill is slower than 1 µs.
  const engine = await Engine.load(model, { ...TINY, kvHostBytes: 1 << 20, kvSpillLimitMs: 1e-3 });
  const first = await twoTurns(engine, 9);
  assert.equal(first.cached, 32, "the slow spill still landed");
  const b = engine.kvStats().tiers!.breaker;
  assert.ok(b.paused && b.trips === 1, JSON.stringify(b));
  assert.match(
    b.reason!,
    /copying a spilled block \(.*\) out of the GPU's mapping took \d+ ms \(limit 0\.001 ms\)/,
  );
  // While paused, an eviction drops the KV: the next turn prefills in full.
  const prompt = ids(40, 10);
  const said = await run(engine, prompt, { session: "t" });
  await long(engine);
  const back = await run(engine, [...prompt, ...said.tokens, 5], { session: "t" });
  assert.equal(back.cached, 0);
  assert.ok(engine.kvStats().tiers!.breaker.skipped >= 1);
});

Deno.test("tiers: the start-up profile measures every tier and leaves nothing behind", async () => {
  const spill = await Deno.makeTempDir({ dir, prefix: "profile_" });
  const store = await SessionStore.open(`${dir}/profile.sqlite`);
  try {
    const engine = await Engine.load(model, {
      ...TINY,
      kvHostBytes: 1 << 20,
      kvSpillDir: spill,
      store,
    });
    const p = engine.kvStats().tiers!.profile!;
    for (
      const r of [p.gpuToHost, p.hostToGpu, p.hostToFile!, p.fileToHost!, p.kvWrite!, p.kvRead!]
    ) {
      assert.ok(r.gbPerS > 0 && r.latencyMs >= 0, JSON.stringify(r));
    }
    assert.equal(
      p.blockBytes,
      2 * 2 * 16 * 32 * 4,
      "2 layers × 1 KV head × 16 rows × 32 dims, K and V",
    );
    assert.ok(Math.abs(p.recomputeMsPerBlock - (16 / p.recomputeTokensPerS) * 1000) < 1e-9);
    for (const u of [p.host, p.file!, p.kv!]) {
      assert.equal(u.use, u.restoreMsPerBlock < p.recomputeMsPerBlock, u.reason);
      assert.match(u.reason, /a block comes back in [\d.]+ ms, recomputing it takes [\d.]+ ms/);
    }
    assert.ok(p.prefetchBlocks >= 4 && p.prefetchBlocks <= 64);
    assert.ok(p.measureMs > 0);
    assert.deepEqual(await Array.fromAsync(Deno.readDir(spill)), [], "the probe's files are gone");
    assert.equal(engine.kvStats().tiers!.file!.bytes, 0);
    assert.deepEqual(await Array.fromAsync(store.kv.list({ prefix: ["kvprobe"] })), []);
  } finally {
    store.close();
  }
});
