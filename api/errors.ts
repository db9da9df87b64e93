/** Errors the engine raises at its edge; the server maps each to an HTTP status. */
import { type GenerateRequest, MAX_LOGIT_BIAS } from "./types.ts";

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
 * @throws InvalidRequestError for an empty prompt, a token id outside the vocabulary, a bad
 *   logit_bias, or a constraint that max_tokens cannot finish (or that may not stop at EOS);
 *   ContextLengthError when prompt + max tokens exceed `contextLength`
 */
export function checkRequest(
  request: Pick<GenerateRequest, "promptIds" | "sampling" | "constraint">,
  vocabSize: number,
  contextLength: number,
): void {
  const { promptIds, sampling } = request;
  if (sampling.logitBias) checkLogitBias(sampling.logitBias, vocabSize);
  const c = request.constraint;
  if (c && sampling.maxTokens < c.minTokens) {
    throw new InvalidRequestError(
      `max_tokens ${sampling.maxTokens} cannot finish this response_format: the shortest ` +
        `output that matches it takes ${c.minTokens} tokens; raise max_tokens`,
      "max_tokens",
    );
  }
  if (c && sampling.stopAtEos === false) {
    throw new InvalidRequestError(
      "a constrained output ends at EOS once it is complete: ignore_eos cannot be used with it",
      "ignore_eos",
    );
  }
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

/**
 * @throws InvalidRequestError (param `logit_bias`) unless `pairs` are at most MAX_LOGIT_BIAS
 *   distinct token ids of the vocabulary with finite biases in [-100, 100]
 */
function checkLogitBias(pairs: readonly (readonly [number, number])[], vocabSize: number): void {
  const bad = (why: string) => new InvalidRequestError(`logit_bias: ${why}`, "logit_bias");
  if (pairs.length > MAX_LOGIT_BIAS) {
    throw bad(`${pairs.length} entries; at most ${MAX_LOGIT_BIAS}`);
  }
  const seen = new Set<number>();
  for (const [id, bias] of pairs) {
    if (!Number.isInteger(id) || id < 0 || id >= vocabSize) {
      throw bad(`token id ${id} is outside the vocabulary [0, ${vocabSize})`);
    }
    if (seen.has(id)) throw bad(`token id ${id} appears twice`);
    seen.add(id);
    if (!(typeof bias === "number" && Number.isFinite(bias) && bias >= -100 && bias <= 100)) {
      throw bad(`the bias of token ${id} must be a number from -100 to 100; got ${bias}`);
    }
  }
}
