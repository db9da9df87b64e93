/**
 * The engine in a worker thread, behind the {@linkcode EngineLike} the server drives.
 *
 * Deno's `mapAsync` blocks the calling thread until the GPU has finished everything submitted
 * (docs/internals.md), and on a CPU adapter a whole submission runs inside `submit`. With the
 * engine on the server's thread, every readback round held HTTP and WebSocket traffic for its
 * wait: pacing kept that short while one generation ran, but a burst of prefills or session
 * snapshots still held it for hundreds of milliseconds. Here the engine (engine/engine.ts) runs in
 * engine/worker/worker.ts, and this thread keeps only the tokenizer, a mirror of the engine's
 * state and one stream per generation: the worker sends each readback round's tokens in one
 * message, with the session table's changes and the load and KV counts.
 *
 * What needs an answer at once is answered here: encoding and decoding (a tokenizer of its own;
 * long prompts in tokenizer workers, engine/worker/tokenizers.ts, so none stalls this thread),
 * the request checks of `Engine.generate` that throw before any token (prompt, vocabulary,
 * context length, queue full, session busy), `occupancy()`, `kvStats()` and `session(id)` from the
 * mirror (as of the worker's last message).
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
} from "../../api/types.ts";
import { checkRequest, EngineBusyError, SessionBusyError } from "../../api/errors.ts";
import type { KvDtype } from "../../gpu/dtype.ts";
import { Channel } from "../sched/channel.ts";
import type { HostStats } from "../engine.ts";
import { loadModelFolder } from "../model/folder.ts";
import { TextTokenizer } from "../model/tokenizer.ts";
import { Tokenizers } from "./tokenizers.ts";
import {
  type CallMethod,
  fromWire,
  type FromWorker,
  type ModelSpec,
  type ReadyInfo,
  type ToWorker,
  type WorkerEngineOptions,
  type WorkerState,
} from "./protocol.ts";

export type { ModelSpec, WorkerEngineOptions } from "./protocol.ts";

/** How long {@linkcode WorkerEngine.close} leaves the worker's thread to end. */
const TEARDOWN_MS = 300;

/** One generation as this thread sees it. */
interface Remote {
  out: Channel<TokenEvent>;
  resolve: (r: GenerationResult) => void;
  reject: (e: unknown) => void;
  sessionId?: string;
  ended: boolean;
}

/** The engine of engine/engine.ts running in a worker (see the module's comment). */
export class WorkerEngine implements EngineLike {
  readonly modelId: string;
  readonly adapterName: string;
  readonly contextLength: number;
  readonly kvDtype: KvDtype;
  readonly #worker: Worker;
  readonly #tokenizer: TextTokenizer;
  /** Tokenization of request prompts off this thread when they are long. */
  readonly #tokenizers: Tokenizers;
  readonly #info: ReadyInfo;
  #state: WorkerState;
  readonly #sessions = new Map<string, SessionInfo>();
  readonly #gens = new Map<number, Remote>();
  readonly #calls = new Map<
    number,
    { resolve: (v: unknown) => void; reject: (e: unknown) => void }
  >();
  #next = 1;
  #dead?: Error;
  #closed?: () => void;

  private constructor(worker: Worker, tokenizers: Tokenizers, info: ReadyInfo) {
    const tokenizer = tokenizers.tokenizer;
    this.#tokenizers = tokenizers;
    this.#worker = worker;
    this.#tokenizer = tokenizer;
    this.#info = info;
    this.modelId = info.modelId;
    this.adapterName = info.adapterName;
    this.contextLength = info.contextLength;
    this.kvDtype = info.kvDtype;
    this.#state = info.state;
    for (const s of info.sessions) this.#sessions.set(s.id, s);
    worker.onmessage = (e: MessageEvent<FromWorker>) => this.#receive(e.data);
    worker.onerror = (e: ErrorEvent) => {
      e.preventDefault();
      this.#die(new Error(`the engine's worker failed: ${e.message}`));
    };
  }

  /**
   * Starts the worker, loads the model there (a folder, or a named shape for the bench) and the
   * tokenizer here.
   *
   * @throws the worker's error when the model does not load (the same message as `Engine.load`)
   * @example
   * const engine = await WorkerEngine.load({ dir: "models/strata-default" }, { kvPath: "kv.db" });
   */
  static async load(model: ModelSpec, options: WorkerEngineOptions = {}): Promise<WorkerEngine> {
    const folder = await loadModelFolder("dir" in model ? model.dir : model.tokenizerDir);
    const tokenizers = new Tokenizers(TextTokenizer.load(folder), {
      tokenizerJson: folder.tokenizerJson,
      tokenizerConfig: folder.tokenizerConfig,
      config: folder.config,
    });
    const worker = new Worker(new URL("./worker.ts", import.meta.url), { type: "module" });
    try {
      const info = await new Promise<ReadyInfo>((resolve, reject) => {
        // A message posted before the worker's module has run (its imports await the xxhash
        // wasm) can be lost, so the worker says when it listens.
        worker.onmessage = (e: MessageEvent<FromWorker>) => {
          const m = e.data;
          if (m.t === "alive") worker.postMessage({ t: "init", model, options } satisfies ToWorker);
          else if (m.t === "ready") resolve(m.info);
          else if (m.t === "failed") reject(fromWire(m.error));
        };
        worker.onerror = (e: ErrorEvent) => {
          e.preventDefault();
          reject(new Error(`the engine's worker failed: ${e.message}`));
        };
      });
      return new WorkerEngine(worker, tokenizers, info);
    } catch (e) {
      worker.terminate();
      await new Promise((r) => setTimeout(r, TEARDOWN_MS)); // see close()
      throw e;
    }
  }

  encode(text: string): number[] {
    return this.#tokenizer.encode(text);
  }

  encodeChat(messages: ChatMessage[], options?: ChatRenderOptions): number[] {
    return this.#tokenizer.encodeChat(messages, options);
  }

  decode(ids: number[]): string {
    return this.#tokenizer.decode(ids);
  }

  tokenize(text: string): Promise<number[]> {
    return this.#tokenizers.encode(text);
  }

  tokenizeChat(messages: ChatMessage[], options?: ChatRenderOptions): Promise<number[]> {
    return this.#tokenizers.encodeChat(messages, options);
  }

  detokenize(ids: number[]): Promise<string> {
    return this.#tokenizers.decode(ids);
  }

  knowsToken(id: number): boolean {
    return this.#tokenizer.knows(id);
  }

  /**
   * Compiles in a tokenizer worker and hands the tables to the engine's worker, which keeps them
   * for the requests that name the result.
   *
   * @throws InvalidRequestError for a spec the compiler refuses
   */
  async compileConstraint(spec: ConstraintSpec, path?: string): Promise<Constraint> {
    const c = await this.#tokenizers.compile(spec, path);
    await this.#call("registerConstraint", c.key, c.image);
    return { key: c.key, minTokens: c.minTokens };
  }

  /**
   * Sequences running and waiting: every generation this thread started and has not seen end is
   * one of the two, the worker's last count says how many run.
   */
  occupancy() {
    const outstanding = this.#gens.size;
    const running = Math.min(this.#state.running, outstanding);
    return {
      running,
      queued: outstanding - running,
      maxRunning: this.#info.maxSlots,
      maxQueued: this.#info.maxQueued,
    };
  }

  kvStats(): KvStats {
    return this.#state.kv;
  }

  speculationStats(): SpeculationStats {
    return this.#state.speculation;
  }

  /** The worker engine's layer precision as of its last message (absent: not quantized). */
  precisionStats(): PrecisionStats | undefined {
    return this.#state.precision;
  }

  /** @throws InvalidRequestError as `Engine.setSpeculation` does */
  async setSpeculation(mode: "off" | "auto"): Promise<void> {
    await this.#call("setSpeculation", mode);
  }

  session(id: string): SessionInfo | undefined {
    return this.#sessions.get(id);
  }

  /** @throws SessionBusyError while a generation uses the session */
  async deleteSession(id: string): Promise<boolean> {
    if (this.#busy(id)) throw new SessionBusyError(id);
    return await this.#call("deleteSession", id) as boolean;
  }

  /** `Engine.replaySession` in the worker. */
  async replaySession(id: string): Promise<ReplayReport> {
    return await this.#call("replaySession", id) as ReplayReport;
  }

  /** Resolves when every session snapshot started so far is written. */
  async flushSnapshots(): Promise<void> {
    await this.#call("flushSnapshots");
  }

  /** The worker engine's `hostStats()` (the bench's host time per step). */
  hostStats(): Promise<HostStats> {
    return this.#call("hostStats") as Promise<HostStats>;
  }

  /**
   * Starts a generation in the worker.
   *
   * @throws ContextLengthError, EngineBusyError, SessionBusyError, InvalidRequestError (as
   *   `Engine.generate` does), or the worker's failure once it has died
   */
  generate(request: GenerateRequest): Generation {
    if (this.#dead) throw this.#dead;
    checkRequest(request, this.#info.vocabSize, this.contextLength);
    const { queued } = this.occupancy();
    if (queued >= this.#info.maxQueued) throw new EngineBusyError(queued);
    const { sessionId } = request;
    if (sessionId !== undefined && this.#busy(sessionId)) {
      throw new SessionBusyError(sessionId);
    }
    const id = this.#next++;
    const out = new Channel<TokenEvent>();
    let resolve!: (r: GenerationResult) => void, reject!: (e: unknown) => void;
    const result = new Promise<GenerationResult>((res, rej) => {
      resolve = res;
      reject = rej;
    });
    result.catch(() => {}); // callers that only iterate see the error there
    const remote: Remote = { out, resolve, reject, sessionId, ended: false };
    this.#gens.set(id, remote);
    this.#worker.postMessage(
      {
        t: "generate",
        id,
        promptIds: [...request.promptIds],
        sampling: request.sampling,
        sessionId,
        tenant: request.tenant,
        speculation: request.speculation,
        constraint: request.constraint,
      } satisfies ToWorker,
    );
    const cancel = () => {
      if (remote.ended || !this.#gens.has(id)) return;
      remote.ended = true;
      out.close(); // the stream ends now; the result ("cancelled") comes from the worker
      this.#worker.postMessage({ t: "cancel", id } satisfies ToWorker);
    };
    request.signal?.addEventListener("abort", cancel, { once: true });
    return { result, cancel, [Symbol.asyncIterator]: () => out[Symbol.asyncIterator]() };
  }

  /**
   * Stops the worker: generations still running fail, the worker destroys its GPU device and
   * closes its session store, then exits (awaited, at most `timeoutMs`, before it is terminated).
   * Flush snapshots first. Await it before `Deno.exit`: the worker's thread drops its WebGPU
   * instance as it ends, and a process that exits meanwhile crashes in the driver's teardown. On
   * the H200, `main.ts serve` on SIGTERM crashed (SIGSEGV or SIGABRT) 4 times in 4 when it exited
   * right after the worker closed itself, and so did the bench 3 times in 3 right after
   * terminating it; with 300 ms between, 0 in 4 (closed or terminated). Deno has no event for a
   * worker's thread ending, hence the wait ({@linkcode TEARDOWN_MS}).
   */
  async close(timeoutMs = 5000): Promise<void> {
    if (this.#dead) return;
    const error = new Error("the engine was closed");
    this.#fail(error);
    let timer: ReturnType<typeof setTimeout> | undefined;
    await new Promise<void>((resolve) => {
      this.#closed = resolve;
      timer = setTimeout(resolve, timeoutMs);
      this.#worker.postMessage({ t: "close" } satisfies ToWorker);
    });
    clearTimeout(timer);
    this.#worker.terminate();
    await new Promise((r) => setTimeout(r, TEARDOWN_MS));
  }

  /** A generation this thread started and has not seen end uses the session. */
  #busy(sessionId: string): boolean {
    for (const g of this.#gens.values()) if (g.sessionId === sessionId) return true;
    return false;
  }

  #call(method: CallMethod, ...args: unknown[]): Promise<unknown> {
    if (this.#dead) return Promise.reject(this.#dead);
    const rid = this.#next++;
    return new Promise((resolve, reject) => {
      this.#calls.set(rid, { resolve, reject });
      this.#worker.postMessage({ t: "call", rid, method, args } satisfies ToWorker);
    });
  }

  #receive(m: FromWorker): void {
    if (m.t === "closed") return this.#closed?.();
    if (m.t === "reply") {
      const c = this.#calls.get(m.rid);
      this.#calls.delete(m.rid);
      if (m.error) c?.reject(fromWire(m.error));
      else c?.resolve(m.value);
      return;
    }
    if (m.t !== "batch") return;
    this.#state = m.state;
    for (const [id, info] of m.sessions) {
      if (info) this.#sessions.set(id, info);
      else this.#sessions.delete(id);
    }
    for (const [id, events] of m.tokens) {
      const g = this.#gens.get(id);
      if (g && !g.ended) { for (const ev of events) g.out.push(ev); }
    }
    for (const [id, r] of m.ends) this.#settle(id)?.resolve(r);
    for (const [id, w] of m.errors) {
      const e = fromWire(w);
      const g = this.#settle(id, e);
      g?.reject(e);
    }
  }

  /** Forgets a generation that ended (its stream closes, with `error` when it failed). */
  #settle(id: number, error?: Error): Remote | undefined {
    const g = this.#gens.get(id);
    if (!g) return;
    this.#gens.delete(id);
    g.ended = true;
    g.out.close(error);
    return g;
  }

  /** The worker died: everything waiting on it fails. */
  #die(error: Error): void {
    if (this.#dead) return;
    this.#fail(error);
    this.#worker.terminate();
  }

  #fail(error: Error): void {
    this.#dead = error;
    this.#tokenizers.close();
    for (const id of [...this.#gens.keys()]) this.#settle(id, error)?.reject(error);
    for (const c of this.#calls.values()) c.reject(error);
    this.#calls.clear();
  }
}
