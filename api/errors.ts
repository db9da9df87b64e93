/** Errors the engine raises at its edge; the server maps each to an HTTP status. */
import type { GenerateRequest } from "./types.ts";

/**
 * The request cannot fit the model's context (400, code context_length_exceeded). The message
 * names what the caller can change: the largest `max_tokens` that fits beside this prompt, or,
 * when the prompt alone leaves no room for one token, the longest prompt that does.
 */
export class ContextLengthError extends Error {
  readonly code = "context_length_exceeded";
  constructor(readonly promptTokens: number, readonly maxTokens: number, readonly limit: number) {
    super(contextLengthMessage(promptTokens, maxTokens, limit));
  }
}

/**
 * The message of {@linkcode ContextLengthError}, also for callers that report the same condition
 * in their own error type.
 *
 * @example
 * contextLengthMessage(100, 50, 128);
 * // "prompt (100 tokens) + max_tokens (50) exceeds the context length of 128 tokens; lower
 * //  max_tokens to 28 or less, or shorten the prompt"
 */
export function contextLengthMessage(promptTokens: number, maxTokens: number, limit: number) {
  const over = `prompt (${promptTokens} tokens) + max_tokens (${maxTokens}) exceeds the context ` +
    `length of ${limit} tokens`;
  // Every generation makes at least one token, so a prompt of `limit` tokens already fails.
  if (promptTokens >= limit) {
    return `${over}; the prompt alone is too long: shorten it to ${limit - 1} tokens or fewer`;
  }
  return `${over}; lower max_tokens to ${limit - promptTokens} or less, or shorten the prompt`;
}

/** The admission queue is full (429 with Retry-After). */
export class EngineBusyError extends Error {
  readonly code = "queue_full";
  constructor(readonly queued: number, readonly retryAfterSeconds = 1) {
    super(`server busy: ${queued} requests already waiting; retry after ${retryAfterSeconds}s`);
  }
}

/** A session is already generating (409). */
export class SessionBusyError extends Error {
  readonly code = "session_busy";
  constructor(readonly sessionId: string) {
    super(`session '${sessionId}' is already generating; wait for it to finish or cancel it`);
  }
}

/** The request is invalid in a way only the engine can see, e.g. token ids out of range (400). */
export class InvalidRequestError extends Error {
  readonly code = "invalid_request";
  constructor(message: string, readonly param?: string) {
    super(message);
  }
}

/**
 * The checks of a request that need only the model's vocabulary size and context length (the
 * worker's proxy runs them on the server's thread, so their errors come before any token).
 *
 * @throws InvalidRequestError for an empty prompt or a token id outside the vocabulary,
 *   ContextLengthError when prompt + max tokens exceed `contextLength`
 */
export function checkRequest(
  request: Pick<GenerateRequest, "promptIds" | "sampling">,
  vocabSize: number,
  contextLength: number,
): void {
  const { promptIds, sampling } = request;
  if (promptIds.length === 0) throw new InvalidRequestError("the prompt is empty", "prompt");
  const bad = promptIds.find((t) => !Number.isInteger(t) || t < 0 || t >= vocabSize);
  if (bad !== undefined) {
    throw new InvalidRequestError(
      `token id ${bad} is outside the vocabulary [0, ${vocabSize})`,
      "prompt",
    );
  }
  if (promptIds.length + sampling.maxTokens > contextLength) {
    throw new ContextLengthError(promptIds.length, sampling.maxTokens, contextLength);
  }
}
