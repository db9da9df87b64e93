/**
 * The scheduler: pure policy over the batch's slots and the waiting queue (nano-vllm size). It
 * decides which waiting sequence takes a free slot next, when a burst's prefills wait so that
 * running streams keep flowing, how many decode steps go into one submission, and whether the
 * next one goes on the GPU now or waits for a readback. It touches no GPU and no timer: the
 * loop (engine/sched/loop.ts) carries out what it decides.
 */
import { EngineBusyError } from "../../api/errors.ts";
import { BLOCK, type BlockPool } from "../kv/blocks.ts";
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
  /** Frees idle sessions' blocks, least recently used first, until `need` blocks are free. */
  evictIdle(need: number): void;
}

/** The budget of `pool`, whose idle blocks are held by the sessions of `table`. */
export function poolBudget(pool: BlockPool, table: SessionTable): KvBudget {
  return {
    get freeBlocks() {
      return pool.freeCount;
    },
    evictIdle: (need) => table.evict(need),
  };
}

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
   */
  nextAdmission(gpu: GpuQueue, kv: KvBudget): Admission | undefined {
    const seq = this.#waiting[0];
    if (!seq) return undefined;
    if (seq.finished) {
      this.#waiting.shift();
      return { kind: "release", seq };
    }
    const slot = this.slots.findIndex((s) => s === undefined);
    if (slot < 0) return undefined;
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
      for (const other of this.#waiting.slice(1).reverse()) {
        if (need() <= kv.freeBlocks) break;
        other.dropKv();
      }
      if (need() > kv.freeBlocks) {
        this.#waiting.shift();
        const error = new Error(`internal error: the KV pool cannot hold ${total} tokens`);
        return { kind: "fail", seq, error };
      }
    }
    this.#waiting.shift();
    seq.blocks.reserve(total);
    seq.slot = slot;
    this.slots[slot] = seq;
    this.#nextK = 1; // a new stream: short submissions first, for its first tokens
    return { kind: "admit", seq };
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
