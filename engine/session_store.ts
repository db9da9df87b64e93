/**
 * Session snapshots in Deno KV: a session's token ids and the KV blocks that hold them survive a
 * restart. Blocks are content-addressed chunks (packed by engine/kv_codec.ts, named by the xxh64
 * of their bytes, split into values under Deno KV's 64 KiB limit), written first; then one atomic
 * commit replaces the session's small manifest. Restore verifies every chunk's hash and keeps the
 * longest valid prefix of blocks.
 */
import xxhash from "xxhash-wasm";
import { inflateSync } from "fflate";
import type { KvDtype } from "./dtype.ts";
import { packBlock, unpackBlock } from "./kv_codec.ts";
import type { PackRequest, PackResponse } from "./pack_worker.ts";

const hasher = await xxhash();

/** xxh64 of a block's bytes, as chunk keys name it. */
function chunkHash(raw: Uint8Array): string {
  return hasher.h64Raw(raw).toString(16).padStart(16, "0");
}

/** A block packed for the store: its hash and packed bytes. */
interface Packed {
  hash: string;
  packed: Uint8Array;
}

/**
 * Hashes and packs blocks in workers (engine/pack_worker.ts), so that snapshot writes neither
 * hold the event loop nor fall behind: a TinyLlama block (720 kB of f32 K and V) takes
 * milliseconds, and a burst of sessions brings hundreds. Up to {@linkcode PACKERS} workers,
 * requests dealt out in turn. If a worker fails, later blocks are packed on the calling thread,
 * and so are pending ones whose bytes were copied rather than handed over.
 */
class Packer {
  readonly #workers: Worker[] = [];
  #broken = false;
  #next = 0;
  readonly #pending = new Map<
    number,
    {
      raw: Uint8Array;
      width: number;
      resolve: (b: Packed) => void;
      reject: (e: Error) => void;
    }
  >();

  /**
   * Packs `raw`. With `give`, a block that is its whole buffer is handed to the worker (and
   * detached here) instead of copied.
   */
  pack(raw: Uint8Array, width: number, give = false): Promise<Packed> {
    if (this.#broken) return Promise.resolve(inPlace(raw, width));
    const id = this.#next++;
    const n = Math.max(1, Math.min(PACKERS, navigator.hardwareConcurrency - 1));
    const worker = this.#workers[id % n] ??= this.#start();
    // Transferred, never cloned: posting a view would clone its whole underlying buffer.
    const whole = raw.byteOffset === 0 && raw.byteLength === raw.buffer.byteLength;
    const sent = give && whole ? raw : raw.slice();
    return new Promise((resolve, reject) => {
      this.#pending.set(id, { raw: sent, width, resolve, reject });
      worker.postMessage({ id, raw: sent, width } satisfies PackRequest, [
        sent.buffer as ArrayBuffer,
      ]);
    });
  }

  #start(): Worker {
    const w = new Worker(new URL("./pack_worker.ts", import.meta.url).href, { type: "module" });
    w.onmessage = (e: MessageEvent<PackResponse>) => {
      const p = this.#pending.get(e.data.id);
      if (!p) return;
      this.#pending.delete(e.data.id);
      const { packed, hash, error } = e.data;
      if (packed && hash) p.resolve({ hash, packed });
      else p.reject(new Error(`packing a block failed: ${error}`));
    };
    w.onerror = (e) => {
      e.preventDefault();
      console.error(`strata: a snapshot worker failed (${e.message}); packing in place`);
      this.#broken = true;
      this.close();
    };
    return w;
  }

  /**
   * Stops the workers. Pending blocks are packed here, or rejected when their bytes went to a
   * worker (flush snapshots before closing the store).
   */
  close(): void {
    for (const w of this.#workers) w?.terminate();
    this.#workers.length = 0;
    for (const [id, p] of this.#pending) {
      this.#pending.delete(id);
      // A transferred buffer is detached: its view reads as empty.
      if (p.raw.buffer.byteLength) p.resolve(inPlace(p.raw, p.width));
      else p.reject(new Error("the snapshot worker stopped before packing a block"));
    }
  }
}

function inPlace(raw: Uint8Array, width: number): Packed {
  return { hash: chunkHash(raw), packed: packBlock(raw, width) };
}

/** Most packing workers (fewer on machines with fewer cores: one core stays for the server). */
const PACKERS = 4;
/** Deno KV refuses values over 64 KiB; stay below with room for the key and framing. */
const PART = 60_000;
/**
 * Parts per atomic commit: Deno KV takes at most 800 KiB of mutations per commit. One commit per
 * part cost ≈ 0.6 ms each on the CPU machine, 12 per TinyLlama block.
 */
const PARTS_PER_COMMIT = 12;

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
  /**
   * One entry per block, in order: the chunk holding that block's K then V bytes. `planes`: the
   * element width it was packed with (engine/kv_codec.ts; chunk values under
   * `["kvblock", hash, planes, i]`); absent in entries written before: the whole block deflated,
   * under `["chunk", hash, i]`.
   */
  blocks: { hash: string; parts: number; bytes: number; planes?: number }[];
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
  readonly #packer = new Packer();

  private constructor(readonly kv: Deno.Kv) {}

  /** Opens (or creates) the store at `path` (a file path, or a KV Connect URL). */
  static async open(path: string): Promise<SessionStore> {
    return new SessionStore(await Deno.openKv(path));
  }

  /**
   * Writes a session: its block chunks (each K‖V block byte array, or a {@linkcode ChunkRef} to
   * one an earlier snapshot wrote), then its manifest in one atomic commit. Returns the
   * manifest's block entries.
   *
   * @param opts.give the blocks that are their whole buffers may be handed to the packing
   *   workers instead of copied: they read as empty afterwards
   */
  async save(
    m: Omit<SessionManifest, "blocks" | "version">,
    blocks: (Uint8Array | ChunkRef)[],
    opts: { give?: boolean } = {},
  ): Promise<ChunkRef[]> {
    const width = m.kv === "f16" ? 2 : 4;
    // Packed all at once (the workers share them out), written in order. Sizes first: a block
    // handed to a worker reads as empty here.
    const sizes = blocks.map((raw) => raw instanceof Uint8Array ? raw.byteLength : 0);
    const packed = blocks.map((raw) =>
      raw instanceof Uint8Array ? this.#packer.pack(raw, width, opts.give) : undefined
    );
    packed.forEach((p) => p?.catch(() => {})); // awaited below, in order
    const entries: ChunkRef[] = [];
    for (const [i, raw] of blocks.entries()) {
      if (!(raw instanceof Uint8Array)) {
        entries.push(raw);
        continue;
      }
      const bytes = sizes[i];
      const { hash, packed: data } = await packed[i]!;
      const parts = Math.max(1, Math.ceil(data.byteLength / PART));
      // Parts are committed in order, so the last one present means the chunk is whole (a crash
      // between two commits of a big chunk leaves it to be written again).
      const tail = await this.kv.get(["kvblock", hash, width, parts - 1]);
      for (let p = 0; tail.value === null && p < parts; p += PARTS_PER_COMMIT) {
        const op = this.kv.atomic();
        for (let q = p; q < Math.min(parts, p + PARTS_PER_COMMIT); q++) {
          op.set(["kvblock", hash, width, q], data.subarray(q * PART, (q + 1) * PART));
        }
        if (!(await op.commit()).ok) {
          throw new Error(`internal error: chunk ${hash} did not commit`);
        }
      }
      entries.push({ hash, parts, bytes, planes: width });
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
      const raw = await this.#chunk(b);
      if (!raw) break;
      blocks.push(raw);
    }
    return { manifest, blocks };
  }

  async #chunk(entry: ChunkRef): Promise<Uint8Array<ArrayBuffer> | undefined> {
    const { hash, parts, bytes, planes } = entry;
    const got: Deno.KvEntryMaybe<Uint8Array>[] = [];
    for (let i = 0; i < parts; i += 10) { // getMany takes at most 10 keys
      const keys = Array.from(
        { length: Math.min(10, parts - i) },
        (_, j) => planes ? ["kvblock", hash, planes, i + j] : ["chunk", hash, i + j],
      );
      got.push(...await this.kv.getMany<Uint8Array[]>(keys));
    }
    if (got.some((e) => !(e.value instanceof Uint8Array))) return undefined;
    const packed = new Uint8Array(got.reduce((n, e) => n + e.value!.byteLength, 0));
    let o = 0;
    for (const e of got) packed.set(e.value!, (o += e.value!.byteLength) - e.value!.byteLength);
    try {
      const raw = planes
        ? unpackBlock(packed, { width: planes, bytes })
        : inflateSync(packed) as Uint8Array<ArrayBuffer>;
      const ok = raw.byteLength === bytes && chunkHash(raw) === hash;
      return ok ? raw : undefined;
    } catch {
      return undefined; // a corrupt chunk
    }
  }

  /** Forgets a session (its chunks stay; other sessions may share them). */
  async delete(id: string): Promise<void> {
    await this.kv.delete(["session", id]);
  }

  close(): void {
    this.#packer.close();
    this.kv.close();
  }
}
