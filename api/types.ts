/**
 * The engine as the server and CLI see it. `engine/engine.ts` implements it over the GPU.
 */

/** Sampling settings of one request (OpenAI names in camelCase). */
export interface SamplingOptions {
  /** 0 means greedy. */
  temperature: number;
  topP: number;
  /** 0 means off. */
  topK: number;
  minP: number;
  presencePenalty: number;
  frequencyPenalty: number;
  /** 1 means off (llama.cpp / HF semantics). */
  repetitionPenalty: number;
  /** u64 seed; undefined picks a random one (reported back in the result). */
  seed?: bigint;
  maxTokens: number;
  /** Stop strings, checked on the host; the output is truncated before the match. */
  stop: string[];
  /** Number of top alternatives to report with each token (0 = none). */
  topLogprobs: number;
  /** Stop at the model's EOS tokens (default true). */
  stopAtEos?: boolean;
  /**
   * Added to the raw logits of these tokens before anything else (OpenAI's `logit_bias`): at most
   * {@linkcode MAX_LOGIT_BIAS} (token id, bias) pairs, ids distinct and in the vocabulary, biases
   * in [-100, 100]; -100 bans a token in effect. Logprobs are of the biased logits.
   */
  logitBias?: [number, number][];
}

/** logit_bias entries a request may have at most. */
export const MAX_LOGIT_BIAS = 1024;

/** What a constrained generation must produce (OpenAI's `response_format`, a tool's schema). */
export type ConstraintSpec =
  | { type: "json_object" }
  | { type: "json_schema"; schema: unknown; strict?: boolean }
  | { type: "regex"; pattern: string };

/** A constraint compiled for the engine's vocabulary ({@linkcode EngineLike.compileConstraint}). */
export interface Constraint {
  /** Names the compiled tables (the same spec compiles once). */
  key: string;
  /** max_tokens below this cannot finish the constrained text: refuse such requests. */
  minTokens: number;
}

/** One generated token as streamed to callers. */
export interface TokenEvent {
  id: number;
  /** Text this token adds after incremental detokenization and stop-string holdback. */
  text: string;
  /** Natural-log probability of the token under the model (before temperature). */
  logprob: number;
  top?: { id: number; text: string; logprob: number }[];
}

/** Why a generation ended. */
export type FinishReason = "stop" | "length" | "cancelled";

/** Final accounting of a generation. */
export interface GenerationResult {
  finishReason: FinishReason;
  promptTokens: number;
  completionTokens: number;
  /** Prompt tokens whose KV came from the session or the prefix cache instead of prefill. */
  cachedTokens: number;
  seed: bigint;
  ttftMs: number;
  /**
   * With `--kv-sync` (a session and a store): when the turn's snapshot was committed (ms since
   * the epoch); the result arrives only after that.
   */
  persistedAt?: number;
  /**
   * When the engine speculated for it: verification steps, drafts proposed and drafts accepted
   * (every accepted draft is a token the step gave beyond its own).
   */
  speculation?: { steps: number; drafted: number; accepted: number };
  /**
   * Per generated token, the fingerprint of the hidden state that produced it (a 32-bit SimHash,
   * kernels/fingerprint.wgsl): replays compare them (`EngineLike.replaySession`).
   */
  fingerprints: number[];
}

/** What replaying a session's recorded turns found (`POST /v1/sessions/:id/replay`). */
export interface ReplayReport {
  session: string;
  /** Turns replayed (the session keeps its most recent ones), and tokens compared. */
  turns: number;
  tokens: number;
  /** Tokens whose fingerprint matched bit for bit, and the largest distance seen (bits of 32). */
  exactFingerprints: number;
  maxDistance: number;
  /**
   * The first place the replay went another way: a different token, or a fingerprint more than
   * {@linkcode REPLAY_MAX_DISTANCE} bits away (a different state behind the same token); null
   * when every token and state agreed.
   */
  divergence: {
    turn: number;
    step: number;
    kind: "token" | "state";
    expected: { token: number; fingerprint: number };
    got: { token: number; fingerprint: number };
  } | null;
  /** Turns that could not be replayed and why (e.g. the model changed). */
  skipped: { turn: number; reason: string }[];
}

/**
 * Fingerprint bits two runs of the same state may differ in: rounding between batch compositions
 * flips a bit only when a projection sits within it of zero; a different state flips about 16.
 */
export const REPLAY_MAX_DISTANCE = 3;

/** A running generation: iterate for tokens, await `result` for the end. */
export interface Generation extends AsyncIterable<TokenEvent> {
  result: Promise<GenerationResult>;
  /** Stops the sequence and frees its blocks (the iterator ends, finishReason "cancelled"). */
  cancel(): void;
}

/** One request to the engine. */
export interface GenerateRequest {
  promptIds: number[];
  sampling: SamplingOptions;
  /** Continue this session: its cached tokens are reused and the new state saved back. */
  sessionId?: string;
  /**
   * Prefix-cache scope: KV blocks are shared only between requests of the same tenant (and a
   * session belongs to the tenant that created it).
   */
  tenant?: string;
  /** false: never speculate for this request (default: as the engine decides). */
  speculation?: boolean;
  /**
   * The output must match this (compiled by `compileConstraint`): the GPU sampler allows only
   * tokens that keep it possible, and the generation stops at EOS once it is complete.
   */
  constraint?: Constraint;
  signal?: AbortSignal;
}

/** What a session keeps between requests (see `GET /v1/sessions/:id`). */
export interface SessionInfo {
  id: string;
  /** Tokens whose KV the session holds (prompt and generated text of earlier turns). */
  tokens: number;
  createdAt: number;
  updatedAt: number;
  /** When the last snapshot of this session reached the store (engines started with --kv). */
  persistedAt?: number;
}

/** KV blocks per tier, for /metrics and /health. */
export interface KvStats {
  blockTokens: number;
  /** Element type of the GPU cache: "f32" or "f16". */
  dtype: string;
  /** Hot blocks of the GPU pool (full precision) in use, and in all (the trash block aside). */
  gpu: { used: number; total: number };
  /** What blocks behind the hot window become (`--kv-codec`; "none": they stay as they are). */
  codec: string;
  /** Tokens each sequence keeps hot at its end (0 without a codec). */
  hotTokens: number;
  /**
   * Codec blocks of the GPU pool in use, and in all (0 of 0 without a codec), and the blocks
   * re-encoded into them since the engine started.
   */
  codecBlocks: { used: number; total: number; reencoded: number };
  /** Tokens the GPU pool holds with every block in use, and per GB of its memory (K and V). */
  capacity: { tokens: number; tokensPerGb: number };
  kv: { used: number };
  fs: { used: number };
  /** KV blocks session snapshots have copied from the GPU, and reused from earlier snapshots. */
  snapshotBlocks: { copied: number; reused: number };
}

/** Speculative decoding's state, for /metrics and /health. */
export interface SpeculationStats {
  /** "off" (never), "auto" (when it pays) or "on" (always). */
  mode: "off" | "auto" | "on";
  /** Why the last decode submission was plain although speculation may run (else absent). */
  pausedBecause?: string;
  /** Verification steps (one per sequence per pass), drafts proposed, drafts accepted. */
  steps: number;
  drafted: number;
  accepted: number;
}

/** One layer's precision, for /metrics and /health. */
export interface LayerPrecisionStats {
  /** What its projections run now, e.g. "int8", "f16" (after a fallback), "q4_k+q6_k". */
  format: string;
  /** Bits per weight of its largest projection (gate/up) now: 4, 8, 16 or 32. */
  bits: number;
  /** Runs its 16-bit weights after the monitor found it out of range. */
  fellBack: boolean;
  /** Batches the monitor found it out of range. */
  outOfRange: number;
  /** Why, the last time. */
  reason?: string;
}

/** The projections' precision and the monitor's counts (see docs/quantization.md). */
export interface PrecisionStats {
  /** "none" (as loaded), "int8" or "e4m3" (`--quantize`), "gguf" (the file's types). */
  mode: string;
  /** Whether the 16-bit weights are on the GPU for the monitor to fall back to. */
  fallback: boolean;
  layers: LayerPrecisionStats[];
  /** Batches measured; switches to 16 bits, and back. */
  observations: number;
  fallbacks: number;
  recoveries: number;
}

/** The engine the server drives (implemented by `Engine` in engine/engine.ts). */
export interface EngineLike {
  modelId: string;
  adapterName: string;
  /** Maximum prompt + generated tokens per sequence. */
  contextLength: number;
  /**
   * Encodes text at once, on the calling thread (adds BOS when the model's tokenizer config
   * says so): for short texts; request prompts go through {@linkcode tokenize}.
   */
  encode(text: string): number[];
  /** Renders messages through the chat template and encodes them, at once (short chats). */
  encodeChat(messages: { role: string; content: string }[]): number[];
  /** Text of `ids`, at once (a token's text, short lists). */
  decode(ids: number[]): string;
  /**
   * Encodes text like {@linkcode encode}, without stalling the caller's thread: a long text is
   * tokenized elsewhere (the server's worker engine uses tokenizer workers), so a megabyte of
   * prompt never holds up other clients.
   */
  tokenize(text: string): Promise<number[]>;
  /** {@linkcode encodeChat} without stalling the caller's thread. */
  tokenizeChat(messages: { role: string; content: string }[]): Promise<number[]>;
  /** {@linkcode decode} without stalling the caller's thread (long id lists). */
  detokenize(ids: number[]): Promise<string>;
  /** Whether the tokenizer has a token `id` (a map lookup, at once). */
  knowsToken(id: number): boolean;
  /**
   * Compiles a constraint for the model's vocabulary, off the caller's thread where it can be
   * (cached per spec).
   *
   * @param path where the spec sits in the request, for error messages
   *   (default "response_format.json_schema.schema", or "pattern" for a regex)
   * @throws InvalidRequestError naming the unsupported keyword or construct (a 400)
   */
  compileConstraint(spec: ConstraintSpec, path?: string): Promise<Constraint>;
  generate(request: GenerateRequest): Generation;
  /**
   * Runs session `id`'s recorded turns again and compares tokens and fingerprints.
   *
   * @throws InvalidRequestError when there is no such session
   */
  replaySession(id: string): Promise<ReplayReport>;
  session(id: string): SessionInfo | undefined;
  deleteSession(id: string): Promise<boolean>;
  /** Sequences running now and waiting for admission. */
  occupancy(): { running: number; queued: number; maxRunning: number; maxQueued: number };
  kvStats(): KvStats;
  speculationStats(): SpeculationStats;
  /**
   * Switches speculation at run time ("off" or "auto"; an engine built without verification
   * rows stays off).
   *
   * @throws InvalidRequestError for another mode, or to turn on an engine that cannot
   */
  setSpeculation(mode: "off" | "auto"): Promise<void>;
  /** The layers' precision (engines without it report nothing). */
  precisionStats?(): PrecisionStats | undefined;
}

/**
 * Sampling options with every knob off (greedy, no penalties, no stop strings), overridden by
 * `overrides`.
 *
 * @example
 * const opts = sampling({ maxTokens: 64, temperature: 0.7, seed: 1n });
 */
export function sampling(overrides: Partial<SamplingOptions> & { maxTokens: number }) {
  const base: SamplingOptions = {
    temperature: 0,
    topP: 1,
    topK: 0,
    minP: 0,
    presencePenalty: 0,
    frequencyPenalty: 0,
    repetitionPenalty: 1,
    maxTokens: overrides.maxTokens,
    stop: [],
    topLogprobs: 0,
  };
  return { ...base, ...overrides };
}
