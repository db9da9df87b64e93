/**
 * What `--kv-sync` costs a turn: the same session turns on an engine with a session store,
 * without and with durable turns (the result waits for the snapshot's commit), alternating,
 * each turn's latency from `generate` to its result. Prints a table; `--out FILE` writes JSON.
 *
 *   deno run -A scripts/probe_kv_sync.ts [--model DIR | --shape NAME] [--turns N]
 *     [--prompt-len N] [--new-tokens N] [--out FILE]
 */
import { parseArgs } from "node:util";
import { sampling } from "../api/types.ts";
import { Engine } from "../engine/engine.ts";
import { syntheticModel } from "../engine/model/synthetic.ts";
import { SessionStore } from "../engine/sessions/store.ts";
import { getGpu } from "../gpu/device.ts";
import { percentile } from "./bench_report.ts";

const DEFAULT_MODEL = new URL("../models/strata-default", import.meta.url).pathname;
const HELP = `probe_kv_sync: turn latency without and with --kv-sync
  --model DIR      model folder (default models/strata-default)
  --shape NAME     a named shape with random weights instead (e.g. tinyllama-1.1b)
  --turns N        turns per mode (default 12)
  --prompt-len N   new prompt tokens per turn (default 64)
  --new-tokens N   tokens generated per turn (default 16)
  --out FILE       write the results as JSON`;

const { values: v } = parseArgs({
  args: Deno.args,
  options: {
    model: { type: "string" },
    shape: { type: "string" },
    turns: { type: "string" },
    "prompt-len": { type: "string" },
    "new-tokens": { type: "string" },
    out: { type: "string" },
    help: { type: "boolean" },
  },
});
if (v.help) {
  console.log(HELP);
  Deno.exit(0);
}
const turns = Number(v.turns ?? 12), promptLen = Number(v["prompt-len"] ?? 64);
const newTokens = Number(v["new-tokens"] ?? 16);
const gpu = await getGpu();
const dir = await Deno.makeTempDir({ prefix: "strata-kvsync-probe-" });
const model = v.shape
  ? await syntheticModel(gpu, v.shape, { tokenizerDir: DEFAULT_MODEL })
  : undefined;
const modes = ["async", "sync"] as const;
type Mode = (typeof modes)[number];
/** Per mode: whole turns, and the end of a turn (its last token to its result). */
const ms: Record<Mode, { turn: number[]; end: number[] }> = {
  async: { turn: [], end: [] },
  sync: { turn: [], end: [] },
};
try {
  // Both engines side by side, turns alternating, so machine noise hits both alike.
  const engines = [];
  for (const mode of modes) {
    const store = await SessionStore.open(`${dir}/${mode}.sqlite3`);
    const opts = { store, kvSync: mode === "sync", maxSlots: 2, contextLength: 2048 };
    const engine = model
      ? Engine.create(gpu, model, opts)
      : await Engine.load(v.model ?? DEFAULT_MODEL, opts);
    engines.push({ mode, store, engine, history: [] as number[] });
  }
  for (let t = 0; t <= turns; t++) {
    for (const e of engines) {
      const vocab = Math.min(e.engine.config.vocabSize, e.engine.tokenizer.vocabSize);
      const fresh = Array.from({ length: promptLen }, (_, i) => (t * 97 + i * 31) % vocab);
      if (e.history.length + promptLen + newTokens > 2000) e.history = [];
      const prompt = [...e.history, ...fresh];
      const t0 = performance.now();
      const gen = e.engine.generate({
        promptIds: prompt,
        sampling: sampling({ maxTokens: newTokens, stopAtEos: false }),
        sessionId: "probe",
      });
      const ids: number[] = [];
      let last = t0;
      for await (const ev of gen) {
        ids.push(ev.id);
        last = performance.now();
      }
      await gen.result;
      const t1 = performance.now();
      if (t > 0) { // turn 0 compiles kernels
        ms[e.mode].turn.push(t1 - t0);
        ms[e.mode].end.push(t1 - last);
      }
      e.history = [...prompt, ...ids];
    }
  }
  for (const e of engines) {
    await e.engine.flushSnapshots();
    e.store.close();
  }
} finally {
  await Deno.remove(dir, { recursive: true });
}
const summary = (v: number[]) => ({
  p50: percentile(v, 50),
  p95: percentile(v, 95),
  mean: v.reduce((a, b) => a + b, 0) / v.length,
});
const row = (m: Mode) => ({ turn: summary(ms[m].turn), end: summary(ms[m].end) });
const result = {
  adapter: gpu.adapterName,
  model: v.shape ?? v.model ?? "strata-default",
  turns,
  prompt_len: promptLen,
  new_tokens: newTokens,
  turn_ms: { async: row("async"), sync: row("sync") },
};
const f = (x: number) => x.toFixed(1).padStart(8);
console.log(
  `kv-sync probe: ${result.model} on ${result.adapter}, ${turns} turns of ` +
    `${promptLen} new prompt tokens + ${newTokens} generated, alternating`,
);
console.log(
  `ms                    turn p50 turn p95   end p50  end p95  (end: last token to result)`,
);
for (const m of modes) {
  const r = result.turn_ms[m];
  console.log(
    `${m === "sync" ? "with --kv-sync   " : "without --kv-sync"} ${f(r.turn.p50)} ${
      f(r.turn.p95)
    }  ${f(r.end.p50)} ${f(r.end.p95)}`,
  );
}
const cost = result.turn_ms.sync.end.p50 - result.turn_ms.async.end.p50;
console.log(`cost per turn (end of turn, p50): ${cost.toFixed(1)} ms`);
if (v.out) await Deno.writeTextFile(v.out, JSON.stringify(result, null, 2));
Deno.exit(0);
