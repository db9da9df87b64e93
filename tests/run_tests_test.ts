// scripts/run_tests.ts: which exits of a test process count as a pass. Real child processes (sh)
// print a summary like `deno test`'s and then exit or kill themselves with a signal.
import assert from "node:assert/strict";
import { runTests } from "../scripts/run_tests.ts";

/** Exit code runTests gives a `sh -c` script. */
function verdict(script: string): Promise<number> {
  return runTests("sh", ["-c", script], {}, "run_tests_test");
}

const PASSED = "echo 'ok | 3 passed (2 steps) | 0 failed (1s)'";
const FAILED = "echo 'FAILED | 2 passed | 1 failed (1s)'";

Deno.test("run_tests: a clean exit passes, an exit code fails", async () => {
  assert.equal(await verdict(`${PASSED}; exit 0`), 0);
  assert.equal(await verdict(`${FAILED}; exit 1`), 1);
  assert.equal(await verdict(`${PASSED}; exit 3`), 3); // not a crash: kept
});

Deno.test("run_tests: wgpu's crash at exit after a passing summary counts as a pass", async () => {
  assert.equal(await verdict(`${PASSED}; kill -ABRT $$`), 0);
  assert.equal(await verdict(`${PASSED}; kill -SEGV $$`), 0);
});

Deno.test("run_tests: a crash without a passing summary fails", async () => {
  assert.notEqual(await verdict(`${FAILED}; kill -SEGV $$`), 0);
  assert.notEqual(await verdict(`${FAILED}; kill -ABRT $$`), 0);
  assert.notEqual(await verdict("echo 'running 3 tests'; kill -SEGV $$"), 0); // mid-run
  assert.notEqual(await verdict(`${PASSED}; kill -TERM $$`), 0); // not the teardown crash
  // a passing summary printed earlier (by a test, say) than the real, failing one
  assert.notEqual(await verdict(`${PASSED}; ${FAILED}; kill -ABRT $$`), 0);
});
