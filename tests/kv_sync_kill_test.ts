/**
 * Kill -9 with `--kv-sync`: a server answers turns of two sessions while it is killed at random
 * moments, 30 times; after every restart on the same store, each session holds at least every
 * turn the client had received an answer for (none lost), exactly what the client knows of it
 * (its token count is that of an acknowledged turn or of the one in flight: none corrupt), and
 * the next turn reuses the restored KV.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { makeTestModel } from "../scripts/make_test_model.ts";
import { rng, testGpu } from "./util.ts";

const MAIN = new URL("../main.ts", import.meta.url).pathname;
const TRIALS = 30;

interface Server {
  url: string;
  child: Deno.ChildProcess;
  log: () => string;
}

async function start(model: string, kv: string): Promise<Server> {
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      MAIN,
      "serve",
      "--model",
      model,
      "--port",
      "0",
      "--kv",
      kv,
      "--kv-sync",
      "--context-length",
      "1024",
    ],
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
      (async () => {
        for (let r; !(r = await reader.read()).done;) seen += r.value;
      })();
      return { url: m[1], child, log: () => seen };
    }
  }
}

/** What the client knows of a session: the prompt of its next turn and the acknowledged sizes. */
interface Known {
  id: string;
  text: string;
  /** Tokens the session holds after each acknowledged turn (the last one's KV is pending). */
  acked: number[];
  /** The size it would hold if the turn in flight lands. */
  inFlight?: number;
}

/** One turn; false when the server went away before answering. */
async function turn(s: Server, k: Known): Promise<boolean> {
  const prompt = `${k.text} and then`;
  let r: Response, j;
  try {
    r = await fetch(`${s.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt, max_tokens: 6, temperature: 0, session_id: k.id }),
    });
    j = await r.json();
  } catch {
    return false; // killed: the connection broke before the answer
  }
  assert.equal(r.status, 200, JSON.stringify(j));
  assert.ok(j.session.persisted_at_ms > 0, "an answer under --kv-sync is persisted");
  k.text = prompt + j.choices[0].text;
  k.acked.push(j.usage.prompt_tokens + j.usage.completion_tokens - 1);
  k.inFlight = undefined;
  return true;
}

Deno.test("kv-sync: 30 kills at random moments lose no answered turn, corrupt no session", async () => {
  await testGpu();
  const dir = await Deno.makeTempDir({ prefix: "strata-kvsync-kill-" });
  const model = join(dir, "model"), kv = join(dir, "sessions.sqlite");
  await makeTestModel(model, { arch: "llama", dtype: "f16", hidden: 64, heads: 2, kvHeads: 1 });
  const r = rng(2026);
  const known: Known[] = ["a", "b"].map((id) => ({ id, text: `session ${id} begins`, acked: [] }));
  let server = await start(model, kv);
  let turns = 0, lost = 0;
  try {
    for (let trial = 0; trial < TRIALS; trial++) {
      // Both sessions talk; the kill lands a random while after the trial's first answer (a
      // restarted server compiles its kernels first), mid-turn or between turns.
      let killed = false, answered!: () => void;
      const first = new Promise<void>((res) => (answered = res));
      const talk = known.map(async (k) => {
        while (!killed) {
          k.inFlight = -1; // a turn is on its way; its size is known only when answered
          if (await turn(server, k)) {
            turns++;
            answered();
          }
        }
      });
      await first;
      await new Promise((res) => setTimeout(res, r.int(400)));
      killed = true;
      server.child.kill("SIGKILL");
      await server.child.status;
      await Promise.all(talk);
      server = await start(model, kv);
      for (const k of known) {
        const res = await fetch(`${server.url}/v1/sessions/${k.id}`);
        const last = k.acked.at(-1) ?? 0;
        if (res.status === 404) {
          assert.equal(
            last,
            0,
            `trial ${trial}: session ${k.id} lost after ${k.acked.length} turns`,
          );
          continue;
        }
        const info = await res.json();
        if (info.tokens < last) lost++;
        // What it holds is an acknowledged turn, or the one that was in flight at the kill.
        assert.ok(
          info.tokens === last || (k.inFlight !== undefined && info.tokens > last),
          `trial ${trial}: session ${k.id} holds ${info.tokens} tokens; acknowledged ${last}` +
            `${k.inFlight !== undefined ? " (a turn in flight)" : ""}`,
        );
        if (info.tokens > last) k.acked.push(info.tokens); // it landed: that is its state now
      }
    }
    assert.equal(lost, 0);
    assert.ok(turns >= TRIALS, `only ${turns} turns were answered`);
    // The restored sessions continue: their next turn reuses the KV they hold.
    for (const k of known) {
      const res = await fetch(`${server.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ prompt: `${k.text} at last`, max_tokens: 3, session_id: k.id }),
      });
      const j = await res.json();
      assert.equal(res.status, 200, JSON.stringify(j));
      assert.ok(j.usage.prompt_tokens_details.cached_tokens > 0, `${k.id}: ${JSON.stringify(j)}`);
    }
    assert.doesNotMatch(server.log(), /not restored|failed/, server.log());
    console.log(`${TRIALS} kills, ${turns} answered turns, 0 lost`);
  } finally {
    try {
      server.child.kill("SIGKILL");
    } catch { /* gone */ }
    await server.child.status;
    await Deno.remove(dir, { recursive: true });
  }
});
