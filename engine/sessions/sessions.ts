/**
 * The sessions an engine keeps between requests: each holds its token ids and the KV blocks that
 * cover them. Idle sessions give their blocks back under pressure (least recently used first);
 * with a store, every turn is snapshotted to Deno KV and sessions come back after a restart.
 */
import type { SessionInfo } from "../../api/types.ts";
import type { Decoder } from "../runner/forward.ts";
import { blockBytes } from "../runner/forward.ts";
import type { KvDtype } from "../../gpu/dtype.ts";
import { BLOCK, type BlockPool, SequenceBlocks } from "../kv/blocks.ts";
import { SessionBusyError } from "../../api/errors.ts";
import type { ChunkRef, SessionStore } from "./store.ts";

/** Bytes of snapshot blocks copied out of a mapping per task of the event loop. */
const COPY_SLICE = 4 << 20;

/**
 * Copies `n` blocks of `bytes` each out of the mapped `staging` buffer, each into a buffer of its
 * own (handed to the packing workers as it is), then unmaps and destroys it. Copying takes ≈ 1 ms
 * per MB (fresh pages), so {@linkcode COPY_SLICE} per task of the event loop with a timer between,
 * and the engine runs one such copy at a time: 12 TinyLlama sessions' copies (13 MB each) in one
 * go held the event loop 220–270 ms on the H200's host.
 */
async function copyOut(staging: GPUBuffer, n: number, bytes: number): Promise<Uint8Array[]> {
  const blocks: Uint8Array[] = [];
  try {
    for (let i = 0, since = COPY_SLICE; i < n; i++) {
      if (since >= COPY_SLICE) {
        await new Promise((r) => setTimeout(r, 0));
        since = 0;
      }
      blocks.push(new Uint8Array(staging.getMappedRange(i * bytes, bytes).slice(0)));
      since += bytes;
    }
  } finally {
    staging.destroy(); // unmaps it too
  }
  return blocks;
}

/** One session: what the API reports, its blocks, and whether a request is using it. */
export interface SessionEntry {
  info: SessionInfo;
  blocks: SequenceBlocks;
  busy: boolean;
}

/** What the store holds of a session: its last committed snapshot. */
interface Committed {
  tokens: Uint32Array;
  computed: number;
  kv: KvDtype;
  blocks: ChunkRef[];
}

/** Blocks snapshots have copied from the GPU and written, and those they took from the store. */
export interface SnapshotStats {
  blocksCopied: number;
  blocksReused: number;
}

/** The session table of one engine. */
export class Sessions {
  readonly #map = new Map<string, SessionEntry>();
  readonly #snapshots = new Map<string, Promise<void>>();
  /** Blocks of each session's last snapshot in the store (for the tiers' metrics). */
  readonly #stored = new Map<string, ChunkRef[]>();
  /** {@linkcode storedBlocks}' last answer, and the store version and `#stored` edit it is of. */
  #storedCount = { kv: 0, fs: 0, version: -1, edit: -1 };
  #storedEdit = 0;
  /** Each session's last committed snapshot: the blocks a later one may reuse. */
  readonly #committed = new Map<string, Committed>();
  /** Snapshot reads to request at the engine's next readback (see {@linkcode startReads}). */
  readonly #pendingReads: (() => void)[] = [];
  /** The last snapshot copy out of a mapping (they run one at a time). */
  #copying: Promise<unknown> = Promise.resolve();
  readonly #stats: SnapshotStats = { blocksCopied: 0, blocksReused: 0 };
  /**
   * Called with a session's id whenever what {@linkcode get} reports of it changes (created,
   * turn ended, persisted, evicted, deleted): the worker mirrors the table to the server's thread.
   */
  onChange?: (id: string) => void;

  constructor(
    readonly decoder: Decoder,
    readonly pool: BlockPool,
    readonly modelId: string,
    readonly store?: SessionStore,
  ) {}

  get(id: string): SessionEntry | undefined {
    return this.#map.get(id);
  }

  /** Starts a new session around `blocks`, marked busy. */
  create(id: string, blocks: SequenceBlocks): SessionEntry {
    const now = Date.now();
    const entry = { info: { id, tokens: 0, createdAt: now, updatedAt: now }, blocks, busy: true };
    this.#map.set(id, entry);
    this.onChange?.(id);
    return entry;
  }

  /** Every session's info. */
  list(): SessionInfo[] {
    return [...this.#map.values()].map((s) => s.info);
  }

  /** Frees a session's blocks and forgets it, in the store too. */
  async delete(id: string): Promise<boolean> {
    const s = this.#map.get(id);
    if (!s) return false;
    if (s.busy) throw new SessionBusyError(id);
    s.blocks.free();
    this.#map.delete(id);
    this.onChange?.(id);
    await this.#snapshots.get(id);
    await this.store?.delete(id);
    this.#setStored(id, undefined);
    this.#committed.delete(id);
    return true;
  }

  /** After a failed turn: the session keeps no KV (it may be garbage) and is free again. */
  abandon(id: string | undefined): void {
    const s = id === undefined ? undefined : this.#map.get(id);
    if (!s) return;
    s.blocks.free();
    s.busy = false;
    s.info.tokens = 0;
    this.onChange?.(id!);
  }

  #setStored(id: string, blocks: ChunkRef[] | undefined): void {
    this.#storedEdit++;
    if (blocks) this.#stored.set(id, blocks);
    else this.#stored.delete(id);
  }

  /**
   * Blocks held by snapshots in the store, by the tier their chunks are in: Deno KV (`kv`) or
   * the cold folder (`fs`). A chunk shared by sessions counts once per session.
   */
  storedBlocks(): { kv: number; fs: number } {
    const version = this.store?.version ?? 0, c = this.#storedCount;
    if (c.version === version && c.edit === this.#storedEdit) return { kv: c.kv, fs: c.fs };
    const n = { kv: 0, fs: 0 };
    for (const blocks of this.#stored.values()) {
      for (const b of blocks) {
        const tier = this.store?.tierOf(b);
        if (tier) n[tier]++;
      }
    }
    this.#storedCount = { ...n, version, edit: this.#storedEdit };
    return n;
  }

  /** Blocks snapshots have copied and reused so far. */
  snapshotStats(): SnapshotStats {
    return { ...this.#stats };
  }

  /**
   * Requests the mappings of the snapshots copied since the last call. Deno's `mapAsync` blocks
   * until the GPU has finished everything submitted, so requesting one inside `snapshot` (at the
   * end of a turn, with the next decode submission on the GPU) stalled the host for that whole
   * submission and then left the GPU idle while it caught up. The engine calls this right after
   * a readback wait, when the copies are done and the requests return at once, and whenever its
   * loop is not running.
   */
  startReads(): void {
    for (const start of this.#pendingReads.splice(0)) start();
  }

  /** Resolves when every snapshot started so far is written. */
  async flush(): Promise<void> {
    await Promise.all(this.#snapshots.values());
  }

  /**
   * Frees the KV of idle sessions, least recently used first, until `need` blocks are free. An
   * evicted session stays known; its next turn prefills again (or finds its blocks by hash).
   */
  evict(need: number): void {
    const idle = [...this.#map.values()]
      .filter((s) => !s.busy && s.blocks.table.length > 0)
      .sort((a, b) => a.info.updatedAt - b.info.updatedAt);
    for (const s of idle) {
      if (this.pool.freeCount >= need) return;
      s.blocks.free();
      s.info.tokens = 0;
      this.onChange?.(s.info.id);
    }
  }

  /**
   * Writes the session to the store: the blocks its last committed snapshot already holds for the
   * same tokens are reused, the others are copied from the GPU (queued now, so later turns cannot
   * change what is read; mapped at the engine's next {@linkcode startReads}) and written as new
   * chunks. A turn thus copies and compresses the blocks it added, not the whole session.
   * Snapshots of one session are written in order.
   */
  snapshot(session: SessionEntry): void {
    this.onChange?.(session.info.id); // the turn that ended changed its tokens
    if (!this.store) return;
    const store = this.store, { info, blocks } = session;
    const d = this.decoder, kv = d.opts.kvDtype, bb = blockBytes(d.cfg, kv), dev = d.gpu.device;
    const n = Math.ceil(blocks.computed / BLOCK);
    const tokens = Uint32Array.from(blocks.tokens), computed = blocks.computed;
    const reused = reusable(this.#committed.get(info.id), tokens, computed, kv);
    const copied = blocks.table.slice(reused.length, n);
    this.#stats.blocksReused += reused.length;
    this.#stats.blocksCopied += copied.length;
    let read: Promise<Uint8Array[]> = Promise.resolve([]);
    if (copied.length) {
      const staging = dev.createBuffer({
        size: 2 * copied.length * bb,
        usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
      });
      const enc = dev.createCommandEncoder();
      copied.forEach((id, i) => {
        enc.copyBufferToBuffer(d.kPool, id * bb, staging, 2 * i * bb, bb);
        enc.copyBufferToBuffer(d.vPool, id * bb, staging, (2 * i + 1) * bb, bb);
      });
      dev.queue.submit([enc.finish()]);
      const mapped = new Promise<void>((resolve, reject) => {
        this.#pendingReads.push(() => staging.mapAsync(GPUMapMode.READ).then(resolve, reject));
      });
      // Copied out one snapshot at a time (see copyOut).
      read = mapped.then(() => {
        const out = this.#copying.then(() => copyOut(staging, copied.length, 2 * bb));
        this.#copying = out.catch(() => {});
        return out;
      });
    }
    const previous = this.#snapshots.get(info.id) ?? Promise.resolve();
    const { createdAt, updatedAt } = info;
    const write = Promise.all([read, previous])
      .then(([data]) =>
        store.save(
          { id: info.id, model: this.modelId, tokens, computed, kv, createdAt, updatedAt },
          [...reused, ...data],
          { give: true },
        )
      )
      .then((entries) => {
        info.persistedAt = Date.now();
        this.onChange?.(info.id);
        this.#committed.set(info.id, { tokens, computed, kv, blocks: entries });
        if (this.#map.has(info.id)) this.#setStored(info.id, entries);
      })
      .catch((e) => console.error(`strata: snapshot of session '${info.id}' failed: ${e}`));
    this.#snapshots.set(info.id, write);
  }

  /**
   * Brings stored sessions back onto the GPU, newest first, keeping half the pool free. Blocks
   * saved from a cache of the other dtype are converted (f32 ↔ f16).
   */
  async restore(): Promise<void> {
    if (!this.store) return;
    // Then a maintenance pass: a crash may have left chunks to collect, or the warm budget may
    // have shrunk since the last run.
    try {
      await this.#restore(this.store);
    } finally {
      void this.store.maintain();
    }
  }

  async #restore(store: SessionStore): Promise<void> {
    const d = this.decoder, kv = d.opts.kvDtype, bb = blockBytes(d.cfg, kv);
    const q = d.gpu.device.queue;
    for (const m of await store.list(this.modelId)) {
      const info = { id: m.id, tokens: 0, createdAt: m.createdAt, updatedAt: m.updatedAt };
      const blocks = new SequenceBlocks(this.pool);
      this.#map.set(m.id, { info, blocks, busy: false });
      this.#setStored(m.id, m.blocks);
      // The next snapshot may reuse these chunks; restore verifies them before it relies on any.
      const kvOf = m.kv ?? "f32";
      this.#committed.set(m.id, { tokens: m.tokens, computed: m.computed, kv: kvOf, blocks: [] });
      if (this.pool.freeCount - m.blocks.length < this.pool.blocks.length / 2) continue;
      const { blocks: saved } = await store.restore(m);
      const data = saved.map((raw) => convertBlock(raw, m.kv ?? "f32", kv));
      if (data.some((raw) => raw.byteLength !== 2 * bb)) {
        console.error(`strata: session '${m.id}' has blocks of another shape; not restored`);
        continue;
      }
      blocks.reserve(data.length * BLOCK);
      data.forEach((raw, i) => {
        q.writeBuffer(d.kPool, blocks.table[i] * bb, raw, 0, bb);
        q.writeBuffer(d.vPool, blocks.table[i] * bb, raw, bb, bb);
      });
      blocks.tokens.push(...m.tokens);
      blocks.markComputed(Math.min(m.computed, data.length * BLOCK));
      blocks.truncate(m.tokens.length);
      Object.assign(info, { tokens: blocks.computed, persistedAt: m.updatedAt });
      this.#committed.set(m.id, {
        tokens: m.tokens,
        computed: Math.min(m.computed, data.length * BLOCK),
        kv: kvOf,
        blocks: m.blocks.slice(0, data.length),
      });
    }
  }
}

/**
 * The leading blocks of a committed snapshot that a new snapshot of `tokens` (KV computed for
 * `computed` of them, in a cache of `kv`) can reuse: whole blocks of the same tokens, written
 * in the same dtype. A block's K and V depend only on the tokens up to its end.
 */
function reusable(
  c: Committed | undefined,
  tokens: Uint32Array,
  computed: number,
  kv: KvDtype,
): ChunkRef[] {
  if (!c || c.kv !== kv) return [];
  const whole = Math.min(Math.floor(c.computed / BLOCK), Math.floor(computed / BLOCK));
  let same = 0;
  while (same < whole * BLOCK && c.tokens[same] === tokens[same]) same++;
  return c.blocks.slice(0, Math.floor(same / BLOCK));
}

/** A block's K‖V bytes as a cache of `to` holds them, from a cache of `from` (little-endian). */
function convertBlock(raw: Uint8Array<ArrayBuffer>, from: KvDtype, to: KvDtype) {
  if (from === to) return raw;
  const view = raw.slice(); // aligned copy
  const values = from === "f16" ? new Float16Array(view.buffer) : new Float32Array(view.buffer);
  const out = to === "f16" ? Float16Array.from(values) : Float32Array.from(values);
  return new Uint8Array(out.buffer);
}
