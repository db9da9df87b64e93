/**
 * Time to write each turn's session snapshot as one conversation grows: every turn adds 60
 * prompt tokens and 24 generated ones to session "c" (greedy), then waits for its snapshot
 * (`flushSnapshots`) in a Deno KV store in a temporary folder. Prints `tokens:ms` per turn and
 * the blocks copied from the GPU and reused from earlier snapshots.
 *
 *   deno run -A scripts/probe_snapshots.ts [--model models/strata-default] [--turns 10]
 */
import { parseArgs } from "node:util";
import { Engine } from "../engine/engine.ts";
import { SessionStore } from "../engine/session_store.ts";
import { sampling } from "../engine/api.ts";

const { values: v } = parseArgs({
  options: {
    model: { type: "string", default: "models/strata-default" },
    turns: { type: "string", default: "10" },
  },
});
const dir = await Deno.makeTempDir({ prefix: "strata-snapshots-" });
const store = await SessionStore.open(`${dir}/sessions.sqlite3`);
try {
  const turns = Number(v.turns);
  const engine = await Engine.load(v.model!, {
    maxSlots: 1,
    contextLength: turns * 84 + 16,
    store,
  });
  let history: number[] = [];
  const out: string[] = [];
  for (let turn = 0; turn < turns; turn++) {
    const added = Array.from({ length: 60 }, (_, i) => 20 + ((i * 13 + turn * 7) % 500));
    history = [...history, ...added];
    const gen = engine.generate({
      promptIds: history,
      sampling: sampling({ maxTokens: 24, stopAtEos: false }),
      sessionId: "c",
    });
    for await (const t of gen) history.push(t.id);
    await gen.result;
    const t0 = performance.now();
    await engine.flushSnapshots();
    out.push(`${history.length}:${(performance.now() - t0).toFixed(1)}`);
  }
  console.log(`${engine.adapterName}, ${engine.modelId}: tokens:ms ${out.join(" ")}`);
  const s = engine.snapshotStats();
  console.log(`blocks copied ${s.blocksCopied}, reused ${s.blocksReused}`);
} finally {
  store.close();
  await Deno.remove(dir, { recursive: true });
}
Deno.exit(0); // the GPU device keeps the event loop alive
