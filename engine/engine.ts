/**
 * The engine: loads a model folder onto the GPU and runs every request through one scheduler.
 * Requests are admitted into batch slots (prefill), then advance together, K steps per GPU
 * submission, with a few submissions queued ahead (see {@linkcode MAX_INFLIGHT}); the host reads
 * the token ring once per submission and streams tokens to each request's iterator.
 */
import type {
  EngineLike,
  GenerateRequest,
  Generation,
  GenerationResult,
  KvStats,
  SessionInfo,
  TokenEvent,
} from "../api/types.ts";
import { getGpu, type Gpu, isCpuAdapter } from "../gpu/device.ts";
import { loadModelFolder } from "./model/folder.ts";
import { type ModelConfig, ropeInvFreq } from "./model/config.ts";
import { TextTokenizer } from "./model/tokenizer.ts";
import { type ModelWeights, uploadWeights } from "./model/weights.ts";
import { KV_BYTES, type KvDtype } from "../gpu/dtype.ts";
import { blockBytes, Decoder } from "./runner/forward.ts";
import { BLOCK, BlockPool, SequenceBlocks } from "./kv/blocks.ts";
import { checkRequest, EngineBusyError, SessionBusyError } from "../api/errors.ts";
import { Sequence } from "./sched/sequence.ts";
import { Submission } from "./runner/submission.ts";
import { Pacer } from "./sched/pacer.ts";
import type { SessionStore } from "./sessions/store.ts";
import { Sessions } from "./sessions/sessions.ts";
import { packSampleParams, SAMPLE_PARAMS_BYTES } from "../kernels/sample.ts";

/** Options for {@linkcode Engine.load}. */
export interface EngineOptions {
  /** Sequences decoding together (default 16). */
  maxSlots?: number;
  /** Requests waiting for a slot before new ones get EngineBusyError (default 64). */
  maxQueued?: number;
  /** Longest prompt + completion (default min(model max positions, 2048)). */
  contextLength?: number;
  /** Prefill chunk in tokens (default 512; 256 on CPU adapters). */
  maxChunk?: number;
  /** Most decode steps per GPU submission (default 32; 4 on CPU adapters). */
  maxSteps?: number;
  /**
   * Decode steps queued on the GPU at once, in units of maxSteps (default 2), the one encoded
   * ahead and held for the next readback included: deeper keeps the GPU busy while K ramps up
   * and the host reads back, but tokens arrive in larger bursts and a new request's prefill
   * waits behind more queued work.
   */
  queueDepth?: number;
  /**
   * KV blocks (default: as many as fit in one binding, at most 4096 with an f32 cache and 8192
   * with an f16 one, the same memory).
   */
  kvBlocks?: number;
  /**
   * Element type of the KV cache (default f32). f16 halves the cache's memory and the bytes
   * decode attention reads; K and V are then rounded to f16 as they are written, so outputs
   * differ from an f32 cache by rounding (greedy tokens may part at near-ties).
   */
  kvDtype?: KvDtype;
  /** Where sessions are snapshotted after every turn and restored from at load (Deno KV). */
  store?: SessionStore;
  gpu?: Gpu;
}

/** What {@linkcode Engine.create} serves: a model's config, tokenizer and GPU weights. */
export interface EngineModel {
  id: string;
  config: ModelConfig;
  tokenizer: TextTokenizer;
  weights: ModelWeights;
}

const REGIONS = 8;
/**
 * Submissions queued on the GPU before the host waits for their readback. Each readback round
 * costs the host a yield to the event loop (≈ 2 ms) besides handing out tokens and encoding, so
 * while K ramps up (1, 2, 4, …) several are queued or the GPU idles: up to four, holding fewer
 * than (queueDepth − 1) × maxSteps steps, plus the one held for the moment the wait returns.
 */
const MAX_INFLIGHT = 4;
const TOP_K = 20;
/**
 * Decode steps after which a sequence's stream is protected from a burst's prefills (see
 * `#admit`): the first request of a burst starts alone, and the rest arrive within its first
 * rounds.
 */
const STREAMING_STEPS = 16;

/** The engine's host-side counters (see {@linkcode Engine.hostStats}). */
export interface HostStats {
  submissions: number;
  steps: number;
  ms: number;
  pacedMs: number;
  prefillPeak: number;
}

/** A model on the GPU and the scheduler that serves it. */
export class Engine implements EngineLike {
  readonly modelId: string;
  readonly adapterName: string;
  readonly contextLength: number;
  /** Element type of the KV cache. */
  readonly kvDtype: KvDtype;
  readonly pool: BlockPool;
  #slots: (Sequence | undefined)[];
  #waiting: Sequence[] = [];
  #inflight: Submission[] = [];
  /** The next decode submission, encoded ahead but not submitted (see {@linkcode #loop}). */
  #held?: Submission;
  readonly #sessions: Sessions;
  #region = 0;
  #running = false;
  /** Ends the loop's current yield to the event loop early (see {@linkcode #yield}). */
  #wake?: () => void;
  #nextK = 1;
  #host = { submissions: 0, steps: 0, ms: 0, pacedMs: 0, prefillPeak: 0 };
  /** GPU-time estimates: how long the loop may sleep before a readback. */
  readonly #pacer = new Pacer();

  private constructor(
    readonly gpu: Gpu,
    modelId: string,
    readonly tokenizer: TextTokenizer,
    readonly decoder: Decoder,
    readonly opts: Required<Omit<EngineOptions, "gpu" | "kvBlocks" | "store">>,
    store?: SessionStore,
  ) {
    this.modelId = modelId;
    this.adapterName = gpu.adapterName;
    this.contextLength = opts.contextLength;
    this.kvDtype = opts.kvDtype;
    this.pool = new BlockPool(decoder.opts.numBlocks);
    this.#slots = new Array(opts.maxSlots).fill(undefined);
    this.#sessions = new Sessions(decoder, this.pool, modelId, store);
  }

  /** Loads `dir` (an HF model folder) onto the GPU. */
  static async load(dir: string, options: EngineOptions = {}): Promise<Engine> {
    const gpu = options.gpu ?? await getGpu();
    const folder = await loadModelFolder(dir);
    const tokenizer = TextTokenizer.load(folder);
    const weights = await uploadWeights(gpu, folder, { invFreq: ropeInvFreq(folder.config) });
    const model = { id: folder.id, config: folder.config, tokenizer, weights };
    const engine = Engine.create(gpu, model, options);
    await engine.#sessions.restore();
    return engine;
  }

  /**
   * Builds an engine over weights already on the GPU (the bench's in-memory random shapes).
   *
   * @throws Error when the KV pool cannot hold one sequence of the context length.
   */
  static create(gpu: Gpu, model: EngineModel, options: EngineOptions = {}): Engine {
    const { config: cfg, tokenizer, weights } = model;
    const opts = {
      maxSlots: options.maxSlots ?? 16,
      maxQueued: options.maxQueued ?? 64,
      // Within Mistral's sliding window full attention is exact, so cap the context there.
      contextLength: Math.min(
        options.contextLength ?? Math.min(cfg.maxPositions, 2048),
        cfg.slidingWindow ?? Infinity,
      ),
      // A chunk fills the GPU's matmuls better the longer it is: on an H200, 512-token chunks
      // prefill a 512-token prompt at 9 200 tok/s, 256-token chunks at 6 500. On a CPU
      // adapter a chunk blocks the event loop until it finishes.
      maxChunk: options.maxChunk ?? (isCpuAdapter(gpu) ? 256 : 512),
      // On a CPU adapter a submission blocks Deno's event loop until it finishes: keep it short
      // so cancels, pings and other requests are served between submissions.
      maxSteps: options.maxSteps ?? (isCpuAdapter(gpu) ? 4 : 32),
      queueDepth: options.queueDepth ?? 2,
      kvDtype: options.kvDtype ?? "f32",
    };
    const perPool = Math.floor(gpu.maxBinding / blockBytes(cfg, opts.kvDtype));
    // The default is a memory budget, 4096 f32 blocks' worth: an f16 cache holds twice the tokens.
    const budget = Math.floor((4096 * KV_BYTES.f32) / KV_BYTES[opts.kvDtype]);
    if (
      options.kvBlocks !== undefined &&
      !(Number.isInteger(options.kvBlocks) && options.kvBlocks >= 2)
    ) {
      throw new Error(`--kv-blocks must be an integer >= 2; got ${options.kvBlocks}`);
    }
    const numBlocks = Math.min(options.kvBlocks ?? budget, perPool);
    const need = Math.ceil(opts.contextLength / BLOCK) + 1;
    if (numBlocks < need) {
      throw new Error(
        `KV pool of ${numBlocks} blocks cannot hold one ${opts.contextLength}-token sequence; ` +
          `lower --context-length`,
      );
    }
    const decoder = new Decoder(gpu, cfg, weights, {
      maxSlots: opts.maxSlots,
      maxChunk: opts.maxChunk,
      contextLength: opts.contextLength,
      numBlocks,
      maxSteps: opts.maxSteps,
      regions: REGIONS,
      topK: TOP_K,
      kvDtype: opts.kvDtype,
    }, tokenizer.eosIds);
    return new Engine(gpu, model.id, tokenizer, decoder, opts, options.store);
  }

  encode(text: string): number[] {
    return this.tokenizer.encode(text);
  }

  encodeChat(messages: { role: string; content: string }[]): number[] {
    return this.tokenizer.encodeChat(messages);
  }

  decode(ids: number[]): string {
    return this.tokenizer.decode(ids);
  }

  occupancy() {
    return {
      running: this.#slots.filter(Boolean).length,
      queued: this.#waiting.length,
      maxRunning: this.opts.maxSlots,
      maxQueued: this.opts.maxQueued,
    };
  }

  kvStats(): KvStats {
    const snap = this.#sessions.snapshotStats();
    const stored = this.#sessions.storedBlocks();
    return {
      blockTokens: BLOCK,
      dtype: this.kvDtype,
      gpu: { used: this.pool.usedCount, total: this.pool.blocks.length - 1 },
      // Blocks held by session snapshots in Deno KV (warm) and in files (cold); chunks shared
      // by sessions count once per session.
      kv: { used: stored.kv },
      fs: { used: stored.fs },
      snapshotBlocks: { copied: snap.blocksCopied, reused: snap.blocksReused },
    };
  }

  session(id: string): SessionInfo | undefined {
    return this.#sessions.get(id)?.info;
  }

  /** Every session the engine knows. */
  sessions(): SessionInfo[] {
    return this.#sessions.list();
  }

  /** Called with a session's id whenever what {@linkcode session} reports of it changes. */
  set onSessionChange(fn: ((id: string) => void) | undefined) {
    this.#sessions.onChange = fn;
  }

  deleteSession(id: string): Promise<boolean> {
    return this.#sessions.delete(id);
  }

  /** Resolves when every session snapshot started so far is written. */
  flushSnapshots(): Promise<void> {
    if (!this.#running) this.#sessions.startReads();
    return this.#sessions.flush();
  }

  /**
   * Starts a generation. With `onToken`, tokens are handed to it as the host reads them back
   * (synchronously, in order) instead of to the generation's iterator, which then yields none:
   * engine/worker/worker.ts forwards a whole readback round in one message this way.
   *
   * @throws ContextLengthError, EngineBusyError, SessionBusyError, InvalidRequestError
   */
  generate(request: GenerateRequest, onToken?: (ev: TokenEvent) => void): Generation {
    // The engine's own copy: a caller may reuse its array (e.g. append the reply to it).
    request = { ...request, promptIds: [...request.promptIds] };
    const { promptIds } = request;
    checkRequest(request, this.decoder.cfg.vocabSize, this.contextLength);
    if (this.#waiting.length >= this.opts.maxQueued) {
      throw new EngineBusyError(this.#waiting.length);
    }
    let blocks: SequenceBlocks;
    let cached = 0;
    const session = request.sessionId ? this.#sessions.get(request.sessionId) : undefined;
    if (session?.busy) throw new SessionBusyError(request.sessionId!);
    if (session) {
      blocks = session.blocks;
      let common = 0;
      while (
        common < blocks.computed && common < promptIds.length - 1 &&
        blocks.tokens[common] === promptIds[common]
      ) common++;
      blocks.truncate(common);
      cached = blocks.computed;
      blocks.appendPrompt(promptIds.slice(blocks.tokens.length));
      session.busy = true;
    } else {
      blocks = new SequenceBlocks(this.pool);
      cached = blocks.appendPrompt(promptIds);
      if (request.sessionId) this.#sessions.create(request.sessionId, blocks);
    }
    const seq = new Sequence({
      request,
      blocks,
      cached,
      tokenizer: this.tokenizer,
      cancel: (s) => this.#cancel(s),
      onToken,
    });
    this.#waiting.push(seq);
    request.signal?.addEventListener("abort", () => seq.cancel(), { once: true });
    this.#kick();
    return seq.generation;
  }

  #kick(): void {
    if (this.#running) return this.#wake?.(); // new work: stop yielding
    this.#running = true;
    this.#loop().catch((e) => {
      // A GPU or internal failure ends every request with the error and drops their KV (it may
      // be garbage); slots are stopped on the GPU, so the engine stays usable.
      const q = this.gpu.device.queue;
      for (const seq of [...this.#waiting, ...this.#slots]) {
        if (!seq) continue;
        seq.fail(e);
        if (seq.slot >= 0) {
          q.writeBuffer(this.decoder.step.slotState, seq.slot * 16, Uint32Array.of(1, 0, 0, 0));
          seq.slot = -1;
        }
        seq.blocks.free();
        this.#sessions.abandon(seq.request.sessionId);
      }
      this.#waiting = [];
      this.#slots.fill(undefined);
      this.#inflight = [];
      this.#dropHeld();
    }).finally(() => {
      this.#running = false;
      this.#sessions.startReads(); // no readback round is coming to request them
      if (this.#waiting.length) this.#kick();
    });
  }

  /**
   * The scheduler. Waiting for a readback blocks the host until the GPU has finished everything
   * submitted (Deno's `mapAsync`, see engine/runner/submission.ts), so the loop keeps one decode
   * submission encoded but not submitted (`#held`) and submits it the moment that wait returns:
   * the GPU then works while the host reads back, hands out tokens, yields to the event loop
   * and encodes the next one.
   * Before waiting, held submissions are submitted outright while fewer than
   * `(queueDepth − 1) · maxSteps` decode steps are queued (early in a generation, K is small
   * next to the host's work per readback round), but not behind a prefill that yields a first
   * token, so that token is not held back by decode steps.
   * Before a readback of work whose GPU time it has measured (decode steps, prefill chunks),
   * the loop sleeps until shortly before the GPU should finish it (engine/sched/pacer.ts), so
   * the wait that blocks the event loop is short: HTTP and WebSocket traffic runs during most
   * of a generation.
   */
  async #loop(): Promise<void> {
    while (true) {
      this.#admit();
      const active = this.#slots.some((s) => s && !s.finished && !s.gpuFinished);
      // The held submission is submitted before every await, so neither of these drops ever
      // finds one today; they keep a buffer encoded for another batch from ever running.
      if (!active) this.#dropHeld();
      if (active && !this.#held) {
        this.#held = this.#encodeDecode();
        continue;
      }
      const queued = this.#inflight.reduce((n, sub) => n + sub.o.steps, 0);
      const firstToken = this.#inflight.some((sub) => sub.o.prefill && sub.o.steps > 0);
      if (
        this.#held && (this.#inflight.length === 0 ||
          (!firstToken && this.#inflight.length < MAX_INFLIGHT &&
            queued < (this.opts.queueDepth - 1) * this.opts.maxSteps))
      ) {
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
      // Readbacks resolve at once (gpu/readback.ts): without this the loop would hold the
      // event loop until no sequence runs, and streams would flush only at the end.
      await this.#yield();
    }
  }

  /**
   * Returns to the event loop for `ms` (default: one timer's wait), or until new work arrives
   * when that is a sleep (`ms` > 0) or no sequence runs: sockets, timers and other I/O get their
   * turn. Needed because readbacks block the event loop until the GPU is done and then resolve
   * without a timer (gpu/readback.ts): a loop awaiting only them would never let the event
   * loop poll, and HTTP writes and new connections would wait for the generation to end.
   *
   * `setTimeout(0)` takes ≈ 2 ms (p50, dev machine and the H200's host), which the GPU covers
   * while it runs the held submission. A request arriving meanwhile cuts it short only when no
   * sequence runs (then it does not add to the first token's time); while streams run it waits
   * (≤ 2 ms), or a burst of arrivals, each cutting the yield short, kept timers from running for
   * 160 ms. Cheaper yields fall short: `setImmediate` and `MessageChannel` return without
   * polling sockets, and awaiting a fast async op (≈ 40 µs) polls them once, so a request
   * needing a few round trips through the loop waited several readbacks.
   */
  async #yield(ms = 0): Promise<void> {
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, ms);
      if (ms > 0 || !this.#slots.some(Boolean)) {
        this.#wake = () => {
          clearTimeout(timer);
          resolve();
        };
      }
    });
    this.#wake = undefined;
  }

  /** Moves waiting sequences into free slots when their blocks fit; submits their prefill. */
  #admit(): void {
    while (this.#waiting.length) {
      const seq = this.#waiting[0];
      if (seq.finished) {
        this.#waiting.shift();
        this.#release(seq);
        continue;
      }
      const slot = this.#slots.findIndex((s) => s === undefined);
      if (slot < 0) return;
      // While streams run, at most a chunk's worth of prompt tokens per readback round (unless
      // one prompt alone is longer): the round's readback blocks the engine's thread until the
      // GPU has done them all, so a burst of requests held the streams for every prefill
      // (0.3–1.2 s for 12 sessions' 256-token turns beside a generation on the H200). A burst
      // that only finds sequences of its own (started within STREAMING_STEPS steps) is
      // admitted whole, so that they decode together: spread over rounds, the first ones
      // finished early, and batch 32 in the bench decoded 6 % slower.
      const todo = seq.blocks.tokens.length - seq.blocks.computed, queued = this.#prefillQueued();
      const streaming = this.#slots.some((s) => s && s.stepsSubmitted > STREAMING_STEPS);
      if (streaming && queued > 0 && queued + todo > this.opts.maxChunk) {
        return;
      }
      const total = seq.blocks.tokens.length + seq.sampling.maxTokens;
      const need = () => Math.ceil(total / BLOCK) - seq.blocks.table.length;
      if (need() > this.pool.freeCount) this.#sessions.evict(need());
      if (need() > this.pool.freeCount) {
        // Running sequences will give blocks back (to the pool, or to their sessions, which
        // then become idle and evictable).
        if (this.#slots.some((s) => s) || this.#inflight.length) return;
        // Nothing runs: the rest is held by sessions whose next turns wait behind this one.
        // Without this they and it would wait for each other forever; their turns prefill
        // their whole prompts instead, newest first.
        for (const other of this.#waiting.slice(1).reverse()) {
          if (need() <= this.pool.freeCount) break;
          other.dropKv();
        }
        if (need() > this.pool.freeCount) {
          this.#waiting.shift();
          seq.fail(new Error(`internal error: the KV pool cannot hold ${total} tokens`));
          seq.blocks.free();
          this.#sessions.abandon(seq.request.sessionId);
          continue;
        }
      }
      this.#waiting.shift();
      seq.blocks.reserve(total);
      seq.slot = slot;
      this.#slots[slot] = seq;
      this.#dropHeld(); // it would lack this sequence's slot (see #loop)
      this.#prefill(seq);
      this.#nextK = 1;
    }
  }

  #prefill(seq: Sequence): void {
    const d = this.decoder, q = this.gpu.device.queue, V = d.cfg.vocabSize, slot = seq.slot;
    const table = new Uint32Array(d.maxBlocks); // last column stays 0: the trash block
    table.set(seq.blocks.table.slice(0, d.maxBlocks - 1));
    q.writeBuffer(d.blockTable, slot * d.maxBlocks * 4, table);
    const counts = new Uint32Array(V);
    for (const t of seq.blocks.tokens) counts[t] = 0x80000000;
    q.writeBuffer(d.step.counts, slot * V * 4, counts);
    q.writeBuffer(
      d.params,
      slot * SAMPLE_PARAMS_BYTES,
      packSampleParams({ ...seq.sampling, seed: seq.seed }),
    );
    const stopAtEos = seq.sampling.stopAtEos === false ? 0 : 1;
    q.writeBuffer(
      d.step.slotState,
      slot * 16,
      Uint32Array.of(0, seq.sampling.maxTokens, stopAtEos, 0),
    );
    const ids = seq.blocks.tokens;
    q.writeBuffer(d.step.seqLen, slot * 4, Uint32Array.of(ids.length));
    const chunk = this.opts.maxChunk;
    for (let p = seq.blocks.computed; p < ids.length; p += chunk) {
      const part = ids.slice(p, Math.min(p + chunk, ids.length));
      const last = p + part.length === ids.length;
      d.writePrefill(part, slot, p);
      const region = this.#nextRegion();
      const dispatches = d.prefill(part.length, {
        slot,
        pos0: p,
        last,
        region,
        withTop: seq.sampling.topLogprobs > 0,
      });
      const slots = new Array(this.opts.maxSlots).fill(undefined);
      slots[slot] = seq;
      const sub = new Submission(this.decoder, dispatches, {
        region,
        steps: last ? 1 : 0,
        slots,
        top: seq.sampling.topLogprobs > 0,
        prefill: true,
        rows: d.prefillRows(part.length),
        tokens: part.length,
      });
      this.#commit(sub);
      this.#host.prefillPeak = Math.max(this.#host.prefillPeak, this.#prefillQueued());
    }
    seq.blocks.markComputed(ids.length);
    seq.prefillSubmitted = true;
    seq.stepsSubmitted = 1; // the prefill's last chunk samples the first token
  }

  /**
   * Encodes the next K decode steps of every live slot, without submitting them: nothing about
   * the sequences changes until {@linkcode #submitHeld}.
   */
  #encodeDecode(): Submission {
    const live = this.#slots.map((s) => (s && !s.finished && !s.gpuFinished ? s : undefined));
    const S = live.findLastIndex(Boolean) + 1;
    const remaining = Math.max(...live.map((s) => (s ? s.gpuRemaining : 0)));
    const K = Math.max(1, Math.min(this.#nextK, this.opts.maxSteps, remaining));
    const withTop = live.some((s) => s && s.sampling.topLogprobs > 0);
    const region = this.#nextRegion();
    const dispatches = [];
    for (let k = 0; k < K; k++) dispatches.push(...this.decoder.decodeStep(S, region, k, withTop));
    return new Submission(this.decoder, dispatches, {
      region,
      steps: K,
      slots: live,
      top: withTop,
    });
  }

  /** Submits the held decode submission and books its steps. */
  #submitHeld(): void {
    const sub = this.#held!;
    this.#held = undefined;
    for (const s of sub.o.slots) if (s) s.stepsSubmitted += sub.o.steps;
    this.#nextK = Math.min(this.opts.maxSteps, this.#nextK * 2);
    this.#commit(sub);
  }

  /** Drops the held submission (the batch it was encoded for changed). */
  #dropHeld(): void {
    this.#held?.discard();
    this.#held = undefined;
  }

  #nextRegion(): number {
    return (this.#region = (this.#region + 1) % REGIONS);
  }

  /** Prompt tokens of the prefill chunks on the GPU since the last readback round. */
  #prefillQueued(): number {
    return this.#inflight.reduce((n, sub) => n + (sub.o.tokens ?? 0), 0);
  }

  /** Submits `sub` and queues it for readback. */
  #commit(sub: Submission): void {
    sub.submit();
    this.#host.submissions++;
    this.#host.steps += sub.o.steps;
    this.#host.ms += sub.hostMs;
    this.#inflight.push(sub);
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

  /** Hands a finished submission's tokens to their sequences. */
  #process(sub: Submission): void {
    sub.read((seq, token, logprob, alts) => {
      seq.accept(token, logprob, alts);
      if (seq.finished) this.#finish(seq);
    }, (seq) => (seq.gpuDone = true));
  }

  #cancel(seq: Sequence): void {
    if (seq.slot >= 0) {
      this.#finish(seq);
      if (!this.#running) this.#sessions.startReads(); // no readback round is coming
    } else this.#kick();
  }

  /**
   * Stops a sequence on the GPU and frees its slot and blocks at once. This is safe while
   * submissions that still use them are in flight: queue order puts every later write (a new
   * sequence's block table, state, KV) after those submissions' work.
   */
  #finish(seq: Sequence): void {
    if (seq.slot < 0) return;
    const q = this.gpu.device.queue;
    q.writeBuffer(this.decoder.step.slotState, seq.slot * 16, Uint32Array.of(1, 0, 0, 0));
    this.#slots[seq.slot] = undefined;
    seq.slot = -1;
    this.#release(seq);
  }

  /** Returns a finished sequence's blocks to the pool, or to its session. */
  #release(seq: Sequence): void {
    const id = seq.request.sessionId;
    const session = id ? this.#sessions.get(id) : undefined;
    if (!session) return seq.blocks.free();
    // The session keeps prompt + accepted output; the last token's KV is not written yet.
    const b = seq.blocks, tokens = seq.allTokens();
    if (seq.prefillSubmitted) {
      b.tokens.push(...tokens.slice(b.tokens.length));
      b.markComputed(tokens.length - 1);
    }
    b.truncate(seq.prefillSubmitted ? tokens.length : b.computed);
    session.busy = false;
    session.info.tokens = b.computed;
    session.info.updatedAt = Date.now();
    this.#sessions.snapshot(session);
  }
}

export type { GenerationResult };
