/**
 * `deno task test:gl`: the kernel tests again on wgpu's GL backend (Mesa llvmpipe without
 * `shader-f16`), one `deno test` process per file, then one summary line. `deno task test` runs
 * this as its second half (scripts/run_tests.ts).
 *
 *   deno task test:gl [FILE ...]        (see --help)
 */
import { parseArgs } from "node:util";
import { denoTest, runGroups } from "./test_runner.ts";

/** The kernel test files, run again on GL. */
export const GL_FILES = [
  "tests/kernels_linear_test.ts",
  "tests/kernels_fused_test.ts",
  "tests/kernels_attention_test.ts",
  "tests/kernels_mask_test.ts",
  "tests/kernels_quant_test.ts",
  "tests/sampling_test.ts",
  "tests/kernels_constraint_test.ts",
  "tests/kernels_fingerprint_test.ts",
  "tests/kernels_cross_check_test.ts",
  "tests/speculate_kernels_test.ts",
  "tests/kernels_kv_codec_test.ts",
];

/** What the GL runs add to the environment. */
export const GL_ENV = { DENO_WEBGPU_BACKEND: "gl" };

export const USAGE = `usage: deno task test:gl [FILE ...]

Runs the kernel tests on wgpu's GL backend (Mesa llvmpipe, no shader-f16), one deno test process
per file, and ends with one summary: "N passed, N failed". Exits 1 when anything failed. Takes
about a minute on a 2-core CPU machine.

  FILE ...   the test files (default: these)
${GL_FILES.map((f) => `               ${f}`).join("\n")}
  -h, --help this text

Environment:
  DENO_WEBGPU_BACKEND  set to gl for the test processes
  XDG_RUNTIME_DIR      wgpu's GL loader wants one; set to /tmp when unset`;

if (import.meta.main) {
  const { values, positionals } = parseArgs({
    args: Deno.args,
    allowPositionals: true,
    options: { help: { type: "boolean", short: "h" } },
  });
  if (values.help) {
    console.log(USAGE);
    Deno.exit(0);
  }
  const files = positionals.length ? positionals : GL_FILES;
  const runs = files.map((f) => denoTest(`${f} on GL`, ["-A", f], GL_ENV));
  const { code, report } = await runGroups([{ name: "the kernel tests on GL", runs }], {
    name: "test:gl",
  });
  console.log(`\n${report.join("\n")}`);
  Deno.exit(code);
}
