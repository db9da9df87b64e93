/**
 * One request inside the engine: its blocks and slot, the tokens the GPU has produced for it,
 * incremental detokenization with stop strings, and the stream its caller reads.
 */
import type {
  FinishReason,
  GenerateRequest,
  Generation,
  GenerationResult,
  SamplingOptions,
  TokenEvent,
} from "../../api/types.ts";
import type { SequenceBlocks } from "../kv/blocks.ts";
import type { RestorePlan } from "../kv/restore.ts";
import { promptSimhash } from "../kv/simhash.ts";
import type { TextTokenizer } from "../model/tokenizer.ts";
import { Channel } from "./channel.ts";
import { StopMatcher } from "../model/stop.ts";
import type { TurnRecord } from "../sessions/table.ts";
import type { GrammarImage } from "../runner/constraints.ts";
import { newSpecStats, type SpecStats } from "./speculation.ts";

/** What {@linkcode Sequence} needs from the engine. */
export interface SequenceInit {
  request: GenerateRequest;
  blocks: SequenceBlocks;
  /** Prompt tokens whose KV was already cached. */
  cached: number;
  tokenizer: TextTokenizer;
  /** Called when the caller cancels, so the engine frees the slot. */
  cancel: (seq: Sequence) => void;
  /** Takes the tokens instead of the generation's iterator (see `Engine.generate`). */
  onToken?: (ev: TokenEvent) => void;
  /**
   * Resolve `result` only once the turn is persisted ({@linkcode Sequence.settle}), not when
   * the last token arrives (`--kv-sync`).
   */
  durable?: boolean;
  /** The engine speculates and the request allows it (`"speculation": false` opts out). */
  speculate?: boolean;
  /** The tables of the request's constraint (engine/constraints.ts). */
  grammar?: GrammarImage;
  /** Its prompt's blocks on their way back from below the GPU (engine/kv/restore.ts). */
  restore?: RestorePlan;
}

/** Draws a random u64 seed. */
function randomSeed(): bigint {
  const w = crypto.getRandomValues(new Uint32Array(2));
  return (BigInt(w[1]) << 32n) | BigInt(w[0]);
}

/** A request's life in the engine. */
export class Sequence {
  readonly request: GenerateRequest;
  readonly sampling: SamplingOptions;
  readonly blocks: SequenceBlocks;
  readonly seed: bigint;
  /** Its speculation: drafts proposed and accepted, and the breaker's state. */
  readonly spec: SpecStats;
  readonly generation: Generation;
  readonly promptIds: number[];
  /** The tables its output must match, when the request is constrained. */
  readonly grammar?: GrammarImage;
  /** Its prompt's blocks on their way back from below the GPU, until admission takes them. */
  restore?: RestorePlan;
  /** Its prompt's SimHash (engine/kv/simhash.ts): similar prompts are admitted together. */
  readonly simhash: bigint;
  /** Times admission took a sequence behind it first (engine/sched/scheduler.ts). */
  bypassed = 0;
  /** Batch slot while admitted, else -1. */
  slot = -1;
  prefillSubmitted = false;
  /** Steps whose tokens the GPU will produce (prefill counts as one). */
  stepsSubmitted = 0;
  /** The GPU reported this slot finished (EOS or max tokens). */
  gpuDone = false;
  finished = false;
  readonly #generated: number[] = [];
  readonly #fingerprints: number[] = [];
  readonly #out = new Channel<TokenEvent>();
  readonly #detok;
  readonly #stop: StopMatcher;
  readonly #tokenizer: TextTokenizer;
  readonly #start = performance.now();
  #ttft = 0;
  #resolve!: (r: GenerationResult) => void;
  #reject!: (e: unknown) => void;
  #cached: number;
  readonly #durable: boolean;
  /** The result, held until {@linkcode settle} when the turn must be persisted first. */
  #held?: GenerationResult;
  readonly #onCancel: (seq: Sequence) => void;
  readonly #onToken?: (ev: TokenEvent) => void;

  constructor(init: SequenceInit) {
    this.request = init.request;
    this.sampling = init.request.sampling;
    this.blocks = init.blocks;
    this.spec = newSpecStats(init.speculate ?? false);
    this.promptIds = init.request.promptIds;
    this.simhash = promptSimhash(this.promptIds);
    if (init.grammar) this.grammar = init.grammar;
    if (init.restore) this.restore = init.restore;
    this.seed = this.sampling.seed ?? randomSeed();
    this.#tokenizer = init.tokenizer;
    this.#detok = init.tokenizer.createDetokenizer();
    this.#stop = new StopMatcher(this.sampling.stop);
    this.#cached = init.cached;
    this.#onCancel = init.cancel;
    this.#onToken = init.onToken;
    this.#durable = init.durable ?? false;
    const result = new Promise<GenerationResult>((res, rej) => {
      this.#resolve = res;
      this.#reject = rej;
    });
    result.catch(() => {}); // callers that only iterate see the error there
    const out = this.#out;
    this.generation = {
      result,
      cancel: () => this.cancel(),
      [Symbol.asyncIterator]: () => out[Symbol.asyncIterator](),
    };
  }

  /** Alternatives to report with each token (0: none). */
  get topLogprobs(): number {
    return this.sampling.topLogprobs;
  }

  /** Tokens the GPU will still produce after what was submitted. */
  get gpuRemaining(): number {
    return this.sampling.maxTokens - this.stepsSubmitted;
  }

  /** No more tokens will come from the GPU for this sequence. */
  get gpuFinished(): boolean {
    return this.gpuDone || this.gpuRemaining <= 0;
  }

  /** This turn as it ran, for its session's records (engine/sessions/table.ts TurnRecord). */
  turnRecord(): TurnRecord {
    const { seed: _, ...sampling } = this.sampling;
    return {
      prompt: [...this.promptIds],
      sampling: { ...sampling, seed: this.seed.toString() },
      ...(this.request.constraint ? { constraint: this.request.constraint.key } : {}),
      tokens: [...this.#generated],
      fingerprints: [...this.#fingerprints],
    };
  }

  /** Tokens of its context as read back so far: the prompt and the output. */
  get context(): number {
    return this.promptIds.length + this.#generated.length;
  }

  /** Prompt plus accepted output. */
  allTokens(): number[] {
    return [...this.promptIds, ...this.#generated];
  }

  /** Takes one token the GPU produced. */
  accept(
    id: number,
    logprob: number,
    alts?: { id: number; logprob: number }[],
    fingerprint = 0,
  ): void {
    if (this.finished) return;
    if (this.#generated.length === 0) this.#ttft = performance.now() - this.#start;
    this.#generated.push(id);
    this.#fingerprints.push(fingerprint);
    const eos = this.sampling.stopAtEos !== false && this.#tokenizer.eosIds.includes(id);
    const piece = eos ? this.#detok.flush() : this.#detok.push(id);
    const { text, stopped } = this.#stop.push(piece);
    const top = alts?.map((a) => ({ ...a, text: this.#tokenizer.tokenText(a.id) }));
    if (eos || stopped) {
      const tail = stopped ? text : text + this.#stop.flush();
      this.#emit({ id, text: tail, logprob, top });
      return this.#end("stop");
    }
    if (this.#generated.length >= this.sampling.maxTokens) {
      const tail = text + this.#stop.push(this.#detok.flush()).text + this.#stop.flush();
      this.#emit({ id, text: tail, logprob, top });
      return this.#end("length");
    }
    this.#emit({ id, text, logprob, top });
  }

  /** Stops generating; the stream ends with finish reason "cancelled". */
  cancel(): void {
    if (this.finished) return;
    this.#end("cancelled");
    this.#onCancel(this);
  }

  /**
   * Gives the KV blocks of a sequence still waiting for admission back to the pool; its prompt
   * is then prefilled in full (and reported as not cached).
   */
  dropKv(): void {
    this.blocks.dropKv();
    this.#cached = 0;
  }

  /** `n` more prompt tokens had their KV brought back instead of prefilled. */
  addCached(n: number): void {
    this.#cached += n;
  }

  /** Ends the stream with an error (GPU failure). */
  fail(error: unknown): void {
    if (this.finished) {
      // A durable turn whose result still waits for its snapshot fails with the engine.
      if (this.#held) this.#reject(error);
      this.#held = undefined;
      return;
    }
    this.finished = true;
    this.restore?.release();
    this.#out.close(error);
    this.#reject(error);
  }

  #emit(ev: TokenEvent): void {
    if (this.#onToken) this.#onToken(ev);
    else this.#out.push(ev);
  }

  /**
   * The engine has put the turn away (its blocks back in the pool or its session):
   * `persisted`, when given, settles once the session's snapshot of it is committed. A durable
   * sequence's result waits for that (and fails when the snapshot does); others resolved at
   * their last token and ignore it.
   */
  settle(persisted?: Promise<number>): void {
    const r = this.#held;
    if (!r) return;
    this.#held = undefined;
    if (!persisted) return this.#resolve(r);
    persisted.then(
      (persistedAt) => this.#resolve({ ...r, persistedAt }),
      (e) => this.#reject(new Error(`the turn was not persisted: ${e?.message ?? e}`)),
    );
  }

  #end(reason: FinishReason): void {
    this.finished = true;
    this.restore?.release();
    this.#out.close();
    const result: GenerationResult = {
      finishReason: reason,
      promptTokens: this.promptIds.length,
      completionTokens: this.#generated.length,
      cachedTokens: this.#cached,
      seed: this.seed,
      ttftMs: this.#ttft,
      fingerprints: [...this.#fingerprints],
      ...(this.spec.steps > 0 || this.spec.checks > 0
        ? {
          speculation: {
            steps: this.spec.steps,
            drafted: this.spec.drafted,
            accepted: this.spec.accepted,
            pooled: this.spec.pooled,
            pooledAccepted: this.spec.pooledAccepted,
            checks: this.spec.checks,
            failures: this.spec.failures,
            byRows: Array.from(this.spec.byRows, (n) => n ?? 0),
          },
        }
        : {}),
    };
    if (this.#durable) this.#held = result;
    else this.#resolve(result);
  }
}
