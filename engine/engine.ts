/**
 * The engine: loads a model onto the GPU and serves every request through one scheduler. The
 * parts, each with one owner: the KV pool (engine/kv/pool.ts), the runner and its per-slot GPU
 * state (engine/runner/), the sessions and their snapshots (engine/sessions/), the scheduler's
 * policy and the loop that carries it out (engine/sched/). This façade builds them, turns a
 * request into a sequence (reusing its session's or the prefix cache's KV) and answers questions
 * about them.
 */
import type {
  ChatMessage,
  ChatRenderOptions,
  Constraint,
  ConstraintSpec,
  EngineLike,
  GenerateRequest,
  Generation,
  GenerationResult,
  KvStats,
  PrecisionStats,
  ReplayReport,
  SessionInfo,
  SpeculationStats,
  TokenEvent,
} from "../api/types.ts";
import {
  checkRequest,
  EngineBusyError,
  InvalidRequestError,
  SessionBusyError,
} from "../api/errors.ts";
import { getGpu, type Gpu } from "../gpu/device.ts";
import type { KvDtype } from "../gpu/dtype.ts";
import type { Dispatch } from "../gpu/dispatch.ts";
import { type ModelConfig, ropeInvFreq } from "./model/config.ts";
import { loadModelFolder } from "./model/folder.ts";
import type { GpuModel } from "./model/gpu_model.ts";
import { TextTokenizer } from "./model/tokenizer.ts";
import { decodeBytes, type ModelWeights, uploadWeights } from "./model/weights.ts";
import { BLOCK, scopeRoot, SequenceBlocks } from "./kv/blocks.ts";
import { KvPool } from "./kv/pool.ts";
import { Runner } from "./runner/runner.ts";
import { hotWindowItems, Reencoder } from "./runner/reencode.ts";
import type { SessionStore } from "./sessions/store.ts";
import { Sessions } from "./sessions/sessions.ts";
import { type HostStats, Loop } from "./sched/loop.ts";
import { Scheduler } from "./sched/scheduler.ts";
import { Sequence } from "./sched/sequence.ts";
import { SpeculationPolicy, type SpeculationTuning } from "./sched/speculation.ts";
import { ConstraintCompiler, ConstraintImages } from "./constraints.ts";
import { replayTurns } from "./replay.ts";
import { kvStatsOf } from "./kv_stats.ts";
import {
  codecBlocks,
  type EngineOptions,
  poolBlocks,
  type Settled,
  settleOptions,
} from "./options.ts";
import type { KvTiers } from "./kv/tiers.ts";
import type { FileTier } from "./kv/tier_file.ts";
import { buildTiers, openFileTier, profileTiers } from "./tiers_setup.ts";
import { PrecisionPolicy, type PrecisionThresholds } from "./sched/precision.ts";
import { precisionStats } from "./sched/precision_stats.ts";

export type { EngineOptions, HostStats };

/** Ring regions: submissions in flight plus prefill chunks, with room to spare. */
const REGIONS = 8;
/** Alternatives kept per token for top_logprobs (the API allows up to 20). */
const TOP_K = 20;

/** The options {@linkcode Engine.create} settled on. */
/** A model on the GPU and the scheduler that serves it. */
export class Engine implements EngineLike {
  readonly modelId: string;
  readonly adapterName: string;
  readonly contextLength: number;
  /** Element type of the KV cache. */
  readonly kvDtype: KvDtype;
  /** The model's config. */
  readonly config: ModelConfig;
  readonly tokenizer: TextTokenizer;
  /** The runner (per-slot GPU state, dispatch builders): for tests and profiling. */
  readonly runner: Runner<Sequence>;
  readonly #kv: KvPool;
  readonly #sched: Scheduler;
  readonly #sessions: Sessions;
  readonly #loop: Loop;
  readonly #weights: ModelWeights;
  readonly #speculation: SpeculationPolicy;
  readonly #compiler: ConstraintCompiler;
  readonly #images = new ConstraintImages();
  /** A score runs: it uses slot 0, so no generation may start meanwhile. */
  #scoring = false;
  /** Which precision each layer runs at (the monitor's measurements decide). */
  readonly #precision: PrecisionPolicy;
  /** The tiers below the GPU (host memory, spill files), when the options ask for them. */
  readonly #tiers?: KvTiers;
  /** With a KV codec: moves blocks behind the hot window into codec blocks. */
  readonly #reencoder?: Reencoder;

  private constructor(
    readonly gpu: Gpu,
    model: GpuModel,
    readonly opts: Settled,
    parts: {
      kv: KvPool;
      runner: Runner<Sequence>;
      compiler: ConstraintCompiler;
      store?: SessionStore;
      precision?: Partial<PrecisionThresholds>;
      speculation?: Partial<SpeculationTuning>;
      tiers?: KvTiers;
    },
  ) {
    this.modelId = model.id;
    this.tokenizer = model.tokenizer;
    this.config = model.config;
    this.#weights = model.weights;
    this.adapterName = gpu.adapterName;
    this.contextLength = opts.contextLength;
    this.kvDtype = opts.kvDtype;
    this.#kv = parts.kv;
    this.runner = parts.runner;
    this.#compiler = parts.compiler;
    this.#sched = new Scheduler(opts);
    this.#tiers = parts.tiers;
    this.#sessions = new Sessions(parts.kv, model.id, parts.store, parts.tiers);
    this.#speculation = new SpeculationPolicy({
      rows: this.runner.specRows,
      mode: opts.speculate,
      tuning: parts.speculation,
    });
    const reencoder = parts.kv.region && new Reencoder(parts.kv, this.runner, opts.kvHot);
    this.#reencoder = reencoder;
    this.#loop = new Loop({
      runner: this.runner,
      scheduler: this.#sched,
      sessions: this.#sessions,
      speculation: this.#speculation,
      mask: opts.mask,
      afterRound: reencoder &&
        (() => reencoder.pass(hotWindowItems(this.#sched.slots, this.#sessions.table))),
    });
    const monitor = this.runner.monitor;
    this.#precision = new PrecisionPolicy({
      canFallBack: monitor.canFallBack,
      thresholds: parts.precision,
    });
    monitor.onObserve = (batch) => {
      for (const c of this.#precision.observe(batch)) monitor.setPrecise(c.layer, c.precise);
    };
  }

  /** Loads `dir` (an HF model folder) onto the GPU, and its sessions from the store. */
  static async load(dir: string, options: EngineOptions = {}): Promise<Engine> {
    const gpu = options.gpu ?? await getGpu();
    const folder = await loadModelFolder(dir);
    const tokenizer = TextTokenizer.load(folder);
    const weights = await uploadWeights(gpu, folder, {
      invFreq: ropeInvFreq(folder.config),
      quantize: options.quantize,
      fallback: options.fallback,
    });
    const model = { id: folder.id, config: folder.config, tokenizer, weights };
    const engine = await Engine.open(gpu, model, options);
    await engine.#sessions.restore();
    return engine;
  }

  /**
   * Builds an engine over weights already on the GPU (the bench's in-memory random shapes),
   * without a spill folder (see {@linkcode open}).
   *
   * @throws Error when the KV pool cannot hold one sequence of the context length.
   */
  static create(gpu: Gpu, model: GpuModel, options: EngineOptions = {}): Engine {
    return Engine.#create(gpu, model, options, undefined);
  }

  /**
   * {@linkcode create}, with the tiers below the GPU whole: the spill folder opened and the
   * start-up profile measured (engine/kv/profile.ts). Sessions in the store are not restored
   * ({@linkcode load} does that).
   *
   * @throws Error when the KV pool cannot hold one sequence of the context length, or an option
   *   is out of range
   */
  static async open(gpu: Gpu, model: GpuModel, options: EngineOptions = {}): Promise<Engine> {
    const engine = Engine.#create(gpu, model, options, await openFileTier(options));
    if (engine.#tiers) await profileTiers(engine.#tiers, engine, options.store);
    return engine;
  }

  static #create(gpu: Gpu, model: GpuModel, options: EngineOptions, file?: FileTier): Engine {
    const { config: cfg, tokenizer, weights } = model;
    const opts = settleOptions(gpu, cfg, options);
    const numBlocks = poolBlocks(gpu, cfg, opts, options.kvBlocks);
    const kv = new KvPool(gpu, cfg, {
      numBlocks,
      dtype: opts.kvDtype,
      codec: opts.kvCodec,
      codecBlocks: codecBlocks(gpu, cfg, opts, numBlocks),
    });
    const compiler = new ConstraintCompiler(tokenizer, cfg.vocabSize);
    const runner = new Runner<Sequence>(gpu, cfg, weights, {
      kv,
      eosIds: tokenizer.eosIds,
      tokenBytes: () => compiler.tokenBytes(),
      options: {
        maxSlots: opts.maxSlots,
        maxChunk: opts.maxChunk,
        contextLength: opts.contextLength,
        maxSteps: opts.maxSteps,
        regions: REGIONS,
        topK: TOP_K,
        specRows: opts.speculate === "off" ? 1 : opts.drafts + 1,
        mask: opts.mask,
        draftPool: options.speculation?.pool ?? true,
      },
    });
    const { precision, store } = options, { pool: _, ...speculation } = options.speculation ?? {};
    const tiers = buildTiers(kv, options, file);
    const parts = { kv, runner, compiler, store, precision, speculation, tiers };
    return new Engine(gpu, model, opts, parts);
  }

  encode(text: string): number[] {
    return this.tokenizer.encode(text);
  }

  encodeChat(messages: ChatMessage[], options?: ChatRenderOptions): number[] {
    return this.tokenizer.encodeChat(messages, options);
  }

  decode(ids: number[]): string {
    return this.tokenizer.decode(ids);
  }

  /** {@linkcode encode}, as a promise: this engine's caller is its own thread anyway. */
  tokenize(text: string): Promise<number[]> {
    return Promise.resolve().then(() => this.encode(text));
  }

  tokenizeChat(messages: ChatMessage[], options?: ChatRenderOptions): Promise<number[]> {
    return Promise.resolve().then(() => this.encodeChat(messages, options));
  }

  detokenize(ids: number[]): Promise<string> {
    return Promise.resolve().then(() => this.decode(ids));
  }

  knowsToken(id: number): boolean {
    return this.tokenizer.knows(id);
  }

  /** Compiles `spec` on this thread (engine/constraints.ts; the worker engine compiles apart). */
  compileConstraint(spec: ConstraintSpec, path?: string): Promise<Constraint> {
    return Promise.resolve().then(() => {
      const c = this.#compiler.compile(spec, path);
      this.#images.register(c.key, c.image);
      return { key: c.key, minTokens: c.minTokens };
    });
  }

  /**
   * Runs the session's recorded turns again and compares tokens and fingerprints
   * (engine/replay.ts).
   *
   * @throws InvalidRequestError when there is no such session
   */
  replaySession(id: string): Promise<ReplayReport> {
    const s = this.#sessions.table.get(id);
    if (!s) return Promise.reject(new InvalidRequestError(`no session '${id}'`, "session_id"));
    return replayTurns(this, id, s.turns ?? []);
  }

  /** Keeps a constraint compiled elsewhere (the worker engine's tokenizer workers). */
  registerConstraint(key: string, image: Uint32Array): void {
    this.#images.register(key, image);
  }

  /** The weights' element type, their bytes on the GPU, and how the projections are held. */
  get weights(): Pick<ModelWeights, "dtype" | "bytes" | "quant"> & { decodeBytes: number } {
    const w = this.#weights;
    return { dtype: w.dtype, bytes: w.bytes, quant: w.quant, decodeBytes: decodeBytes(w) };
  }

  /** Each layer's precision and the monitor's counts (for /metrics and /health). */
  precisionStats(): PrecisionStats {
    return precisionStats(this.#weights, this.runner.monitor, this.#precision);
  }

  occupancy() {
    return {
      running: this.#sched.running,
      queued: this.#sched.queued,
      maxRunning: this.opts.maxSlots,
      maxQueued: this.opts.maxQueued,
    };
  }

  kvStats(): KvStats {
    return kvStatsOf({
      kv: this.#kv,
      sessions: this.#sessions,
      kvHot: this.opts.kvHot,
      reencoded: this.#reencoder?.total ?? 0,
      tiers: this.#tiers,
    });
  }

  speculationStats(): SpeculationStats {
    return this.#speculation.stats();
  }

  setSpeculation(mode: "off" | "auto"): Promise<void> {
    try {
      if (mode !== "off" && mode !== "auto") {
        throw new Error(`mode must be "off" or "auto"; got ${JSON.stringify(mode)}`);
      }
      this.#speculation.setMode(mode);
      return Promise.resolve();
    } catch (e) {
      return Promise.reject(new InvalidRequestError((e as Error).message, "mode"));
    }
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

  /**
   * Resolves when every session snapshot started so far is written, and every spill of an
   * evicted session's KV has landed in its tier.
   */
  flushSnapshots(): Promise<void> {
    if (!this.#loop.running) this.#sessions.startReads();
    return this.#sessions.flush();
  }

  /** The loop's host-side counters (see {@linkcode HostStats}). */
  hostStats(): HostStats {
    return this.#loop.hostStats();
  }

  /**
   * The dispatches of one decode step over slots [0, slots) at `context` keys each, for timing
   * (scripts/bench_profile.ts). Only while the engine is idle: every slot is done then, so the
   * step writes KV to the trash block and records no token.
   */
  profileDecodeStep(slots: number, context: number, k = 0): Dispatch[] {
    return this.runner.profileDecodeStep(slots, context, k);
  }

  /**
   * The dispatches of one verification pass of `rows` rows per slot (default the engine's) over
   * slots [0, slots) at `context` keys, every row live, for timing; call
   * {@linkcode profileDone} after. Only while idle.
   */
  profileVerifyStep(slots: number, context: number, k = 0, rows?: number): Dispatch[] {
    return this.runner.profileVerifyStep(slots, context, k, rows);
  }

  /** Ends a profile of slots [0, slots): they are done again. */
  profileDone(slots: number): void {
    this.runner.profileDone(slots);
  }

  /** The dispatches of one prefill chunk of `tokens` tokens, for timing (only while idle). */
  profilePrefill(tokens: number): Dispatch[] {
    return this.runner.profilePrefill(tokens);
  }

  /**
   * Log-probabilities of `ids[1..]`, each given the tokens before it: how likely the model finds
   * a text (perplexity). Runs on the GPU in prefill-sized chunks, only while the engine is idle.
   *
   * @returns `ids.length − 1` natural-log probabilities
   * @throws Error while requests run or wait, or when `ids` is longer than the context
   */
  async score(ids: readonly number[]): Promise<Float64Array> {
    if (this.#sched.running || this.#sched.queued) {
      throw new Error("score needs an idle engine: wait for the running requests");
    }
    await this.#loop.idle(); // the last readbacks of requests that just ended
    if (this.#scoring) throw new Error("score needs an idle engine: another score runs");
    if (ids.length > this.contextLength) {
      throw new Error(`cannot score ${ids.length} tokens: the context is ${this.contextLength}`);
    }
    const bad = ids.find((t) => !(Number.isInteger(t) && t >= 0 && t < this.config.vocabSize));
    if (bad !== undefined) {
      throw new Error(`token id ${bad} is outside the vocabulary [0, ${this.config.vocabSize})`);
    }
    const blocks = new SequenceBlocks(this.#kv.blocks);
    this.#scoring = true; // slot 0 is ours meanwhile: generate() waits (see #scoring)
    try {
      blocks.reserve(ids.length);
      // With a codec, a block at a time, re-encoding what falls behind the hot window in
      // between: later chunks read codec blocks as decoding would (docs/kv_codecs.md).
      const r = this.#reencoder;
      return await this.runner.score(
        ids,
        blocks.table,
        r ? { chunk: BLOCK, afterChunk: (written) => r.pass([{ blocks, written, slot: 0 }]) } : {},
      );
    } finally {
      blocks.free();
      this.#scoring = false;
    }
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
    checkRequest(request, this.config.vocabSize, this.contextLength);
    if (this.#scoring) throw new EngineBusyError(0);
    this.#sched.checkRoom();
    const table = this.#sessions.table;
    const session = request.sessionId ? table.get(request.sessionId) : undefined;
    if (session?.busy) throw new SessionBusyError(request.sessionId!);
    const grammar = request.constraint && this.#images.get(request.constraint);
    const root = scopeRoot(request.tenant);
    if (session && session.blocks.root !== root) {
      // The routes give each tenant its own session ids: a mismatch is a bug, not a request.
      throw new Error(`internal error: session '${request.sessionId}' is another tenant's`);
    }
    let blocks: SequenceBlocks, cached: number;
    if (session) {
      // The session's tokens the prompt starts with keep their KV (the last prompt token is
      // always computed again: its logits start the generation).
      blocks = session.blocks;
      let common = 0;
      while (
        common < blocks.computed && common < promptIds.length - 1 &&
        blocks.tokens[common] === promptIds[common]
      ) common++;
      blocks.truncate(common);
      cached = blocks.computed;
      cached += blocks.appendPrompt(promptIds.slice(blocks.tokens.length));
      table.startTurn(session);
    } else {
      blocks = new SequenceBlocks(this.#kv.blocks, root);
      cached = blocks.appendPrompt(promptIds);
      if (request.sessionId) table.create(request.sessionId, blocks);
    }
    // What the GPU lacks of the prompt may be below it: its reads start now (engine/kv/tiers.ts).
    const restore = this.#sessions.planRestore(blocks, request.sessionId);
    const seq = new Sequence({
      request,
      blocks,
      cached,
      tokenizer: this.tokenizer,
      cancel: (s) => this.#loop.cancel(s),
      onToken,
      durable: this.opts.kvSync && request.sessionId !== undefined,
      // A grammar's state advances a token per step: its slot does not speculate.
      speculate: this.runner.specRows > 1 && request.speculation !== false && !grammar,
      grammar,
      restore,
    });
    const entry = request.sessionId ? table.get(request.sessionId) : undefined;
    if (entry) entry.simhash = seq.simhash;
    this.#sched.enqueue(seq);
    restore?.done.then(() => this.#loop.kick());
    request.signal?.addEventListener("abort", () => seq.cancel(), { once: true });
    this.#loop.kick();
    return seq.generation;
  }
}

export type { GenerationResult };
