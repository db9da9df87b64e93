/**
 * Time to write each turn's session snapshot as one conversation grows: every turn adds 60
 * prompt tokens and 24 generated ones to session "c" (greedy), then waits for its snapshot
 * (`flushSnapshots`) in a Deno KV store in a temporary folder. Prints, per turn, `tokens:ms/lag`:
 * the session's length, the time to write its snapshot, and the longest `setTimeout(0)` meanwhile
 * (how long the event loop was held); then the blocks copied from the GPU and reused.
 *
 *   deno run -A scripts/probe_snapshots.ts [--model models/strata-default] [--turns 10]
 */
import { parseArgs } from "node:util";
import { Engine } from "../engine/engine.ts";
import { SessionStore } from "../engine/sessions/store.ts";
import { sampling } from "../api/types.ts";
import { lagProbe } from "./bench.ts";
import { helpFromComment } from "./help.ts";

helpFromComment(import.meta.url);

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
  const vocab = Math.min(engine.config.vocabSize, 540);
  let history: number[] = [];
  const out: string[] = [];
  for (let turn = 0; turn < turns; turn++) {
    const added = Array.from({ length: 60 }, (_, i) => 20 + ((i * 13 + turn * 7) % (vocab - 40)));
    history = [...history, ...added];
    const gen = engine.generate({
      promptIds: history,
      sampling: sampling({ maxTokens: 24, stopAtEos: false }),
      sessionId: "c",
    });
    for await (const t of gen) history.push(t.id);
    await gen.result;
    // How long the event loop was held while the snapshot was written: the longest
    // setTimeout(0) meanwhile.
    const probe = lagProbe();
    const t0 = performance.now();
    await engine.flushSnapshots();
    const ms = performance.now() - t0;
    const worst = (await probe.stop()).max;
    out.push(`${history.length}:${ms.toFixed(1)}/${worst.toFixed(1)}`);
  }
  console.log(`${engine.adapterName}, ${engine.modelId}: tokens:ms/lag ${out.join(" ")}`);
  const s = engine.kvStats().snapshotBlocks;
  console.log(`blocks copied ${s.copied}, reused ${s.reused}`);
} finally {
  store.close();
  await Deno.remove(dir, { recursive: true });
}
Deno.exit(0); // the GPU device keeps the event loop alive
