/**
 * `deno task bench --speculate` end to end on the CPU adapter (small: 6 tokens, no big shape):
 * every prompt kind gives the same tokens with and without speculation, the table and JSON say
 * so, and its flags are checked.
 */
import assert from "node:assert/strict";
import { testGpu } from "./util.ts";

const SCRIPT = new URL("../scripts/bench.ts", import.meta.url).pathname;

Deno.test("bench --speculate: same tokens for every kind, acceptance and tokens per step", async () => {
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
        "none",
        "--new-tokens",
        "12",
        "--out",
        out,
      ],
      stdout: "piped",
      stderr: "piped",
    }).output();
    const text = new TextDecoder().decode(r.stdout);
    assert.equal(r.code, 0, new TextDecoder().decode(r.stderr));
    assert.match(text, /copy-heavy/);
    const j = JSON.parse(await Deno.readTextFile(out));
    assert.deepEqual(j.kinds.map((k: { kind: string }) => k.kind), [
      "copy-heavy",
      "copy-heavy",
      "repetitive",
      "repetitive",
      "free",
      "free",
    ]);
    for (const k of j.kinds) {
      assert.equal(k.identical, true, JSON.stringify(k));
      assert.ok(k.tokens_per_step >= 1 && k.acceptance >= 0 && k.acceptance <= 1);
    }
    const bad = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", SCRIPT, "--speculate", "--drafts", "0"],
      stderr: "piped",
    }).output();
    assert.equal(bad.code, 1);
    assert.match(new TextDecoder().decode(bad.stderr), /--drafts must be an integer >= 1/);
  } finally {
    await Deno.remove(out);
  }
});
