/**
 * `deno task test`: every test in two halves, then one summary of both:
 *
 * 1. the suite, `deno test -A --parallel tests/`, on the default adapter (lavapipe or a GPU);
 * 2. the kernel tests again on wgpu's GL backend (scripts/test_gl.ts), one process per file.
 *
 * The last line counts every test of both halves, e.g.
 * `test: 412 passed, 0 failed, 1 ignored in 38m 12s (the suite: 380 passed, 0 failed, 1 ignored;
 * the kernel tests on GL: 32 passed, 0 failed in 4 processes)`. Both halves always run, so the
 * summary covers everything; the exit status is 1 when anything failed. scripts/test_runner.ts
 * has the machinery and the one wgpu crash at exit that counts as a pass.
 *
 *   deno task test [FILE ...]        (see --help)
 */
import { parseArgs } from "node:util";
import { denoTest, runGroups, type TestGroup } from "./test_runner.ts";
import { GL_ENV, GL_FILES } from "./test_gl.ts";

export const USAGE = `usage: deno task test [--no-gl] [FILE ...]

Runs the test suite on the default WebGPU adapter, then the kernel tests again on wgpu's GL
backend, and ends with one summary of both halves: "N passed, N failed". Test output streams as it
comes; which process runs shows on stderr when it is a terminal. Exits 1 when anything failed.
Takes about 3 minutes on a 2-core CPU machine with lavapipe (5 with GL alone), many times that
when other jobs share the cores (50 minutes was seen on a loaded one).

  FILE ...   test files or folders for the first half (default: tests/); the GL half then runs
             those of its kernel test files that they name (deno task test:gl --help lists them)
  --no-gl    skip the GL half
  -h, --help this text

Environment:
  DENO_WEBGPU_BACKEND  the first half's wgpu backend (unset: Vulkan when present, else GL); the
                       GL half always sets gl
  XDG_RUNTIME_DIR      wgpu's loaders want one; set to /tmp when unset
  NO_COLOR             set for the test processes (their summary lines are parsed)

The browser test (tests/browser_test.ts) needs /usr/bin/chromium and is ignored without it.`;

/** The halves `deno task test` runs for `files` (empty: everything). */
export function testPlan(files: string[], gl = true): TestGroup[] {
  const suite = files.length ? files : ["tests/"];
  const named = (f: string) =>
    files.length === 0 || files.some((a) => {
      const p = a.replace(/^\.\//, "");
      return f === p || f.startsWith(p.endsWith("/") ? p : `${p}/`);
    });
  const glFiles = gl ? GL_FILES.filter(named) : [];
  return [
    { name: "the suite", runs: [denoTest(suite.join(" "), ["-A", "--parallel", ...suite])] },
    ...(glFiles.length
      ? [{
        name: "the kernel tests on GL",
        runs: glFiles.map((f) => denoTest(`${f} on GL`, ["-A", f], GL_ENV)),
      }]
      : []),
  ];
}

if (import.meta.main) {
  const { values, positionals } = parseArgs({
    args: Deno.args,
    allowPositionals: true,
    options: { "no-gl": { type: "boolean" }, help: { type: "boolean", short: "h" } },
  });
  if (values.help) {
    console.log(USAGE);
    Deno.exit(0);
  }
  const { code, report } = await runGroups(testPlan(positionals, !values["no-gl"]));
  console.log(`\n${report.join("\n")}`);
  Deno.exit(code);
}
