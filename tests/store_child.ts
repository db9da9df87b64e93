/**
 * The child process of tests/session_store_test.ts's kill-and-restart test: works on the store
 * at `Deno.args[1]` until it is killed, printing a line after each step.
 *
 * - `write SEED`: snapshots sessions s0..s4 over and over (each later snapshot of a session
 *   replaces its manifest), three blocks each, one of them with the bytes of the previous
 *   session's last block, under a warm budget of 100 kB, so that maintenance passes move chunks
 *   to files beside the writes. Prints `saved N`.
 * - `collect`: with no grace period, deletes the sessions one by one, each followed by a
 *   maintenance pass. Prints `deleted ID`.
 */
import { SessionStore } from "../engine/sessions/store.ts";
import { rng } from "./util.ts";

const [mode, path, seed] = Deno.args;

function block(r: ReturnType<typeof rng>): Uint8Array {
  return Uint8Array.from({ length: 30_000 }, (_, i) => (i % 2 ? 0 : r.int(256)));
}

if (mode === "write") {
  const store = await SessionStore.open(path, { warmBytes: 100_000 });
  const r = rng(Number(seed));
  let last = block(r);
  for (let i = 0;; i++) {
    const blocks = [last, block(r), block(r)];
    last = blocks[2];
    await store.save({
      id: `s${i % 5}`,
      model: "m",
      tokens: Uint32Array.from({ length: 49 }, (_, j) => j),
      computed: 48,
      createdAt: 1,
      updatedAt: Date.now(),
    }, blocks);
    console.log(`saved ${i}`);
  }
} else if (mode === "collect") {
  const store = await SessionStore.open(path, { graceMs: 0, warmBytes: 100_000 });
  for (const m of await store.list()) {
    await store.delete(m.id);
    await store.maintain();
    console.log(`deleted ${m.id}`);
  }
  console.log("done");
  setInterval(() => {}, 1000); // until killed
}
