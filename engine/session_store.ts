/**
 * Session snapshots in Deno KV: a session's token ids and the KV blocks that hold them survive a
 * restart. Blocks are content-addressed chunks (fflate-compressed, named by the xxh64 of their
 * bytes, split into values under Deno KV's 64 KiB limit), written first; then one atomic commit
 * replaces the session's small manifest. Restore verifies every chunk's hash and keeps the
 * longest valid prefix of blocks.
 */
import xxhash from "xxhash-wasm";
import { deflateSync, inflateSync } from "fflate";
import type { KvDtype } from "./dtype.ts";
import type { DeflateRequest, DeflateResponse } from "./deflate_worker.ts";

const hasher = await xxhash();

/**
 * Deflates blocks in a worker (engine/deflate_worker.ts), so that snapshot writes do not hold the
 * event loop: fflate's level 1 takes tens of milliseconds per 720 kB block (TinyLlama's f32 K and
 * V) on the CPU machines. Requests are answered in order. If the worker fails, pending and later
 * blocks are deflated on the calling thread.
 */
class Deflater {
  #worker?: Worker;
  #broken = false;
  #next = 0;
  readonly #pending = new Map<
    number,
    { raw: Uint8Array; resolve: (b: Uint8Array) => void; reject: (e: Error) => void }
  >();

  deflate(raw: Uint8Array): Promise<Uint8Array> {
    if (this.#broken) return Promise.resolve(deflateSync(raw, { level: 1 }));
    const worker = this.#worker ??= this.#start();
    const id = this.#next++;
    // A compact copy, transferred: posting a view would clone its whole underlying buffer.
    const copy = raw.slice();
    return new Promise((resolve, reject) => {
      this.#pending.set(id, { raw: copy, resolve, reject });
      worker.postMessage({ id, raw: copy } satisfies DeflateRequest, [copy.buffer]);
    });
  }

  #start(): Worker {
    const w = new Worker(new URL("./deflate_worker.ts", import.meta.url).href, { type: "module" });
    w.onmessage = (e: MessageEvent<DeflateResponse>) => {
      const p = this.#pending.get(e.data.id);
      if (!p) return;
      this.#pending.delete(e.data.id);
      if (e.data.packed) p.resolve(e.data.packed);
      else p.reject(new Error(`deflate failed: ${e.data.error}`));
    };
    w.onerror = (e) => {
      e.preventDefault();
      console.error(`strata: the deflate worker failed (${e.message}); deflating in place`);
      this.#broken = true;
      this.close();
    };
    return w;
  }

  /** Stops the worker; blocks still pending are deflated here. */
  close(): void {
    this.#worker?.terminate();
    this.#worker = undefined;
    for (const [id, p] of this.#pending) {
      this.#pending.delete(id);
      p.resolve(deflateSync(p.raw, { level: 1 }));
    }
  }
}
/** Deno KV refuses values over 64 KiB; stay below with room for the key and framing. */
const PART = 60_000;

/** What a snapshot records about one session. */
export interface SessionManifest {
  version: 1;
  id: string;
  model: string;
  /** Prompt and output token ids, as the session holds them. */
  tokens: Uint32Array;
  /** Tokens whose KV the blocks hold (≤ tokens.length). */
  computed: number;
  /** Element type of the blocks' K and V (absent in snapshots from before f16 caches: f32). */
  kv?: KvDtype;
  /** One entry per block, in order: the chunk holding that block's K then V bytes. */
  blocks: { hash: string; parts: number; bytes: number }[];
  createdAt: number;
  updatedAt: number;
}

/**
 * A block a snapshot has already written: its manifest entry. A later snapshot of the same
 * tokens passes it instead of the bytes (chunks are never deleted, so it stays valid).
 */
export type ChunkRef = SessionManifest["blocks"][number];

/** A restored session: its manifest and the raw K‖V bytes of each block that verified. */
export interface RestoredSession {
  manifest: SessionManifest;
  blocks: Uint8Array<ArrayBuffer>[];
}

/** Snapshots of sessions in one Deno KV database (a local SQLite file or a remote KV). */
export class SessionStore {
  readonly #deflater = new Deflater();

  private constructor(readonly kv: Deno.Kv) {}

  /** Opens (or creates) the store at `path` (a file path, or a KV Connect URL). */
  static async open(path: string): Promise<SessionStore> {
    return new SessionStore(await Deno.openKv(path));
  }

  /**
   * Writes a session: its block chunks (each K‖V block byte array, or a {@linkcode ChunkRef} to
   * one an earlier snapshot wrote), then its manifest in one atomic commit. Returns the
   * manifest's block entries.
   */
  async save(
    m: Omit<SessionManifest, "blocks" | "version">,
    blocks: (Uint8Array | ChunkRef)[],
  ): Promise<ChunkRef[]> {
    const entries: ChunkRef[] = [];
    for (const raw of blocks) {
      if (!(raw instanceof Uint8Array)) {
        entries.push(raw);
        continue;
      }
      const hash = hasher.h64Raw(raw).toString(16).padStart(16, "0");
      const packed = await this.#deflater.deflate(raw);
      const parts = Math.max(1, Math.ceil(packed.byteLength / PART));
      const head = await this.kv.get(["chunk", hash, 0]);
      if (head.value === null) {
        for (let i = 0; i < parts; i++) {
          await this.kv.set(["chunk", hash, i], packed.subarray(i * PART, (i + 1) * PART));
        }
      }
      entries.push({ hash, parts, bytes: raw.byteLength });
    }
    const manifest: SessionManifest = { ...m, version: 1, blocks: entries };
    const r = await this.kv.atomic().set(["session", m.id], manifest).commit();
    if (!r.ok) throw new Error(`internal error: snapshot of session '${m.id}' did not commit`);
    return entries;
  }

  /** Manifests of every stored session, newest first. */
  async list(model?: string): Promise<SessionManifest[]> {
    const out: SessionManifest[] = [];
    for await (const e of this.kv.list<SessionManifest>({ prefix: ["session"] })) {
      if (!model || e.value.model === model) out.push(e.value);
    }
    return out.sort((a, b) => b.updatedAt - a.updatedAt);
  }

  /** Reads a session's blocks, stopping at the first missing or corrupt chunk. */
  async restore(manifest: SessionManifest): Promise<RestoredSession> {
    const blocks: Uint8Array<ArrayBuffer>[] = [];
    for (const b of manifest.blocks) {
      const raw = await this.#chunk(b.hash, b.parts, b.bytes);
      if (!raw) break;
      blocks.push(raw);
    }
    return { manifest, blocks };
  }

  async #chunk(
    hash: string,
    parts: number,
    bytes: number,
  ): Promise<Uint8Array<ArrayBuffer> | undefined> {
    const got: Deno.KvEntryMaybe<Uint8Array>[] = [];
    for (let i = 0; i < parts; i += 10) { // getMany takes at most 10 keys
      const keys = Array.from(
        { length: Math.min(10, parts - i) },
        (_, j) => ["chunk", hash, i + j],
      );
      got.push(...await this.kv.getMany<Uint8Array[]>(keys));
    }
    if (got.some((e) => !(e.value instanceof Uint8Array))) return undefined;
    const packed = new Uint8Array(got.reduce((n, e) => n + e.value!.byteLength, 0));
    let o = 0;
    for (const e of got) packed.set(e.value!, (o += e.value!.byteLength) - e.value!.byteLength);
    try {
      const raw = inflateSync(packed) as Uint8Array<ArrayBuffer>;
      const ok = raw.byteLength === bytes &&
        hasher.h64Raw(raw).toString(16).padStart(16, "0") === hash;
      return ok ? raw : undefined;
    } catch {
      return undefined; // corrupt deflate stream
    }
  }

  /** Forgets a session (its chunks stay; other sessions may share them). */
  async delete(id: string): Promise<void> {
    await this.kv.delete(["session", id]);
  }

  close(): void {
    this.#deflater.close();
    this.kv.close();
  }
}
