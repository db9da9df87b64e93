/**
 * The `openai` client examples of README.md and docs/api.md, run as a reader would run them: each
 * code block saved to a file and run by `deno run` in a child process, against the real server
 * (the default model, models/strata-default, which README.md's example names; the engine in a
 * worker, as `main.ts serve` runs it), with no key in the environment and,
 * where the example reads one, with the server's key. Only the base URL is rewritten (the
 * examples say port 8000; the test server takes a free one).
 */
import assert from "node:assert/strict";
import { WorkerEngine } from "../engine/worker/host.ts";
import { createApp, type ServerOptions } from "../routes/app.ts";

const ROOT = new URL("../", import.meta.url).pathname;
const dir = await Deno.makeTempDir({ prefix: "strata_docs_" });
globalThis.addEventListener("unload", () => Deno.removeSync(dir, { recursive: true }));
const engine = await WorkerEngine.load({ dir: `${ROOT}models/strata-default` }, { maxSlots: 2 });
globalThis.addEventListener("unload", () => engine.close());

/** The ```ts blocks of `file` that construct an OpenAI client. */
async function clientExamples(file: string): Promise<string[]> {
  const text = await Deno.readTextFile(`${ROOT}${file}`);
  const blocks = [...text.matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1]);
  return blocks.filter((b) => b.includes("new OpenAI("));
}

/** Runs `code` with `deno run -A` against a server made with `options`; its exit and output. */
async function runExample(code: string, options: ServerOptions, env: Record<string, string>) {
  const server = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen() {} },
    createApp(engine, options).fetch,
  );
  try {
    const url = `http://127.0.0.1:${server.addr.port}/v1`;
    const rewritten = code.replace(/http:\/\/(?:localhost|127\.0\.0\.1):8000\/v1/g, url);
    assert.notEqual(rewritten, code, "the example has no base URL on port 8000");
    const file = `${dir}/example.ts`;
    await Deno.writeTextFile(file, rewritten);
    // The repository's deno.json maps "openai", as for a reader running it here.
    const child = new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", "--config", `${ROOT}deno.json`, file],
      clearEnv: true,
      env: { PATH: Deno.env.get("PATH") ?? "", HOME: Deno.env.get("HOME") ?? "", ...env },
      stdout: "piped",
      stderr: "piped",
    });
    const out = await child.output();
    const decode = (b: Uint8Array) => new TextDecoder().decode(b);
    return { code: out.code, stdout: decode(out.stdout), stderr: decode(out.stderr) };
  } finally {
    await server.shutdown();
  }
}

for (const file of ["README.md", "docs/api.md"]) {
  Deno.test(`${file}: the openai client example runs against a server without a key`, async () => {
    const examples = await clientExamples(file);
    assert.ok(examples.length > 0, `${file} has no openai client example`);
    for (const code of examples) {
      // No OPENAI_API_KEY or STRATA_API_KEY: the example must not need one for an open server.
      const r = await runExample(code, {}, {});
      assert.equal(r.code, 0, `${file}: exit ${r.code}\n${r.stderr}`);
      assert.doesNotMatch(r.stderr, /Missing credentials/);
      assert.ok(r.stdout.length > 0, `${file}: the example printed nothing`);
    }
  });
}

Deno.test("docs/api.md: the openai client example sends STRATA_API_KEY to a server with a key", async () => {
  const [code] = await clientExamples("docs/api.md");
  assert.match(code, /STRATA_API_KEY/);
  const key = "sk-docs";
  const r = await runExample(code, { apiKey: key }, { STRATA_API_KEY: key });
  assert.equal(r.code, 0, r.stderr);
  assert.ok(r.stdout.length > 0, "the example printed nothing");
  const refused = await runExample(code, { apiKey: key }, {});
  assert.notEqual(refused.code, 0, "a keyed server answered the example without its key");
  assert.match(refused.stderr, /401|missing API key/);
});
