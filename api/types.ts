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

/** A tool call of an assistant message (OpenAI's shape; `arguments` is JSON text). */
export interface ChatToolCall {
  id: string;
  type: "function";
  function: { name: string; arguments: string };
}

/**
 * One message of a chat as the chat template sees it: `role` and `content`, and for tool use
 * the assistant's `tool_calls` and a `tool` message's `tool_call_id` (and the called function's
 * `name`). `name` on other roles is the participant's name, passed to the template as is.
 */
export interface ChatMessage {
  role: string;
  content: string;
  tool_calls?: ChatToolCall[];
  tool_call_id?: string;
  name?: string;
}

/** A function the model may call (OpenAI's `tools[i]`; `parameters` is a JSON Schema). */
export interface ChatTool {
  type: "function";
  function: { name: string; description?: string; parameters?: unknown; strict?: boolean };
}

/** Which tool call a request wants: OpenAI's `tool_choice`, a named function as `{name}`. */
export type ToolChoice = "auto" | "none" | "required" | { name: string };

/** How a chat is rendered (`encodeChat`, `tokenizeChat`); see docs/api.md, "Tools". */
export interface ChatRenderOptions {
  /** Functions the model may call: the template's `tools` variable, or strata's preamble. */
  tools?: ChatTool[];
  /** Said in strata's preamble for templates without tool support (default "auto"). */
  toolChoice?: ToolChoice;
  /** Whether the preamble offers several calls at once (default true). */
  parallelToolCalls?: boolean;
  /** Append the assistant turn's header (default: true unless continuing). */
  addGenerationPrompt?: boolean;
  /** Render the last message open, so generation continues it (an assistant prefill). */
  continueFinalMessage?: boolean;
}

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
   * (every accepted draft is a token the step gave beyond its own); beside them, the drafts that
   * came from the n-gram pool of the model's guesses (and were accepted), the steps
   * cross-checked against the plain path and those that failed, and the verification steps by
   * the rows per slot of their pass (index R).
   */
  speculation?: {
    steps: number;
    drafted: number;
    accepted: number;
    pooled?: number;
    pooledAccepted?: number;
    checks?: number;
    failures?: number;
    byRows?: number[];
  };
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
  /** The tiers below the GPU (host memory, spill files), when the engine has them. */
  tiers?: KvTierStats;
}

/** A path between two tiers as the start-up profile measured it. */
export interface TierRate {
  /** Throughput once a transfer runs (GB/s, 10⁹ bytes). */
  gbPerS: number;
  /** Fixed cost of one transfer (ms): a GPU round trip, a file's open. */
  latencyMs: number;
}

/** Whether restores use a tier, from the profile: only when that beats recomputing. */
export interface TierUse {
  use: boolean;
  /** Time to bring one block back from the tier onto the GPU (ms, throughput only). */
  restoreMsPerBlock: number;
  reason: string;
}

/**
 * Measured at start-up with real reads and writes of each tier (docs/kv_tiers.md): it decides
 * which tiers sessions go down to and come back from, and how many reads a restore keeps in
 * flight.
 */
export interface StorageTierProfile {
  /** When it was measured (ms since the epoch), and how long that took (ms). */
  measuredAt: number;
  measureMs: number;
  /** Bytes of one block's K‖V record (16 tokens, every layer). */
  blockBytes: number;
  /** Prefill throughput (tokens/s) and the time to recompute one block's 16 tokens (ms). */
  recomputeTokensPerS: number;
  recomputeMsPerBlock: number;
  gpuToHost: TierRate;
  hostToGpu: TierRate;
  hostToFile?: TierRate;
  fileToHost?: TierRate;
  /** The snapshot store (Deno KV): writes and reads of packed blocks, packing included. */
  kvWrite?: TierRate;
  kvRead?: TierRate;
  host: TierUse;
  file?: TierUse;
  kv?: TierUse;
  /** Reads from a lower tier a restore keeps in flight. */
  prefetchBlocks: number;
}

/** The tiers below the GPU, for /health and /metrics (docs/kv_tiers.md). */
export interface KvTierStats {
  /** spareBytes: freed buffers kept for reuse (engine/kv/tier_host.ts), not counted in bytes. */
  host: { blocks: number; bytes: number; budgetBytes: number; spareBytes: number };
  file?: { blocks: number; bytes: number; budgetBytes: number };
  /** Blocks below the GPU by state: a restore waits for them, at rest, a copy in flight. */
  states: { active: number; inactive: number; pendingEvict: number };
  /** Blocks evicted sessions copied down from the GPU (and the time it took, ms). */
  spilled: { blocks: number; bytes: number; ms: number };
  /** Blocks moved from host memory to files (ms: the time some write was in flight). */
  written: { blocks: number; bytes: number; ms: number };
  /** Blocks that left every tier (budgets), and evicted blocks not kept at all. */
  dropped: number;
  /**
   * Blocks brought back onto the GPU, by the tier they came from, their bytes, and the time
   * from each restore's plan (its request queued) to its upload, summed (ms).
   */
  restored: { host: number; file: number; kv: number; bytes: number; ms: number };
  /** Blocks read from files ahead of their restore. */
  prefetched: number;
  /** Blocks a restore could not read (missing or corrupt): their tokens were prefilled. */
  failed: number;
  /** The spill breaker: a slow spill pauses spills. */
  breaker: { paused: boolean; reason?: string; trips: number; skipped: number };
  profile?: StorageTierProfile;
}

/** Speculative decoding's state, for /metrics and /health. */
export interface SpeculationStats {
  /** "off" (never), "auto" (when it pays) or "on" (always). */
  mode: "off" | "auto" | "on";
  /**
   * Why speculation does not run although the mode allows it: the failure breaker (off until
   * switched on again), or why the last decode submission was plain (else absent).
   */
  pausedBecause?: string;
  /** The failure breaker turned it off (until `setSpeculation` switches it on again). */
  tripped?: boolean;
  /** Verification steps (one per sequence per pass), drafts proposed, drafts accepted. */
  steps: number;
  drafted: number;
  accepted: number;
  /** Drafts that came from the n-gram pool of the model's own guesses, and those accepted. */
  pooled?: number;
  pooledAccepted?: number;
  /**
   * Verification steps cross-checked against the plain path, those that failed, and the
   * largest ‖h_verify − h_plain‖ / mean ‖h‖ measured.
   */
  checks?: number;
  failures?: number;
  maxDistance?: number;
  /** The length groups: their contexts, counts and the draft depth each chose. */
  groups?: SpeculationGroupStats[];
}

/** One length group of speculation (engine/sched/spec_groups.ts). */
export interface SpeculationGroupStats {
  /** "<128", "128-511", "512+" with the default bounds. */
  name: string;
  steps: number;
  drafted: number;
  accepted: number;
  /** Draft depth it runs now (0: it does not speculate now). */
  depth: number;
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
  /**
   * Renders messages through the chat template and encodes them, at once (short chats).
   *
   * @throws Error when the template refuses the chat (its message), or for a final message that
   *   cannot be continued
   */
  encodeChat(messages: ChatMessage[], options?: ChatRenderOptions): number[];
  /** Text of `ids`, at once (a token's text, short lists). */
  decode(ids: number[]): string;
  /**
   * Encodes text like {@linkcode encode}, without stalling the caller's thread: a long text is
   * tokenized elsewhere (the server's worker engine uses tokenizer workers), so a megabyte of
   * prompt never holds up other clients.
   */
  tokenize(text: string): Promise<number[]>;
  /** {@linkcode encodeChat} without stalling the caller's thread. */
  tokenizeChat(messages: ChatMessage[], options?: ChatRenderOptions): Promise<number[]>;
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
