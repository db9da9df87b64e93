/**
 * `deno task bench --speculate` end to end on the CPU adapter (small: one length group, 8 tokens,
 * 2 drafts, the `tiny` shape for the cost): every prompt kind gives the same tokens with and
 * without speculation, the JSON has acceptance, tokens per step, the cost of each k, the modeled
 * combination and the targets, the table says so, and its flags are checked.
 */
import assert from "node:assert/strict";
import { modeledSpeedup } from "../scripts/bench_speculation.ts";
import { taskPermissions, testGpu } from "./util.ts";

const SCRIPT = new URL("../scripts/bench.ts", import.meta.url).pathname;

Deno.test("bench --speculate: same tokens for every kind, acceptance, costs, combination", async () => {
  await testGpu();
  const out = await Deno.makeTempFile({ suffix: ".json" });
  try {
    const r = await new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "-A",
        SCRIPT,
        "--speculate",
        "--shape",
        "tiny",
        "--drafts",
        "2",
        "--contexts",
        "40",
        "--new-tokens",
        "8",
        "--out",
        out,
      ],
      stdout: "piped",
      stderr: "piped",
    }).output();
    const text = new TextDecoder().decode(r.stdout);
    assert.equal(r.code, 0, new TextDecoder().decode(r.stderr));
    assert.match(text, /copy-heavy/);
    assert.match(text, /verify step, k=2: [\d.]+x a plain step at most/);
    const j = JSON.parse(await Deno.readTextFile(out));
    assert.deepEqual(
      j.runs.map((k: { kind: string; group: string }) => `${k.group} ${k.kind}`),
      [
        "<128 copy-heavy",
        "<128 copy-heavy",
        "<128 repetitive",
        "<128 repetitive",
        "<128 free",
        "<128 free",
      ],
    );
    for (const k of j.runs) {
      assert.equal(k.identical, true, JSON.stringify(k));
      assert.ok(k.tokens_per_step >= 1 && k.acceptance >= 0 && k.acceptance <= 1);
      assert.ok(k.speedup_on > 0 && k.speedup_auto > 0, JSON.stringify(k));
    }
    assert.deepEqual(j.cost.map((c: { k: number }) => c.k), [1, 2]);
    for (const c of j.cost) assert.ok(c.plain_ms > 0 && c.ratio > 0, JSON.stringify(c));
    assert.ok(j.targets.verify_k4_max_ratio > 0 && j.targets.free_min_speedup > 0);
    const bad = await new Deno.Command(Deno.execPath(), {
      args: ["run", ...taskPermissions("bench"), SCRIPT, "--speculate", "--contexts", "40,2000"],
      stderr: "piped",
    }).output();
    assert.equal(bad.code, 1);
    assert.match(new TextDecoder().decode(bad.stderr), /--contexts must be token counts/);
  } finally {
    await Deno.remove(out);
  }
});

Deno.test("bench --speculate: the combination weighs passes by their cost", () => {
  // 17 tokens: the prefill's, then 4 plain steps and 4 passes of 3 rows that took 8 drafts,
  // one cross-checked (a plain step more).
  const d = {
    ids: new Array(17).fill(0),
    tokS: 0,
    steps: 4,
    drafted: 8,
    accepted: 8,
    pooled: 0,
    checks: 1,
    byRows: [0, 0, 0, 4],
  };
  assert.equal(modeledSpeedup(d, (R) => (R === 3 ? 1.25 : NaN)), 16 / (4 + 4 * 1.25 + 1));
});
