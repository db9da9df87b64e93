/**
 * Every runnable script answers --help with its usage and exits 0, before it touches a GPU or a
 * file (a new script is checked unless it is listed below as a module other scripts import).
 */
import assert from "node:assert/strict";

/** Modules of other scripts (no command line of their own). */
const LIBRARIES = new Set([
  "bench_codecs.ts",
  "bench_constrained.ts",
  "bench_options.ts",
  "bench_profile.ts",
  "bench_progress.ts",
  "bench_report.ts",
  "bench_result.ts",
  "bench_resume.ts",
  "bench_speculation.ts",
  "cli_flags.ts",
  "duration.ts",
  "gguf_quantize.ts",
  "gguf_vocab.ts",
  "gguf_writer.ts",
  "help.ts",
  "rng.ts",
  "test_runner.ts",
  "test_tokenizer.ts",
  "ts_imports.ts",
  // The start and generate tasks' launcher: `deno task start --help` is main.ts's help.
  "launch.ts",
]);

const dir = new URL("../scripts/", import.meta.url);
const scripts = [...Deno.readDirSync(dir)]
  .map((e) => e.name)
  .filter((n) => n.endsWith(".ts") && !LIBRARIES.has(n))
  .sort();

Deno.test("scripts: every runnable script answers --help", async () => {
  assert.ok(scripts.length > 20, `only ${scripts.length} scripts found`);
  const failed: string[] = [];
  // A few at a time: each is a Deno process starting up.
  for (let i = 0; i < scripts.length; i += 4) {
    await Promise.all(
      scripts.slice(i, i + 4).map(async (name) => {
        const out = await new Deno.Command(Deno.execPath(), {
          args: ["run", "-A", new URL(name, dir).pathname, "--help"],
          stdout: "piped",
          stderr: "piped",
          env: { DENO_WEBGPU_BACKEND: "none-for-help" },
        }).output();
        const text = new TextDecoder().decode(out.stdout);
        const err = new TextDecoder().decode(out.stderr);
        if (out.code !== 0 || text.trim().length < 40 || /^adapter: /m.test(text + err)) {
          failed.push(`${name}: exit ${out.code}, ${text.length} bytes\n${err.slice(0, 300)}`);
        }
      }),
    );
  }
  assert.deepEqual(failed, []);
});
