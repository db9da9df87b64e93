/**
 * The session table: each session holds its token ids and the KV blocks that cover them, and
 * whether a request is using it. Idle sessions give their blocks back under pressure (least
 * recently used first). Pure bookkeeping over the block pool: no GPU, no store (snapshots are
 * engine/sessions/snapshots.ts).
 */
import type { SamplingOptions } from "../../api/types.ts";
import type { SessionInfo } from "../../api/types.ts";
import { SessionBusyError } from "../../api/errors.ts";
import type { BlockPool, SequenceBlocks } from "../kv/blocks.ts";

/** One session: what the API reports, its blocks, and whether a request is using it. */
export interface SessionEntry {
  info: SessionInfo;
  blocks: SequenceBlocks;
  busy: boolean;
  /** Its most recent turns as generated, oldest first (replays re-run them). */
  turns?: TurnRecord[];
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

  constructor(readonly pool: BlockPool) {}

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
    this.#map.delete(id);
    this.onChange?.(id);
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
}
