/**
 * The HTTP app: CORS, auth, body limits, metrics, the sub-apps, the static chat page, and one
 * error handler that answers in OpenAI's error shape. docs/api.md documents every route.
 */
import { Hono } from "hono";
import { bodyLimit } from "hono/body-limit";
import { cors } from "hono/cors";
import { serveStatic } from "hono/deno";
import { matchedRoutes } from "hono/route";
import type { EngineLike } from "../api/types.ts";
import { chatRoutes } from "./chat.ts";
import { completionsRoutes } from "./completions.ts";
import { fnv1a, type ServerContext, type ServerOptions } from "./context.ts";
import { ApiError, renderError } from "./errors.ts";
import { healthRoutes } from "./health.ts";
import { createMetrics, metricsRoutes } from "./metrics.ts";
import { modelsRoutes } from "./models.ts";
import { sessionsRoutes } from "./sessions.ts";
import { tokenizeRoutes } from "./tokenize.ts";
import { wsRoutes } from "./ws.ts";

export type { ServerOptions } from "./context.ts";

const WS_PATH = "/v1/chat/ws";
const METHODS = new Set(["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]);

async function sha256(text: string): Promise<Uint8Array> {
  return new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(text)));
}

/** Compares the SHA-256 digests byte by byte, always all 32, so timing says nothing of the key. */
async function keyMatches(given: string, expected: Promise<Uint8Array>): Promise<boolean> {
  const [a, b] = await Promise.all([sha256(given), expected]);
  let diff = 0;
  for (let i = 0; i < a.length; i++) diff |= a[i] ^ b[i];
  return diff === 0;
}

function staticRoot(dir: string | URL | null | undefined): string | null {
  if (dir === null) return null;
  const url = dir === undefined ? new URL("../static/", import.meta.url) : dir;
  if (typeof url === "string") return url;
  return url.protocol === "file:" ? decodeURIComponent(url.pathname) : null;
}

/**
 * Builds the app around an engine.
 *
 * @param engine the model server (`Engine` from engine/engine.ts)
 * @param options auth, CORS, limits and shutdown; see {@linkcode ServerOptions}
 * @returns a Hono app; serve it with `Deno.serve({ port }, app.fetch)`
 *
 * @example
 * ```ts
 * const app = createApp(await Engine.load("models/tinyllama"), { apiKey: Deno.env.get("KEY") });
 * Deno.serve({ port: 8080 }, app.fetch);
 * ```
 */
export function createApp(engine: EngineLike, options: ServerOptions = {}): Hono {
  const ctx: ServerContext = {
    engine,
    metrics: createMetrics(engine),
    maxBodyBytes: options.maxBodyBytes ?? 1 << 20,
    maxQueued: options.maxQueued ?? Infinity,
    retryAfterSeconds: options.retryAfterSeconds ?? 1,
    shutdown: options.shutdown,
    fingerprint: `fp_${fnv1a(`${engine.modelId}|${engine.adapterName}`)}`,
    startedAt: Math.floor(Date.now() / 1000),
  };
  const app = new Hono();
  app.onError(renderError);
  app.notFound((c) =>
    renderError(
      new ApiError(404, `no route ${c.req.method} ${c.req.path}; see docs/api.md for the routes`, {
        code: "not_found",
      }),
      c,
    )
  );

  // Count every response by its route: the most specific non-wildcard route that matched, even
  // when middleware (auth, body limit) answered first; unmatched paths share the label "other".
  app.use("*", async (c, next) => {
    await next();
    const route = matchedRoutes(c).map((r) => r.path).findLast((p) => !p.endsWith("*"));
    ctx.metrics.requests.inc({
      route: route?.replace(/\{.*\}/, "") ?? "other",
      method: METHODS.has(c.req.method) ? c.req.method : "other", // bounded label values
      status: String(c.res.status),
    });
  });

  const origins = options.corsOrigins ?? [];
  if (origins.length > 0) {
    app.use("*", cors({ origin: origins.includes("*") ? "*" : origins, maxAge: 600 }));
  }

  if (options.apiKey !== undefined) {
    const expected = sha256(options.apiKey);
    app.use("/v1/*", async (c, next) => {
      const header = c.req.header("authorization");
      const bearer = header?.match(/^Bearer\s+(.+)$/i)?.[1];
      // Browsers cannot set headers on a WebSocket, so the socket may carry the key in the URL.
      const given = bearer ?? (c.req.path === WS_PATH ? c.req.query("api_key") : undefined);
      if (given === undefined || !(await keyMatches(given.trim(), expected))) {
        throw new ApiError(
          401,
          given === undefined
            ? "missing API key; send the header Authorization: Bearer <key>"
            : "incorrect API key; send the server's key as Authorization: Bearer <key>",
          {
            type: "invalid_request_error",
            code: "invalid_api_key",
            headers: { "WWW-Authenticate": 'Bearer realm="strata"' },
          },
        );
      }
      await next();
    });
  }

  app.use(
    "/v1/*",
    bodyLimit({
      maxSize: ctx.maxBodyBytes,
      onError: () => {
        throw new ApiError(
          413,
          `the request body is over ${ctx.maxBodyBytes} bytes; send a smaller one`,
          { code: "request_too_large" },
        );
      },
    }),
  );

  app.route("/v1/completions", completionsRoutes(ctx));
  app.route("/v1/chat/completions", chatRoutes(ctx));
  app.route(WS_PATH, wsRoutes(ctx));
  app.route("/v1/sessions", sessionsRoutes(engine));
  app.route("/v1/models", modelsRoutes(ctx));
  app.route("/v1", tokenizeRoutes(engine)); // /v1/tokenize, /v1/detokenize
  app.route("/health", healthRoutes(ctx));
  app.route("/metrics", metricsRoutes(ctx.metrics));

  const root = staticRoot(options.staticDir);
  if (root !== null) app.get("/*", serveStatic({ root }));
  return app;
}
