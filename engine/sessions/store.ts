/**
 * Session snapshots in Deno KV: a session's token ids and the KV blocks that hold them survive a
 * restart. Blocks are content-addressed chunks (packed by engine/sessions/block_pack.ts, named by the xxh64
 * of their bytes, split into values under Deno KV's 64 KiB limit), written first; then one atomic
 * commit replaces the session's small manifest. Restore verifies every chunk's hash and keeps the
 * longest valid prefix of blocks.
 *
 * Tiers (DESIGN.md): a chunk lives in Deno KV (warm) or in a file of the cold folder (cold). Each
 * chunk has a small record, `["kvmeta", hash, width]`: where it is, its packed size and when a
 * snapshot last wrote or reused it. {@linkcode SessionStore.maintain} deletes the chunks no
 * manifest refers to (once they are older than a grace period: a snapshot writes its chunks
 * before its manifest), and while the warm chunks take more than their budget it moves those of
 * the least recently updated sessions to files: the file is written (and synced) under a temporary
 * name and renamed, the folder synced, then one atomic commit, checked against the record, flips
 * the record and deletes the chunk's values. Every step leaves a whole copy somewhere. A snapshot
 * that finds a chunk already stored rewrites its record in a commit checked against what it
 * read, so a move or a deletion that read the old record fails its check (and one that committed
 * first makes the snapshot look again). Files that hold no cold chunk are removed after the grace
 * period. Restore reads a chunk from Deno KV, else from its file.
 */
import type { TurnRecord } from "./table.ts";
import { inflateSync } from "fflate";
import type { KvDtype } from "../../gpu/dtype.ts";
import { unpackBlock } from "./block_pack.ts";
import { chunkHash, Packer } from "./packer.ts";
import { ColdFolder } from "./cold_folder.ts";
import { type BodyRef, storedManifest, sweepBodies, wholeManifest } from "./manifest_body.ts";

/** Deno KV refuses values over 64 KiB; stay below with room for the key and framing. */
export const PART = 60_000;
/**
 * Parts per atomic commit: Deno KV takes at most 800 KiB of mutations per commit. One commit per
 * part cost ≈ 0.6 ms each on the CPU machine, 12 per TinyLlama block.
 */
export const PARTS_PER_COMMIT = 12;

/** Packed bytes of chunks kept in Deno KV before older sessions' chunks go to files: 512 MiB. */
export const WARM_BYTES = 512 * 2 ** 20;
/** How long a chunk no manifest refers to is kept: 10 minutes. */
export const GRACE_MS = 10 * 60_000;

/** Where a chunk is: Deno KV (warm) or a file (cold). */
export type ChunkTier = "kv" | "fs";

/** The record of one chunk, `["kvmeta", hash, width]`. */
interface ChunkMeta {
  tier: ChunkTier;
  /** Packed bytes (what Deno KV or the file holds). */
  size: number;
  /** Values it takes in Deno KV. */
  parts: number;
  /** When a snapshot last wrote or reused it (ms since the epoch). */
  at: number;
}

/** Options of {@linkcode SessionStore.open}. */
export interface SessionStoreOptions {
  /**
   * Folder of the cold tier. Default: the store's path + `.cold` for a local file; none for a
   * remote Deno KV (URL), whose chunks then all stay in it.
   */
  coldDir?: string;
  /** Packed bytes of chunks Deno KV keeps before moving the oldest to files (default 512 MiB). */
  warmBytes?: number;
  /** How long a chunk no manifest refers to is kept before it is deleted (default 10 min). */
  graceMs?: number;
}

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
   * The prefix-cache scope of the session's blocks (engine/kv/blocks.ts `scopeRoot`) in hex;
   * absent: the shared scope (0).
   */
  scope?: string;
  /**
   * One entry per block, in order: the chunk holding that block's K then V bytes. `planes`: the
   * element width it was packed with (engine/sessions/block_pack.ts; chunk values under
   * `["kvblock", hash, planes, i]`); absent in entries written before: the whole block deflated,
   * under `["chunk", hash, i]`.
   */
  blocks: { hash: string; parts: number; bytes: number; planes?: number }[];
  /** The session's most recent turns as they ran (absent in snapshots from before replays). */
  turns?: TurnRecord[];
  /** Where `tokens`, `blocks` and `turns` went when too long for one value (manifest_body.ts). */
  body?: BodyRef;
  createdAt: number;
  updatedAt: number;
}

/**
 * A block a snapshot has already written: its manifest entry. A later snapshot of the same
 * tokens passes it instead of the bytes (it stays valid: the session's committed manifest refers
 * to it until the new one does).
 */
export type ChunkRef = SessionManifest["blocks"][number];

/** A restored session: its manifest and the raw K‖V bytes of each block that verified. */
export interface RestoredSession {
  manifest: SessionManifest;
  blocks: Uint8Array<ArrayBuffer>[];
}

/** Snapshots of sessions in one Deno KV database (a local SQLite file or a remote KV). */
export class SessionStore {
  /** Packs chunks in workers (engine/sessions/packer.ts); the profile's probe uses it too. */
  readonly packer = new Packer();
  /** The cold tier's folder (none for a remote Deno KV without --kv-cold). */
  readonly #cold?: ColdFolder;
  /** Every chunk's tier and packed size, by {@linkcode chunkKey} (as of this instance's view). */
  readonly #chunks = new Map<string, { tier: ChunkTier; size: number }>();
  #version = 0;
  /** The maintenance running, if any, and whether another pass was asked for meanwhile. */
  #maintaining?: Promise<void>;
  #again = false;
  #closed = false;
  readonly coldDir?: string;
  readonly warmBytes: number;
  readonly graceMs: number;
  /** Called after a maintenance pass that moved or deleted chunks (for the tiers' metrics). */
  onTiersChange?: () => void;

  private constructor(readonly kv: Deno.Kv, opts: SessionStoreOptions) {
    this.coldDir = opts.coldDir;
    this.#cold = opts.coldDir === undefined ? undefined : new ColdFolder(opts.coldDir);
    this.warmBytes = opts.warmBytes ?? WARM_BYTES;
    this.graceMs = opts.graceMs ?? GRACE_MS;
  }

  /**
   * Opens (or creates) the store at `path` (a file path, or a KV Connect URL), and reads its
   * chunk records (creating those of chunks written before records existed).
   */
  static async open(path: string, opts: SessionStoreOptions = {}): Promise<SessionStore> {
    const remote = /^https?:\/\//.test(path);
    const coldDir = opts.coldDir ?? (remote ? undefined : `${path}.cold`);
    const store = new SessionStore(await Deno.openKv(path), { ...opts, coldDir });
    try {
      await Promise.all([store.#load(), store.packer.warm()]);
    } catch (e) {
      store.close();
      throw e;
    }
    return store;
  }

  /** Packed bytes of the chunks in Deno KV (as of this instance's view). */
  get warmUsed(): number {
    let n = 0;
    for (const c of this.#chunks.values()) if (c.tier === "kv") n += c.size;
    return n;
  }

  #setChunk(key: string, chunk: { tier: ChunkTier; size: number }): void {
    this.#version++;
    this.#chunks.set(key, chunk);
  }

  /** Changes whenever a chunk's tier as {@linkcode tierOf} reports it may have changed. */
  get version(): number {
    return this.#version;
  }

  /** The tier of the chunk behind a manifest entry; undefined if unknown (or gone). */
  tierOf(entry: ChunkRef): ChunkTier | undefined {
    return entry.planes ? this.#chunks.get(chunkKey(entry.hash, entry.planes))?.tier : "kv";
  }

  /**
   * Writes a session: its block chunks (each K‖V block byte array, or a {@linkcode ChunkRef} to
   * one an earlier snapshot wrote), then its manifest in one atomic commit. Returns the
   * manifest's block entries. Starts a {@linkcode maintain} pass when the warm chunks are over
   * their budget.
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
      raw instanceof Uint8Array ? this.packer.pack(raw, width, opts.give) : undefined
    );
    packed.forEach((p) => p?.catch(() => {})); // awaited below, in order
    const entries: ChunkRef[] = [];
    for (const [i, raw] of blocks.entries()) {
      if (!(raw instanceof Uint8Array)) {
        // Still referred to by this session's committed manifest until the new one replaces it.
        entries.push(raw);
        continue;
      }
      const { hash, packed: data } = await packed[i]!;
      const parts = Math.max(1, Math.ceil(data.byteLength / PART));
      await this.#putChunk(hash, width, data, parts);
      entries.push({ hash, parts, bytes: sizes[i], planes: width });
    }
    const manifest: SessionManifest = { ...m, version: 1, blocks: entries };
    const stored = await storedManifest(this.kv, manifest); // a long session's in parts
    const r = await this.kv.atomic().set(["session", m.id], stored).commit();
    if (!r.ok) throw new Error(`internal error: snapshot of session '${m.id}' did not commit`);
    if (this.coldDir !== undefined && this.warmUsed > this.warmBytes) void this.maintain();
    return entries;
  }

  /**
   * Stores one chunk unless a whole copy is already there (shared by sessions, or this one's
   * earlier snapshot). A copy found is vouched for by rewriting the chunk's record in a commit
   * checked against the record and the last value as they were read: a move or deletion that
   * read the old record then fails its own check, and if one committed first, this commit fails
   * and the chunk is looked for again.
   */
  async #putChunk(hash: string, width: number, data: Uint8Array, parts: number): Promise<void> {
    const mk = ["kvmeta", hash, width];
    // Parts are committed in order, so the last one present means the chunk is whole (a crash
    // between two commits of a big chunk leaves it to be written again).
    const tk = ["kvblock", hash, width, parts - 1];
    const meta: ChunkMeta = { tier: "kv", size: data.byteLength, parts, at: Date.now() };
    for (let attempt = 0; attempt < 10; attempt++) {
      const [old, tail] = await this.kv.getMany<[ChunkMeta, Uint8Array]>([mk, tk]);
      meta.tier = old.value?.tier ?? "kv";
      const whole = meta.tier === "fs"
        ? (await this.#cold?.size(hash, width)) === data.byteLength
        : tail.value !== null;
      if (!whole) break;
      if ((await this.kv.atomic().check(old, tail).set(mk, meta).commit()).ok) {
        this.#setChunk(chunkKey(hash, width), { tier: meta.tier, size: meta.size });
        return;
      }
    }
    meta.tier = "kv";
    for (let p = 0; p < parts; p += PARTS_PER_COMMIT) {
      const op = this.kv.atomic();
      for (let q = p; q < Math.min(parts, p + PARTS_PER_COMMIT); q++) {
        op.set(["kvblock", hash, width, q], data.subarray(q * PART, (q + 1) * PART));
      }
      if (p + PARTS_PER_COMMIT >= parts) op.set(mk, meta); // with the last part
      if (!(await op.commit()).ok) throw new Error(`internal error: chunk ${hash} did not commit`);
    }
    this.#setChunk(chunkKey(hash, width), { tier: meta.tier, size: meta.size });
  }

  /** Manifests of every stored session, newest first. */
  async list(model?: string): Promise<SessionManifest[]> {
    const out: SessionManifest[] = [];
    for await (const e of this.kv.list<SessionManifest>({ prefix: ["session"] })) {
      if (model && e.value.model !== model) continue;
      const m = await wholeManifest(this.kv, e.value);
      if (m) out.push(m);
      else console.error(`strata: session '${e.value.id}' has a missing or corrupt manifest body`);
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

  /**
   * One block of a snapshot: its K‖V bytes, verified against the chunk's hash; undefined when the
   * chunk is missing or corrupt.
   */
  readBlock(entry: ChunkRef): Promise<Uint8Array<ArrayBuffer> | undefined> {
    return this.#chunk(entry);
  }

  async #chunk(entry: ChunkRef): Promise<Uint8Array<ArrayBuffer> | undefined> {
    const { hash, bytes, planes } = entry;
    const packed = await this.#fromKv(entry) ??
      (planes ? await this.#cold?.read(hash, planes) : undefined);
    if (!packed) return undefined;
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

  /** A chunk's packed bytes from Deno KV, if all its values are there. */
  async #fromKv(entry: ChunkRef): Promise<Uint8Array<ArrayBuffer> | undefined> {
    const { hash, parts, planes } = entry;
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
    return packed;
  }

  /** Forgets a session, and starts a {@linkcode maintain} pass (its chunks may be shared). */
  async delete(id: string): Promise<void> {
    await this.kv.delete(["session", id]);
    void this.maintain();
  }

  /**
   * Deletes the chunks (in both tiers) that no manifest refers to and whose record is older than
   * the grace period, then moves the warm chunks of the least recently updated sessions to the
   * cold folder until the warm ones fit their budget. One pass at a time: a call during a pass
   * runs one more after it. Resolves when the passes are done.
   */
  maintain(): Promise<void> {
    if (this.#closed) return Promise.resolve();
    if (this.#maintaining) {
      this.#again = true;
      return this.#maintaining;
    }
    const run = async () => {
      do {
        this.#again = false;
        try {
          if (await this.#pass()) this.onTiersChange?.();
        } catch (e) {
          // Closing the store stops a pass where it is, as a crash would (see the module doc).
          if (!this.#closed) console.error(`strata: session store maintenance failed: ${e}`);
        }
      } while (this.#again && !this.#closed);
      this.#maintaining = undefined;
    };
    return this.#maintaining = run();
  }

  /** One maintenance pass; true if it deleted or moved any chunk. */
  async #pass(): Promise<boolean> {
    // Newest update of a session referring to each chunk; the manifest bodies in use.
    const used = new Map<string, number>(), bodies = new Set<string>();
    for (const m of await this.list()) {
      if (m.body) bodies.add(m.body.hash);
      for (const b of m.blocks) {
        if (!b.planes) continue;
        const k = chunkKey(b.hash, b.planes);
        used.set(k, Math.max(used.get(k) ?? 0, m.updatedAt));
      }
    }
    const now = Date.now();
    const warm: { entry: Deno.KvEntry<ChunkMeta>; last: number }[] = [];
    let changed = false;
    // The chunk map is refreshed in place (not cleared first): tierOf must never see a chunk
    // vanish while the listing runs (stored-block counts read 0 then).
    const before = new Set(this.#chunks.keys()), seen = new Set<string>();
    for await (const e of this.kv.list<ChunkMeta>({ prefix: ["kvmeta"] })) {
      const [, hash, width] = e.key as [string, string, number];
      const k = chunkKey(hash, width);
      seen.add(k);
      const last = used.get(k);
      if (last === undefined && now - e.value.at >= this.graceMs) {
        const op = this.kv.atomic().check(e).delete(e.key);
        for (let p = 0; p < e.value.parts; p++) op.delete(["kvblock", hash, width, p]);
        if ((await op.commit()).ok) {
          await this.#cold?.remove(hash, width);
          this.#chunks.delete(k);
          this.#version++;
          changed = true;
          continue;
        }
      }
      this.#setChunk(k, { tier: e.value.tier, size: e.value.size });
      if (e.value.tier === "kv" && last !== undefined) warm.push({ entry: e, last });
    }
    for (const k of before) if (!seen.has(k)) this.#chunks.delete(k);
    this.#version++;
    await sweepBodies(this.kv, bodies, { now, graceMs: this.graceMs });
    await this.#sweepFolder(now);
    if (this.coldDir === undefined) return changed;
    let over = this.warmUsed - this.warmBytes;
    const queue = warm.sort((a, b) => a.last - b.last).map((w) => w.entry);
    while (over > 0 && queue.length > 0 && !this.#closed) {
      // The oldest chunks that cover the excess, at most MOVE_BATCH at a time.
      const batch: Deno.KvEntry<ChunkMeta>[] = [];
      for (let bytes = 0; batch.length < MOVE_BATCH && queue.length > 0 && bytes < over;) {
        const e = queue.shift()!;
        batch.push(e);
        bytes += e.value.size;
      }
      const moved = await this.#moveToFiles(batch);
      over -= moved;
      changed ||= moved > 0;
    }
    return changed;
  }

  /**
   * Moves chunks from Deno KV to their files: each written and synced under a temporary name
   * (the files of a batch at once, so that their syncs overlap), renamed, the folder synced, then
   * one commit per chunk checked against its record. Returns the bytes moved; a chunk that
   * changed meanwhile (or is gone) stays in Deno KV, its file a spare copy.
   */
  async #moveToFiles(batch: Deno.KvEntry<ChunkMeta>[]): Promise<number> {
    const staged = await this.#cold!.writeDurable(
      await Promise.all(batch.map(async (e) => {
        const [, hash, width] = e.key as [string, string, number];
        const data = await this.#fromKv({ hash, parts: e.value.parts, bytes: 0, planes: width });
        if (!data || data.byteLength !== e.value.size) return undefined;
        return { e, hash, width, data };
      })),
    );
    let moved = 0;
    for (const s of staged) {
      if (!s) continue;
      const { e, hash, width } = s;
      const op = this.kv.atomic().check(e).set(e.key, { ...e.value, tier: "fs" });
      for (let p = 0; p < e.value.parts; p++) op.delete(["kvblock", hash, width, p]);
      if (!(await op.commit()).ok) continue;
      this.#setChunk(chunkKey(hash, width), { tier: "fs", size: e.value.size });
      moved += e.value.size;
    }
    return moved;
  }

  /**
   * Removes from the cold folder, once older than the grace period, every file that does not
   * hold a cold chunk: temporary files of a move that stopped, files of chunks without a record
   * (a deletion stopped between its commit and the file's removal) and spare copies of chunks
   * still in Deno KV (a move stopped, or its commit failed, after the rename).
   */
  async #sweepFolder(now: number): Promise<void> {
    await this.#cold?.sweep({
      keep: (hash, width) => this.#chunks.get(chunkKey(hash, width))?.tier === "fs",
      olderThan: now - this.graceMs,
    });
  }

  /**
   * Reads the chunk records. A store written before records existed gets one per chunk, from a
   * single listing of its values (its unreferenced chunks are then deleted like any others).
   */
  async #load(): Promise<void> {
    if ((await this.kv.get(RECORDS_KEY)).value === null) {
      const found = new Map<string, ChunkMeta & { hash: string; width: number }>();
      for await (const e of this.kv.list<Uint8Array>({ prefix: ["kvblock"] })) {
        const [, hash, width, part] = e.key as [string, string, number, number];
        const k = chunkKey(hash, width);
        const c = found.get(k) ?? { hash, width, tier: "kv", size: 0, parts: 0, at: Date.now() };
        c.size += e.value.byteLength;
        c.parts = Math.max(c.parts, part + 1);
        found.set(k, c);
      }
      for (const { hash, width, ...meta } of found.values()) {
        await this.kv.atomic().check({ key: ["kvmeta", hash, width], versionstamp: null })
          .set(["kvmeta", hash, width], meta).commit();
      }
      await this.kv.set(RECORDS_KEY, true);
    }
    for await (const e of this.kv.list<ChunkMeta>({ prefix: ["kvmeta"] })) {
      const [, hash, width] = e.key as [string, string, number];
      this.#setChunk(chunkKey(hash, width), { tier: e.value.tier, size: e.value.size });
    }
  }

  /** Closes the store; a maintenance pass in progress stops where it is. */
  close(): void {
    this.#closed = true;
    this.packer.close();
    this.kv.close();
  }
}

/** Chunks moved to files per batch (their files are synced together). */
const MOVE_BATCH = 16;

/** Set once every chunk has a record (stores written before records existed get them at open). */
const RECORDS_KEY = ["strata", "chunk-records"];

/** In-memory name of a chunk: its hash and element width. */
function chunkKey(hash: string, width: number): string {
  return `${hash}/${width}`;
}
