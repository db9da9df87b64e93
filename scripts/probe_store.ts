/**
 * How fast the session store moves blocks from Deno KV to its cold folder: writes `--sessions`
 * sessions of `--blocks` random f32 blocks of `--block-kb` KiB each (default: 40 × 3 TinyLlama
 * blocks of 704 KiB) into a store in a temporary folder, reopens it with a warm budget of 0 and
 * times one maintenance pass, which moves every chunk to a file.
 *
 *   deno run -A scripts/probe_store.ts [--sessions 40] [--blocks 3] [--block-kb 704]
 */
import { parseArgs } from "node:util";
import { SessionStore } from "../engine/sessions/store.ts";
import { rng } from "./rng.ts";
import { helpFromComment } from "./help.ts";

helpFromComment(import.meta.url);

const { values: v } = parseArgs({
  options: {
    sessions: { type: "string", default: "40" },
    blocks: { type: "string", default: "3" },
    "block-kb": { type: "string", default: "704" },
  },
});
const sessions = Number(v.sessions), blocks = Number(v.blocks), kb = Number(v["block-kb"]);
const r = rng(1);
/** A block of f32 values in [-2, 2): the packer's high planes compress as K and V do. */
function block(): Uint8Array {
  const f = Float32Array.from({ length: (kb * 1024) / 4 }, () => (r.int(256) - 128) / 64);
  return new Uint8Array(f.buffer);
}
const dir = await Deno.makeTempDir({ prefix: "strata-probe-store-" });
try {
  let store = await SessionStore.open(`${dir}/s.sqlite`);
  for (let s = 0; s < sessions; s++) {
    const meta = { id: `s${s}`, model: "m", tokens: new Uint32Array(1), computed: 0 };
    await store.save(
      { ...meta, createdAt: 1, updatedAt: s },
      Array.from({ length: blocks }, block),
    );
  }
  const mib = store.warmUsed / 2 ** 20;
  store.close();
  store = await SessionStore.open(`${dir}/s.sqlite`, { warmBytes: 0 });
  const t0 = performance.now();
  await store.maintain();
  const ms = performance.now() - t0;
  console.log(
    `moved ${mib.toFixed(1)} MiB packed (${sessions * blocks} chunks) in ${ms.toFixed(0)} ms: ` +
      `${(mib / ms * 1000).toFixed(1)} MiB/s; left in Deno KV: ${store.warmUsed} bytes`,
  );
  store.close();
} finally {
  await Deno.remove(dir, { recursive: true });
}
