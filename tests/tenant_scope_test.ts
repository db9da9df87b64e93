/**
 * The prefix cache per tenant, in the engine: a request shares KV blocks (and reports them as
 * cached) only with earlier requests of the same tenant, also after its session comes back from
 * the store; the tokens are the same whoever asks.
 */
import assert from "node:assert/strict";
import { Engine } from "../engine/engine.ts";
import { SessionStore } from "../engine/sessions/store.ts";
import { sampling } from "../api/types.ts";
import { withTestModel } from "../scripts/make_test_model.ts";
import { testGpu } from "./util.ts";

const MODEL = { arch: "llama", dtype: "f16", hidden: 64, heads: 2, kvHeads: 1 } as const;

async function run(engine: Engine, promptIds: number[], o: { tenant?: string; session?: string }) {
  const gen = engine.generate({
    promptIds,
    sampling: sampling({ maxTokens: 4, stopAtEos: false }),
    tenant: o.tenant,
    sessionId: o.session,
  });
  const tokens: number[] = [];
  for await (const t of gen) tokens.push(t.id);
  return { tokens, cached: (await gen.result).cachedTokens };
}

const PROMPT = Array.from({ length: 40 }, (_, i) => 20 + i); // two whole blocks and a part

Deno.test("tenants: the prefix cache is shared within a tenant, never across", async () => {
  await testGpu();
  await withTestModel(MODEL, async (dir) => {
    const engine = await Engine.load(dir, { maxSlots: 2, contextLength: 128 });
    const first = await run(engine, PROMPT, { tenant: "a" });
    assert.equal(first.cached, 0);
    assert.equal((await run(engine, PROMPT, { tenant: "a" })).cached, 32);
    const other = await run(engine, PROMPT, { tenant: "b" });
    assert.equal(other.cached, 0, "tenant b learns nothing of tenant a's prompt");
    assert.deepEqual(other.tokens, first.tokens);
    assert.equal((await run(engine, PROMPT, {})).cached, 0, "nor does a request without one");
    assert.equal((await run(engine, PROMPT, {})).cached, 32);
    assert.equal((await run(engine, PROMPT, { tenant: "b" })).cached, 32);
  });
});

Deno.test("tenants: a restored session keeps its tenant's scope", async () => {
  await testGpu();
  await withTestModel(MODEL, async (dir) => {
    const tmp = await Deno.makeTempDir({ prefix: "strata-tenant-" });
    try {
      const path = `${tmp}/s.sqlite3`;
      let store = await SessionStore.open(path);
      const a = await Engine.load(dir, { maxSlots: 1, contextLength: 128, store });
      const said = await run(a, PROMPT, { tenant: "a", session: "a/s" });
      await a.flushSnapshots();
      store.close();
      store = await SessionStore.open(path);
      const b = await Engine.load(dir, { maxSlots: 1, contextLength: 128, store });
      assert.equal(b.session("a/s")?.tokens, PROMPT.length + 3);
      // Another tenant (or none) finds nothing of the restored blocks…
      assert.equal((await run(b, PROMPT, { tenant: "b" })).cached, 0);
      assert.equal((await run(b, PROMPT, {})).cached, 0);
      // …its own tenant does, and the session continues where it was.
      assert.equal((await run(b, PROMPT, { tenant: "a" })).cached, 32);
      const next = await run(b, [...PROMPT, ...said.tokens, 7], { tenant: "a", session: "a/s" });
      assert.equal(next.cached, PROMPT.length + 3);
      // A session driven by another tenant's scope is an internal error, not a quiet share.
      assert.throws(
        () =>
          b.generate({ promptIds: PROMPT, sampling: sampling({ maxTokens: 1 }), sessionId: "a/s" }),
        /internal error: session 'a\/s' is another tenant's/,
      );
      await b.flushSnapshots();
      store.close();
    } finally {
      await Deno.remove(tmp, { recursive: true });
    }
  });
});
