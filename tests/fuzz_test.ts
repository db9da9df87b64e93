/**
 * A fuzz of 1 200 malformed requests (tests/fuzz_cases.ts, seeded) against the real server:
 * the real engine on a small random test model behind the real listener, twelve sockets at a
 * time. No answer may be a 5xx, the app's answers must be OpenAI-shaped errors, nothing may be
 * logged, and afterwards the server must still serve a real completion.
 */
import assert from "node:assert/strict";
import OpenAI from "openai";
import { WorkerEngine } from "../engine/worker/host.ts";
import { createApp } from "../routes/app.ts";
import { listen } from "../routes/listen.ts";
import { makeTestModel } from "../scripts/make_test_model.ts";
import { fuzzCases } from "./fuzz_cases.ts";
import { rawRequest, type RawResponse } from "./raw_http.ts";

const KEY = "sk-fuzz";
const SEED = 20261201, COUNT = 1200, PARALLEL = 12;

Deno.test(`fuzz: ${COUNT} malformed requests, no 5xx, nothing logged, service afterwards`, async () => {
  const dir = await Deno.makeTempDir({ prefix: "strata_fuzz_" });
  await makeTestModel(dir, {});
  const engine = await WorkerEngine.load({ dir }, { contextLength: 64, maxSlots: 4 });
  const server = listen(
    createApp(engine, { apiKey: KEY, maxBodyBytes: 64 * 1024, bodyTimeoutMs: 1500 }).fetch,
    { hostname: "127.0.0.1", port: 0, headerTimeoutMs: 1500, idleTimeoutMs: 1500 },
  );
  const port = server.addr.port;
  const logged: string[] = [];
  const { error, warn } = console;
  console.error = console.warn = (...args: unknown[]) => logged.push(args.map(String).join(" "));
  try {
    const cases = fuzzCases(SEED, COUNT, KEY);
    const results: { kind: string; r: RawResponse }[] = [];
    let next = 0;
    await Promise.all(Array.from({ length: PARALLEL }, async () => {
      while (next < cases.length) {
        const c = cases[next++];
        const r = await rawRequest(port, c.parts, { timeoutMs: 4000, ...c.options });
        results.push({ kind: c.kind, r });
      }
    }));
    const byStatus = new Map<string, number>();
    for (const { kind, r } of results) {
      const key = `${kind} ${r.status ?? "none"}`;
      byStatus.set(key, (byStatus.get(key) ?? 0) + 1);
      assert.ok(r.status === null || r.status < 500, `${kind}: ${r.raw.slice(0, 400)}`);
      // What the app answers is OpenAI-shaped; Deno's own parser answers bare 400s.
      if (r.status! >= 400 && r.headers["content-type"]?.startsWith("application/json")) {
        const body = JSON.parse(r.body);
        assert.equal(typeof body.error?.message, "string", r.body);
        assert.equal(typeof body.error?.code, "string", r.body);
      }
    }
    console.log([...byStatus].sort().map(([k, n]) => `${k}: ${n}`).join("\n"));
    const answered = results.filter(({ r }) => r.status !== null).length;
    assert.ok(answered > COUNT * 0.8, `only ${answered} of ${COUNT} requests were answered`);
  } finally {
    Object.assign(console, { error, warn });
  }
  assert.deepEqual(logged, [], "the server logged while it was fuzzed");
  const client = new OpenAI({ apiKey: KEY, baseURL: `http://127.0.0.1:${port}/v1` });
  const done = await client.completions.create({
    model: engine.modelId,
    prompt: "Once upon a time",
    max_tokens: 4,
  });
  assert.equal(done.choices.length, 1);
  assert.ok(done.usage!.completion_tokens >= 1);
  await server.shutdown();
  await engine.close();
  await Deno.remove(dir, { recursive: true });
});
