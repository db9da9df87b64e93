/**
 * The session table: each session holds its token ids and the KV blocks that cover them, and
 * whether a request is using it. Idle sessions give their GPU blocks back under pressure, in the
 * block manager's order (engine/kv/manager.ts: the one predicted to come back last first), and
 * their KV goes down a tier (engine/kv/tiers.ts) when there is one. Bookkeeping over the block
 * pool: no store (snapshots are engine/sessions/sessions.ts).
 */
import type { SamplingOptions } from "../../api/types.ts";
import type { SessionInfo } from "../../api/types.ts";
import { SessionBusyError } from "../../api/errors.ts";
import { BLOCK, type BlockPool, type SequenceBlocks } from "../kv/blocks.ts";
import { evictionOrder, recordGap, type ReuseStats } from "../kv/manager.ts";
import type { KvTiers } from "../kv/tiers.ts";

/** One session: what the API reports, its blocks, and whether a request is using it. */
export interface SessionEntry {
  info: SessionInfo;
  blocks: SequenceBlocks;
  busy: boolean;
  /** Its most recent turns as generated, oldest first (replays re-run them). */
  turns?: TurnRecord[];
  /** The gaps between its turns: when it is predicted to come back (engine/kv/manager.ts). */
  reuse?: ReuseStats;
  /** The SimHash of its last prompt (engine/kv/simhash.ts), for the scheduler. */
  simhash?: bigint;
}

/**
 * One turn as it ran, enough to run it again and compare (`Engine.replaySession`): its whole
 * prompt, the sampling settings with the seed drawn, the constraint's key, the tokens and their
 * fingerprints (kernels/fingerprint.wgsl).
 */
export interface TurnRecord {
  prompt: number[];
  sampling: Omit<SamplingOptions, "seed"> & { seed: string };
  /** The constraint's key (its spec's JSON, engine/constraints.ts), when it had one. */
  constraint?: string;
  tokens: number[];
  fingerprints: number[];
}

/** Turns a session keeps records of. */
export const KEPT_TURNS = 8;

/** The sessions of one engine, by id. */
export class SessionTable {
  readonly #map = new Map<string, SessionEntry>();
  /**
   * Called with a session's id whenever what {@linkcode get} reports of it changes (created,
   * turn ended, persisted, evicted, deleted): the worker mirrors the table to the server's thread.
   */
  onChange?: (id: string) => void;

  /**
   * @param tiers where evicted sessions' KV goes (none: it is dropped, and their next turns
   *   prefill again)
   */
  constructor(readonly pool: BlockPool, readonly tiers?: KvTiers) {}

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

  /** Adds an idle session brought back from the store. */
  add(entry: SessionEntry): void {
    this.#map.set(entry.info.id, entry);
  }

  /** Every session's info. */
  list(): SessionInfo[] {
    return [...this.#map.values()].map((s) => s.info);
  }

  /**
   * Frees a session's blocks and forgets it.
   *
   * @returns false when there is no such session
   * @throws SessionBusyError while a request uses it
   */
  remove(id: string): boolean {
    const s = this.#map.get(id);
    if (!s) return false;
    if (s.busy) throw new SessionBusyError(id);
    s.blocks.free();
    this.tiers?.forget(id);
    this.#map.delete(id);
    this.onChange?.(id);
    return true;
  }

  /** After a failed turn: the session keeps no KV (it may be garbage) and is free again. */
  abandon(id: string | undefined): void {
    const s = id === undefined ? undefined : this.#map.get(id);
    if (!s) return;
    s.blocks.free();
    this.tiers?.forget(id!);
    s.busy = false;
    s.info.tokens = 0;
    this.onChange?.(id!);
  }

  /**
   * Ends a turn of session `id` (busy until now) whose sequence holds `tokens` (prompt and
   * accepted output) in `blocks`: the session keeps them, less the last token, whose KV is not
   * written yet (none of the output when the prompt never reached the GPU: `prefilled` false).
   *
   * @returns the session, or undefined when `id` names none (the blocks are then freed)
   */
  endTurn(
    id: string | undefined,
    blocks: SequenceBlocks,
    o: { tokens: readonly number[]; prefilled: boolean; turn?: TurnRecord },
  ): SessionEntry | undefined {
    const session = id === undefined ? undefined : this.#map.get(id);
    if (!session) {
      blocks.free();
      return undefined;
    }
    if (o.prefilled) {
      for (let i = blocks.tokens.length; i < o.tokens.length; i++) blocks.tokens.push(o.tokens[i]);
      blocks.markComputed(o.tokens.length - 1);
    }
    blocks.truncate(o.prefilled ? o.tokens.length : blocks.computed);
    session.busy = false;
    if (o.turn && o.prefilled) {
      session.turns = [...(session.turns ?? []), o.turn].slice(-KEPT_TURNS);
    }
    session.info.tokens = blocks.computed;
    session.info.updatedAt = Date.now();
    return session;
  }

  /**
   * A turn of idle session `s` starts (`s` becomes busy): the gap since its last one counts
   * towards its predicted reuse. Its KV below the GPU, if any, is found by hash from here.
   */
  startTurn(s: SessionEntry, simhash?: bigint): void {
    s.reuse = recordGap(s.reuse, Date.now() - s.info.updatedAt);
    if (simhash !== undefined) s.simhash = simhash;
    s.busy = true;
  }

  /**
   * The idle sessions whose KV is on the GPU (what eviction would take): the SimHash of each
   * one's last prompt, undefined where unknown (restored from the store).
   */
  residentIdle(): (bigint | undefined)[] {
    const out: (bigint | undefined)[] = [];
    for (const s of this.#map.values()) {
      if (!s.busy && s.blocks.table.length > 0) out.push(s.simhash);
    }
    return out;
  }

  /**
   * Frees the GPU blocks of idle sessions until `need` blocks are free, in the block manager's
   * order (least recently used first without tiers). Each evicted session's KV goes down a tier
   * when there is one (its info then counts the tokens kept there), else it is dropped; it
   * stays known either way, and its next turn finds what is left by hash (or prefills again).
   */
  evict(need: number): void {
    const now = Date.now(), tiers = this.tiers;
    const idle = [...this.#map.values()].filter((s) => !s.busy && s.blocks.table.length > 0);
    const order = evictionOrder(
      idle.map((s) => ({
        id: s.info.id,
        lastUse: s.info.updatedAt,
        reuse: s.reuse,
        toCopy: tiers?.toCopy(s.blocks) ?? 0,
      })),
      now,
    );
    for (const { id } of order) {
      if (this.pool.freeCount >= need) return;
      const s = this.#map.get(id)!;
      const kept = tiers?.spill(id, s.blocks, { lastUse: s.info.updatedAt, reuse: s.reuse }) ?? 0;
      s.blocks.free();
      s.info.tokens = kept;
      this.onChange?.(id);
    }
  }

  /**
   * Sessions whose KV below the GPU lost blocks: each counts only what is left there (a
   * resident or busy session is not concerned).
   */
  lost(ids: readonly string[]): void {
    for (const id of ids) {
      const s = this.#map.get(id);
      if (!s || s.busy || s.blocks.table.length > 0 || !this.tiers) continue;
      s.info.tokens = Math.min(s.info.tokens, this.tiers.manager.heldTokens(id, BLOCK));
      this.onChange?.(id);
    }
  }
}
