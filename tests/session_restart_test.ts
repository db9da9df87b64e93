/**
 * Kill and restart: a server started with --kv snapshots each session into Deno KV; after
 * SIGKILL and a restart on the same file, the session is still there, its next turn reuses the
 * restored KV blocks (cached tokens), and the reply equals that of a session that never went
 * through a restart.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { makeTestModel } from "../scripts/make_test_model.ts";
import { testGpu } from "./util.ts";

const MAIN = new URL("../main.ts", import.meta.url).pathname;

interface Server {
  url: string;
  child: Deno.ChildProcess;
}

/** Starts `main.ts serve` on a free port and waits for its "serving … at URL" line. */
async function start(model: string, kv: string, extra: string[]): Promise<Server> {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", MAIN, "serve", "--model", model, "--port", "0", "--kv", kv, ...extra],
    stdout: "null",
    stderr: "piped",
  }).spawn();
  const reader = child.stderr.pipeThrough(new TextDecoderStream()).getReader();
  let seen = "";
  while (true) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`server exited before listening:\n${seen}`);
    seen += value;
    const m = seen.match(/at (http:\/\/[^\s]+)\//);
    if (m) {
      // Keep draining stderr so the child never blocks on a full pipe.
      (async () => {
        while (!(await reader.read()).done) { /* drain */ }
      })();
      return { url: m[1], child };
    }
  }
}

async function complete(s: Server, prompt: string, session: string) {
  const r = await fetch(`${s.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt, max_tokens: 12, temperature: 0, session_id: session }),
  });
  assert.equal(r.status, 200, await r.clone().text());
  const j = await r.json();
  return { text: j.choices[0].text as string, cached: j.usage.prompt_tokens_details.cached_tokens };
}

async function sessionInfo(s: Server, id: string) {
  const r = await fetch(`${s.url}/v1/sessions/${id}`);
  return { status: r.status, body: await r.json() };
}

/** Stored blocks of the server's sessions by tier, as /health reports them. */
async function tiers(s: Server): Promise<{ kv: number; fs: number }> {
  const h = await (await fetch(`${s.url}/health`)).json();
  return { kv: h.kv.kv.used, fs: h.kv.fs.used };
}

/** Polls `cond` every 100 ms for up to 30 s. */
async function until(what: string, cond: () => Promise<boolean>) {
  const deadline = Date.now() + 30_000;
  while (!(await cond())) {
    assert.ok(Date.now() < deadline, what);
    await new Promise((r) => setTimeout(r, 100));
  }
}

Deno.test("sessions survive SIGKILL and restart through Deno KV", async () => {
  await restartTest([], {
    async beforeKill(a) {
      const t = await tiers(a);
      assert.ok(t.kv > 0 && t.fs === 0, JSON.stringify(t));
    },
    async restarted(b) {
      const t = await tiers(b);
      assert.ok(t.kv > 0 && t.fs === 0, JSON.stringify(t));
    },
  });
});

Deno.test("sessions survive SIGKILL and restart from the cold tier of files", async () => {
  // No room in Deno KV: every snapshot's blocks move to files right after it lands.
  await restartTest(["--kv-warm-mb", "0"], {
    async beforeKill(a, kv) {
      await until("the blocks never moved to files", async () => (await tiers(a)).kv === 0);
      const t = await tiers(a);
      assert.ok(t.fs > 0, JSON.stringify(t));
      assert.equal((await Array.fromAsync(Deno.readDir(`${kv}.cold`))).length, t.fs);
    },
    async restarted(b) {
      const t = await tiers(b);
      assert.ok(t.kv === 0 && t.fs > 0, `restored from files: ${JSON.stringify(t)}`);
    },
  });
});

/**
 * Two turns of a session across a SIGKILL and a restart, against the same turns without one.
 * `beforeKill` runs on the first server once turn 1 is persisted, `restarted` on the second
 * before turn 2.
 */
async function restartTest(
  extra: string[],
  check: {
    beforeKill: (a: Server, kv: string) => Promise<void>;
    restarted: (b: Server, kv: string) => Promise<void>;
  },
) {
  await testGpu();
  const dir = await Deno.makeTempDir({ prefix: "strata-restart-" });
  const model = join(dir, "model"), kv = join(dir, "sessions.sqlite");
  await makeTestModel(model, { arch: "llama", dtype: "f16", hidden: 128, heads: 4, kvHeads: 2 });
  const servers: Server[] = [];
  try {
    const turn1 = "the quick brown fox jumps over the lazy dog and then";
    const a = await start(model, kv, extra);
    servers.push(a);
    const first = await complete(a, turn1, "s1");
    // Wait until the snapshot of turn 1 is in the store, then kill without any chance to flush.
    await until(
      "the session was never persisted",
      async () => (await sessionInfo(a, "s1")).body.persisted_at_ms !== null,
    );
    await check.beforeKill(a, kv);
    a.child.kill("SIGKILL");
    await a.child.status;

    const b = await start(model, kv, extra);
    servers.push(b);
    const info = await sessionInfo(b, "s1");
    assert.equal(info.status, 200);
    assert.ok(info.body.tokens > 0, `restored session holds no tokens: ${JSON.stringify(info)}`);
    await check.restarted(b, kv);
    const turn2 = turn1 + first.text + " and after that";
    const resumed = await complete(b, turn2, "s1");
    assert.ok(resumed.cached > 0, "the restored session's KV was not reused");

    // The same two turns on a session that never went through a restart.
    await complete(b, turn1, "s2");
    const uninterrupted = await complete(b, turn2, "s2");
    // The uninterrupted session's turn 2 also finds, by hash, the blocks the resumed turn has
    // just computed (the same prompt, the same tenant), and counts them as cached: it reuses at
    // least as much as the resumed one, whose reuse comes from its restored blocks alone.
    assert.ok(
      uninterrupted.cached >= resumed.cached,
      `${uninterrupted.cached} < ${resumed.cached}`,
    );
    assert.equal(resumed.text, uninterrupted.text);
    // Every turn was snapshotted: /metrics counts the blocks copied from the GPU.
    const metrics = await (await fetch(`${b.url}/metrics`)).text();
    const copied = Number(
      metrics.match(/^strata_snapshot_blocks_total\{source="gpu"\} (\d+)$/m)?.[1],
    );
    assert.ok(copied >= 3, `snapshot blocks copied: ${copied}`);
    console.log(`restored: ${info.body.tokens} tokens, turn 2 reused ${resumed.cached} tokens`);
  } finally {
    for (const s of servers) {
      try {
        s.child.kill("SIGKILL");
      } catch { /* already gone */ }
      await s.child.status;
    }
    await Deno.remove(dir, { recursive: true });
  }
}
