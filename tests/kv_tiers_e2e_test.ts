/**
 * The acceptance, end to end: `main.ts serve --kv-blocks 48 --context-length 700` on the
 * default model, a real server on a real port driven by the official `openai` client. A chat
 * session's KV is evicted from the tiny pool by a long request; its next turn (temperature 0) says
 * exactly what an engine whose pool never evicted says, and reports the tokens brought back as
 * cached. Host memory holds 1 MiB (8 of the session's blocks): the rest goes to spill files, so
 * the turn comes back from both. /health shows the tiers, the breaker and the start-up profile;
 * /metrics the blocks restored from each tier.
 */
import assert from "node:assert/strict";
import OpenAI from "openai";
import { Engine } from "../engine/engine.ts";
import { DEFAULT_MODEL } from "../main.ts";
import { BLOCK } from "../engine/kv/blocks.ts";
import { sampling } from "../api/types.ts";
import { serverAddress } from "./util.ts";

const MAIN = new URL("../main.ts", import.meta.url).pathname;
const dir = await Deno.makeTempDir({ prefix: "strata_tiers_e2e_" });
globalThis.addEventListener("unload", () => Deno.removeSync(dir, { recursive: true }));

const text = await Deno.readTextFile(`${DEFAULT_MODEL}/val_sample.txt`);
/** A pool that never evicts: the reference. */
const roomy = await Engine.load(DEFAULT_MODEL, { maxSlots: 1, contextLength: 700, kvBlocks: 200 });

/** The longest start of `from` whose tokens number at most `n`. */
function tokensOf(from: string, n: number): string {
  let lo = 0, hi = from.length;
  while (lo < hi) {
    const mid = Math.ceil((lo + hi) / 2);
    if (roomy.encode(from.slice(0, mid)).length <= n) lo = mid;
    else hi = mid - 1;
  }
  return from.slice(0, lo);
}

type Msg = { role: "user" | "assistant"; content: string };
const first: Msg[] = [{ role: "user", content: tokensOf(text, 220) }];
const follow = { role: "user" as const, content: "And then what happened?" };
/**
 * About 670 tokens + 24 generated: 44 of the pool's 47 blocks, more than the session leaves, so
 * it is evicted, and all but three of its blocks are overwritten.
 */
const LONG = tokensOf(text.slice(5000), 670);

/** The second turn on the roomy engine: its tokens' text and what it found cached. */
async function reference() {
  const turn = async (messages: Msg[]) => {
    const gen = roomy.generate({
      promptIds: roomy.encodeChat(messages),
      sampling: sampling({ maxTokens: 12 }),
      sessionId: "conv",
    });
    let out = "";
    for await (const t of gen) out += t.text;
    return { text: out, cached: (await gen.result).cachedTokens };
  };
  const a = await turn(first);
  const b = await turn([...first, { role: "assistant", content: a.text }, follow]);
  return { first: a.text, second: b.text, cached: b.cached };
}

/** Starts `main.ts serve` with `args`; its port and a way to stop it. */
async function serve(args: string[]) {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", MAIN, "serve", "--port", "0", ...args],
    stdout: "null",
    stderr: "piped",
  }).spawn();
  const { port } = await serverAddress(child.stderr);
  return {
    port,
    stop: async () => {
      child.kill("SIGTERM");
      await child.status;
    },
  };
}

const want = await reference();

Deno.test("e2e: an evicted session continues identically from host memory and spill files", async () => {
  const server = await serve([
    ...["--kv-blocks", "48", "--context-length", "700"],
    ...["--kv-host-mb", "1", "--kv-spill", `${dir}/spill`],
  ]);
  try {
    const base = `http://127.0.0.1:${server.port}`;
    const client = new OpenAI({ apiKey: "none", baseURL: `${base}/v1`, maxRetries: 0 });
    const chat = (messages: Msg[]) =>
      client.chat.completions.create({
        model: roomy.modelId,
        messages,
        max_tokens: 12,
        temperature: 0,
        session_id: "conv",
      } as OpenAI.ChatCompletionCreateParamsNonStreaming);
    const a = await chat(first);
    assert.equal(a.choices[0].message.content, want.first);
    // The long request needs more blocks than are free: the idle session is evicted.
    const long = await client.completions.create({
      model: roomy.modelId,
      prompt: LONG,
      max_tokens: 24,
      temperature: 0,
    });
    assert.ok(long.usage!.prompt_tokens > 640, JSON.stringify(long.usage));
    const evicted = await (await fetch(`${base}/health`)).json();
    assert.ok(evicted.kv.spill.spilled_blocks > 8, JSON.stringify(evicted.kv));

    const said = a.choices[0].message.content!;
    const b = await chat([...first, { role: "assistant", content: said }, follow]);
    assert.equal(b.choices[0].message.content, want.second, "a pool that never evicted says this");
    const cached = b.usage!.prompt_tokens_details!.cached_tokens!;
    assert.equal(cached, BLOCK * Math.floor(want.cached / BLOCK), "its whole blocks came back");

    const kv = (await (await fetch(`${base}/health`)).json()).kv;
    assert.ok(kv.spill.restored_blocks > 0 && kv.spill.written_blocks > 0, JSON.stringify(kv));
    assert.equal(kv.spill.failed_blocks, 0);
    // (A loaded CPU machine may trip the breaker: spills then pause; nothing here needs more.)
    assert.equal(typeof kv.spill.paused, "boolean");
    assert.equal(kv.host.budget_bytes, 2 ** 20);
    assert.ok(
      Number.isInteger(kv.host.spare_bytes) && kv.host.spare_bytes >= 0,
      JSON.stringify(kv),
    );
    assert.ok(kv.file.blocks > 0 && kv.file.bytes > 0, JSON.stringify(kv));
    const p = kv.profile;
    assert.ok(p.recompute_tokens_per_s > 0 && p.block_bytes > 0, JSON.stringify(p));
    for (const t of ["host", "file"]) assert.equal(typeof p.restore_from[t].use, "boolean");
    const metrics = await (await fetch(`${base}/metrics`)).text();
    for (const from of ["host", "file"]) {
      const n = metrics.match(
        new RegExp(`strata_kv_restore_blocks_total\\{from="${from}"\\} (\\d+)`),
      );
      const lines = metrics.split("\n").filter((l) => l.includes("kv_")).join("\n");
      assert.ok(n && Number(n[1]) > 0, `restored from ${from}:\n${lines}`);
    }
  } finally {
    await server.stop();
  }
});
