/**
 * The tiers' bytes: host memory's buffers and budget (engine/kv/tier_host.ts), spill files
 * (engine/kv/tier_file.ts: real files, every way one can be wrong), and whole round trips through
 * a real GPU pool (engine/kv/tiers.ts): blocks spilled from the GPU to host memory and on to
 * files, their GPU blocks overwritten, then brought back by hash — bit for bit.
 */
import assert from "node:assert/strict";
import { BLOCK, blockHash, scopeRoot, SequenceBlocks } from "../engine/kv/blocks.ts";
import { KvPool } from "../engine/kv/pool.ts";
import { FILE_HEADER, FileTier } from "../engine/kv/tier_file.ts";
import { readerCount } from "../engine/kv/tier_file_readers.ts";
import { HostTier } from "../engine/kv/tier_host.ts";
import { KvTiers } from "../engine/kv/tiers.ts";
import type { ModelConfig } from "../engine/model/config.ts";
import type { StorageTierProfile } from "../api/types.ts";
import { rng, testGpu } from "./util.ts";

const dir = await Deno.makeTempDir({ prefix: "strata_tier_io_" });
globalThis.addEventListener("unload", () => Deno.removeSync(dir, { recursive: true }));

function randomBytes(n: number, seed: number): Uint8Array<ArrayBuffer> {
  const r = rng(seed), out = new Uint8Array(n);
  for (let i = 0; i < n; i++) out[i] = Math.floor(r.next() * 256);
  return out;
}

Deno.test("host tier: a budget, and buffers of a size handed out again", () => {
  const host = new HostTier(1000);
  const a = host.take(400), b = host.take(400);
  assert.equal(host.used, 800);
  assert.ok(host.fits(200) && !host.fits(201));
  const c = host.take(400);
  assert.equal(host.over, 200, "given past the budget; the caller moves blocks down");
  host.give(c);
  assert.equal(host.used, 800);
  host.give(a);
  assert.equal(host.take(400), a, "a kept buffer of that size comes back (warm pages)");
  host.give(b);
  assert.notEqual(host.take(300), b, "not one of another size");
  assert.throws(() => new HostTier(-1), /budget/);
  assert.throws(() => new HostTier(0, 0.5), /transit/);
});

Deno.test("file tier: reader threads only where the cores pay for them", () => {
  assert.deepEqual([1, 2, 3, 4, 5, 6, 16, 128].map((c) => readerCount(c)), [
    0,
    0,
    0,
    2,
    3,
    4,
    4,
    4,
  ]);
});

Deno.test("host tier: freed buffers are kept past the budget up to the transit allowance", () => {
  const host = new HostTier(0, 800);
  const bufs = [host.take(400), host.take(400), host.take(400)];
  assert.equal(host.over, 1200);
  for (const b of bufs) host.give(b);
  assert.equal(host.used, 0);
  assert.equal(host.spare, 800, "two kept (the allowance), the third left to the collector");
  const again = [host.take(400), host.take(400), host.take(400)];
  assert.ok(again[0] === bufs[1] && again[1] === bufs[0], "kept buffers come back");
  assert.ok(!bufs.includes(again[2]), "then fresh ones");
  assert.equal(host.spare, 0);
  const none = new HostTier(1000, 0);
  const a = none.take(600), b = none.take(600);
  none.give(a);
  assert.equal(none.spare, 0, "used 600 + 600 kept would pass the budget");
  none.give(b);
  assert.equal(none.spare, 600);
});

for (const memory of ["plain", "shared"] as const) {
  // Plain memory is read on this thread; shared memory (the host tier's) on reader threads.
  const alloc = (n: number) =>
    memory === "shared" ? new Uint8Array(new SharedArrayBuffer(n)) : new Uint8Array(n);
  const readers = memory === "shared" ? 2 : 0;
  Deno.test(`file tier: records round-trip bit for bit into ${memory} memory; a wrong file reads as missing`, async () => {
    const folder = `${dir}/files-${memory}`;
    await Deno.mkdir(folder);
    await Deno.writeFile(`${folder}/00000000000000aa.kvt`, new Uint8Array(3)); // an earlier run's
    await Deno.writeFile(`${folder}/00000000000000ab.kvt.x.tmp`, new Uint8Array(3));
    await Deno.writeFile(`${folder}/notes.txt`, new Uint8Array(3));
    const file = await FileTier.open(folder, 1 << 20, { readers });
    const names = async () => (await Array.fromAsync(Deno.readDir(folder))).map((e) => e.name);
    assert.deepEqual(await names(), ["notes.txt"], "block files of an earlier run are removed");

    const tokens = Array.from({ length: BLOCK }, (_, i) => 1000 + i);
    for (const [i, size] of [8, 8192, 98_304].entries()) {
      const hash = blockHash(BigInt(i), tokens), data = randomBytes(size, i + 1);
      await file.write(hash, tokens, data);
      const into = alloc(size);
      assert.ok(await file.read(hash, tokens, into));
      assert.deepEqual(into, data, `${size} bytes`);
      assert.ok(!(await file.read(hash, tokens, alloc(size + 4))), "another size");
      assert.ok(!(await file.read(hash, tokens.toReversed(), into)), "other tokens");
    }
    assert.equal(file.used, 3 * FILE_HEADER + 8 + 8192 + 98_304);
    assert.ok(file.fits(1 << 19) && !file.fits(1 << 20));

    const hash = blockHash(7n, tokens), data = randomBytes(4096, 7), into = alloc(4096);
    const path = file.path(hash);
    const damaged = async (edit: (b: Uint8Array) => Uint8Array) => {
      await file.write(hash, tokens, data);
      await Deno.writeFile(path, edit(await Deno.readFile(path)));
      return !(await file.read(hash, tokens, into));
    };
    assert.ok(await damaged((b) => (b[FILE_HEADER + 100] ^= 1, b)), "a flipped bit in the record");
    assert.ok(await damaged((b) => (b[0] = 0, b)), "another magic");
    assert.ok(await damaged((b) => (b[16] ^= 1, b)), "another hash in the header");
    assert.ok(await damaged((b) => (b[40] ^= 1, b)), "another token in the header");
    assert.ok(await damaged((b) => b.subarray(0, b.length - 1)), "cut short");
    assert.ok(await damaged((b) => new Uint8Array([...b, 0])), "a byte too many");
    assert.ok(await damaged((b) => b.subarray(0, 10)), "a header cut short");
    await Deno.remove(path);
    assert.ok(!(await file.read(hash, tokens, into)), "missing");
    const before = file.used;
    await file.remove(blockHash(0n, tokens));
    assert.equal(file.used, before - FILE_HEADER - 8);
    assert.ok(!(await file.read(blockHash(0n, tokens), tokens, alloc(8))));

    // Many reads in flight at once, then again after the reader threads were stopped.
    const many = Array.from({ length: 24 }, (_, i) => {
      const t = tokens.map((x) => x + i);
      return { hash: blockHash(100n, t), tokens: t, data: randomBytes(3000 + 8 * i, 50 + i) };
    });
    for (const m of many) await file.write(m.hash, m.tokens, m.data);
    for (let round = 0; round < 2; round++) {
      const got = many.map((m) => alloc(m.data.byteLength));
      const ok = await Promise.all(many.map((m, i) => file.read(m.hash, m.tokens, got[i])));
      assert.ok(ok.every((x) => x), `round ${round}: every read succeeds`);
      many.forEach((m, i) => assert.deepEqual(got[i], m.data, `round ${round}, block ${i}`));
      file.close();
    }
  });
}

/** A pool of a small model shape: 3 layers, 2 KV heads of 24 (awkward sizes). */
async function smallPool(numBlocks: number): Promise<KvPool> {
  const cfg = { nLayers: 3, nKvHeads: 2, headDim: 24 } as ModelConfig;
  return new KvPool(await testGpu(), cfg, { numBlocks, dtype: "f32" });
}

/** The K‖V records of `ids`, read back from the GPU. */
async function records(pool: KvPool, ids: number[]): Promise<Uint8Array[]> {
  const staging = pool.copyOut(ids), rec = 2 * pool.blockBytes;
  await staging.mapAsync(GPUMapMode.READ);
  const out = ids.map((_, i) => new Uint8Array(staging.getMappedRange(i * rec, rec).slice(0)));
  staging.destroy();
  return out;
}

/** A sequence of `n` tokens whose blocks hold random records; the records, by block. */
function filled(pool: KvPool, n: number, seed: number, tenant?: string) {
  const seq = new SequenceBlocks(pool.blocks, scopeRoot(tenant));
  const tokens = Array.from({ length: n }, (_, i) => 1 + ((i * 13 + seed) % 500));
  seq.appendPrompt(tokens);
  seq.reserve(n);
  const data = seq.table.map((id, i) => {
    const raw = randomBytes(2 * pool.blockBytes, seed * 100 + i);
    pool.write(id, raw);
    return raw;
  });
  seq.markComputed(n);
  return { seq, tokens, data };
}

/** Overwrites every free block of the GPU pool (what later requests do to evicted blocks). */
function overwriteFree(pool: KvPool): void {
  const ids = [];
  while (pool.blocks.freeCount > 0) ids.push(pool.blocks.allocate());
  for (const id of ids) pool.write(id, new Uint8Array(2 * pool.blockBytes));
  for (const id of ids) pool.blocks.release(id);
}

for (const via of ["host memory", "files"] as const) {
  Deno.test(`tiers: GPU → ${via} → GPU is bit-exact, found by hash`, async () => {
    const pool = await smallPool(12);
    const spill = via === "files" ? await Deno.makeTempDir({ dir }) : undefined;
    const tiers = new KvTiers(pool, {
      host: new HostTier(via === "files" ? 0 : 1 << 20),
      file: spill ? await FileTier.open(spill, 1 << 20, { readers: 2 }) : undefined,
    });
    // 3 whole blocks and 5 tokens: the whole ones go down, the partial one does not.
    const { seq, tokens, data } = filled(pool, 3 * BLOCK + 5, 1, "t");
    assert.equal(tiers.toCopy(seq), 3);
    assert.equal(tiers.spill("s", seq, { lastUse: Date.now() }), 3 * BLOCK);
    const hashes = [...seq.hashes];
    seq.free();
    overwriteFree(pool);
    tiers.startReads();
    await tiers.flush();
    const st = tiers.stats();
    assert.equal(st.spilled.blocks, 3);
    assert.equal(st[via === "files" ? "file" : "host"]!.blocks, 3);
    assert.equal(st.host.bytes, via === "files" ? 0 : 3 * data[0].byteLength);
    // Written blocks' buffers are kept past a budget of 0 (the transit allowance) for the reads.
    assert.equal(st.host.spareBytes, via === "files" ? 3 * data[0].byteLength : 0);
    if (spill) assert.equal((await Array.fromAsync(Deno.readDir(spill))).length, 3);

    // Another tenant's prompt with the same tokens finds nothing.
    const other = new SequenceBlocks(pool.blocks, scopeRoot("u"));
    other.appendPrompt([...tokens, 9]);
    assert.equal(tiers.plan(other), undefined);

    const back = new SequenceBlocks(pool.blocks, scopeRoot("t"));
    back.appendPrompt([...tokens, 9]);
    const plan = tiers.plan(back, { owner: "s" })!;
    assert.equal(plan.blocks, 3);
    await plan.done;
    assert.equal(tiers.take(plan, back), 3 * BLOCK);
    assert.equal(back.computed, 3 * BLOCK);
    assert.deepEqual(back.hashes, hashes);
    assert.deepEqual(await records(pool, back.table), data.slice(0, 3), "bit for bit");
    assert.equal(tiers.stats().restored[via === "files" ? "file" : "host"], 3);
    // Each restored block is sealed with its chained hash: the GPU's cache finds it again.
    const again = new SequenceBlocks(pool.blocks, scopeRoot("t"));
    assert.equal(again.appendPrompt([...tokens, 9]), 3 * BLOCK);
  });
}

Deno.test("tiers: host memory over its budget moves blocks to files, the least valuable first", async () => {
  const pool = await smallPool(16);
  const rec = 2 * pool.blockBytes;
  const spill = await Deno.makeTempDir({ dir });
  const tiers = new KvTiers(pool, {
    host: new HostTier(2 * rec),
    file: await FileTier.open(spill, 1 << 20),
  });
  const a = filled(pool, 2 * BLOCK, 2), b = filled(pool, 2 * BLOCK, 3);
  tiers.spill("a", a.seq, { lastUse: Date.now() - 60_000 }); // idle a minute: comes back last
  tiers.spill("b", b.seq, { lastUse: Date.now(), reuse: { turns: 3, gapMs: 1000 } });
  a.seq.free();
  b.seq.free();
  tiers.startReads();
  await tiers.flush();
  const st = tiers.stats();
  assert.deepEqual([st.host.blocks, st.file!.blocks], [2, 2]);
  for (const h of b.seq.hashes) assert.ok(tiers.manager.get(h)!.host, "b stays in memory");
  for (const h of a.seq.hashes) assert.ok(tiers.manager.get(h)!.file, "a went to files");
  assert.equal(st.written.blocks, 2);
});

Deno.test("tiers: without room in any tier, the least valuable blocks are dropped", async () => {
  const pool = await smallPool(16);
  const rec = 2 * pool.blockBytes;
  const tiers = new KvTiers(pool, { host: new HostTier(3 * rec) });
  const a = filled(pool, 2 * BLOCK, 4), b = filled(pool, 2 * BLOCK, 5);
  assert.equal(tiers.spill("a", a.seq, { lastUse: Date.now() - 60_000 }), 2 * BLOCK);
  tiers.startReads();
  await tiers.flush();
  // b's two blocks need one more block's room: a's last block goes (its chain's tail first).
  assert.equal(tiers.spill("b", b.seq, { lastUse: Date.now() }), 2 * BLOCK);
  tiers.startReads();
  await tiers.flush();
  assert.equal(tiers.stats().dropped, 1);
  assert.equal(tiers.manager.heldTokens("a", BLOCK), BLOCK);
  assert.equal(tiers.manager.heldTokens("b", BLOCK), 2 * BLOCK);
  assert.equal(tiers.stats().host.bytes, 3 * rec);
});

/** A profile whose verdicts are `use` (the rates do not matter to the decisions' users). */
function verdicts(use: { host: boolean; file?: boolean; kv?: boolean }): StorageTierProfile {
  const rate = { gbPerS: 1, latencyMs: 0 };
  const v = (u: boolean) => ({ use: u, restoreMsPerBlock: u ? 0.1 : 9, reason: "measured" });
  return {
    measuredAt: 0,
    measureMs: 1,
    blockBytes: 1,
    recomputeTokensPerS: 1000,
    recomputeMsPerBlock: 1,
    gpuToHost: rate,
    hostToGpu: rate,
    host: v(use.host),
    ...(use.file !== undefined ? { file: v(use.file) } : {}),
    ...(use.kv !== undefined ? { kv: v(use.kv) } : {}),
    prefetchBlocks: 4,
  };
}

Deno.test('tiers: the profile decides which tiers are used; "always" uses every one', async () => {
  const pool = await smallPool(8);
  const host = new HostTier(1 << 20),
    file = await FileTier.open(await Deno.makeTempDir({ dir }), 1 << 20);
  const t = new KvTiers(pool, { host, file });
  assert.deepEqual([t.uses("host"), t.uses("file"), t.uses("kv")], [true, true, false]);
  t.profile = verdicts({ host: true, file: false, kv: true });
  assert.deepEqual([t.uses("host"), t.uses("file"), t.uses("kv")], [true, false, true]);
  assert.ok(t.spilling);
  // Slower than recomputing everywhere: an evicted session drops its KV.
  t.profile = verdicts({ host: false, file: false });
  assert.ok(!t.spilling);
  const { seq } = filled(pool, 2 * BLOCK, 9);
  assert.equal(t.spill("s", seq, { lastUse: Date.now() }), 0);
  assert.equal(t.manager.size, 0);
  const always = new KvTiers(pool, { host, file, policy: "always" });
  always.profile = t.profile;
  assert.deepEqual([always.uses("host"), always.uses("file"), always.uses("kv")], [
    true,
    true,
    true,
  ]);
  const noFile = new KvTiers(pool, { host, policy: "always" });
  assert.ok(!noFile.uses("file"));
});

Deno.test("file tier: startReaders waits for every reader thread; a process does not wait for idle ones", async () => {
  const folder = await Deno.makeTempDir({ dir });
  const file = await FileTier.open(folder, 1 << 20, { readers: 3 });
  await file.startReaders();
  const tokens = [1, 2, 3], hash = blockHash(9n, tokens), data = randomBytes(5000, 9);
  await file.write(hash, tokens, data);
  const into = new Uint8Array(new SharedArrayBuffer(5000));
  assert.ok(await file.read(hash, tokens, into));
  assert.deepEqual(into, data);
  // A process whose tier read through its threads and was never closed still ends.
  const script = `import { FileTier } from ${
    JSON.stringify(new URL("../engine/kv/tier_file.ts", import.meta.url).href)
  };
const t = await FileTier.open(${JSON.stringify(folder + "/child")}, 1 << 20, { readers: 2 });
await t.startReaders();
await t.write(5n, [1], new Uint8Array(64).fill(7));
const into = new Uint8Array(new SharedArrayBuffer(64));
console.log(await t.read(5n, [1], into), into[63]);`;
  const path = `${folder}/child.ts`;
  await Deno.writeTextFile(path, script);
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "--config", new URL("../deno.json", import.meta.url).pathname, path],
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.timeout(60_000),
  }).output();
  assert.equal(
    new TextDecoder().decode(out.stdout).trim(),
    "true 7",
    new TextDecoder().decode(out.stderr),
  );
  assert.equal(out.code, 0);
  file.close();
});
