/**
 * The snapshot store's rates for the start-up profile (engine/kv/profile.ts): records written as
 * snapshots write chunks (packed in the store's workers, in values under Deno KV's limit, a dozen
 * per commit) under keys of their own, read back and unpacked as restores do, then deleted.
 */
import { unpackBlock } from "./block_pack.ts";
import { chunkHash } from "./packer.ts";
import { PART, PARTS_PER_COMMIT, type SessionStore } from "./store.ts";

/**
 * Writes `records` through `store` and reads them back (see the module doc).
 *
 * @param width bytes per element of the records (2 for an f16 cache, 4 for f32)
 * @returns the time each way (ms)
 * @throws Error when what is read back is not what was written
 */
export async function probeStore(
  store: SessionStore,
  records: Uint8Array<ArrayBuffer>[],
  width: number,
): Promise<{ writeMs: number; readMs: number }> {
  const kv = store.kv, id = crypto.randomUUID(), keys: Deno.KvKey[] = [];
  const t0 = performance.now();
  const packed = await Promise.all(records.map((r) => store.packer.pack(r, width)));
  const parts = packed.map((p) => Math.max(1, Math.ceil(p.packed.byteLength / PART)));
  try {
    for (const [i, { packed: data }] of packed.entries()) {
      for (let p = 0; p < parts[i]; p += PARTS_PER_COMMIT) {
        const op = kv.atomic();
        for (let q = p; q < Math.min(parts[i], p + PARTS_PER_COMMIT); q++) {
          keys.push(["kvprobe", id, i, q]);
          op.set(keys.at(-1)!, data.subarray(q * PART, (q + 1) * PART));
        }
        await op.commit();
      }
    }
    const t1 = performance.now();
    for (const [i, r] of records.entries()) {
      const got: Uint8Array[] = [];
      for (let p = 0; p < parts[i]; p += 10) {
        const batch = Array.from(
          { length: Math.min(10, parts[i] - p) },
          (_, j) => ["kvprobe", id, i, p + j],
        );
        for (const e of await kv.getMany<Uint8Array[]>(batch)) got.push(e.value!);
      }
      const all = new Uint8Array(got.reduce((n, g) => n + g.byteLength, 0));
      got.reduce((o, g) => (all.set(g, o), o + g.byteLength), 0);
      const raw = unpackBlock(all, { width, bytes: r.byteLength });
      if (chunkHash(raw) !== packed[i].hash) {
        throw new Error("internal error: the store's probe read back other bytes");
      }
    }
    return { writeMs: t1 - t0, readMs: performance.now() - t1 };
  } finally {
    for (let i = 0; i < keys.length; i += 10) {
      const op = kv.atomic();
      for (const k of keys.slice(i, i + 10)) op.delete(k);
      await op.commit();
    }
  }
}
