/**
 * Replays: a session's turns (sampled and greedy, run with speculation on) are recorded with the
 * fingerprints of their hidden states; `POST /v1/sessions/:id/replay` runs them again and finds
 * every token and state the same; after the process is gone, `main.ts generate --replay` does the
 * same from the snapshot in Deno KV; a token or a fingerprint changed in the stored record is
 * reported as the first divergence at exactly its turn and step (exit code 1).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { sampling } from "../api/types.ts";
import { Engine } from "../engine/engine.ts";
import { SessionStore } from "../engine/sessions/store.ts";
import type { SessionManifest } from "../engine/sessions/store.ts";
import { createApp } from "../routes/app.ts";
import { testGpu } from "./util.ts";

const MAIN = new URL("../main.ts", import.meta.url).pathname;
const MODEL = new URL("../models/strata-default", import.meta.url).pathname;

async function cliReplay(kv: string, id: string) {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", MAIN, "generate", "--replay", id, "--kv", kv, "--json"],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stdout).trim();
  assert.ok(text, new TextDecoder().decode(out.stderr));
  return { code: out.code, report: JSON.parse(text.split("\n").at(-1)!) };
}

async function editTurns(kv: string, id: string, edit: (m: SessionManifest) => void) {
  const db = await Deno.openKv(kv);
  try {
    const e = await db.get<SessionManifest>(["session", id]);
    const m = structuredClone(e.value!);
    edit(m);
    await db.set(["session", id], m);
  } finally {
    db.close();
  }
}

Deno.test("replay: recorded turns come back token for token and state for state; edits are found", async () => {
  await testGpu();
  const dir = await Deno.makeTempDir({ prefix: "strata-replay-" });
  const kv = join(dir, "sessions.sqlite3");
  try {
    const store = await SessionStore.open(kv);
    const engine = await Engine.load(MODEL, {
      maxSlots: 4,
      contextLength: 512,
      store,
      speculate: "on",
    });
    const app = createApp(engine);
    const turn = async (content: string, extra: object) => {
      const r = await app.request("/v1/chat/completions", {
        method: "POST",
        headers: { "content-type": "application/json", "x-session-id": "s1" },
        body: JSON.stringify({ messages: [{ role: "user", content }], max_tokens: 40, ...extra }),
      });
      assert.equal(r.status, 200, await r.clone().text());
      return await r.json();
    };
    await turn("Tell me a fortune.", { temperature: 0.8, seed: 7 });
    await turn("Tell me a fortune. And another one about the sea and the sea.", { temperature: 0 });
    // a free request alongside a replay changes the batch, not the answer
    const busy = engine.generate({
      promptIds: engine.encode("The king said"),
      sampling: sampling({ maxTokens: 60, stopAtEos: false }),
    });
    const json = { "content-type": "application/json" };
    const r = await app.request("/v1/sessions/s1/replay", { method: "POST", headers: json });
    const rep = await r.json();
    await busy.result;
    assert.equal(r.status, 200, JSON.stringify(rep));
    assert.equal(rep.object, "session.replay");
    assert.equal(rep.turns, 2);
    assert.ok(rep.tokens > 10, JSON.stringify(rep));
    assert.equal(rep.identical, true, JSON.stringify(rep.divergence));
    assert.ok(rep.max_fingerprint_distance <= 3);
    const bad = await app.request("/v1/sessions/s1/replay", {
      method: "POST",
      headers: json,
      body: '{"x":1}',
    });
    assert.equal(bad.status, 400);
    assert.equal((await bad.json()).error.param, "x");
    const none = await app.request("/v1/sessions/nope/replay", {
      method: "POST",
      headers: json,
      body: "{}",
    });
    assert.equal(none.status, 404);
    await engine.flushSnapshots();
    store.close();

    // From the snapshot, in another process.
    const again = await cliReplay(kv, "s1");
    assert.equal(again.code, 0, JSON.stringify(again.report));
    assert.equal(again.report.divergence, null);
    assert.equal(again.report.tokens, rep.tokens);

    // A token changed in the record: found at its turn and step.
    let original = 0;
    await editTurns(kv, "s1", (m) => {
      original = m.turns![1].tokens[3];
      m.turns![1].tokens[3] = original === 5 ? 6 : 5;
    });
    const tok = await cliReplay(kv, "s1");
    assert.equal(tok.code, 1);
    assert.deepEqual(
      [tok.report.divergence.turn, tok.report.divergence.step, tok.report.divergence.kind],
      [1, 3, "token"],
    );
    assert.equal(tok.report.divergence.got.token, original);
    // A state changed (half the fingerprint's bits) with the same tokens: found as a state.
    await editTurns(kv, "s1", (m) => {
      m.turns![1].tokens[3] = original;
      m.turns![0].fingerprints[5] = (m.turns![0].fingerprints[5] ^ 0x0000ffff) >>> 0;
    });
    const st = await cliReplay(kv, "s1");
    assert.equal(st.code, 1);
    assert.deepEqual(
      [st.report.divergence.turn, st.report.divergence.step, st.report.divergence.kind],
      [0, 5, "state"],
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
