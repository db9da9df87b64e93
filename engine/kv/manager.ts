/**
 * The IO-aware block manager: what the tiers below the GPU hold, and the order in which things
 * go down or away. Pure bookkeeping and policy (no GPU, no files, no timers: the caller passes
 * the clock); engine/kv/tiers.ts moves the bytes.
 *
 * Every block below the GPU is known by its chained hash (engine/kv/blocks.ts), so it is found
 * by content wherever it lives, and only within its tenant's scope (the hash chains from the
 * scope's root). Each has a state (active: a restore waits for it; pending-evict: a copy down to
 * it, or from host memory to its file, is in flight; inactive: at rest), a tier (its fastest
 * copy: host memory or a file), an access count, its last access, and a predicted reuse: the
 * soonest predicted next turn of the sessions whose evicted KV it is (its holders).
 *
 * A session's next turn is predicted from its turns so far: the previous one ended at `lastUse`,
 * and the gaps between its turns average `gapMs` (an exponential moving average), so the next
 * is due at `lastUse + gapMs`; one that is overdue, or has no history, is expected after as long
 * again as it has been idle (the longer idle, the later: least recently used).
 */
import type { HostBuffer } from "./tier_host.ts";

/** Where a block's KV is: GPU memory, host memory, a spill file, or the snapshot store. */
export type BlockTier = "gpu" | "host" | "file" | "kv";

/** A block's state (see the module doc). */
export type BlockState = "active" | "inactive" | "pending-evict";

/** One block below the GPU. */
export interface TierBlock {
  hash: bigint;
  /** Its 16 token ids (a hash hit is checked against them). */
  tokens: number[];
  /** Bytes of its K‖V record. */
  bytes: number;
  /** Its record in host memory, when it is there. */
  host?: HostBuffer;
  /** Whether its record is in a file. */
  file: boolean;
  /** The copy from the GPU, in flight: resolves true once the record is in host memory. */
  landing?: Promise<boolean>;
  /** Its record being written to its file. */
  writing?: Promise<void>;
  accesses: number;
  /** ms since the epoch. */
  lastAccess: number;
  /** Sessions whose evicted KV it is. */
  holders: Set<string>;
  /** Restores waiting on it (it stays in its tier meanwhile). */
  pins: number;
}

/** A session's turns so far, for its predicted reuse. */
export interface ReuseStats {
  turns: number;
  /** Moving average of the gaps between the end of a turn and the start of the next (ms). */
  gapMs?: number;
}

/** How much the latest gap weighs in {@linkcode ReuseStats.gapMs}. */
const GAP_WEIGHT = 0.5;

/** `stats` after a turn that started `gapMs` after the previous one ended. */
export function recordGap(stats: ReuseStats | undefined, gapMs: number): ReuseStats {
  const gap = Math.max(0, gapMs);
  const old = stats?.gapMs;
  return {
    turns: (stats?.turns ?? 0) + 1,
    gapMs: old === undefined ? gap : old + GAP_WEIGHT * (gap - old),
  };
}

/**
 * When a session whose last turn ended at `lastUse` is predicted to start its next (ms since the
 * epoch; see the module doc).
 *
 * @example
 * nextUse(1000, { turns: 3, gapMs: 500 }, 1200); // 1500: due in 300 ms
 * nextUse(1000, undefined, 1200); // 1400: idle 200 ms, expected in 200 more
 */
export function nextUse(lastUse: number, reuse: ReuseStats | undefined, now: number): number {
  const due = lastUse + (reuse?.gapMs ?? 0);
  return due > now ? due : now + Math.max(0, now - lastUse);
}

/** The tier of a block's fastest copy (a copy still landing counts as host memory). */
export function tierOf(b: TierBlock): BlockTier {
  return b.host || b.landing ? "host" : b.file ? "file" : "kv";
}

/** A block's state (see the module doc). */
export function stateOf(b: TierBlock): BlockState {
  return b.pins > 0 ? "active" : b.landing || b.writing ? "pending-evict" : "inactive";
}

/** An idle session as eviction from the GPU weighs it. */
export interface IdleSession {
  id: string;
  /** When its last turn ended. */
  lastUse: number;
  reuse?: ReuseStats;
  /** Its blocks on the GPU that are not below it yet (what evicting it copies). */
  toCopy: number;
}

/**
 * The order in which idle sessions leave the GPU: the one predicted to come back last first.
 * Predictions within a factor of two of each other count as equal, and then the one that copies
 * fewer blocks goes first (its KV is mostly below already: evicting it costs little IO), then the
 * least recently used.
 */
export function evictionOrder(sessions: readonly IdleSession[], now: number): IdleSession[] {
  const bucket = (s: IdleSession) =>
    Math.floor(Math.log2(1 + Math.max(0, nextUse(s.lastUse, s.reuse, now) - now)));
  return [...sessions].sort((a, b) =>
    bucket(b) - bucket(a) || a.toCopy - b.toCopy || a.lastUse - b.lastUse
  );
}

/** One session's evicted KV: its blocks' hashes in order, and what predicts its return. */
interface Holder {
  hashes: bigint[];
  lastUse: number;
  reuse?: ReuseStats;
}

/** Counts of blocks below the GPU, by tier and state (a block with copies in both counts once). */
export interface ManagerCounts {
  host: number;
  file: number;
  active: number;
  inactive: number;
  pendingEvict: number;
}

/** The blocks below the GPU and the sessions they belong to (see the module doc). */
export class BlockManager {
  readonly #blocks = new Map<bigint, TierBlock>();
  readonly #holders = new Map<string, Holder>();

  /** Blocks known. */
  get size(): number {
    return this.#blocks.size;
  }

  /** The block with chained hash `hash`, when its tokens are `tokens`. */
  find(hash: bigint, tokens: readonly number[]): TierBlock | undefined {
    const b = this.#blocks.get(hash);
    if (!b || b.tokens.length !== tokens.length || b.tokens.some((t, i) => t !== tokens[i])) {
      return undefined;
    }
    return b;
  }

  get(hash: bigint): TierBlock | undefined {
    return this.#blocks.get(hash);
  }

  /** Adds a block (its hash must be new). */
  add(b: TierBlock): void {
    if (this.#blocks.has(b.hash)) {
      throw new Error(`internal error: block ${b.hash.toString(16)} is already below the GPU`);
    }
    this.#blocks.set(b.hash, b);
  }

  /**
   * Forgets a block (its bytes are gone from every tier). Its holders can no longer restore it,
   * nor anything after it (a restore follows the hash chain and stops at the first miss): they
   * let go of the rest of their chains too.
   *
   * @returns the sessions that held it
   */
  remove(hash: bigint): string[] {
    const b = this.#blocks.get(hash);
    if (!b) return [];
    this.#blocks.delete(hash);
    const holders = [...b.holders];
    for (const id of holders) {
      const h = this.#holders.get(id)!;
      const at = h.hashes.indexOf(hash);
      for (const later of h.hashes.splice(at)) this.#blocks.get(later)?.holders.delete(id);
    }
    return holders;
  }

  /**
   * Records that session `id`'s evicted KV is the blocks `hashes` (in order, all known), its
   * last turn ended at `lastUse`.
   */
  hold(id: string, hashes: readonly bigint[], lastUse: number, reuse?: ReuseStats): void {
    this.release(id);
    for (const h of hashes) this.#blocks.get(h)!.holders.add(id);
    this.#holders.set(id, { hashes: [...hashes], lastUse, reuse });
  }

  /** Session `id` holds nothing below the GPU any more (it came back, or is gone). */
  release(id: string): void {
    const h = this.#holders.get(id);
    if (!h) return;
    for (const hash of h.hashes) this.#blocks.get(hash)?.holders.delete(id);
    this.#holders.delete(id);
  }

  /** Tokens of session `id`'s evicted KV still below the GPU (its chain's whole blocks). */
  heldTokens(id: string, blockTokens: number): number {
    return (this.#holders.get(id)?.hashes.length ?? 0) * blockTokens;
  }

  /**
   * When block `b` is predicted to be needed next: the soonest predicted turn of its holders;
   * for a block no session holds (a shared prefix, kept in case a prompt starts with it),
   * `nextUse` of its own last access.
   */
  predictedReuse(b: TierBlock, now: number): number {
    let soonest = Infinity;
    for (const id of b.holders) {
      const h = this.#holders.get(id)!;
      soonest = Math.min(soonest, nextUse(h.lastUse, h.reuse, now));
    }
    return soonest === Infinity ? nextUse(b.lastAccess, undefined, now) : soonest;
  }

  /**
   * The blocks `pick` allows, in the order they should leave their tier: first those no session
   * holds (the prefix cache), those taken once before those taken again; then the held ones,
   * predicted to be needed last first, a chain's tail before its head (a restore stops at the
   * first missing block: the head is what makes the rest worth keeping); ties by the least
   * recently used. Pinned blocks and blocks with a copy in flight never leave (not listed).
   */
  victims(now: number, pick: (b: TierBlock) => boolean): TierBlock[] {
    const out: { b: TierBlock; held: number; again: number; next: number; at: number }[] = [];
    for (const b of this.#blocks.values()) {
      if (b.pins > 0 || b.landing || b.writing || !pick(b)) continue;
      const held = b.holders.size > 0 ? 1 : 0;
      let at = -1; // its latest place in a holder's chain
      for (const id of b.holders) at = Math.max(at, this.#holders.get(id)!.hashes.indexOf(b.hash));
      const next = this.predictedReuse(b, now);
      out.push({ b, held, again: b.accesses > 1 ? 1 : 0, next, at });
    }
    out.sort((x, y) =>
      x.held - y.held || x.again - y.again || y.next - x.next || y.at - x.at ||
      x.b.lastAccess - y.b.lastAccess
    );
    return out.map((x) => x.b);
  }

  /** Every block known. */
  all(): IterableIterator<TierBlock> {
    return this.#blocks.values();
  }

  counts(): ManagerCounts {
    const n: ManagerCounts = { host: 0, file: 0, active: 0, inactive: 0, pendingEvict: 0 };
    for (const b of this.#blocks.values()) {
      const tier = tierOf(b), state = stateOf(b);
      if (tier === "host" || tier === "file") n[tier]++;
      if (state === "pending-evict") n.pendingEvict++;
      else n[state]++;
    }
    return n;
  }
}
