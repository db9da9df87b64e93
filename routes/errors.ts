/**
 * OpenAI-shaped errors: {@linkcode ApiError} is thrown at the edge, {@linkcode renderError} (the
 * app's one `onError`) turns every error into `{"error":{"message","type","param","code"}}`.
 */
import type { Context } from "hono";
import { HTTPException } from "hono/http-exception";
import type { ContentfulStatusCode } from "hono/utils/http-status";

/** The body of every error response (OpenAI's shape). */
export interface ErrorBody {
  error: { message: string; type: string; param: string | null; code: string | null };
}

/** Options of {@linkcode ApiError}. */
export interface ApiErrorOptions {
  /** OpenAI error type; derived from the status when omitted. */
  type?: string;
  /** The request field at fault (`"max_tokens"`, `"messages[2].content"`). */
  param?: string | null;
  /** Machine-readable code (`"model_not_found"`, `"context_length_exceeded"`). */
  code?: string | null;
  /** Extra response headers (`Retry-After`, `WWW-Authenticate`). */
  headers?: Record<string, string>;
}

function defaultType(status: number): string {
  if (status === 401) return "authentication_error";
  if (status === 429) return "rate_limit_error";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}

/**
 * An error the client can act on: status, message, and the OpenAI `type`/`param`/`code`.
 *
 * @example
 * ```ts
 * throw new ApiError(400, "max_tokens must be an integer >= 1; got 0", { param: "max_tokens" });
 * ```
 */
export class ApiError extends HTTPException {
  /** OpenAI error type. */
  readonly type: string;
  /** Offending request field, or null. */
  readonly param: string | null;
  /** Machine-readable code, or null. */
  readonly code: string | null;
  /** Extra response headers. */
  readonly headers: Record<string, string>;

  /** Creates the error; `message` should say what to change. */
  constructor(status: ContentfulStatusCode, message: string, options: ApiErrorOptions = {}) {
    super(status, { message });
    this.name = "ApiError";
    this.type = options.type ?? defaultType(status);
    this.param = options.param ?? null;
    this.code = options.code ?? null;
    this.headers = options.headers ?? {};
  }

  /** The JSON body of this error (also sent as WebSocket `error.error`). */
  body(): ErrorBody {
    return {
      error: { message: this.message, type: this.type, param: this.param, code: this.code },
    };
  }
}

/** A 400 for request field `param` (`code` defaults to `"invalid_value"`). */
export function badRequest(
  param: string | null,
  message: string,
  code = "invalid_value",
): ApiError {
  return new ApiError(400, message, { param, code });
}

/** HTTP status of the engine's edge errors (api/errors.ts), by their `code`. */
const ENGINE_CODES: Record<string, ContentfulStatusCode> = {
  context_length_exceeded: 400,
  invalid_request: 400,
  session_busy: 409,
  queue_full: 429,
  shutting_down: 503,
};

/**
 * Maps any thrown value to an {@linkcode ApiError}: ApiErrors pass through; Hono's
 * HTTPExceptions keep their status; engine errors that carry a known `code` get its status (and
 * their `param`); everything else is a 500 whose message says "internal error" with the original
 * message.
 */
export function toApiError(err: unknown): ApiError {
  if (err instanceof ApiError) return err;
  if (err instanceof HTTPException) {
    const status = err.status as ContentfulStatusCode;
    const message = err.message || err.getResponse().statusText || `HTTP ${status}`;
    return new ApiError(status, message);
  }
  const message = err instanceof Error ? err.message : String(err);
  const { code, param, retryAfterSeconds } = (err ?? {}) as {
    code?: unknown;
    param?: unknown;
    retryAfterSeconds?: unknown;
  };
  if (typeof code === "string" && code in ENGINE_CODES) {
    const status = ENGINE_CODES[code];
    const headers: Record<string, string> = status === 429
      ? { "Retry-After": String(typeof retryAfterSeconds === "number" ? retryAfterSeconds : 1) }
      : {};
    return new ApiError(status, message, {
      code: code === "invalid_request" ? "invalid_value" : code,
      param: typeof param === "string" ? param : null,
      headers,
    });
  }
  return new ApiError(500, `internal error: ${message}`, { code: "internal_error" });
}

/** The app's `onError`: renders any error in the OpenAI shape; logs unexpected ones. */
export function renderError(err: unknown, c: Context): Response {
  const api = toApiError(err);
  if (api.status >= 500 && api.code === "internal_error") console.error(err);
  return c.json(api.body(), api.status as ContentfulStatusCode, api.headers);
}
