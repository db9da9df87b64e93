/**
 * The engine in a worker (engine/worker/host.ts), as `main.ts serve` runs it: the same tokens as
 * the engine on this thread, the same errors (thrown before any token, of the same classes), the
 * session table mirrored here (turns, snapshots, deletes, a restart), cancels, the worker's own
 * failures, and this thread's event loop running while the worker waits on the GPU.
 */
import assert from "node:assert/strict";
import { sampling, type TokenEvent } from "../api/types.ts";
import { Engine } from "../engine/engine.ts";
import {
  ContextLengthError,
  EngineBusyError,
  InvalidRequestError,
  SessionBusyError,
} from "../api/errors.ts";
import { WorkerEngine } from "../engine/worker/host.ts";
import { fromWire, toWire } from "../engine/worker/protocol.ts";
import type { EngineLike, GenerateRequest } from "../api/types.ts";
import { withTestModel } from "../scripts/make_test_model.ts";
import { testGpu } from "./util.ts";

async function run(engine: EngineLike, request: GenerateRequest) {
  const gen = engine.generate(request);
  const events: TokenEvent[] = [];
  for await (const ev of gen) events.push(ev);
  return { events, result: await gen.result };
}

/** Six requests at once: greedy and seeded, with stop strings and top logprobs. */
function requests(engine: EngineLike): GenerateRequest[] {
  const prompts = ["Once upon a time", "The fox", "A", "In the beginning was", "hello", "x y z"];
  return prompts.map((p, i) => ({
    promptIds: engine.encode(p),
    sampling: sampling({
      maxTokens: 10 + 3 * i,
      temperature: i % 2 ? 0.9 : 0,
      topK: i === 3 ? 5 : 0,
      seed: BigInt(100 + i),
      topLogprobs: i === 1 ? 3 : 0,
      stop: i === 4 ? ["e"] : [],
    }),
  }));
}

Deno.test("worker engine: the same tokens, texts and logprobs as the engine on this thread", async () => {
  await testGpu();
  await withTestModel({}, async (dir) => {
    const opts = { maxSlots: 4, contextLength: 128 };
    const local = await Engine.load(dir, opts);
    const want = await Promise.all(requests(local).map((r) => run(local, r)));
    const remote = await WorkerEngine.load({ dir }, opts);
    try {
      assert.equal(remote.modelId, local.modelId);
      assert.equal(remote.adapterName, local.adapterName);
      assert.equal(remote.contextLength, local.contextLength);
      const got = await Promise.all(requests(remote).map((r) => run(remote, r)));
      for (let i = 0; i < want.length; i++) {
        assert.deepEqual(got[i].events, want[i].events, `request ${i}`);
        const { ttftMs: _a, ...g } = got[i].result, { ttftMs: _b, ...w } = want[i].result;
        assert.deepEqual(g, w, `request ${i}`);
      }
      assert.ok(want.some((w) => w.result.finishReason === "stop"), "a stop string matched");
      assert.deepEqual(remote.occupancy(), { running: 0, queued: 0, maxRunning: 4, maxQueued: 64 });
      assert.deepEqual(remote.kvStats(), local.kvStats());
      assert.ok((await remote.hostStats()).steps > 0, "the worker's host counters");
    } finally {
      await remote.close();
    }
  });
});

Deno.test("worker engine: request errors are thrown at once, of the engine's classes", async () => {
  await testGpu();
  await withTestModel({}, async (dir) => {
    const engine = await WorkerEngine.load({ dir }, {
      maxSlots: 1,
      maxQueued: 2,
      contextLength: 64,
    });
    try {
      const ids = engine.encode("hello there");
      const req = (n: number, more: Partial<GenerateRequest> = {}) => ({
        promptIds: ids,
        sampling: sampling({ maxTokens: n }),
        ...more,
      });
      assert.throws(() => engine.generate(req(4, { promptIds: [] })), InvalidRequestError);
      assert.throws(() => engine.generate(req(4, { promptIds: [1, 1e9] })), InvalidRequestError);
      assert.throws(() => engine.generate(req(1000)), ContextLengthError);
      // Until the worker reports them running, both count as queued: the third finds it full.
      const a = engine.generate(req(40, { sessionId: "s" }));
      assert.throws(() => engine.generate(req(4, { sessionId: "s" })), SessionBusyError);
      await assert.rejects(engine.deleteSession("s"), SessionBusyError);
      const b = engine.generate(req(4));
      assert.throws(() => engine.generate(req(4)), EngineBusyError);
      assert.equal((await a.result).finishReason, "length");
      assert.equal((await b.result).completionTokens, 4);
      assert.equal(engine.session("s")?.tokens, ids.length + 39);
      assert.equal(await engine.deleteSession("s"), true);
      assert.equal(engine.session("s"), undefined);
      assert.equal(await engine.deleteSession("s"), false);
    } finally {
      await engine.close();
    }
  });
});

Deno.test("worker engine: errors keep class and fields across the thread boundary", () => {
  const cases = [
    new ContextLengthError(100, 50, 128),
    new EngineBusyError(7, 3),
    new SessionBusyError("abc"),
    new InvalidRequestError("bad token", "prompt"),
  ];
  for (const e of cases) {
    const back = fromWire(structuredClone(toWire(e)));
    assert.equal(back.constructor, e.constructor);
    assert.equal(back.message, e.message);
    assert.deepEqual({ ...back }, { ...e });
  }
  const plain = fromWire(structuredClone(toWire(new RangeError("boom"))));
  assert.ok(plain instanceof Error);
  assert.equal(plain.name, "RangeError");
  assert.equal(plain.message, "boom");
});

Deno.test("worker engine: cancel ends the stream at once and frees the session", async () => {
  await testGpu();
  await withTestModel({}, async (dir) => {
    const engine = await WorkerEngine.load({ dir }, { maxSlots: 2, contextLength: 256 });
    try {
      const ids = engine.encode("a long story");
      const gen = engine.generate({
        promptIds: ids,
        sampling: sampling({ maxTokens: 200 }),
        sessionId: "c",
      });
      let n = 0;
      for await (const _ of gen) if (++n === 3) gen.cancel();
      assert.ok(n < 200, "the stream ended at the cancel (after the tokens already here)");
      const r = await gen.result;
      assert.equal(r.finishReason, "cancelled");
      assert.ok(r.completionTokens >= 3 && r.completionTokens < 200);
      // The session is free again, and holds the turn so far.
      const again = await run(engine, {
        promptIds: ids,
        sampling: sampling({ maxTokens: 2 }),
        sessionId: "c",
      });
      assert.equal(again.result.completionTokens, 2);
      // A signal cancels too.
      const abort = new AbortController();
      const g2 = engine.generate({
        promptIds: ids,
        sampling: sampling({ maxTokens: 200 }),
        signal: abort.signal,
      });
      abort.abort();
      assert.equal((await g2.result).finishReason, "cancelled");
      assert.deepEqual(engine.occupancy().running + engine.occupancy().queued, 0);
    } finally {
      await engine.close();
    }
  });
});

Deno.test("worker engine: sessions mirrored, snapshotted and restored after a restart", async () => {
  await testGpu();
  await withTestModel({}, async (dir) => {
    const kvPath = `${dir}/sessions.sqlite3`;
    const opts = { maxSlots: 2, contextLength: 128, kvPath };
    const a = await WorkerEngine.load({ dir }, opts);
    const ids = a.encode("remember this");
    let first;
    try {
      first = await run(a, {
        promptIds: ids,
        sampling: sampling({ maxTokens: 8 }),
        sessionId: "m",
      });
      const info = a.session("m")!;
      assert.equal(info.tokens, ids.length + 7);
      await a.flushSnapshots();
      // The persisted time comes with the worker's next message, sent once the write lands.
      assert.ok(a.session("m")?.persistedAt, "persistedAt mirrored after the flush");
      assert.ok(a.kvStats().kv.used > 0);
    } finally {
      await a.close();
    }
    const b = await WorkerEngine.load({ dir }, opts);
    try {
      assert.equal(b.session("m")?.tokens, ids.length + 7);
      const reply = first.events.map((e) => e.id);
      const next = await run(b, {
        promptIds: [...ids, ...reply, ...b.encode(" and more")],
        sampling: sampling({ maxTokens: 2 }),
        sessionId: "m",
      });
      assert.equal(next.result.cachedTokens, ids.length + 7);
    } finally {
      await b.close();
    }
  });
});

Deno.test("worker engine: a model that does not load rejects with the worker's error", async () => {
  await testGpu();
  await withTestModel({}, async (dir) => {
    await assert.rejects(
      WorkerEngine.load({ shape: "no-such-shape", tokenizerDir: dir }),
      /no-such-shape/,
    );
    await assert.rejects(WorkerEngine.load({ dir: `${dir}/missing` }), /does not exist/);
  });
});

Deno.test("worker engine: a closed engine fails its generations and refuses new ones", async () => {
  await testGpu();
  await withTestModel({}, async (dir) => {
    const engine = await WorkerEngine.load({ dir }, { maxSlots: 1, contextLength: 256 });
    const gen = engine.generate({
      promptIds: engine.encode("go"),
      sampling: sampling({ maxTokens: 200 }),
    });
    await engine.close();
    await assert.rejects(gen.result, /closed/);
    assert.throws(() =>
      engine.generate(
        { promptIds: [1], sampling: sampling({ maxTokens: 2 }) },
      ), /closed/);
  });
});
