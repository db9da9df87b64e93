/**
 * The sessions an engine keeps between requests (the table: engine/sessions/table.ts) and their
 * snapshots: with a store, every turn is snapshotted to Deno KV, copying from the GPU only the
 * blocks the turn added, and sessions come back onto the GPU after a restart.
 */
import type { SessionInfo } from "../../api/types.ts";
import type { KvDtype } from "../../gpu/dtype.ts";
import { BLOCK, SequenceBlocks } from "../kv/blocks.ts";
import type { KvPool } from "../kv/pool.ts";
import type { RestorePlan } from "../kv/restore.ts";
import type { FallbackSource, KvTiers } from "../kv/tiers.ts";
import type { ChunkRef, SessionStore } from "./store.ts";
import { type SessionEntry, SessionTable, type TurnRecord } from "./table.ts";

export type { SessionEntry } from "./table.ts";

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

/** The sessions of one engine and their snapshots in the store. */
export class Sessions {
  readonly table: SessionTable;
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

  /** What the store holds of each session (its last committed snapshot), for restores. */
  readonly #onStore = new Map<string, Committed>();

  /**
   * @param tiers the tiers below the GPU: evicted sessions go down to them, and prompts come
   *   back from them (and from the store, where the tiers' profile says it is faster)
   */
  constructor(
    readonly kv: KvPool,
    readonly modelId: string,
    readonly store?: SessionStore,
    readonly tiers?: KvTiers,
  ) {
    this.table = new SessionTable(kv.blocks, tiers);
    if (tiers) tiers.onLoss = (ids) => this.table.lost(ids);
  }

  get(id: string): SessionEntry | undefined {
    return this.table.get(id);
  }

  /** Every session's info. */
  list(): SessionInfo[] {
    return this.table.list();
  }

  /**
   * Called with a session's id whenever what {@linkcode get} reports of it changes (created,
   * turn ended, persisted, evicted, deleted).
   */
  set onChange(fn: ((id: string) => void) | undefined) {
    this.table.onChange = fn;
  }

  /**
   * Frees a session's blocks and forgets it, in the store too.
   *
   * @throws SessionBusyError while a request uses it
   */
  async delete(id: string): Promise<boolean> {
    if (!this.table.remove(id)) return false;
    await this.#snapshots.get(id);
    await this.store?.delete(id);
    this.#setStored(id, undefined);
    this.#committed.delete(id);
    this.#onStore.delete(id);
    return true;
  }

  /**
   * Plans bringing back the blocks of a queued prompt (`blocks`, its uncomputed tokens) that lie
   * below the GPU: in the tiers, by hash, and for session `id`, in its snapshot in the store
   * when restoring from there beats recomputing (the profile decides; policy "always": always).
   */
  planRestore(blocks: SequenceBlocks, id?: string): RestorePlan | undefined {
    return this.tiers?.plan(blocks, { owner: id, fallback: this.#storeSource(id) });
  }

  /** The store's copy of session `id`'s blocks, when a restore may read it. */
  #storeSource(id: string | undefined): FallbackSource | undefined {
    const store = this.store, tiers = this.tiers;
    const c = id === undefined ? undefined : this.#onStore.get(id);
    if (!store || !tiers || !c || c.kv !== this.kv.dtype || !tiers.uses("kv")) return undefined;
    return (index, _hash, tokens) => {
      const ref = c.blocks[index], at = index * BLOCK;
      if (!ref || at + BLOCK > c.computed) return undefined;
      if (tokens.some((t, i) => c.tokens[at + i] !== t)) return undefined;
      return () => store.readBlock(ref);
    };
  }

  /**
   * Ends a turn (see SessionTable.endTurn) and snapshots the session; blocks of a sequence
   * without a session go back to the pool.
   */
  release(
    id: string | undefined,
    blocks: SequenceBlocks,
    o: { tokens: readonly number[]; prefilled: boolean; turn?: TurnRecord },
  ): Promise<number> | undefined {
    const session = this.table.endTurn(id, blocks, o);
    return session ? this.snapshot(session) : undefined;
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
    this.tiers?.startReads(); // spills follow the same rule
  }

  /** Resolves when every snapshot started so far is written, and every spill has landed. */
  async flush(): Promise<void> {
    await Promise.all(this.#snapshots.values());
    await this.tiers?.flush();
  }

  /**
   * Writes the session to the store: the blocks its last committed snapshot already holds for the
   * same tokens are reused, the others are copied from the GPU (queued now, so later turns cannot
   * change what is read; mapped at the engine's next {@linkcode startReads}) and written as new
   * chunks. A turn thus copies and compresses the blocks it added, not the whole session.
   * Snapshots of one session are written in order.
   *
   * @returns when there is a store: when the snapshot was committed (rejects when it failed)
   */
  snapshot(session: SessionEntry): Promise<number> | undefined {
    this.table.onChange?.(session.info.id); // the turn that ended changed its tokens
    if (!this.store) return undefined;
    const store = this.store, { info, blocks } = session;
    const kv = this.kv.dtype, bb = this.kv.blockBytes;
    const n = Math.ceil(blocks.computed / BLOCK);
    const tokens = Uint32Array.from(blocks.tokens), computed = blocks.computed;
    const reused = reusable(this.#committed.get(info.id), tokens, computed, kv);
    const copied = blocks.table.slice(reused.length, n);
    this.#stats.blocksReused += reused.length;
    this.#stats.blocksCopied += copied.length;
    let read: Promise<Uint8Array[]> = Promise.resolve([]);
    if (copied.length) {
      const staging = this.kv.copyOut(copied);
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
          {
            id: info.id,
            model: this.modelId,
            tokens,
            computed,
            kv,
            createdAt,
            updatedAt,
            ...(blocks.root ? { scope: blocks.root.toString(16) } : {}),
            ...(session.turns ? { turns: session.turns } : {}),
          },
          [...reused, ...data],
          { give: true },
        )
      )
      .then((entries) => {
        const at = info.persistedAt = Date.now();
        this.table.onChange?.(info.id);
        this.#committed.set(info.id, { tokens, computed, kv, blocks: entries });
        if (this.table.get(info.id)) {
          this.#setStored(info.id, entries);
          this.#onStore.set(info.id, { tokens, computed, kv, blocks: entries });
        }
        return at;
      });
    // Later snapshots of the session wait for this one, failed or not.
    this.#snapshots.set(
      info.id,
      write.then(
        () => {},
        (e) => console.error(`strata: snapshot of session '${info.id}' failed: ${e}`),
      ),
    );
    return write;
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
    const kv = this.kv.dtype, bb = this.kv.blockBytes, pool = this.kv.blocks;
    for (const m of await store.list(this.modelId)) {
      const info = { id: m.id, tokens: 0, createdAt: m.createdAt, updatedAt: m.updatedAt };
      const blocks = new SequenceBlocks(pool, m.scope ? BigInt(`0x${m.scope}`) : 0n);
      this.table.add({ info, blocks, busy: false, ...(m.turns ? { turns: m.turns } : {}) });
      this.#setStored(m.id, m.blocks);
      // The next snapshot may reuse these chunks; restore verifies them before it relies on any.
      const kvOf = m.kv ?? "f32";
      this.#committed.set(m.id, { tokens: m.tokens, computed: m.computed, kv: kvOf, blocks: [] });
      // A run-time restore may read its chunks (each verified as it is read).
      this.#onStore.set(m.id, {
        tokens: m.tokens,
        computed: m.computed,
        kv: kvOf,
        blocks: m.blocks,
      });
      if (pool.freeCount - m.blocks.length < pool.hot / 2) continue;
      const { blocks: saved } = await store.restore(m);
      const data = saved.map((raw) => convertBlock(raw, m.kv ?? "f32", kv));
      if (data.some((raw) => raw.byteLength !== 2 * bb)) {
        console.error(`strata: session '${m.id}' has blocks of another shape; not restored`);
        continue;
      }
      blocks.reserve(data.length * BLOCK);
      data.forEach((raw, i) => this.kv.write(blocks.table[i], raw));
      for (const t of m.tokens) blocks.tokens.push(t);
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
