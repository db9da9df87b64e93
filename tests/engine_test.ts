/**
 * End to end: the GPU engine against the float64 reference forward on random test models that
 * cover GQA, MQA, tied embeddings, Qwen2 biases, head_dim 64 and 128, and f32/f16/bf16 weights.
 * Reference logits are teacher-forced along the engine's own tokens, so one early near-tie
 * cannot derail the rest of the comparison.
 */
import assert from "node:assert/strict";
import { Engine } from "../engine/engine.ts";
import { type KvDtype, parseKvDtype } from "../gpu/dtype.ts";
import { SessionStore } from "../engine/sessions/store.ts";
import { sampling, type SamplingOptions } from "../api/types.ts";
import { loadModelFolder } from "../engine/model/folder.ts";
import { logSoftmax, ReferenceModel, topMargin } from "../engine/model/reference_forward.ts";
import { makeTestModel, type TestModelOptions, withTestModel } from "../scripts/make_test_model.ts";
import { rng, testGpu } from "./util.ts";

/** The small test models most engine tests run on. */
const SMALL_MODEL: TestModelOptions = {
  arch: "llama",
  dtype: "f16",
  hidden: 64,
  heads: 2,
  kvHeads: 1,
};
const MEDIUM_MODEL: TestModelOptions = {
  arch: "llama",
  dtype: "f16",
  hidden: 128,
  heads: 4,
  kvHeads: 2,
};

const VARIANTS: [string, TestModelOptions][] = [
  ["llama f32 MQA tied hd64", {
    arch: "llama",
    dtype: "f32",
    hidden: 128,
    heads: 2,
    kvHeads: 1,
    ffn: 160,
    layers: 2,
    tie: true,
  }],
  ["qwen2 bf16 GQA biases hd64", {
    arch: "qwen2",
    dtype: "bf16",
    hidden: 256,
    heads: 4,
    kvHeads: 2,
    ffn: 320,
    layers: 2,
  }],
  ["mistral f16 GQA hd128 explicit", {
    arch: "mistral",
    dtype: "f16",
    hidden: 96,
    heads: 4,
    kvHeads: 2,
    headDim: 128,
    ffn: 200,
    layers: 2,
    seed: 7,
  }],
  ["llama bf16 llama3-rope", {
    arch: "llama",
    dtype: "bf16",
    hidden: 128,
    heads: 4,
    kvHeads: 4,
    ffn: 192,
    layers: 3,
    ropeScaling: "llama3",
    seed: 3,
  }],
];

function greedy(maxTokens: number, extra: Partial<SamplingOptions> = {}): SamplingOptions {
  return sampling({ maxTokens, stopAtEos: false, ...extra });
}

async function collect(
  engine: Engine,
  promptIds: number[],
  sampling: SamplingOptions,
  sessionId?: string,
) {
  const gen = engine.generate({ promptIds, sampling, sessionId });
  const tokens: number[] = [], logprobs: number[] = [];
  for await (const t of gen) {
    tokens.push(t.id);
    logprobs.push(t.logprob);
  }
  return { tokens, logprobs, result: await gen.result };
}

for (const [name, options] of VARIANTS) {
  Deno.test(`engine matches float64 reference: ${name}`, async () => {
    await testGpu();
    await withTestModel(options, async (dir) => {
      const engine = await Engine.load(dir, { maxSlots: 4, contextLength: 128, maxChunk: 32 });
      const ref = await ReferenceModel.load(await loadModelFolder(dir));
      const r = rng(11);
      const V = ref.config.vocabSize;
      let compared = 0, worst = 0;
      for (const len of [1, 7, 40]) {
        const prompt = Array.from({ length: len }, () => r.int(Math.min(V, 300)));
        const got = await collect(engine, prompt, greedy(24));
        assert.equal(got.tokens.length, 24);
        assert.equal(got.result.finishReason, "length");
        const logits = ref.forward([...prompt, ...got.tokens]);
        for (let i = 0; i < got.tokens.length; i++) {
          const row = logits[len - 1 + i];
          const lp = logSoftmax(row);
          const best = lp.indexOf(Math.max(...lp));
          const margin = topMargin(row);
          if (margin > 0.05) {
            assert.equal(got.tokens[i], best, `prompt ${len}, step ${i}: margin ${margin}`);
            compared++;
          }
          const d = Math.abs(got.logprobs[i] - lp[got.tokens[i]]);
          worst = Math.max(worst, d);
          assert.ok(d <= 0.05, `prompt ${len}, step ${i}: |Δ logprob| = ${d}`);
        }
      }
      console.log(
        `${name}: ${compared}/72 argmax checks (margin > 0.05), max |Δ logprob| ${worst}`,
      );
      assert.ok(compared >= 36, `too few decisive steps (${compared}): the test model is too flat`);
    });
  });
}

Deno.test("engine with an f16 KV cache matches the reference with K and V rounded to f16", async () => {
  await testGpu();
  await withTestModel(MEDIUM_MODEL, async (dir) => {
    const engine = await Engine.load(dir, {
      maxSlots: 2,
      contextLength: 128,
      maxChunk: 32,
      kvDtype: "f16",
    });
    const ref = await ReferenceModel.load(await loadModelFolder(dir));
    const r = rng(12);
    let worst = 0, worstUnrounded = 0;
    for (const len of [5, 45]) {
      const prompt = Array.from({ length: len }, () => r.int(300));
      const got = await collect(engine, prompt, greedy(16));
      const seq = [...prompt, ...got.tokens];
      const rounded = ref.forward(seq, { kvRound: Math.f16round });
      const exact = ref.forward(seq);
      for (let i = 0; i < got.tokens.length; i++) {
        const id = got.tokens[i];
        const lp = logSoftmax(rounded[len - 1 + i]);
        if (topMargin(rounded[len - 1 + i]) > 0.05) {
          assert.equal(id, lp.indexOf(Math.max(...lp)), `prompt ${len}, step ${i}`);
        }
        worst = Math.max(worst, Math.abs(got.logprobs[i] - lp[id]));
        worstUnrounded = Math.max(
          worstUnrounded,
          Math.abs(got.logprobs[i] - logSoftmax(exact[len - 1 + i])[id]),
        );
      }
    }
    console.log(`f16 KV: max |Δ logprob| ${worst} (against an unrounded cache: ${worstUnrounded})`);
    // Measured on lavapipe: 1.9e-4 against the rounded reference, 1.9e-3 against the exact one
    // (what an f32 cache would give). The rest is f16 rounding of f32 (GPU) against float64
    // (reference) values at the rounding boundary.
    assert.ok(worst <= 6e-4, `|Δ logprob| ${worst} against the f16-rounded reference`);
  });
});

Deno.test("sessions saved from an f32 KV cache come back into an f16 one, and the reverse", async () => {
  await testGpu();
  const dir = await Deno.makeTempDir({ prefix: "strata-engine-" });
  try {
    const model = `${dir}/model`;
    await makeTestModel(model, SMALL_MODEL);
    const prompt = Array.from({ length: 20 }, (_, i) => 30 + i);
    const opts = { maxSlots: 1, contextLength: 128 };
    for (const [from, to] of [["f32", "f16"], ["f16", "f32"]] as KvDtype[][]) {
      const path = `${dir}/${from}.sqlite3`;
      let store = await SessionStore.open(path);
      const a = await Engine.load(model, { ...opts, store, kvDtype: from });
      const said = (await collect(a, prompt, greedy(8), "s")).tokens;
      await a.flushSnapshots();
      store.close();
      // The next turn, on an engine of the other dtype that restores the session.
      store = await SessionStore.open(path);
      const b = await Engine.load(model, { ...opts, store, kvDtype: to });
      assert.equal(b.session("s")?.tokens, 27, `${from} -> ${to}: restored`);
      const turn = [...prompt, ...said, 1, 2, 3];
      const got = await collect(b, turn, greedy(6), "s");
      assert.equal(got.result.cachedTokens, 27, `${from} -> ${to}: KV reused`);
      await b.flushSnapshots();
      store.close();
      // The same turn prefilled from scratch on a fresh engine of that dtype.
      const fresh = await collect(
        await Engine.load(model, { ...opts, kvDtype: to }),
        turn,
        greedy(6),
      );
      assert.deepEqual(got.tokens, fresh.tokens, `${from} -> ${to}: tokens`);
      got.logprobs.forEach((lp, i) => {
        const d = Math.abs(lp - fresh.logprobs[i]);
        assert.ok(d <= 1e-2, `${from} -> ${to}, token ${i}: |Δ logprob| ${d}`);
      });
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("session snapshots copy only the blocks a turn added, and restore the whole session", async () => {
  await testGpu();
  await withTestModel(SMALL_MODEL, async (model) => {
    const dir = await Deno.makeTempDir({ prefix: "strata-snap-" });
    try {
      const path = `${dir}/s.sqlite3`;
      const opts = { maxSlots: 2, contextLength: 256 };
      let store = await SessionStore.open(path);
      const a = await Engine.load(model, { ...opts, store });
      const prompt = Array.from({ length: 40 }, (_, i) => 30 + i);
      const first = await collect(a, prompt, greedy(9), "s");
      await a.flushSnapshots();
      // 48 tokens hold KV for 48: blocks 0-2, all copied.
      assert.deepEqual(a.kvStats().snapshotBlocks, { copied: 3, reused: 0 });
      const turn2 = [...prompt, ...first.tokens, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14];
      const second = await collect(a, turn2, greedy(8), "s");
      assert.equal(second.result.cachedTokens, 48, "the first turn's KV is reused");
      await a.flushSnapshots();
      // 65 tokens, KV for 65: blocks 0-4; 0-2 were whole in the first snapshot.
      assert.deepEqual(a.kvStats().snapshotBlocks, { copied: 5, reused: 3 });
      // A turn that rewrites history (another second-turn prompt): only block 0 still matches.
      const other = [...prompt.slice(0, 20), 99, 98, 97];
      const said = (await collect(a, other, greedy(4), "s")).tokens;
      await a.flushSnapshots();
      assert.deepEqual(a.kvStats().snapshotBlocks, { copied: 6, reused: 4 });
      store.close();

      // After a restart the session comes back whole: its next turn gives what the same turn
      // gives on an engine that never stopped.
      store = await SessionStore.open(path);
      const b = await Engine.load(model, { ...opts, store });
      assert.equal(b.session("s")?.tokens, 26);
      const turn3 = [...other, ...said, ...Array.from({ length: 40 }, (_, i) => 200 + i)];
      const resumed = await collect(b, turn3, greedy(6), "s");
      assert.equal(resumed.result.cachedTokens, 26);
      await b.flushSnapshots();
      // 73 tokens, KV for 72: block 0 (whole among the 26 restored tokens) is reused, 1-4 new.
      assert.deepEqual(b.kvStats().snapshotBlocks, { copied: 4, reused: 1 });
      store.close();
      const fresh = await collect(await Engine.load(model, opts), turn3, greedy(6));
      assert.deepEqual(resumed.tokens, fresh.tokens);
      store = await SessionStore.open(path);
      const c = await Engine.load(model, { ...opts, store });
      assert.equal(c.session("s")?.tokens, turn3.length + 5, "the last snapshot, whole");
      store.close();
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  });
});

Deno.test("engine: the KV pool's size, by default a memory budget, and bad sizes refused", async () => {
  await testGpu();
  await withTestModel(SMALL_MODEL, async (dir) => {
    const total = async (o: { kvDtype?: KvDtype; kvBlocks?: number }) =>
      (await Engine.load(dir, { maxSlots: 1, contextLength: 64, ...o })).kvStats().gpu.total;
    // 4096 blocks of f32 or 8192 of f16 (the same bytes), less the trash block.
    assert.equal(await total({}), 4095);
    assert.equal(await total({ kvDtype: "f16" }), 8191);
    assert.equal(await total({ kvDtype: "f16", kvBlocks: 50 }), 49);
    await assert.rejects(
      () => total({ kvBlocks: 1 }),
      /--kv-blocks must be an integer >= 2; got 1/,
    );
    assert.equal(parseKvDtype(undefined), "f32");
    assert.throws(() => parseKvDtype("bf16"), /--kv-dtype must be f32 or f16; got 'bf16'/);
  });
});

Deno.test("engine: prefill launches are built per size class, for any slot and position", async () => {
  await testGpu();
  await withTestModel(SMALL_MODEL, async (dir) => {
    const engine = await Engine.load(dir, { maxSlots: 2, contextLength: 512, maxChunk: 200 });
    const d = engine.runner.forward;
    assert.deepEqual(
      [1, 2, 3, 5, 32, 33, 64, 65, 190, 193, 200].map((n) => d.prefillRows(n)),
      [1, 2, 4, 8, 32, 64, 64, 96, 192, 200, 200],
    );
    const chunk = (n: number, slot: number, pos0: number) =>
      d.prefill(n, { slot, pos0, last: false, region: 0, withTop: false });
    // Other lengths of the class, other slots and positions: the same launches.
    assert.equal(chunk(70, 0, 0), chunk(96, 1, 300));
    assert.notEqual(chunk(70, 0, 0), chunk(97, 0, 0));
    // The padded rows change nothing: a prompt run as chunks of 70 and 33 tokens gives the
    // tokens and logprobs of the whole prompt in one chunk of 103 (rows 96 + 64 against 128).
    const prompt = Array.from({ length: 103 }, (_, i) => (i * 7 + 3) % 200);
    const whole = await collect(engine, prompt, greedy(6));
    const chunked = await Engine.load(dir, { maxSlots: 2, contextLength: 512, maxChunk: 70 });
    const parts = await collect(chunked, prompt, greedy(6));
    assert.deepEqual(parts.tokens, whole.tokens);
    parts.logprobs.forEach((lp, i) => assert.ok(Math.abs(lp - whole.logprobs[i]) < 1e-4));
  });
});

Deno.test("engine: timers and sockets get their turn while a generation runs", async () => {
  await testGpu();
  const server = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen() {} },
    () => new Response("ok"),
  );
  await withTestModel(SMALL_MODEL, async (dir) => {
    const engine = await Engine.load(dir, { maxSlots: 1, contextLength: 512, maxSteps: 16 });
    await engine.runner.readback.ring.idle(); // its buffers are primed: every read is early
    // Readbacks resolve without a timer (gpu/readback.ts); if the scheduler never returned
    // to the event loop, a timer or a request made at the first token would wait until the
    // readback pool ran dry (8 submissions, 79 tokens here) or the generation ended. With one
    // yield per readback they get their turn about 16 tokens in (K ramps 1, 2, 4, 8, 16).
    const gen = engine.generate({ promptIds: [1, 2, 3], sampling: greedy(300) });
    let received = 0;
    let timer: Promise<number> | undefined, fetched: Promise<number> | undefined;
    for await (const _ of gen) {
      if (++received > 1) continue;
      timer = new Promise((r) => setTimeout(() => r(received), 0));
      fetched = fetch(`http://127.0.0.1:${server.addr.port}/`).then((r) => r.text())
        .then(() => received);
    }
    assert.equal(received, 300);
    const [t, f] = [await timer!, await fetched!];
    assert.ok(t < 48, `the timer fired after ${t} tokens`);
    assert.ok(f < 48, `the request was answered after ${f} tokens`);
    // Once K reached 16, the loop slept through most of each submission's GPU time.
    assert.ok(engine.hostStats().pacedMs > 0, "the loop never slept before a readback");
  }).finally(() => server.shutdown());
});

Deno.test("engine: tokens do not depend on batch composition or steps per submission", async () => {
  await testGpu();
  await withTestModel(MEDIUM_MODEL, async (dir) => {
    const prompts = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21], [
      9,
    ]];
    const seeded = (seed: number) =>
      greedy(20, { temperature: 0.9, topP: 0.95, topK: 40, seed: BigInt(seed) });
    const run = async (engine: Engine, together: boolean | "staggered") => {
      const jobs = prompts.map((p, i) => () =>
        collect(engine, p, i === 1 ? greedy(20) : seeded(i))
      );
      if (together === "staggered") {
        // The others arrive while the first decodes (admitted between its submissions).
        const first = jobs[0]();
        const start = engine.hostStats().submissions;
        while (engine.hostStats().submissions < start + 3) {
          await new Promise((r) => setTimeout(r, 1));
        }
        return await Promise.all([first, ...jobs.slice(1).map((j) => j())]);
      }
      if (together) return await Promise.all(jobs.map((j) => j()));
      const out = [];
      for (const j of jobs) out.push(await j());
      return out;
    };
    const one = await Engine.load(dir, { maxSlots: 4, contextLength: 64, maxSteps: 1 });
    const many = await Engine.load(dir, { maxSlots: 4, contextLength: 64, maxSteps: 16 });
    // One submission queued at a time, or four: the queue changes timing, never tokens.
    const shallow = await Engine.load(dir, {
      maxSlots: 4,
      contextLength: 64,
      maxSteps: 4,
      queueDepth: 1,
    });
    const deep = await Engine.load(dir, { maxSlots: 4, contextLength: 64, queueDepth: 4 });
    const alone = await run(one, false);
    const batched = await run(many, true);
    const late = await Engine.load(dir, { maxSlots: 4, contextLength: 64, maxSteps: 2 });
    for (
      const [name, engine, mode] of [
        ["shallow", shallow, true],
        ["deep", deep, true],
        ["staggered", late, "staggered"],
      ] as const
    ) {
      const got = await run(engine, mode);
      for (let i = 0; i < prompts.length; i++) {
        assert.deepEqual(got[i].tokens, alone[i].tokens, `${name} queue, prompt ${i}`);
      }
    }
    for (let i = 0; i < prompts.length; i++) {
      assert.deepEqual(batched[i].tokens, alone[i].tokens, `prompt ${i}`);
    }
    // Every token came out of a recorded step, and encoding them took host time.
    const stats = one.hostStats();
    const generated = alone.reduce((n, r) => n + r.tokens.length, 0);
    assert.ok(stats.steps >= generated, `${stats.steps} steps for ${generated} tokens`);
    assert.ok(stats.submissions >= stats.steps && stats.ms > 0, JSON.stringify(stats));
  });
});

Deno.test("engine: a burst beside running streams prefills a chunk's worth per readback round", async () => {
  await testGpu();
  await withTestModel(SMALL_MODEL, async (dir) => {
    const prompt = (seed: number, n = 40) =>
      Array.from({ length: n }, (_, i) => 10 + ((i * 7 + seed) % 90));
    const burst = (engine: Engine) =>
      Promise.all([0, 1, 2, 3, 4].map((i) => collect(engine, prompt(i), greedy(6))));
    // On an idle engine a burst is admitted whole, so that the sequences decode together: the
    // first starts alone, the other four prompts (160 tokens) are queued at once.
    const idle = await Engine.load(dir, { maxSlots: 6, contextLength: 256, maxChunk: 64 });
    const together = await burst(idle);
    assert.equal(idle.hostStats().prefillPeak, 160);
    // Beside a decoding stream, each readback blocks the event loop (and the stream) until the
    // GPU has done everything queued: at most 64 prompt tokens per round.
    const engine = await Engine.load(dir, { maxSlots: 6, contextLength: 256, maxChunk: 64 });
    const long = collect(engine, prompt(9), greedy(120));
    const start = engine.hostStats().steps;
    while (engine.hostStats().steps < start + 24) await new Promise((r) => setTimeout(r, 1));
    const beside = await burst(engine);
    await long;
    assert.ok(
      engine.hostStats().prefillPeak <= 64,
      `${engine.hostStats().prefillPeak} prompt tokens queued at once`,
    );
    for (let i = 0; i < beside.length; i++) {
      assert.deepEqual(beside[i].tokens, together[i].tokens, `prompt ${i}`);
    }
    // A prompt longer than a chunk still goes to the GPU whole, in chunks.
    const again = collect(engine, prompt(9), greedy(60));
    const now = engine.hostStats().steps;
    while (engine.hostStats().steps < now + 24) await new Promise((r) => setTimeout(r, 1));
    await collect(engine, prompt(8, 150), greedy(2));
    await again;
    assert.equal(engine.hostStats().prefillPeak, 150);
  });
});

Deno.test("engine: sessions whose turns wait behind a request give their KV back when nothing runs", async () => {
  await testGpu();
  await withTestModel(SMALL_MODEL, async (dir) => {
    // 8 usable blocks, one slot. Sessions a and b hold 3 blocks each and their second turns
    // queue behind c's first, which needs 3 of the 2 left: before, the three waited for each
    // other forever, and the scheduler spun without yielding to the event loop.
    const engine = await Engine.load(dir, { maxSlots: 1, contextLength: 96, kvBlocks: 9 });
    const prompt = (seed: number) =>
      Array.from({ length: 32 }, (_, i) => 10 + ((i * 7 + seed) % 90));
    const turns = new Map<string, { tokens: number[]; cached: number; prompt: number[] }>();
    const session = async (id: string, seed: number) => {
      const first = prompt(seed);
      const a = await collect(engine, first, greedy(8), id);
      const second = [...first, ...a.tokens, ...prompt(seed + 50).slice(0, 16)];
      const b = await collect(engine, second, greedy(8), id);
      turns.set(id, { tokens: b.tokens, cached: b.result.cachedTokens, prompt: second });
    };
    let timer: ReturnType<typeof setTimeout> | undefined;
    const stuck = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error("the sessions deadlocked")), 60_000);
    });
    try {
      await Promise.race([Promise.all([session("a", 1), session("b", 2), session("c", 3)]), stuck]);
    } finally {
      clearTimeout(timer);
    }
    assert.equal(turns.get("b")?.cached, 0, "b's queued turn gave its KV back");
    assert.ok(turns.get("a")!.cached > 0, "a's kept it");
    // Every second turn gives what it gives on an engine with room to spare.
    const roomy = await Engine.load(dir, { maxSlots: 1, contextLength: 96 });
    for (const [id, t] of turns) {
      assert.deepEqual((await collect(roomy, t.prompt, greedy(8))).tokens, t.tokens, id);
    }
  });
});

Deno.test("engine: a caller appending the reply to its prompt array changes nothing", async () => {
  await testGpu();
  await withTestModel(SMALL_MODEL, async (dir) => {
    const engine = await Engine.load(dir, { maxSlots: 1, contextLength: 128 });
    const prompt = Array.from({ length: 20 }, (_, i) => 30 + i);
    const want = await collect(engine, [...prompt], greedy(8), "plain");
    const history = [...prompt];
    const gen = engine.generate({ promptIds: history, sampling: greedy(8), sessionId: "reuse" });
    for await (const t of gen) history.push(t.id); // the caller's array grows meanwhile
    await gen.result;
    assert.deepEqual(history.slice(20), want.tokens);
    assert.equal(engine.session("reuse")?.tokens, engine.session("plain")?.tokens);
    // The next turn finds the session free and its KV cached.
    const next = await collect(engine, [...history, 7], greedy(2), "reuse");
    assert.equal(next.result.cachedTokens, 27);
  });
});

Deno.test("engine: idle sessions give their KV back when the pool runs out", async () => {
  await testGpu();
  await withTestModel(SMALL_MODEL, async (dir) => {
    // 7 blocks (block 0 is the trash block) of 16 tokens; one sequence may use 64 tokens.
    const engine = await Engine.load(dir, { maxSlots: 2, contextLength: 64, kvBlocks: 7 });
    const prompt = Array.from({ length: 40 }, (_, i) => 10 + i);
    const gen = engine.generate({ promptIds: prompt, sampling: greedy(8), sessionId: "a" });
    for await (const _ of gen) { /* drain */ }
    assert.equal(engine.session("a")?.tokens, 47);
    const held = engine.kvStats().gpu.used;
    assert.equal(held, 3, "the session keeps the blocks of its 48 tokens");
    // 30 tokens need 2 of the 3 free blocks: the session keeps its KV.
    const other = await collect(engine, prompt.slice(0, 20), greedy(10));
    assert.equal(other.tokens.length, 10);
    assert.equal(engine.session("a")?.tokens, 47);
    // 64 new tokens (no prefix shared with the session) need 4 blocks: only evicting the idle
    // session makes room.
    const more = await collect(engine, prompt.map((t) => t + 100).slice(0, 50), greedy(14));
    assert.equal(more.tokens.length, 14);
    assert.equal(engine.session("a")?.tokens, 0, "the idle session was evicted");
    // The evicted session still answers: its next turn prefills again.
    const again = engine.generate({ promptIds: prompt, sampling: greedy(8), sessionId: "a" });
    const tokens = [];
    for await (const t of again) tokens.push(t.id);
    assert.equal(tokens.length, 8);
  });
});
