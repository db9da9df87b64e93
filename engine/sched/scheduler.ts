/**
 * The scheduler: pure policy over the batch's slots and the waiting queue (nano-vllm size). It
 * decides which waiting sequence takes a free slot next, when a burst's prefills wait so that
 * running streams keep flowing, how many decode steps go into one submission, and whether the
 * next one goes on the GPU now or waits for a readback. It touches no GPU and no timer: the
 * loop (engine/sched/loop.ts) carries out what it decides.
 */
import { EngineBusyError } from "../../api/errors.ts";
import { BLOCK, type BlockPool } from "../kv/blocks.ts";
import { hamming, SIMILAR_BITS } from "../kv/simhash.ts";
import type { KvTiers } from "../kv/tiers.ts";
import type { SessionTable } from "../sessions/table.ts";
import type { Sequence } from "./sequence.ts";

/** Options of {@linkcode Scheduler}. */
export interface SchedulerOptions {
  /** Batch slots. */
  maxSlots: number;
  /** Sequences that may wait for a slot. */
  maxQueued: number;
  /** Prompt tokens per prefill chunk (and per readback round while streams run). */
  maxChunk: number;
  /** Most decode steps per submission. */
  maxSteps: number;
  /** Decode steps queued on the GPU at once, in units of maxSteps (see EngineOptions). */
  queueDepth: number;
}

/** The KV cache as admission sees it: free blocks, and idle sessions' blocks to take back. */
export interface KvBudget {
  readonly freeBlocks: number;
  /**
   * Frees idle sessions' blocks until `need` blocks are free (their KV goes down a tier when
   * there is one), the one predicted to come back last first.
   */
  evictIdle(need: number): void;
  /**
   * The idle sessions whose KV is on the GPU (what eviction takes): each one's last prompt's
   * SimHash, undefined where unknown.
   */
  residentIdle(): readonly (bigint | undefined)[];
  /**
   * Gives an admitted sequence the blocks of its prompt that are cached on the GPU or planned
   * to come back from below it (`Sequence.restore`), in order, counting them as cached; called
   * before its blocks are reserved (they come out of the room admission found for it).
   */
  restore(seq: Sequence): void;
}

/**
 * The budget of `pool`, whose idle blocks are held by the sessions of `table`; restores upload
 * through `tiers`.
 */
export function poolBudget(pool: BlockPool, table: SessionTable, tiers?: KvTiers): KvBudget {
  return {
    get freeBlocks() {
      return pool.freeCount;
    },
    evictIdle: (need) => table.evict(need),
    residentIdle: () => table.residentIdle(),
    restore: (seq) => {
      let n = seq.blocks.shareCached();
      if (seq.restore && tiers) n += tiers.take(seq.restore, seq.blocks);
      seq.restore?.release();
      seq.addCached(n);
    },
  };
}

/**
 * Waiting sequences (after the head) that admission looks at for one that shares KV with the
 * GPU's (see {@linkcode Scheduler.nextAdmission}).
 */
export const AFFINITY_WINDOW = 8;
/** Times the head of the queue may be passed over for such a one before it goes first. */
export const MAX_BYPASS = 4;

/** What the loop knows of the work on the GPU when it asks for an admission. */
export interface GpuQueue {
  /** Prompt tokens of the prefill chunks submitted since the last readback round. */
  prefillQueued: number;
  /** Submissions waiting for their readback. */
  inflight: number;
}

/** A submission as the scheduler weighs it (engine/runner/submission.ts `o`). */
export interface QueuedWork {
  steps: number;
  prefill?: boolean;
}

/**
 * One admission decision. `admit`: the sequence has its slot and its blocks reserved, prefill
 * it. `release`: it ended while it waited, give its blocks back. `fail`: it can never fit.
 */
export type Admission =
  | { kind: "admit"; seq: Sequence }
  | { kind: "release"; seq: Sequence }
  | { kind: "fail"; seq: Sequence; error: Error };

/**
 * Submissions queued on the GPU before the host waits for their readback. Each readback round
 * costs the host a yield to the event loop (≈ 2 ms) besides handing out tokens and encoding, so
 * while K ramps up (1, 2, 4, …) several are queued or the GPU idles: up to four, holding fewer
 * than (queueDepth − 1) × maxSteps steps, plus the one held for the moment the wait returns.
 */
export const MAX_INFLIGHT = 4;
/**
 * Decode steps after which a sequence's stream is protected from a burst's prefills (see
 * {@linkcode Scheduler.nextAdmission}): the first request of a burst starts alone, and the rest
 * arrive within its first rounds.
 */
export const STREAMING_STEPS = 16;

/** Slots, the waiting queue and the decode ramp of one engine. */
export class Scheduler {
  /** The sequence in each batch slot. */
  readonly slots: (Sequence | undefined)[];
  readonly #waiting: Sequence[] = [];
  /** Steps of the next decode submission before the cap by maxSteps and what is left. */
  #nextK = 1;

  constructor(readonly opts: SchedulerOptions) {
    this.slots = new Array(opts.maxSlots).fill(undefined);
  }

  /** Sequences waiting for a slot. */
  get queued(): number {
    return this.#waiting.length;
  }

  /** Whether the head of the queue waits for its blocks to be read from below the GPU. */
  get restoring(): boolean {
    const head = this.#waiting[0];
    return head !== undefined && !head.finished && head.restore !== undefined &&
      !head.restore.ready;
  }

  /** Sequences in slots. */
  get running(): number {
    return this.slots.filter(Boolean).length;
  }

  /**
   * @throws EngineBusyError when the queue is full (check before building the sequence)
   */
  checkRoom(): void {
    if (this.#waiting.length >= this.opts.maxQueued) {
      throw new EngineBusyError(this.#waiting.length);
    }
  }

  /** Queues a sequence for a slot. */
  enqueue(seq: Sequence): void {
    this.#waiting.push(seq);
  }

  /**
   * Decides about the head of the queue; undefined when nothing more is admitted now. Admitting
   * reserves the sequence's blocks for its prompt and every token it may generate, evicting idle
   * sessions when the pool is short.
   *
   * - While streams run (a sequence past {@linkcode STREAMING_STEPS} steps), at most a chunk's
   *   worth of prompt tokens per readback round, unless one prompt alone is longer: the round's
   *   readback blocks the engine's thread until the GPU has done them all. A burst that finds
   *   only sequences of its own is admitted whole, so that they decode together.
   * - When blocks are short and nothing runs, the blocks are held by sessions whose next turns
   *   wait behind this one: they drop their KV (newest first) and prefill in full, or the two
   *   would wait for each other forever.
   * - A sequence whose blocks are still being read from below the GPU (`Sequence.restore`)
   *   waits for them, and the queue with it (a read takes milliseconds).
   * - When the head would evict idle sessions' KV to fit, a sequence among the next
   *   {@linkcode AFFINITY_WINDOW} that fits without evicting and shares KV with the GPU's (it
   *   holds cached blocks already, or its prompt's SimHash is near a running or resident one's)
   *   goes first, so that what it shares is used before it is evicted. The head is passed over
   *   at most {@linkcode MAX_BYPASS} times.
   */
  nextAdmission(gpu: GpuQueue, kv: KvBudget): Admission | undefined {
    const head = this.#waiting[0];
    if (!head) return undefined;
    if (head.finished) {
      this.#waiting.shift();
      return { kind: "release", seq: head };
    }
    const slot = this.slots.findIndex((s) => s === undefined);
    if (slot < 0) return undefined;
    if (head.restore && !head.restore.ready) return undefined;
    const at = this.#affine(kv);
    const seq = this.#waiting[at];
    const todo = seq.blocks.tokens.length - seq.blocks.computed, queued = gpu.prefillQueued;
    const streaming = this.slots.some((s) => s && s.stepsSubmitted > STREAMING_STEPS);
    if (streaming && queued > 0 && queued + todo > this.opts.maxChunk) return undefined;
    const total = seq.blocks.tokens.length + seq.sampling.maxTokens;
    const need = () => Math.ceil(total / BLOCK) - seq.blocks.table.length;
    if (need() > kv.freeBlocks) kv.evictIdle(need());
    if (need() > kv.freeBlocks) {
      // Running sequences will give blocks back (to the pool, or to their sessions, which then
      // become idle and evictable).
      if (this.slots.some((s) => s) || gpu.inflight > 0) return undefined;
      for (const other of this.#waiting.filter((o) => o !== seq).reverse()) {
        if (need() <= kv.freeBlocks) break;
        other.dropKv();
      }
      if (need() > kv.freeBlocks) {
        this.#waiting.splice(at, 1);
        const error = new Error(`internal error: the KV pool cannot hold ${total} tokens`);
        return { kind: "fail", seq, error };
      }
    }
    this.#waiting.splice(at, 1);
    kv.restore(seq);
    seq.blocks.reserve(total);
    seq.slot = slot;
    this.slots[slot] = seq;
    this.#nextK = 1; // a new stream: short submissions first, for its first tokens
    return { kind: "admit", seq };
  }

  /**
   * Which waiting sequence admission considers: the head, unless it would evict idle sessions'
   * KV and one of the next {@linkcode AFFINITY_WINDOW} fits without that and shares KV with
   * the GPU's (see {@linkcode nextAdmission}).
   */
  #affine(kv: KvBudget): number {
    const head = this.#waiting[0];
    const need = (s: Sequence) =>
      Math.ceil((s.blocks.tokens.length + s.sampling.maxTokens) / BLOCK) - s.blocks.table.length;
    if (head.bypassed >= MAX_BYPASS || need(head) <= kv.freeBlocks) return 0;
    const idle = kv.residentIdle();
    if (idle.length === 0) return 0; // nothing to evict: the head waits, or breaks a deadlock
    const hot = [
      ...this.slots.flatMap((s) => (s ? [s.simhash] : [])),
      ...idle.filter((h) => h !== undefined),
    ];
    const near = (h: bigint) => hot.some((x) => hamming(x, h) <= SIMILAR_BITS);
    const end = Math.min(this.#waiting.length, 1 + AFFINITY_WINDOW);
    for (let i = 1; i < end; i++) {
      const c = this.#waiting[i];
      if (c.finished || (c.restore && !c.restore.ready) || need(c) > kv.freeBlocks) continue;
      if (c.blocks.computed > 0 || near(c.simhash)) {
        head.bypassed++;
        return i;
      }
    }
    return 0;
  }

  /** By slot, the sequences the GPU still produces tokens for. */
  live(): (Sequence | undefined)[] {
    return this.slots.map((s) => (s && !s.finished && !s.gpuFinished ? s : undefined));
  }

  /** Whether any slot still gets tokens from the GPU. */
  hasLive(): boolean {
    return this.slots.some((s) => s && !s.finished && !s.gpuFinished);
  }

  /**
   * Decode steps for the next submission of `live`: doubling from 1 after each admission up to
   * maxSteps, and no more than any live sequence can still use.
   */
  decodeSteps(live: readonly (Sequence | undefined)[]): number {
    const remaining = Math.max(...live.map((s) => (s ? s.gpuRemaining : 0)));
    return Math.max(1, Math.min(this.#nextK, this.opts.maxSteps, remaining));
  }

  /** A decode submission went on the GPU: the next one may be twice as long. */
  submitted(): void {
    this.#nextK = Math.min(this.opts.maxSteps, this.#nextK * 2);
  }

  /**
   * Whether the encoded decode submission goes on the GPU now, with `inflight` waiting for
   * readback: always when nothing is, else while fewer than (queueDepth − 1) · maxSteps steps
   * and {@linkcode MAX_INFLIGHT} submissions are queued — but never behind a prefill that yields
   * a first token, so that token is not held back by decode steps.
   */
  submitNow(inflight: readonly QueuedWork[]): boolean {
    if (inflight.length === 0) return true;
    const queued = inflight.reduce((n, w) => n + w.steps, 0);
    const firstToken = inflight.some((w) => w.prefill && w.steps > 0);
    return !firstToken && inflight.length < MAX_INFLIGHT &&
      queued < (this.opts.queueDepth - 1) * this.opts.maxSteps;
  }

  /**
   * Frees `seq`'s slot.
   *
   * @returns false when it had none (it was still waiting, or already finished)
   */
  vacate(seq: Sequence): boolean {
    if (seq.slot < 0) return false;
    this.slots[seq.slot] = undefined;
    seq.slot = -1;
    return true;
  }

  /** Empties the queue and the slots (after a GPU failure); returns what they held. */
  drain(): Sequence[] {
    const all = [...this.#waiting, ...this.slots.filter((s) => s !== undefined)];
    this.#waiting.length = 0;
    this.slots.fill(undefined);
    return all;
  }
}
