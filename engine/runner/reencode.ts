/**
 * The re-encode pass of precision by recency (docs/kv_codecs.md): after each readback round the
 * engine hands it the sequences in slots and the idle sessions, and the blocks each holds alone
 * behind its hot window move into codec blocks (engine/kv/recency.ts): one encode submission
 * for all of them (KvPool.encode), then the running slots' block tables repointed, in that queue
 * order, so work already submitted reads the hot blocks and work submitted later the codec ones.
 */
import type { SequenceBlocks } from "../kv/blocks.ts";
import type { KvPool } from "../kv/pool.ts";
import { type Reencode, reencodeAged } from "../kv/recency.ts";

/** A sequence the pass looks at. */
export interface HotWindowItem {
  blocks: SequenceBlocks;
  /** Positions whose KV work already submitted writes (see reencodeAged). */
  written: number;
  /** Its batch slot, whose GPU table is repointed; −1 for an idle session. */
  slot: number;
}

/** What repoints a slot's GPU block table (the runner). */
export interface TableOwner {
  repoint(slot: number, moved: readonly Reencode[]): void;
}

/** Moves blocks behind the hot window into codec blocks, pass by pass. */
export class Reencoder {
  /** `written` at each sequence's last pass that found room for everything it wanted. */
  readonly #settled = new WeakMap<SequenceBlocks, number>();
  /** Blocks re-encoded so far. */
  total = 0;

  /** @param window tokens kept hot at the end of each sequence */
  constructor(readonly kv: KvPool, readonly tables: TableOwner, readonly window: number) {}

  /**
   * Re-encodes the aged blocks of `items` (a sequence unchanged since a pass that settled it is
   * skipped) and returns how many moved.
   */
  pass(items: Iterable<HotWindowItem>): number {
    const pairs: [number, number][] = [];
    const repoints: { slot: number; moved: Reencode[] }[] = [];
    for (const it of items) {
      if (this.#settled.get(it.blocks) === it.written) continue;
      const { moved, full } = reencodeAged(it.blocks, it.written, this.window);
      if (full) this.#settled.delete(it.blocks);
      else this.#settled.set(it.blocks, it.written);
      for (const m of moved) pairs.push([m.from, m.to]);
      if (moved.length && it.slot >= 0) repoints.push({ slot: it.slot, moved });
    }
    if (!pairs.length) return 0;
    this.kv.encode(pairs);
    for (const r of repoints) this.tables.repoint(r.slot, r.moved);
    this.total += pairs.length;
    return pairs.length;
  }
}

/**
 * What the re-encode pass looks at after a readback round: the sequences in slots (their KV
 * written up to the last token read back, which the next step writes) and the idle sessions.
 */
export function* hotWindowItems(
  slots: readonly (
    | { blocks: SequenceBlocks; slot: number; allTokens(): readonly number[] }
    | undefined
  )[],
  sessions: {
    list(): readonly { id: string }[];
    get(id: string): { blocks: SequenceBlocks; busy: boolean } | undefined;
  },
): Generator<HotWindowItem> {
  for (const s of slots) {
    if (s && s.slot >= 0) {
      yield { blocks: s.blocks, written: s.allTokens().length - 1, slot: s.slot };
    }
  }
  for (const info of sessions.list()) {
    const e = sessions.get(info.id);
    if (e && !e.busy) yield { blocks: e.blocks, written: e.blocks.computed, slot: -1 };
  }
}
