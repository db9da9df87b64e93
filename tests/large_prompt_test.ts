/**
 * A megabyte of prompt never stalls other clients: the real server (listener, worker engine)
 * tokenizes long prompts in tokenizer workers, so `/health` keeps answering at once while three
 * clients each send one, and the prompt-size limits still answer them (the context is far
 * shorter than such a prompt). A short chat still completes meanwhile.
 */
import assert from "node:assert/strict";
import { WorkerEngine } from "../engine/worker/host.ts";
import { createApp } from "../routes/app.ts";
import { listen } from "../routes/listen.ts";
import { makeTestModel } from "../scripts/make_test_model.ts";
import { testGpu } from "./util.ts";

Deno.test("a 1 MB prompt is tokenized off the server's thread: /health never waits", async () => {
  await testGpu();
  const dir = await Deno.makeTempDir({ prefix: "strata_bigprompt_" });
  await makeTestModel(dir, {});
  const engine = await WorkerEngine.load({ dir }, { contextLength: 256, maxSlots: 4 });
  const server = listen(createApp(engine, { maxBodyBytes: 4 << 20 }).fetch, {
    hostname: "127.0.0.1",
    port: 0,
  });
  const url = `http://127.0.0.1:${server.addr.port}`;
  try {
    const words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog"];
    const prompt = Array.from({ length: 260_000 }, (_, i) => words[(i * 7) % 9]).join(" ");
    assert.ok(prompt.length > 1_000_000);
    const post = (body: unknown) =>
      fetch(`${url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(body),
      });
    let busy = true;
    const big = Promise.all([1, 2, 3].map(() => post({ prompt, max_tokens: 4 })))
      .finally(() => (busy = false));
    // /health, every 25 ms while the big prompts are tokenized: each answer's delay past when
    // it was due, 25 ms after the one before (a stalled thread delays the poll itself too).
    const waits: number[] = [];
    let last = performance.now();
    while (busy) {
      await new Promise((r) => setTimeout(r, 25));
      const h = await fetch(`${url}/health`);
      await h.body?.cancel();
      const now = performance.now();
      waits.push(now - last - 25);
      last = now;
    }
    const answers = await big;
    for (const r of answers) {
      const j = await r.json();
      assert.equal(r.status, 400, JSON.stringify(j));
      assert.equal(j.error.code, "context_length_exceeded");
    }
    const short = await post({ prompt: "Once upon a time", max_tokens: 3 });
    assert.equal(short.status, 200, await short.clone().text());
    await short.body?.cancel();
    const worst = Math.max(...waits);
    console.log(`/health answered ${waits.length} times; the slowest in ${worst.toFixed(1)} ms`);
    assert.ok(waits.length >= 5, `the big prompts took only ${waits.length} polls`);
    assert.ok(worst < 250, `/health waited ${worst.toFixed(0)} ms behind the big prompts`);
  } finally {
    await server.shutdown();
    await engine.close();
    await Deno.remove(dir, { recursive: true });
  }
});
