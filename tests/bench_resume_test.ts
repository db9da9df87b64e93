/**
 * `deno task bench --resume` end to end on the CPU adapter at a small size: every tier brings the
 * evicted session's whole blocks back (cached, the prompt's length) and recomputing brings none,
 * the table and the JSON say so, and the flags are checked. Times are not asserted.
 */
import assert from "node:assert/strict";
import { taskPermissions, testGpu } from "./util.ts";

const SCRIPT = new URL("../scripts/bench.ts", import.meta.url).pathname;

async function bench(args: string[]) {
  const r = await new Deno.Command(Deno.execPath(), {
    args: ["run", ...taskPermissions("bench"), SCRIPT, "--resume", ...args],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const dec = new TextDecoder();
  return { code: r.code, out: dec.decode(r.stdout), err: dec.decode(r.stderr) };
}

Deno.test("bench --resume: every tier brings the session back, recompute does not", async () => {
  await testGpu();
  const out = await Deno.makeTempFile({ suffix: ".json" });
  try {
    const r = await bench([
      ...["--shape", "tiny", "--lengths", "48", "--runs", "1", "--out", out],
    ]);
    assert.equal(r.code, 0, r.err);
    assert.match(r.out, /length {2}source/);
    const j = JSON.parse(await Deno.readTextFile(out));
    const rows = j.rows.map((
      x: { source: string; cached_tokens: number; of_recompute: number },
    ) => [
      x.source,
      x.cached_tokens,
    ]);
    assert.deepEqual(rows, [["recompute", 0], ["host", 48], ["file", 48], ["kv", 48]]);
    assert.equal(j.rows[0].of_recompute, 1);
    for (const x of j.rows.slice(1)) {
      assert.ok(x.ttft_ms > 0 && x.restore_gb_s > 0, JSON.stringify(x));
    }
    assert.ok(j.profile.recomputeTokensPerS > 0);
    assert.deepEqual(j.resident, [], "skipped on a CPU adapter unless asked for");
  } finally {
    await Deno.remove(out);
  }
});

Deno.test("bench --resume: --help, and bad flags refused", async () => {
  const help = await bench(["--help"]);
  assert.equal(help.code, 0);
  assert.match(help.out, /--lengths L,\.\.\./);
  assert.match(help.out, /--kv-codec C,\.\.\./);
  for (
    const [args, message] of [
      [["--tiers", "disk"], /--tiers takes host, file and kv; got 'disk'/],
      [["--lengths", "0"], /--lengths takes integers >= 1/],
      [["--shape", "huge"], /--shape must be one of/],
      [["--shape", "tiny", "--model", "x"], /not both/],
    ] as const
  ) {
    const r = await bench([...args]);
    assert.equal(r.code, 1, r.out);
    assert.match(r.err, message);
  }
});
