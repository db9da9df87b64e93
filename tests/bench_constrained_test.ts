/**
 * `deno task bench --constrained` end to end on the CPU adapter, small (the tiny random shape,
 * batch 2, the schema's shortest output plus a few tokens): every row is measured, every
 * constrained output validates against the schema, the compile times are there; `--help` lists
 * every flag with its default; bad flags are refused (a budget below the schema's shortest output
 * once the schema is compiled).
 */
import assert from "node:assert/strict";
import { CONSTRAINED_USAGE } from "../scripts/bench_constrained.ts";
import { taskPermissions, testGpu } from "./util.ts";

const SCRIPT = new URL("../scripts/bench.ts", import.meta.url).pathname;

async function bench(...args: string[]) {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", ...taskPermissions("bench"), SCRIPT, "--constrained", ...args],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

Deno.test("bench --constrained: rates alone, batched and mixed; every output valid", async () => {
  await testGpu();
  const out = await Deno.makeTempFile({ suffix: ".json" });
  try {
    const args = ["--shape", "tiny", "--batch", "2", "--new-tokens", "56", "--prompt-len", "4"];
    const r = await bench(...args, "--out", out);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /batch of 2/);
    assert.match(r.stdout, /mixed 1\+1/);
    const j = JSON.parse(await Deno.readTextFile(out));
    for (const row of [j.alone, j.batched]) {
      assert.ok(row.free_tok_s > 0 && row.constrained_tok_s > 0, JSON.stringify(row));
      assert.ok(row.constrained_tokens >= j.min_tokens && row.constrained_tokens <= 56);
    }
    assert.ok(j.mixed.tok_s > 0 && j.mixed.ratio > 0);
    assert.equal(j.outputs, 4); // 1 alone, 2 batched, 1 mixed
    assert.equal(j.valid, j.outputs, "a constrained output did not validate");
    assert.ok(j.compile_ms.first > 0 && j.compile_ms.cached < j.compile_ms.first);
  } finally {
    await Deno.remove(out);
  }
});

Deno.test("bench --constrained: --help lists every flag with its default; bad flags refused", async () => {
  const help = await bench("--help");
  assert.equal(help.code, 0);
  assert.equal(help.stdout.trim(), CONSTRAINED_USAGE);
  for (const line of CONSTRAINED_USAGE.split("\n").filter((l) => /^ {2}--[a-z]/.test(l))) {
    const flag = line.trim().split(" ")[0];
    if (["--model", "--shape", "--out"].includes(flag)) continue;
    const text = CONSTRAINED_USAGE.slice(CONSTRAINED_USAGE.indexOf(line)).split("\n  -")[0];
    assert.match(text, /default/, `${flag} has no default in --help`);
  }
  const cases: [string[], RegExp][] = [
    [["--batch", "1"], /--batch must be an integer >= 2; got '1'/],
    [["--new-tokens", "many"], /--new-tokens must be an integer/],
    [["--model", "x", "--shape", "tiny"], /--model and --shape exclude each other/],
    [["--shape", "tiny", "--new-tokens", "8"], /--new-tokens must be at least 53/],
  ];
  for (const [args, re] of cases) {
    const r = await bench(...args);
    assert.equal(r.code, 1, args.join(" "));
    assert.match(r.stderr, re);
  }
});
