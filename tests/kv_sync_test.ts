/**
 * Durable turns (`kvSync`): a session's turn ends only once its snapshot is committed, and fails
 * when it cannot be; without it the turn ends at its last token and the snapshot lands after.
 */
import assert from "node:assert/strict";
import { Engine } from "../engine/engine.ts";
import { SessionStore } from "../engine/sessions/store.ts";
import { sampling } from "../api/types.ts";
import { withTestModel } from "../scripts/make_test_model.ts";
import { testGpu } from "./util.ts";

const MODEL = { arch: "llama", dtype: "f16", hidden: 64, heads: 2, kvHeads: 1 } as const;
const PROMPT = Array.from({ length: 30 }, (_, i) => 10 + i);

async function withStore<T>(fn: (path: string) => Promise<T>): Promise<T> {
  const dir = await Deno.makeTempDir({ prefix: "strata-kvsync-" });
  try {
    return await fn(`${dir}/s.sqlite3`);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

function turn(engine: Engine, session?: string) {
  return engine.generate({
    promptIds: PROMPT,
    sampling: sampling({ maxTokens: 5, stopAtEos: false }),
    sessionId: session,
  });
}

Deno.test("kv-sync: a session's turn ends once its snapshot is committed", async () => {
  await testGpu();
  await withTestModel(MODEL, (dir) =>
    withStore(async (path) => {
      const store = await SessionStore.open(path);
      const engine = await Engine.load(dir, {
        maxSlots: 2,
        contextLength: 128,
        store,
        kvSync: true,
      });
      const r = await turn(engine, "s").result;
      // Committed before the result: the store already holds the turn.
      assert.ok(r.persistedAt !== undefined);
      assert.equal(engine.session("s")?.persistedAt, r.persistedAt);
      const [m] = await store.list();
      assert.equal(m.id, "s");
      assert.equal(m.tokens.length, PROMPT.length + 5);
      assert.equal(m.computed, PROMPT.length + 4); // the last token's KV is not written yet
      // A request without a session has nothing to persist: it ends at its last token.
      assert.equal((await turn(engine).result).persistedAt, undefined);
      // A snapshot that cannot commit fails the turn instead of acknowledging it.
      store.close();
      await assert.rejects(turn(engine, "s").result, /the turn was not persisted/);
    }));
});

Deno.test("kv-sync: without it the turn ends first and the snapshot follows", async () => {
  await testGpu();
  await withTestModel(MODEL, (dir) =>
    withStore(async (path) => {
      const store = await SessionStore.open(path);
      const engine = await Engine.load(dir, { maxSlots: 2, contextLength: 128, store });
      const r = await turn(engine, "s").result;
      assert.equal(r.persistedAt, undefined);
      await engine.flushSnapshots();
      assert.ok(engine.session("s")?.persistedAt);
      store.close();
      await assert.rejects(
        () => Engine.load(dir, { contextLength: 128, kvSync: true }),
        /--kv-sync needs --kv PATH/,
      );
    }));
});
