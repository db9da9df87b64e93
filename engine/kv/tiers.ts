/**
 * The tiers below the GPU, and the moves between them (docs/kv_tiers.md). An idle session that
 * must leave the GPU goes down instead of away: the copy of its full blocks from the GPU is
 * queued at once (queue order: what later work writes into the freed blocks comes after it) and
 * mapped at the engine's next readback round ({@linkcode KvTiers.startReads}: Deno's mapAsync
 * blocks until the GPU is idle), then copied into host memory. Host memory over its budget moves
 * its least valuable blocks to files (engine/kv/manager.ts decides the order); with no file tier,
 * they are dropped. A prompt's blocks are found by chained hash in any tier and brought back by a
 * {@linkcode RestorePlan} (engine/kv/restore.ts).
 *
 * Bytes are opaque K‖V records in the hot form (`KvPool.copyOut` decodes codec blocks on the GPU;
 * a restore writes them into hot blocks, which the re-encoder moves again): nothing here looks
 * inside.
 */
import type { KvTierStats, StorageTierProfile } from "../../api/types.ts";
import { BLOCK, blockHash, type SequenceBlocks } from "./blocks.ts";
import { type BreakerOptions, SpillBreaker } from "./breaker.ts";
import {
  BlockManager,
  type BlockTier,
  type ReuseStats,
  type TierBlock,
  tierOf,
} from "./manager.ts";
import type { KvPool } from "./pool.ts";
import { RestorePlan, type RestoreSource } from "./restore.ts";
import type { FileTier } from "./tier_file.ts";
import type { HostBuffer, HostTier } from "./tier_host.ts";

/** How restores choose their tiers: by the profile, or from any tier that has the block. */
export type TierPolicy = "profile" | "always";

/** Options of {@linkcode KvTiers}. */
export interface KvTiersOptions {
  host: HostTier;
  file?: FileTier;
  /** "profile" (default): only tiers faster than recomputing; "always": every tier (tests). */
  policy?: TierPolicy;
  breaker?: BreakerOptions;
}

/** Bytes copied out of a mapping per task of the event loop (as snapshots do). */
const COPY_SLICE = 4 << 20;
/** Files written at once when host memory is over its budget. */
const WRITES_IN_FLIGHT = 8;
/** Reads a restore keeps in flight before a profile says otherwise. */
const DEFAULT_PREFETCH = 8;

/** A loader of one block from outside the tiers (the snapshot store), by block index. */
export type FallbackSource = (
  index: number,
  hash: bigint,
  tokens: number[],
) => (() => Promise<Uint8Array<ArrayBuffer> | undefined>) | undefined;

/** The host and file tiers of one engine (see the module doc). */
export class KvTiers {
  readonly manager = new BlockManager();
  readonly breaker: SpillBreaker;
  readonly host: HostTier;
  readonly file?: FileTier;
  readonly policy: TierPolicy;
  /** The start-up profile, once measured (engine/kv/profile.ts). */
  profile?: StorageTierProfile;
  /** Called with the sessions whose KV below lost blocks (left every tier, or a spill failed). */
  onLoss?: (sessions: string[]) => void;
  readonly #pending: (() => void)[] = [];
  readonly #inflight = new Set<Promise<unknown>>();
  #copying: Promise<unknown> = Promise.resolve();
  #balancing = false;
  #writes = 0;
  /** Bytes of the blocks below (each once, wherever its copies are), and of those being written. */
  #storedBytes = 0;
  #writingBytes = 0;
  /** Since when a file write has been in flight (for `written.ms`). */
  #writingSince = 0;
  readonly #stats = {
    spilled: { blocks: 0, bytes: 0, ms: 0 },
    written: { blocks: 0, bytes: 0, ms: 0 },
    dropped: 0,
    restored: { host: 0, file: 0, kv: 0, bytes: 0, ms: 0 },
    prefetched: 0,
    failed: 0,
  };

  constructor(readonly pool: KvPool, o: KvTiersOptions) {
    this.host = o.host;
    this.file = o.file;
    this.policy = o.policy ?? "profile";
    this.breaker = new SpillBreaker(o.breaker);
  }

  /**
   * Whether restores (and so spills) use tier `t`: by the profile's verdict, or always (policy
   * "always"). Before a profile is measured: host memory and files, not the snapshot store.
   */
  uses(t: "host" | "file" | "kv"): boolean {
    if (t === "file" && !this.file) return false;
    if (this.policy === "always") return true;
    if (!this.profile) return t !== "kv";
    return this.profile[t]?.use ?? false;
  }

  /** Whether an evicted session goes down a tier at all (else it drops its KV). */
  get spilling(): boolean {
    return (this.uses("host") && this.host.budget > 0) || this.uses("file");
  }

  /** Bytes host memory may keep: its budget when restores use it, else none (files only). */
  get #hostRoom(): number {
    return this.uses("host") ? this.host.budget : 0;
  }

  /** Blocks of `blocks` (full, on the GPU) that are not below it yet: what a spill copies. */
  toCopy(blocks: SequenceBlocks): number {
    const full = this.#full(blocks);
    let n = 0;
    for (let b = 0; b < full; b++) {
      if (!this.manager.get(blocks.hashes[b])) n++;
    }
    return n;
  }

  #full(blocks: SequenceBlocks): number {
    const n = Math.min(blocks.hashes.length, Math.floor(blocks.computed / BLOCK));
    const trash = blocks.table.indexOf(this.pool.blocks.trash);
    return trash >= 0 ? Math.min(n, trash) : n;
  }

  /**
   * Sends the KV of session `owner` (idle, about to free its GPU blocks) down a tier: its full
   * blocks not below already are copied out of the GPU (queued now), within the tiers' budgets
   * (dropping less valuable blocks to make room). Its partial last block is not kept.
   *
   * @returns tokens of its KV kept below (a prefix of its tokens); 0 when spills are off or
   *   paused (the caller drops the KV)
   */
  spill(owner: string, blocks: SequenceBlocks, o: { lastUse: number; reuse?: ReuseStats }): number {
    if (!this.spilling) return 0;
    const now = Date.now();
    if (this.breaker.paused(now)) {
      this.breaker.skip();
      return 0;
    }
    // Its chain: blocks below already (pinned while room is made) and blocks to copy.
    const full = this.#full(blocks), known: (TierBlock | undefined)[] = [];
    let need = 0;
    for (let b = 0; b < full; b++) {
      const k = this.manager.find(
        blocks.hashes[b],
        blocks.tokens.slice(b * BLOCK, (b + 1) * BLOCK),
      );
      if (k) k.pins++;
      else need += 2 * this.pool.blockBytes;
      known.push(k);
    }
    let room = this.#makeRoom(need, owner, now);
    for (const k of known) if (k) k.pins--;
    const hashes: bigint[] = [], fresh: TierBlock[] = [], ids: number[] = [];
    for (let b = 0; b < full; b++) {
      const hash = blocks.hashes[b];
      if (!known[b]) {
        const id = blocks.table[b], bytes = 2 * this.pool.blockBytes;
        if ((room -= bytes) < 0) break; // the rest does not fit: the prefix that did is kept
        const tb: TierBlock = {
          hash,
          tokens: blocks.tokens.slice(b * BLOCK, (b + 1) * BLOCK),
          bytes,
          file: false,
          accesses: this.pool.blocks.blocks[id].accesses,
          lastAccess: now,
          holders: new Set(),
          pins: 0,
        };
        this.manager.add(tb);
        this.#storedBytes += bytes;
        fresh.push(tb);
        ids.push(id);
      }
      hashes.push(hash);
    }
    if (fresh.length) {
      const staging = this.pool.copyOut(ids);
      let settle!: (ok: boolean) => void;
      const landing = new Promise<boolean>((r) => (settle = r));
      for (const tb of fresh) tb.landing = landing;
      this.#track(landing);
      this.#pending.push(() => this.#land(staging, fresh, settle));
    }
    this.manager.hold(owner, hashes, o.lastUse, o.reuse);
    return hashes.length * BLOCK;
  }

  /**
   * Makes room for `bytes` more in host memory and files together, dropping the least valuable
   * blocks not held by `owner` (engine/kv/manager.ts `victims`) until they fit.
   *
   * @returns the bytes there is room for (less than `bytes` when dropping all it may was not
   *   enough)
   */
  #makeRoom(bytes: number, owner: string, now: number): number {
    const capacity = this.#hostRoom + (this.uses("file") ? this.file!.budget : 0);
    let over = this.#storedBytes + bytes - capacity;
    if (over > 0) {
      for (const b of this.manager.victims(now, (b) => !b.holders.has(owner))) {
        over -= b.bytes;
        this.#drop(b);
        if (over <= 0) break;
      }
    }
    return bytes - Math.max(0, over);
  }

  /**
   * A block leaves every tier (once). A restore that holds it may be reading its memory: that
   * goes back when the restore lets go (see {@linkcode #source}).
   */
  #drop(b: TierBlock): void {
    if (this.manager.get(b.hash) !== b) return;
    if (b.host && b.pins === 0) {
      this.host.give(b.host);
      b.host = undefined;
    }
    if (b.file) void this.file!.remove(b.hash);
    b.file = false;
    this.#storedBytes -= b.bytes;
    const losers = this.manager.remove(b.hash);
    this.#stats.dropped++;
    if (losers.length) this.onLoss?.(losers);
  }

  #track(p: Promise<unknown>): void {
    this.#inflight.add(p);
    p.finally(() => this.#inflight.delete(p));
  }

  /** Requests the mappings of the spills queued since the last call (see the module doc). */
  startReads(): void {
    for (const start of this.#pending.splice(0)) start();
  }

  /** Maps a spill's staging buffer and copies its blocks into host memory. */
  async #land(staging: GPUBuffer, fresh: TierBlock[], settle: (ok: boolean) => void) {
    // The spill's own IO: copying the mapped blocks into host memory. Waiting for the mapping
    // is waiting for the GPU's queue and Deno's timer (and on a CPU adapter, for the thread's
    // other work), not for the tier.
    let ok = false, io = 0;
    try {
      await staging.mapAsync(GPUMapMode.READ);
      // One copy out of a mapping at a time, a slice per task of the event loop.
      const copy = this.#copying.then(async () => {
        let at = 0, since = 0;
        for (const tb of fresh) {
          if (since >= COPY_SLICE) {
            await new Promise((r) => setTimeout(r, 0));
            since = 0;
          }
          const t = performance.now();
          const buf = this.host.take(tb.bytes);
          buf.set(new Uint8Array(staging.getMappedRange(at, tb.bytes)));
          tb.host = buf;
          io += performance.now() - t;
          at += tb.bytes;
          since += tb.bytes;
        }
      });
      this.#copying = copy.catch(() => {});
      await copy;
      ok = true;
    } catch (e) {
      console.error(`strata: a KV spill failed: ${e}`);
    } finally {
      staging.destroy();
    }
    let bytes = 0;
    for (const tb of fresh) {
      tb.landing = undefined;
      bytes += tb.bytes;
      if (!ok) this.#drop(tb);
    }
    settle(ok);
    if (ok) {
      const s = this.#stats.spilled;
      s.blocks += fresh.length;
      s.bytes += bytes;
      s.ms += io;
      // Per block, as file writes are timed: a session of 8k tokens is 512 blocks, and its
      // spill taking 500 ms says nothing about the tier (a block in 1 ms).
      this.breaker.record(
        io / fresh.length,
        `copying a spilled block (${mb(bytes / fresh.length)}) out of the GPU's mapping`,
        Date.now(),
      );
    }
    this.#balance();
  }

  /**
   * Moves host memory back within its budget: copies that also have a file go first (nothing
   * to write), then the least valuable blocks are written to files (at most
   * {@linkcode WRITES_IN_FLIGHT} at once; their memory is given back once written), or dropped
   * when there is no file tier or no room in it. Blocks a restore waits for stay.
   */
  #balance(): void {
    if (this.#balancing) return;
    this.#balancing = true;
    try {
      const now = Date.now(), room = this.#hostRoom;
      let over = this.host.used - room - this.#writingBytes;
      if (over <= 0) return;
      for (const b of this.manager.victims(now, (b) => b.host !== undefined)) {
        if (over <= 0) break;
        if (b.file) {
          this.host.give(b.host!);
          b.host = undefined;
          over -= b.bytes;
        } else if (this.uses("file") && this.file!.fits(b.bytes)) {
          if (this.#writes >= WRITES_IN_FLIGHT) break;
          over -= b.bytes;
          this.#write(b);
        } else {
          over -= b.bytes;
          this.#drop(b);
        }
      }
    } finally {
      this.#balancing = false;
    }
  }

  /** Writes block `b`'s host copy to its file, then gives the memory back. */
  #write(b: TierBlock): void {
    if (this.#writes++ === 0) this.#writingSince = performance.now();
    this.#writingBytes += b.bytes;
    const t0 = performance.now();
    b.writing = this.file!.write(b.hash, b.tokens, b.host!).then(
      () => {
        const ms = performance.now() - t0, w = this.#stats.written;
        w.blocks++;
        w.bytes += b.bytes;
        this.breaker.record(ms, `writing a block (${mb(b.bytes)}) to a file`, Date.now());
        b.file = true;
        if (this.manager.get(b.hash) === b && b.pins === 0 && b.host) {
          this.host.give(b.host);
          b.host = undefined;
        }
      },
      (e) => {
        console.error(`strata: writing a KV block to ${this.file!.dir} failed: ${e}`);
        this.#drop(b);
      },
    ).finally(() => {
      b.writing = undefined;
      if (--this.#writes === 0) this.#stats.written.ms += performance.now() - this.#writingSince;
      this.#writingBytes -= b.bytes;
      this.#balance();
    });
    this.#track(b.writing);
  }

  /**
   * Plans bringing back the blocks of `blocks`' uncomputed prompt tokens that some tier holds,
   * along its hash chain from its computed prefix (only at a block boundary), keeping at least one
   * token to prefill: from the GPU's cache, host memory, files, or `fallback` (the snapshot
   * store), stopping at the first block none has. Reads start now.
   *
   * @param o.owner the session whose KV this is (it holds nothing below once it is back)
   * @returns undefined when no block is found below the GPU
   */
  plan(
    blocks: SequenceBlocks,
    o: { owner?: string; fallback?: FallbackSource } = {},
  ): RestorePlan | undefined {
    if (!blocks.atBoundary) return undefined;
    const sources: RestoreSource[] = [];
    let parent = blocks.lastHash, below = false;
    for (let i = blocks.computed; i + BLOCK < blocks.tokens.length; i += BLOCK) {
      const tokens = blocks.tokens.slice(i, i + BLOCK), hash = blockHash(parent, tokens);
      const tb = this.manager.find(hash, tokens);
      const tier = tb ? tierOf(tb) : undefined;
      if (tb && (tier === "host" || tier === "file") && this.uses(tier)) {
        sources.push(this.#source(tb));
        below = true;
      } else if (this.pool.blocks.has(hash, tokens)) {
        sources.push({ hash, tokens, tier: "gpu" });
      } else {
        const load = o.fallback?.(i / BLOCK, hash, tokens);
        if (!load) break;
        sources.push({ hash, tokens, tier: "kv", load });
        below = true;
      }
      parent = hash;
    }
    if (!below) return undefined;
    const distance = this.profile?.prefetchBlocks ?? DEFAULT_PREFETCH;
    return new RestorePlan(sources, distance, o.owner);
  }

  /** A restore's source for tier block `b`: pinned until released. */
  #source(b: TierBlock): RestoreSource {
    b.pins++;
    let transient: HostBuffer | undefined, read: Promise<unknown> | undefined;
    const fromFile = !b.host && !b.landing;
    const load = async (): Promise<Uint8Array | undefined> => {
      if (b.landing && !(await b.landing)) return undefined;
      if (b.host) return b.host;
      if (!b.file) return undefined;
      const buf = this.host.take(b.bytes);
      const p = this.file!.read(b.hash, b.tokens, buf);
      read = p;
      if (!(await p)) {
        this.host.give(buf);
        this.#stats.failed++;
        // The file is bad: the block leaves the tiers (its holders recompute from here).
        this.#drop(b);
        return undefined;
      }
      this.#stats.prefetched++;
      if (this.manager.get(b.hash) === b && !b.host) b.host = buf; // kept: a clean copy
      else transient = buf;
      return buf;
    };
    const tier = fromFile ? "file" : "host";
    return {
      hash: b.hash,
      tokens: b.tokens,
      tier,
      load,
      release: () => {
        // A read still in flight writes into its buffer: give it back only after.
        void (read ?? Promise.resolve()).finally(() => {
          if (transient) this.host.give(transient);
          transient = undefined;
          b.pins--;
          if (b.pins === 0 && b.host && this.manager.get(b.hash) !== b) {
            this.host.give(b.host); // it left the tiers while held
            b.host = undefined;
          }
          b.accesses++;
          b.lastAccess = Date.now();
          this.#balance();
        });
      },
    };
  }

  /** Takes what a plan read (at admission): uploads it, counts it, and lets go of its sources. */
  take(plan: RestorePlan, blocks: SequenceBlocks): number {
    const r = plan.take(this.pool, blocks);
    const s = this.#stats.restored;
    s.host += r.blocks.host;
    s.file += r.blocks.file;
    s.kv += r.blocks.kv;
    s.bytes += r.bytes;
    s.ms += r.ms;
    if (plan.owner !== undefined) this.manager.release(plan.owner);
    return r.tokens;
  }

  /** Session `owner` is gone: it holds nothing below any more. */
  forget(owner: string): void {
    this.manager.release(owner);
  }

  /** Resolves once every spill and file write started so far has settled. */
  async flush(): Promise<void> {
    while (this.#inflight.size > 0 || this.#pending.length > 0) {
      this.startReads();
      await Promise.allSettled([...this.#inflight]);
    }
  }

  stats(): KvTierStats {
    const c = this.manager.counts();
    let hostBytes = 0;
    for (const b of this.manager.all()) if (b.host) hostBytes += b.bytes;
    const file = this.file, h = this.host;
    return {
      host: { blocks: c.host, bytes: hostBytes, budgetBytes: h.budget, spareBytes: h.spare },
      ...(file ? { file: { blocks: c.file, bytes: file.used, budgetBytes: file.budget } } : {}),
      states: { active: c.active, inactive: c.inactive, pendingEvict: c.pendingEvict },
      spilled: { ...this.#stats.spilled },
      written: { ...this.#stats.written },
      dropped: this.#stats.dropped,
      restored: { ...this.#stats.restored },
      prefetched: this.#stats.prefetched,
      failed: this.#stats.failed,
      breaker: this.breaker.state(Date.now()),
      ...(this.profile ? { profile: this.profile } : {}),
    };
  }
}

function mb(bytes: number): string {
  return `${(bytes / 2 ** 20).toFixed(1)} MiB`;
}

export type { BlockTier };
