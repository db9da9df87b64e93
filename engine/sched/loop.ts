/**
 * The engine's async loop: it carries out the scheduler's decisions (engine/sched/scheduler.ts)
 * on the runner (engine/runner/runner.ts): admits and prefills sequences, keeps decode
 * submissions queued on the GPU, sleeps through the GPU's work with the event loop free
 * (engine/sched/pacer.ts), reads tokens back once per submission and hands them to their
 * sequences, and ends turns into their sessions.
 */
import type { AttentionMask } from "../../kernels/attention_mask.ts";
import { releaseDead } from "../kv/window.ts";
import type { Runner } from "../runner/runner.ts";
import type { Submission } from "../runner/submission.ts";
import type { Sessions } from "../sessions/sessions.ts";
import { Pacer } from "./pacer.ts";
import { type KvBudget, poolBudget, type Scheduler } from "./scheduler.ts";
import type { SpeculationPolicy } from "./speculation.ts";
import type { Sequence } from "./sequence.ts";

/** The loop's host-side counters (see {@linkcode Loop.hostStats}). */
export interface HostStats {
  submissions: number;
  steps: number;
  ms: number;
  pacedMs: number;
  prefillPeak: number;
}

/** What the loop drives. */
export interface LoopParts {
  runner: Runner<Sequence>;
  scheduler: Scheduler;
  sessions: Sessions;
  /** When decode submissions are verification passes (speculative decoding). */
  speculation: SpeculationPolicy;
  /**
   * The attention mask the runner's kernels apply (default causal): under a window, blocks behind
   * it are released as sequences move on (engine/kv/window.ts).
   */
  mask?: AttentionMask;
  /**
   * Runs after each readback round, once tokens are handed out: with a KV codec, the re-encode
   * pass of the blocks behind the hot window (engine/runner/reencode.ts).
   */
  afterRound?: () => void;
}

/** The loop of one engine: started by {@linkcode kick}, it runs while there is work. */
export class Loop {
  readonly #runner: Runner<Sequence>;
  readonly #sched: Scheduler;
  readonly #sessions: Sessions;
  readonly #kv: KvBudget;
  readonly #spec: SpeculationPolicy;
  readonly #mask?: AttentionMask;
  readonly #afterRound?: () => void;
  #inflight: Submission<Sequence>[] = [];
  /** The next decode submission, encoded ahead but not submitted (see {@linkcode #run}). */
  #held?: Submission<Sequence>;
  #running = false;
  /** Who waits for the loop to stop (see {@linkcode idle}). */
  #idle: (() => void)[] = [];
  /** Ends the loop's current yield to the event loop early (see {@linkcode #yield}). */
  #wake?: () => void;
  #host: HostStats = { submissions: 0, steps: 0, ms: 0, pacedMs: 0, prefillPeak: 0 };
  /** Host time to encode and submit one step, by kind of work (ms; a moving average). */
  readonly #hostMs = new Map<string, number>();
  /** GPU-time estimates: how long the loop may sleep before a readback. */
  readonly #pacer = new Pacer();

  constructor(parts: LoopParts) {
    this.#runner = parts.runner;
    this.#sched = parts.scheduler;
    this.#sessions = parts.sessions;
    this.#spec = parts.speculation;
    this.#kv = poolBudget(parts.sessions.kv.blocks, parts.sessions.table, parts.sessions.tiers);
    if (parts.mask && parts.mask.kind !== "causal") this.#mask = parts.mask;
    this.#afterRound = parts.afterRound;
  }

  /** Whether the loop is running (it stops when no work is left). */
  get running(): boolean {
    return this.#running;
  }

  /** Resolves once the loop has stopped (at once when it is not running). */
  idle(): Promise<void> {
    if (!this.#running) return Promise.resolve();
    return new Promise((resolve) => this.#idle.push(resolve));
  }

  /**
   * Totals since the engine started: submissions, the steps they recorded, the host time
   * spent encoding and submitting them (ms; the bench divides it by the steps), and the time
   * the loop slept before readbacks while the GPU worked (`pacedMs`; the event loop was free),
   * and the most prompt tokens queued on the GPU in one readback round (`prefillPeak`).
   */
  hostStats(): HostStats {
    return { ...this.#host };
  }

  /** New work: starts the loop, or ends its yield to the event loop. */
  kick(): void {
    if (this.#running) return this.#wake?.();
    this.#running = true;
    this.#run().catch((e) => {
      // A GPU or internal failure ends every request with the error and drops their KV (it may
      // be garbage); slots are stopped on the GPU, so the engine stays usable.
      for (const seq of this.#sched.drain()) {
        seq.fail(e);
        if (seq.slot >= 0) {
          this.#runner.stop(seq.slot);
          seq.slot = -1;
        }
        seq.blocks.free();
        this.#sessions.table.abandon(seq.request.sessionId);
      }
      this.#inflight = [];
      this.#dropHeld();
    }).finally(() => {
      this.#running = false;
      this.#sessions.startReads(); // no readback round is coming to request them
      // A head still reading its blocks from below the GPU kicks the loop when they are in.
      if (this.#sched.queued && !this.#sched.restoring) this.kick();
      else for (const resolve of this.#idle.splice(0)) resolve();
    });
  }

  /** The caller cancelled `seq` (its stream has ended): free its slot, or drop it from the queue. */
  cancel(seq: Sequence): void {
    if (seq.slot >= 0) {
      this.#finish(seq);
      if (!this.#running) this.#sessions.startReads(); // no readback round is coming
    } else this.kick();
  }

  /**
   * Waiting for a readback blocks the host until the GPU has finished everything submitted
   * (Deno's `mapAsync`, see engine/runner/submission.ts), so the loop keeps one decode
   * submission encoded but not submitted (`#held`) and submits it the moment that wait returns:
   * the GPU then works while the host reads back, hands out tokens, yields to the event loop
   * and encodes the next one. Before waiting, held submissions are submitted outright while the
   * scheduler says so (`submitNow`). Before a readback of work whose GPU time it has measured,
   * the loop sleeps until shortly before the GPU should finish it (engine/sched/pacer.ts), so
   * the wait that blocks the event loop is short: HTTP and WebSocket traffic runs during most
   * of a generation.
   */
  async #run(): Promise<void> {
    while (true) {
      this.#admit();
      const active = this.#sched.hasLive();
      // The held submission is submitted before every await, so neither of these drops ever
      // finds one today; they keep a buffer encoded for another batch from ever running.
      if (!active) this.#dropHeld();
      if (active && !this.#held) {
        this.#held = this.#encodeDecode();
        continue;
      }
      if (this.#held && this.#sched.submitNow(this.#inflight.map((s) => s.o))) {
        this.#submitHeld();
        continue;
      }
      if (!this.#inflight.length) break;
      // A readback blocks the event loop until the GPU is done: sleep through most of the
      // decode work first (a request arriving meanwhile wakes the loop).
      const sleep = this.#pacer.sleepMs(this.#inflight);
      if (sleep > 0) {
        const t = performance.now();
        await this.#yield(sleep);
        this.#host.pacedMs += performance.now() - t;
        continue;
      }
      // Every submitted buffer is finished once the first readback request returns: request
      // them all, then put the held one on the GPU before handing out tokens.
      const batch = this.#inflight.splice(0);
      const t0 = performance.now();
      const dones = batch.map((sub) => sub.done);
      this.#pacer.learn(batch, t0, performance.now());
      this.#sessions.startReads(); // the GPU is idle: snapshot copies are done, maps return at once
      for (const d of dones) d.catch(() => {}); // awaited below, in order
      if (this.#held) this.#submitHeld();
      for (let i = 0; i < batch.length; i++) {
        await dones[i];
        this.#process(batch[i]);
      }
      this.#afterRound?.();
      // Readbacks resolve at once (gpu/readback.ts): without this the loop would hold the
      // event loop until no sequence runs, and streams would flush only at the end.
      await this.#yield();
    }
  }

  /**
   * Returns to the event loop for `ms` (default: one timer's wait), or until new work arrives
   * when that is a sleep (`ms` > 0) or no sequence runs: sockets, timers and other I/O get their
   * turn. Needed because readbacks block the event loop until the GPU is done and then resolve
   * without a timer (gpu/readback.ts): a loop awaiting only them would never let the event loop
   * poll, and HTTP writes and new connections would wait for the generation to end.
   *
   * `setTimeout(0)` takes ≈ 2 ms, which the GPU covers while it runs the held submission. A
   * request arriving meanwhile cuts it short only when no sequence runs (then it does not add to
   * the first token's time); while streams run it waits (≤ 2 ms): a burst of arrivals, each
   * cutting the yield short, would keep timers from running. Cheaper yields (`setImmediate`,
   * `MessageChannel`, a fast async op) return without polling sockets often enough
   * (docs/internals.md).
   */
  async #yield(ms = 0): Promise<void> {
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, ms);
      if (ms > 0 || this.#sched.running === 0) {
        this.#wake = () => {
          clearTimeout(timer);
          resolve();
        };
      }
    });
    this.#wake = undefined;
  }

  /** Carries out the scheduler's admissions: prefills the admitted, ends the rest. */
  #admit(): void {
    for (let a; (a = this.#sched.nextAdmission(this.#queue(), this.#kv));) {
      if (a.kind === "release") this.#release(a.seq);
      else if (a.kind === "fail") {
        a.seq.fail(a.error);
        a.seq.blocks.free();
        this.#sessions.table.abandon(a.seq.request.sessionId);
      } else {
        this.#dropHeld(); // it would lack this sequence's slot (see #run)
        this.#prefill(a.seq);
      }
    }
  }

  #queue() {
    return { prefillQueued: this.#prefillQueued(), inflight: this.#inflight.length };
  }

  #prefill(seq: Sequence): void {
    const { blocks } = seq, ids = blocks.tokens, withTop = seq.topLogprobs > 0;
    try {
      this.#runner.admit(seq.slot, {
        table: blocks.table,
        tokens: ids,
        sampling: seq.sampling,
        seed: seq.seed,
        grammar: seq.grammar,
      });
    } catch (e) {
      // Its grammar's tables found no room (ArenaFullError, a 429): it ends before it began.
      seq.fail(e);
      this.#finish(seq);
      return;
    }
    this.#runner.prefill(
      seq.slot,
      ids,
      { from: blocks.computed, occupant: seq, withTop },
      (sub) => {
        this.#commit(sub);
        this.#host.prefillPeak = Math.max(this.#host.prefillPeak, this.#prefillQueued());
      },
    );
    blocks.markComputed(ids.length);
    seq.prefillSubmitted = true;
    seq.stepsSubmitted = 1; // the prefill's last chunk samples the first token
    this.#releaseDead(seq);
  }

  /**
   * Under a window, gives back the blocks no query still to be submitted reads: every query
   * before the sequence's last token is on the GPU (queue order protects those reads), and the
   * ones to come sit at or after it. A session's blocks stay whole: its next turn may rewind.
   */
  #releaseDead(seq: Sequence): void {
    if (!this.#mask || seq.slot < 0 || seq.request.sessionId !== undefined) return;
    releaseDead(seq.blocks, this.#mask, seq.allTokens().length - 1);
  }

  /**
   * Encodes the next decode steps of every live slot, without submitting them: nothing about
   * the sequences changes until {@linkcode #submitHeld}.
   */
  #encodeDecode(): Submission<Sequence> {
    const live = this.#sched.live();
    const withTop = live.some((s) => s && s.topLogprobs > 0);
    const width = live.findLastIndex(Boolean) + 1;
    const plan = this.#spec.plan(live.map((s) => s && { stats: s.spec, context: s.context }), {
      plain: this.#stepMs(`decode ${width}`),
      verify: (R) => this.#stepMs(`verify${R} ${width}`),
    });
    // Each slot's drafts, by its length group's depth (queue order: from this submission on).
    plan.caps.forEach((cap, slot) => live[slot] && this.#runner.setSpecCap(slot, cap));
    const steps = this.#sched.decodeSteps(live);
    // The most keys a slot can hold by the end of these steps (a verification step adds up to a
    // row per draft): the launch plan's length bucket.
    const R = plan.rows;
    const speculate = R > 1 ? { rows: R, check: plan.check } : undefined;
    const keys = Math.max(
      ...live.map((s) =>
        s
          ? Math.min(
            s.promptIds.length + s.sampling.maxTokens,
            s.blocks.tokens.length + (s.stepsSubmitted + steps) * R,
          )
          : 0
      ),
    );
    return this.#runner.decode(live, steps, { withTop, speculate, keys });
  }

  /** Submits the held decode submission and books its steps. */
  #submitHeld(): void {
    const sub = this.#held!;
    this.#held = undefined;
    for (const s of sub.o.slots) if (s) s.stepsSubmitted += sub.o.steps;
    this.#sched.submitted();
    this.#commit(sub);
  }

  /** Drops the held submission (the batch it was encoded for changed). */
  #dropHeld(): void {
    this.#held?.discard();
    this.#held = undefined;
  }

  /** Prompt tokens of the prefill chunks on the GPU since the last readback round. */
  #prefillQueued(): number {
    return this.#inflight.reduce((n, sub) => n + (sub.o.tokens ?? 0), 0);
  }

  /**
   * What a step of `work` costs: its GPU time (the pacer's) or the host's time to encode and
   * submit it, whichever is longer — the loop overlaps the two, so the slower bounds the rate
   * (for a small model the host's, where a verification pass's extra dispatches show).
   */
  #stepMs(work: string): number | undefined {
    const gpu = this.#pacer.estimate(work);
    return gpu === undefined ? undefined : Math.max(gpu, this.#hostMs.get(work) ?? 0);
  }

  /** Submits `sub` and queues it for readback. */
  #commit(sub: Submission<Sequence>): void {
    sub.submit();
    if (!sub.o.prefill && sub.o.steps > 0) {
      const per = sub.hostMs / sub.o.steps, old = this.#hostMs.get(sub.work);
      this.#hostMs.set(sub.work, old === undefined ? per : (old + per) / 2);
    }
    this.#host.submissions++;
    this.#host.steps += sub.o.steps;
    this.#host.ms += sub.hostMs;
    this.#inflight.push(sub);
  }

  /** Hands a finished submission's tokens to their sequences. */
  #process(sub: Submission<Sequence>): void {
    const moved = new Set<Sequence>();
    sub.read(
      (seq, token, logprob, alts, fingerprint) => {
        seq.accept(token, logprob, alts, fingerprint);
        if (seq.finished) this.#finish(seq);
        else if (this.#mask) moved.add(seq);
      },
      (seq) => (seq.gpuDone = true),
      (seq, step) => this.#spec.record(seq.spec, step, seq.context),
    );
    for (const seq of moved) this.#releaseDead(seq);
  }

  /**
   * Stops a sequence on the GPU and frees its slot and blocks at once. This is safe while
   * submissions that still use them are in flight: queue order puts every later write (a new
   * sequence's block table, state, KV) after those submissions' work.
   */
  #finish(seq: Sequence): void {
    if (seq.slot < 0) return;
    this.#runner.stop(seq.slot);
    this.#sched.vacate(seq);
    this.#release(seq);
  }

  /** Returns a finished sequence's blocks to the pool, or to its session (and snapshots it). */
  #release(seq: Sequence): void {
    const persisted = this.#sessions.release(seq.request.sessionId, seq.blocks, {
      tokens: seq.allTokens(),
      prefilled: seq.prefillSubmitted,
      ...(seq.request.sessionId !== undefined ? { turn: seq.turnRecord() } : {}),
    });
    seq.settle(persisted);
  }
}
