/** Errors the engine raises at its edge; the server maps each to an HTTP status. */

/** The request cannot fit the model's context (400, code context_length_exceeded). */
export class ContextLengthError extends Error {
  readonly code = "context_length_exceeded";
  constructor(readonly promptTokens: number, readonly maxTokens: number, readonly limit: number) {
    super(
      `prompt (${promptTokens} tokens) + max_tokens (${maxTokens}) exceeds the context length ` +
        `of ${limit} tokens; shorten the prompt or lower max_tokens`,
    );
  }
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
