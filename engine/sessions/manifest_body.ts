/**
 * Manifests larger than one Deno KV value. A value holds at most 64 KiB, and a manifest's token
 * ids, block entries and turn records grow with the session: an 8k-token TinyLlama session's
 * did not fit, and its snapshots failed ("Value too large"), so with `--kv-sync` every turn of it
 * failed. Such a manifest keeps its small fields in the `["session", id]` value and refers to a
 * body (those three fields, V8-serialized) stored content-addressed as parts, written before the
 * manifest's commit: the commit still switches the session from one whole snapshot to the next,
 * and a body no manifest refers to is collected once older than the grace period, as chunks are.
 *
 * Keys: `["mbodymeta", hash]` → {@linkcode BodyMeta} (written first, so its time bounds the
 * parts' age), `["mbody", hash, i]` → part i's bytes.
 */
import { deserialize, serialize } from "node:v8";
import { chunkHash } from "./packer.ts";

/** A manifest whose serialized fields exceed this goes to a body (a value is ≤ 64 KiB). */
export const INLINE_BYTES = 48 * 1024;
/** Bytes per body part. */
const PART_BYTES = 60 * 1024;
/** Parts per atomic commit (10 × 60 KiB stays inside a commit's size limit). */
const PARTS_PER_COMMIT = 10;

/** The fields a body holds. */
const FIELDS = ["tokens", "blocks", "turns"] as const;

/** What a manifest's head says of its body. */
export interface BodyRef {
  /** xxh64 of the serialized fields, hex. */
  hash: string;
  parts: number;
  bytes: number;
}

/** A stored body's record. */
interface BodyMeta {
  parts: number;
  bytes: number;
  /** When it was written (ms since the epoch): unreferenced bodies are collected after grace. */
  at: number;
}

/**
 * The value to store under `["session", id]` for manifest `m`: `m` itself when it is small,
 * else its head (`m` without the body's fields, with `body`) once the body is written.
 */
export async function storedManifest(kv: Deno.Kv, m: object): Promise<object> {
  const all = m as Record<string, unknown>;
  const fields = Object.fromEntries(FIELDS.filter((f) => f in all).map((f) => [f, all[f]]));
  const bytes = new Uint8Array(serialize(fields));
  if (bytes.byteLength <= INLINE_BYTES) return m;
  const hash = chunkHash(bytes), parts = Math.ceil(bytes.byteLength / PART_BYTES);
  const meta: BodyMeta = { parts, bytes: bytes.byteLength, at: Date.now() };
  await kv.set(["mbodymeta", hash], meta);
  for (let i = 0; i < parts; i += PARTS_PER_COMMIT) {
    const op = kv.atomic();
    for (let p = i; p < Math.min(parts, i + PARTS_PER_COMMIT); p++) {
      op.set(["mbody", hash, p], bytes.subarray(p * PART_BYTES, (p + 1) * PART_BYTES));
    }
    if (!(await op.commit()).ok) throw new Error(`internal error: manifest body ${hash}`);
  }
  const head: Record<string, unknown> = { ...all, body: { hash, parts, bytes: bytes.byteLength } };
  for (const f of FIELDS) delete head[f];
  return head;
}

/**
 * The whole manifest of a stored value: the value itself, or its head with the body's fields read
 * back; undefined when a part is missing or the body does not match its hash.
 */
export async function wholeManifest<M>(
  kv: Deno.Kv,
  stored: M & { body?: BodyRef },
): Promise<M | undefined> {
  const ref = stored.body;
  if (!ref) return stored;
  const parts: Uint8Array[] = [];
  for (let i = 0; i < ref.parts; i += 10) { // getMany takes at most 10 keys
    const keys = Array.from({ length: Math.min(10, ref.parts - i) }, (_, j) => [
      "mbody",
      ref.hash,
      i + j,
    ]);
    for (const e of await kv.getMany<Uint8Array[]>(keys)) {
      if (!(e.value instanceof Uint8Array)) return undefined;
      parts.push(e.value);
    }
  }
  const bytes = new Uint8Array(ref.bytes);
  let at = 0;
  for (const p of parts) {
    if (at + p.byteLength > bytes.byteLength) return undefined;
    bytes.set(p, at);
    at += p.byteLength;
  }
  if (at !== ref.bytes || chunkHash(bytes) !== ref.hash) return undefined;
  try {
    return { ...stored, ...deserialize(bytes) } as M;
  } catch {
    return undefined;
  }
}

/**
 * Deletes the bodies no manifest refers to (`live`: the hashes manifests hold) once older than
 * `graceMs` (a snapshot writes its body before its manifest).
 *
 * @returns how many it deleted
 */
export async function sweepBodies(
  kv: Deno.Kv,
  live: ReadonlySet<string>,
  o: { now: number; graceMs: number },
): Promise<number> {
  let deleted = 0;
  for await (const e of kv.list<BodyMeta>({ prefix: ["mbodymeta"] })) {
    const hash = e.key[1] as string;
    if (live.has(hash) || o.now - e.value.at < o.graceMs) continue;
    // One commit, checked against the record: a snapshot that writes the same body again
    // rewrites the record first, so this fails and its parts stay.
    const op = kv.atomic().check(e).delete(e.key);
    for (let p = 0; p < e.value.parts; p++) op.delete(["mbody", hash, p]);
    if ((await op.commit()).ok) deleted++;
  }
  return deleted;
}
