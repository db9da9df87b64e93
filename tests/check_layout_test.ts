/**
 * scripts/check_layout.ts on in-memory fixtures (and its command line on temporary folders):
 * the layer rule, routes/' narrower rule, unknown folders, the size limits, and the tokenizer
 * that keeps comments and strings from counting as imports. The real tree is checked by
 * `deno task check`, not here.
 */
import assert from "node:assert/strict";
import { checkLayout, formatViolation, type SourceFile } from "../scripts/check_layout.ts";
import { findImports } from "../scripts/ts_imports.ts";

const RULE = "a file may import only its own folder or a lower layer";
const ROUTES_RULE = "routes/ may import only api/ and routes/ (and packages)";

/** The formatted violations of files given as path → text. */
function check(files: Record<string, string>): string[] {
  const list: SourceFile[] = Object.entries(files).map(([path, text]) => ({ path, text }));
  return checkLayout(list).map(formatViolation);
}

/** `n` lines of code (each ends in a newline, as files do). */
const lines = (n: number) => "export const x = 1;\n".repeat(n);

Deno.test("a downward import and a same-folder import pass", () => {
  assert.deepEqual(
    check({
      "engine/kv/blocks.ts": 'import { getGpu } from "../../gpu/device.ts";\n' +
        'import { a } from "./codec.ts";\nimport type { B } from "../model/config.ts";\n',
      "engine/kv/codec.ts": 'export * from "../../api/types.ts";\n',
      "main.ts": 'import { x } from "./scripts/bench.ts";\nimport "./engine/worker/host.ts";\n',
      "scripts/bench.ts": 'import { DEFAULT_MODEL } from "../main.ts";\n',
    }),
    [],
  );
});

Deno.test("an upward import fails, naming both layers and the line", () => {
  assert.deepEqual(
    check({
      "gpu/device.ts": '// the device\n\nimport { Block } from "../engine/kv/blocks.ts";\n',
    }),
    [
      "gpu/device.ts:3: imports engine/kv/blocks.ts (layer 6, engine/kv/) from layer 2 (gpu/); " +
      RULE,
    ],
  );
});

Deno.test("type-only imports, re-exports and multi-line imports count", () => {
  assert.deepEqual(
    check({
      "engine/model/synthetic.ts": [
        'import type { EngineModel } from "../engine.ts";',
        "import {",
        "  type Seq,",
        "  step,",
        '} from "../sched/sequence.ts";',
        'export type { Pool } from "../kv/pool.ts";',
        'export * as forward from "../runner/forward.ts";',
        "export { local };",
        "export const y = 2;",
      ].join("\n"),
    }),
    [
      "engine/model/synthetic.ts:1: imports engine/engine.ts (layer 10, engine/*.ts) from layer 4 " +
      `(engine/model/); ${RULE}`,
      "engine/model/synthetic.ts:5: imports engine/sched/sequence.ts (layer 9, engine/sched/) " +
      `from layer 4 (engine/model/); ${RULE}`,
      "engine/model/synthetic.ts:6: imports engine/kv/pool.ts (layer 6, engine/kv/) from layer 4 " +
      `(engine/model/); ${RULE}`,
      "engine/model/synthetic.ts:7: imports engine/runner/forward.ts (layer 7, engine/runner/) " +
      `from layer 4 (engine/model/); ${RULE}`,
    ],
  );
});

Deno.test("routes/ may import api/, routes/ and packages", () => {
  assert.deepEqual(
    check({
      "routes/chat.ts":
        'import { Hono } from "hono";\nimport { streamSSE } from "hono/streaming";\n' +
        'import type { EngineLike } from "../api/types.ts";\nimport { limits } from "./validate.ts";\n' +
        'import { ApiError } from "../api/errors.ts";\n',
    }),
    [],
  );
});

Deno.test("routes/ importing the engine fails, even a type; so does a lower layer", () => {
  assert.deepEqual(
    check({
      "routes/chat.ts": 'import { Engine } from "../engine/engine.ts";\n' +
        'import type { Seq } from "../engine/sched/sequence.ts";\n' +
        'import { BYTES } from "../gpu/dtype.ts";\n',
    }),
    [
      `routes/chat.ts:1: imports engine/engine.ts (layer 10, engine/*.ts) from layer 12 (routes/); ${ROUTES_RULE}`,
      "routes/chat.ts:2: imports engine/sched/sequence.ts (layer 9, engine/sched/) from layer 12 " +
      `(routes/); ${ROUTES_RULE}`,
      `routes/chat.ts:3: imports gpu/dtype.ts (layer 2, gpu/) from layer 12 (routes/); ${ROUTES_RULE}`,
    ],
  );
});

Deno.test("scripts may not import tests; tests may import anything", () => {
  assert.deepEqual(
    check({
      "scripts/probe_store.ts": 'import { rng } from "../tests/util.ts";\n',
      "tests/util.ts": 'import { rng } from "../scripts/rng.ts";\nimport "../main.ts";\n' +
        'import { Engine } from "../engine/engine.ts";\nimport { a } from "./other_test.ts";\n',
    }),
    [
      "scripts/probe_store.ts:1: imports tests/util.ts (layer 14, tests/) from layer 13 " +
      `(main.ts, scripts/); ${RULE}`,
    ],
  );
});

Deno.test("dynamic imports, new URL(…, import.meta.url) and import.meta.resolve count", () => {
  assert.deepEqual(
    check({
      "engine/sessions/store.ts": [
        'const w = new Worker(new URL("./pack_worker.ts", import.meta.url).href, { type: "module" });',
        'const v = new Worker(new URL("../worker/worker.ts", import.meta.url), { type: "module" });',
        'const { loop } = await import("../sched/loop.ts");',
        'const ok = await import("../kv/blocks.ts");',
        'const r = import.meta.resolve("../engine.ts");',
        "const computed = await import(`../${name}.ts`);",
        'const wgsl = new URL("../../kernels/matmul.wgsl", import.meta.url);',
        'const model = new URL("../../models/strata-default", import.meta.url);',
      ].join("\n"),
    }),
    [
      "engine/sessions/store.ts:2: imports engine/worker/worker.ts (layer 11, engine/worker/) " +
      `from layer 8 (engine/sessions/); ${RULE}`,
      "engine/sessions/store.ts:3: imports engine/sched/loop.ts (layer 9, engine/sched/) from " +
      `layer 8 (engine/sessions/); ${RULE}`,
      "engine/sessions/store.ts:5: imports engine/engine.ts (layer 10, engine/*.ts) from layer 8 " +
      `(engine/sessions/); ${RULE}`,
    ],
  );
});

Deno.test("imports inside comments, strings, templates and regular expressions are ignored", () => {
  const text = [
    '// import { Engine } from "../engine/engine.ts";',
    "/* a block comment:",
    '   import "../routes/app.ts";',
    "   export * from '../engine/engine.ts'; */",
    `const help = 'import("../engine/engine.ts")';`,
    'const doc = "export { a } from \\"../engine/engine.ts\\"";',
    'const t = `import x from "../engine/engine.ts" ${1 + { a: 1 }.a} import("../engine/engine.ts")`;',
    "const re = /[\"'`/]import/g, half = 4 / 2;",
    'const q = obj.import("../engine/engine.ts");',
    "const o = { import: 1, export: 2 };",
    '/** @example import { rng } from "../tests/util.ts"; */',
    'import { a } from "../engine/engine.ts"; // the real one, after all of the above',
  ].join("\n");
  assert.deepEqual(check({ "gpu/device.ts": text }), [
    `gpu/device.ts:12: imports engine/engine.ts (layer 10, engine/*.ts) from layer 2 (gpu/); ${RULE}`,
  ]);
});

Deno.test("findImports: the forms it finds, their kinds and lines", () => {
  const text = [
    "#!/usr/bin/env -S deno run",
    'import "./side.ts";',
    'import type Def from "./def.ts";',
    'import type, { a as b } from "./type_named.ts";',
    'import * as ns from "./ns.ts";',
    'import fs = require("./required.ts");',
    'export type * from "./all.ts";',
    'export { "a-b" as c, type D } from "./strings.ts";',
    "const x = `${`nested ${1}`}`;",
    'await import("./lazy.ts", { with: { type: "json" } });',
    "const re = /a/; const s = `plain`; const y = 1 /2/ 3;",
    "new URL(`./worker.ts`, import.meta.url);",
    'import.meta.resolve("./resolved.ts");',
  ].join("\n");
  assert.deepEqual(findImports(text).map((r) => `${r.line} ${r.kind} ${r.specifier}`), [
    "2 import ./side.ts",
    "3 import ./def.ts",
    "4 import ./type_named.ts",
    "5 import ./ns.ts",
    "6 import ./required.ts",
    "7 export ./all.ts",
    "8 export ./strings.ts",
    "10 dynamic ./lazy.ts",
    "12 url ./worker.ts",
    "13 resolve ./resolved.ts",
  ]);
});

Deno.test("package specifiers are allowed anywhere; absolute and out-of-repo paths are not", () => {
  assert.deepEqual(
    check({
      "api/types.ts":
        'import { x } from "npm:fflate@^0.8.3";\nimport { parseArgs } from "node:util";\n' +
        'import { y } from "jsr:@std/path";\nimport { z } from "https://example.com/mod.ts";\n' +
        'import { Hono } from "hono";\nimport { w } from "/work/strata/engine/engine.ts";\n' +
        'import { v } from "file:///work/strata/engine/engine.ts";\nimport "../../elsewhere.ts";\n',
    }),
    [
      "api/types.ts:6: imports /work/strata/engine/engine.ts by an absolute path; use a relative " +
      "specifier (./, ../) so the layer rule can check it",
      "api/types.ts:7: imports file:///work/strata/engine/engine.ts by an absolute path; use a " +
      "relative specifier (./, ../) so the layer rule can check it",
      "api/types.ts:8: imports ../../elsewhere.ts, outside the repository",
    ],
  );
});

Deno.test("a folder not in the layer table is an error naming it", () => {
  const fix = "is not in the layer table: add it to LAYERS in scripts/check_layout.ts, at the " +
    "layer it belongs to (DESIGN.md, Layout)";
  assert.deepEqual(
    check({
      "lib/helpers.ts": 'import { a } from "../gpu/device.ts";\n',
      "engine/cache/lru.ts": "export const lru = 1;\n",
      "gpu/device.ts": 'import { lru } from "../engine/cache/lru.ts";\n',
      "util.ts": "export const u = 1;\n",
      "static/app.js": 'import "../engine/engine.ts";\n',
      "static/vendor.ts": 'import "../engine/engine.ts";\n',
      "routes/app.ts": 'const dir = new URL("../static/", import.meta.url);\n',
    }),
    [
      `engine/cache/lru.ts: engine/cache/ ${fix}`,
      `gpu/device.ts:1: imports engine/cache/lru.ts, but engine/cache/ ${fix}`,
      `lib/helpers.ts: lib/ ${fix}`,
      `util.ts: top-level file util.ts ${fix}`,
    ],
  );
});

Deno.test("product .ts files over 500 lines fail; tests, scripts and reference.ts are aside", () => {
  assert.deepEqual(
    check({
      "engine/engine.ts": lines(501),
      "engine/kv/blocks.ts": lines(500),
      "main.ts": lines(520),
      "tests/engine_test.ts": lines(501),
      "scripts/bench.ts": lines(900),
      "kernels/reference.ts": lines(700),
      "kernels/matmul.ts": lines(1066).slice(0, -1), // no final newline: still 1066 lines
    }),
    [
      "engine/engine.ts: 501 lines; product .ts files stay under 500 (split it)",
      "kernels/matmul.ts: 1066 lines; product .ts files stay under 500 (split it)",
      "main.ts: 520 lines; product .ts files stay under 500 (split it)",
    ],
  );
});

Deno.test(".wgsl files over 600 lines fail", () => {
  assert.deepEqual(
    check({
      "kernels/matmul.wgsl": "// x\n".repeat(601),
      "kernels/rmsnorm.wgsl": "// x\n".repeat(600),
      "static/big.js": "// x\n".repeat(9000),
    }),
    ["kernels/matmul.wgsl: 601 lines; .wgsl files stay under 600 (split it)"],
  );
});

/** Runs the checker's command line on `root`; its exit code and output. */
async function runCli(args: string[]) {
  const script = new URL("../scripts/check_layout.ts", import.meta.url).pathname;
  const { code, stdout, stderr } = await new Deno.Command(Deno.execPath(), {
    args: ["run", "--allow-read", script, ...args],
  }).output();
  const text = (b: Uint8Array) => new TextDecoder().decode(b);
  return { code, stdout: text(stdout), stderr: text(stderr) };
}

/** A temporary folder with `files` (path → text) written into it. */
async function tree(files: Record<string, string>): Promise<string> {
  const root = await Deno.makeTempDir({ prefix: "strata-check-layout-" });
  for (const [path, text] of Object.entries(files)) {
    await Deno.mkdir(`${root}/${path.slice(0, path.lastIndexOf("/") + 1)}`, { recursive: true });
    await Deno.writeTextFile(`${root}/${path}`, text);
  }
  return root;
}

Deno.test("the command line exits 1 on violations and 0 with a summary otherwise", async () => {
  const bad = await tree({
    "gpu/device.ts": 'import "../engine/engine.ts";\n',
    "engine/engine.ts": "export const e = 1;\n",
    "node_modules/pkg/index.ts": 'import "../../tests/x.ts";\n',
    ".gpu/cache.ts": 'import "../tests/x.ts";\n',
    "models/strata-default/load.ts": "export {};\n",
  });
  const good = await tree({
    "engine/engine.ts": 'import "../gpu/device.ts";\n',
    "gpu/device.ts": "export const d = 1;\n",
    "kernels/matmul.wgsl": "// x\n",
  });
  try {
    const failed = await runCli(["--root", bad]);
    assert.equal(failed.code, 1, failed.stderr);
    assert.equal(
      failed.stdout,
      `gpu/device.ts:1: imports engine/engine.ts (layer 10, engine/*.ts) from layer 2 (gpu/); ${RULE}\n`,
    );
    assert.match(failed.stderr, /check_layout: 1 violation in 1 file \(see --help\)/);
    const passed = await runCli(["--root", good]);
    assert.equal(passed.code, 0, passed.stdout + passed.stderr);
    assert.equal(
      passed.stdout,
      "check_layout: 3 files follow the layer rule and the size limits\n",
    );
    const help = await runCli(["--help"]);
    assert.equal(help.code, 0);
    assert.match(help.stdout, /12\. routes\/ \(only api\/, routes\/\)/);
  } finally {
    await Deno.remove(bad, { recursive: true });
    await Deno.remove(good, { recursive: true });
  }
});
