/** What every route sees: the engine, the options, the metrics, and admission control. */
import type { EngineLike } from "../api/types.ts";
import { ApiError } from "./errors.ts";
import type { ServerMetrics } from "./metrics.ts";

/** Options of {@linkcode createApp} (routes/app.ts). */
export interface ServerOptions {
  /** When set, `/v1/*` requires `Authorization: Bearer <apiKey>` (WebSocket: or `?api_key=`). */
  apiKey?: string;
  /**
   * Keys, one per tenant (with `apiKey`, if set): `/v1/*` requires one of them, and each
   * tenant's sessions and prefix cache are its own (routes/tenants.ts).
   */
  apiKeys?: string[];
  /**
   * Host names (`Host` header, port ignored) the server answers to, others get 421; `["*"]` or
   * absent: any. `main.ts serve` defaults to the loopback names when it listens on loopback.
   */
  allowedHosts?: string[];
  /**
   * Origins allowed by CORS (`["*"]` for any); CORS is off when absent or empty. A WebSocket
   * from a browser page must come from one of them, or from the server's own origin.
   */
  corsOrigins?: string[];
  /** Largest request body in bytes (and largest WebSocket message); default 1 MiB. */
  maxBodyBytes?: number;
  /** A request body must arrive within this after the request head (ms; default 30 000). */
  bodyTimeoutMs?: number;
  /** Sequences allowed to wait for admission before new requests get 429; default: engine's. */
  maxQueued?: number;
  /** `Retry-After` seconds sent with 429; default 1. */
  retryAfterSeconds?: number;
  /** Once aborted, new generations get 503 and /health reports "shutting_down". */
  shutdown?: AbortSignal;
  /** Folder served at `/` (`index.html` for `/`); default `static/` of the repository; null: off. */
  staticDir?: string | URL | null;
}

/** Server state shared by the sub-apps. */
export interface ServerContext {
  engine: EngineLike;
  metrics: ServerMetrics;
  maxBodyBytes: number;
  bodyTimeoutMs: number;
  corsOrigins: string[];
  maxQueued: number;
  retryAfterSeconds: number;
  shutdown?: AbortSignal;
  /** `system_fingerprint` of responses: model and adapter. */
  fingerprint: string;
  /** Unix seconds when the app was created (the model's `created`). */
  startedAt: number;
}

/**
 * Admission control, checked before a request starts generating: 503 while shutting down, 429
 * with `Retry-After` when the engine's queue (or `maxQueued`) is full.
 *
 * @throws {ApiError} 503 `shutting_down` or 429 `queue_full`
 */
export function admit(ctx: ServerContext): void {
  if (ctx.shutdown?.aborted) {
    throw new ApiError(503, "the server is shutting down; retry on another instance", {
      code: "shutting_down",
    });
  }
  const load = ctx.engine.occupancy();
  const limit = Math.min(load.maxQueued, ctx.maxQueued);
  if (load.queued >= limit) {
    const s = ctx.retryAfterSeconds;
    throw new ApiError(
      429,
      `the server is busy (${load.running} running, ${load.queued} queued, queue limit ${limit}); ` +
        `retry after ${s} s`,
      { code: "queue_full", headers: { "Retry-After": String(s) } },
    );
  }
}

/** A 32-bit FNV-1a hash as 8 hex digits (for `system_fingerprint`). */
export function fnv1a(text: string): string {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h.toString(16).padStart(8, "0");
}
