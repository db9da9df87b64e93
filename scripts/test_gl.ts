/**
 * `deno task test:gl`: the kernel tests again on wgpu's GL backend (Mesa llvmpipe without
 * `shader-f16`), one `deno test` process per file.
 *
 * A process that aborts at exit after a passing summary (wgpu's teardown crash, about one run
 * in four on GL) counts as a pass: see scripts/run_tests.ts.
 *
 *   deno run -A scripts/test_gl.ts [FILE ...]
 */
import { denoTest } from "./run_tests.ts";

const FILES = [
  "tests/kernels_linear_test.ts",
  "tests/kernels_fused_test.ts",
  "tests/kernels_attention_test.ts",
  "tests/sampling_test.ts",
];

if (import.meta.main) {
  const files = Deno.args.length ? Deno.args : FILES;
  for (const file of files) {
    const code = await denoTest(["-A", file], { DENO_WEBGPU_BACKEND: "gl" }, `test:gl: ${file}`);
    if (code !== 0) Deno.exit(code);
  }
}
