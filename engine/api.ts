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
}

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
  signal?: AbortSignal;
}
