/**
 * `main.ts generate` as a user runs it: a real child process on the embedded default model, its
 * JSON on stdout, its errors on stderr with a failing exit code. And `main.ts serve` refusing bad
 * flags before it loads anything.
 */
import assert from "node:assert/strict";

const MAIN = new URL("../main.ts", import.meta.url).pathname;

async function main(...args: string[]) {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", MAIN, ...args],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

const generate = (...args: string[]) => main("generate", ...args);

Deno.test("generate: --context-length bounds prompt + max tokens; bad values are refused", async () => {
  const ok = await generate(
    "--prompt-ids",
    "1,2,3",
    "--max-tokens",
    "4",
    "--context-length",
    "7",
    "--json",
  );
  assert.equal(ok.code, 0, ok.stderr);
  const json = JSON.parse(ok.stdout);
  console.log(`adapter: ${json.adapter}`);
  assert.equal(json.tokens.length, 4);
  assert.equal(json.finish_reason, "length");

  const long = await generate(
    "--prompt-ids",
    "1,2,3",
    "--max-tokens",
    "5",
    "--context-length",
    "7",
  );
  assert.notEqual(long.code, 0);
  assert.match(long.stderr, /exceeds the context length of 7 tokens/);

  const bad = await generate("--prompt-ids", "1,2,3", "--context-length", "long");
  assert.notEqual(bad.code, 0);
  assert.match(bad.stderr, /--context-length must be an integer; got 'long'/);
});

Deno.test("serve: the store's and the tiers' flags are refused without what they need, or out of range", async () => {
  const cases: [string[], RegExp][] = [
    [["--kv-warm-mb", "64"], /--kv-cold and --kv-warm-mb need --kv PATH/],
    [["--kv-cold", "/tmp/x"], /--kv-cold and --kv-warm-mb need --kv PATH/],
    [["--kv", "/tmp/x.sqlite", "--kv-warm-mb=-1"], /--kv-warm-mb must be >= 0; got -1/],
    [["--kv", "/tmp/x.sqlite", "--kv-warm-mb", "lots"], /--kv-warm-mb must be an integer/],
    [["--kv-host-mb=-1"], /--kv-host-mb must be >= 0; got -1/],
    [["--kv-host-mb", "lots"], /--kv-host-mb must be an integer; got 'lots'/],
    [["--kv-spill-mb", "64"], /--kv-spill-mb needs --kv-spill DIR/],
    [["--kv-spill", "/tmp/s", "--kv-spill-mb", "0"], /--kv-spill-mb must be >= 1; got 0/],
  ];
  for (const [args, message] of cases) {
    const r = await main("serve", "--port", "0", ...args);
    assert.equal(r.code, 1, `${args.join(" ")}: ${r.stderr}`);
    assert.match(r.stderr, message);
  }
});
