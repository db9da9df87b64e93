// scripts/test_runner.ts, run_tests.ts and test_gl.ts: which exits of a test process count as a
// pass, the counts read from its summary, and the one summary of several. Real child processes:
// `sh` scripts that print a summary like `deno test`'s and then exit or kill themselves with a
// signal, and a real `deno test` of a file written here. Their output goes to buffers, not to
// this test's own output, where a fake "FAILED" line would read as a real one.
import assert from "node:assert/strict";
import { formatDuration } from "../scripts/duration.ts";
import {
  denoTest,
  parseSummary,
  runGroups,
  runTests,
  type TestRun,
} from "../scripts/test_runner.ts";
import { testPlan, USAGE as TEST_USAGE } from "../scripts/run_tests.ts";
import { GL_FILES, USAGE as GL_USAGE } from "../scripts/test_gl.ts";

const PASSED = "echo 'ok | 3 passed (2 steps) | 0 failed (1s)'";
const FAILED = "echo 'FAILED | 2 passed | 1 failed (1s)'";

/** A run of `sh -c script`. */
function sh(script: string, label = "sh"): TestRun {
  return { label, command: "sh", args: ["-c", script] };
}

/** Sinks that keep what a child writes. */
function capture() {
  const decoder = new TextDecoder();
  const got = { stdout: "", stderr: "" };
  return {
    got,
    sinks: {
      stdout: (c: Uint8Array) => (got.stdout += decoder.decode(c)),
      stderr: (c: Uint8Array) => (got.stderr += decoder.decode(c)),
    },
  };
}

/** Exit code runTests gives a `sh -c` script. */
async function verdict(script: string): Promise<number> {
  return (await runTests(sh(script), capture().sinks)).code;
}

Deno.test("run_tests: a clean exit passes, an exit code fails", async () => {
  assert.equal(await verdict(`${PASSED}; exit 0`), 0);
  assert.equal(await verdict(`${FAILED}; exit 1`), 1);
  assert.equal(await verdict(`${PASSED}; exit 3`), 3); // not a crash: kept
});

Deno.test("run_tests: wgpu's crash at exit after a passing summary counts as a pass", async () => {
  assert.equal(await verdict(`${PASSED}; kill -ABRT $$`), 0);
  assert.equal(await verdict(`${PASSED}; kill -SEGV $$`), 0);
  // The crash's own message gives way to one note that says why it still passes. (It comes
  // while the process exits, a while after the summary: the sleep.)
  const { got, sinks } = capture();
  const crash = await runTests(
    sh(
      `echo 'running'; echo 'a warning' >&2; ${PASSED}; sleep 0.2; ` +
        "echo 'double free or corruption (!prev)' >&2; kill -ABRT $$",
    ),
    sinks,
  );
  assert.equal(crash.code, 0);
  assert.deepEqual(crash.counts, { passed: 3, failed: 0, ignored: 0 });
  assert.match(crash.note!, /every test passed; the process then ended with SIGABRT/);
  assert.match(crash.note!, /"double free or corruption \(!prev\)"/);
  assert.equal(got.stderr, "a warning\n", "stderr before the summary streams; the crash's is held");
  assert.match(got.stdout, /^running\nok \| 3 passed/);
});

Deno.test("run_tests: a crash without a passing summary fails", async () => {
  assert.notEqual(await verdict(`${FAILED}; kill -SEGV $$`), 0);
  assert.notEqual(await verdict(`${FAILED}; kill -ABRT $$`), 0);
  assert.notEqual(await verdict(`${PASSED}; kill -TERM $$`), 0); // not the teardown crash
  // a passing summary printed earlier (by a test, say) than the real, failing one
  assert.notEqual(await verdict(`${PASSED}; ${FAILED}; kill -ABRT $$`), 0);
  // mid-run: no summary, so one failed, and what it said on stderr is passed on
  const { got, sinks } = capture();
  const mid = await runTests(sh("echo 'running 3 tests'; echo 'boom' >&2; kill -SEGV $$"), sinks);
  assert.notEqual(mid.code, 0);
  assert.equal(mid.counts, null);
  assert.match(mid.note!, /ended \(SIGSEGV\) before its summary; counted as 1 failed/);
  assert.equal(got.stderr, "boom\n");
  // A failing run's stderr after its summary ("error: Test failed") is passed on too.
  const late = capture();
  await runTests(sh(`${FAILED}; echo 'error: Test failed' >&2; exit 1`), late.sinks);
  assert.equal(late.got.stderr, "error: Test failed\n");
});

Deno.test("run_tests: summary lines as deno test prints them", () => {
  assert.deepEqual(parseSummary("x\nok | 2 passed (2 steps) | 0 failed | 1 ignored (6ms)\n\n"), {
    passed: 2,
    failed: 0,
    ignored: 1,
  });
  assert.deepEqual(parseSummary("FAILED | 1 passed (1 step) | 2 failed (1 step) (7ms)\n"), {
    passed: 1,
    failed: 2,
    ignored: 0,
  });
  assert.deepEqual(parseSummary("ok | 2 passed | 0 failed | 4 filtered out (100ms)"), {
    passed: 2,
    failed: 0,
    ignored: 0,
  });
  assert.equal(parseSummary("ok | 2 passed | 0 failed (1s)\nrunning 1 test"), null);
  assert.equal(parseSummary(""), null);
  assert.equal(formatDuration(41_400), "41s");
  assert.equal(formatDuration(723_000), "12m 3s");
});

Deno.test("run_tests: a real deno test process, its counts and its output", async () => {
  const dir = await Deno.makeTempDir({ prefix: "strata_runner_" });
  try {
    const file = `${dir}/sample_test.ts`;
    await Deno.writeTextFile(
      file,
      `Deno.test("one", () => {});
Deno.test({ name: "skipped", ignore: true, fn() {} });
Deno.test("two", async (t) => { await t.step("a step", () => {}); });
`,
    );
    const { got, sinks } = capture();
    const r = await runTests(denoTest("sample", ["--no-check", file]), sinks);
    assert.equal(r.code, 0, got.stdout + got.stderr);
    assert.deepEqual(r.counts, { passed: 2, failed: 0, ignored: 1 });
    assert.match(got.stdout, /^one \.\.\. ok/m);
    assert.ok(!got.stdout.includes("\x1b["), "NO_COLOR: plain text");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("run_tests: one summary of every group, after all of them ran", async () => {
  const lines: string[] = [];
  const { got, sinks } = capture();
  const result = await runGroups([
    { name: "the suite", runs: [sh(`echo 'ok | 5 passed | 0 failed | 1 ignored (1s)'`, "tests/")] },
    {
      name: "the kernel tests on GL",
      runs: [
        sh(`${PASSED}; kill -ABRT $$`, "a on GL"),
        sh(`${FAILED}; exit 1`, "b on GL"),
        sh("echo 'running'; kill -SEGV $$", "c on GL"),
      ],
    },
  ], { ...sinks, progress: (line) => lines.push(line) });
  assert.equal(result.code, 1);
  assert.deepEqual(result.total, { passed: 10, failed: 2, ignored: 1 });
  assert.deepEqual(lines.map((l) => l.replace(/ \(\d+s so far\)$/, "")), [
    "test: [1/4] the suite: tests/",
    "test: [2/4] the kernel tests on GL: a on GL",
    "test: [3/4] the kernel tests on GL: b on GL",
    "test: [4/4] the kernel tests on GL: c on GL",
  ]);
  const report = result.report;
  assert.match(report[0], /^test: a on GL: every test passed; .* counts as passed$/);
  assert.equal(report[1], "test: b on GL: FAILED (exit 1)");
  assert.match(report[2], /^test: c on GL: the process ended \(SIGSEGV\) before its summary/);
  assert.match(
    report.at(-1)!,
    new RegExp(
      "^test: 10 passed, 2 failed, 1 ignored in \\d+s \\(the suite: 5 passed, 0 failed, " +
        "1 ignored; the kernel tests on GL: 5 passed, 2 failed in 3 processes\\)$",
    ),
  );
  assert.match(got.stdout, /ok \| 5 passed/); // the children's output went to the sinks

  const clean = await runGroups([{ name: "the suite", runs: [sh(PASSED)] }], {
    ...capture().sinks,
    progress: () => {},
  });
  assert.equal(clean.code, 0);
  assert.equal(clean.report.length, 1);
  assert.doesNotMatch(clean.report[0], /FAILED|error|crash/, "nothing failed, nothing alarming");
});

Deno.test("run_tests: the halves of deno task test, and --help of both tasks", () => {
  const all = testPlan([]);
  assert.deepEqual(all.map((g) => g.runs.map((r) => r.args.join(" "))), [
    ["test -A --parallel tests/"],
    GL_FILES.map((f) => `test -A ${f}`),
  ]);
  assert.deepEqual(all[1].runs[0].env, { DENO_WEBGPU_BACKEND: "gl" });
  // Files name the suite's files, and those of them run on GL too.
  const some = testPlan(["./tests/sampling_test.ts", "tests/routes_test.ts"]);
  assert.deepEqual(some.map((g) => g.runs.map((r) => r.args.at(-1))), [
    ["tests/routes_test.ts"],
    ["tests/sampling_test.ts"],
  ]);
  assert.equal(testPlan(["tests/routes_test.ts"]).length, 1, "no kernel file named: no GL half");
  assert.equal(testPlan([], false).length, 1, "--no-gl");
  for (const usage of [TEST_USAGE, GL_USAGE]) {
    assert.match(usage, /FILE \.\.\./);
    assert.match(usage, /-h, --help/);
    assert.match(usage, /Environment:\n {2}DENO_WEBGPU_BACKEND/);
    assert.match(usage, /XDG_RUNTIME_DIR/);
    assert.match(usage, /Takes\s+about .* minute/); // the expected duration
  }
  assert.match(TEST_USAGE, /--no-gl/);
  assert.match(TEST_USAGE, /default: tests\//);
});
