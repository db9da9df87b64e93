/**
 * The HTTP app: the Host allow-list, CORS, API keys and tenants, JSON bodies within limits,
 * metrics, the sub-apps, the static chat page, and one error handler that answers in OpenAI's
 * error shape. docs/api.md documents every route; routes/listen.ts serves it.
 */
import { Hono } from "hono";
import { cors } from "hono/cors";
import { serveStatic } from "hono/deno";
import { matchedRoutes } from "hono/route";
import type { EngineLike } from "../api/types.ts";
import { bodyReader } from "./body.ts";
import { chatRoutes } from "./chat.ts";
import { completionsRoutes } from "./completions.ts";
import { fnv1a, type ServerContext, type ServerOptions } from "./context.ts";
import { ApiError, renderError } from "./errors.ts";
import { hostGuard, jsonOnly } from "./guard.ts";
import { healthRoutes } from "./health.ts";
import { createMetrics, metricsRoutes } from "./metrics.ts";
import { modelsRoutes } from "./models.ts";
import { responsesRoutes } from "./responses.ts";
import { sessionsRoutes } from "./sessions.ts";
import { tokenizeRoutes } from "./tokenize.ts";
import { speculationRoutes } from "./speculation.ts";
import { auth } from "./tenants.ts";
import { wsRoutes } from "./ws.ts";

export type { ServerOptions } from "./context.ts";

const WS_PATH = "/v1/chat/ws";
/** The tokenizer's routes outside /v1, as llama.cpp's server names them. */
const TOKENIZER_PATHS = ["/tokenize", "/detokenize"];
const METHODS = new Set(["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]);

function staticRoot(dir: string | URL | null | undefined): string | null {
  if (dir === null) return null;
  const url = dir === undefined ? new URL("../static/", import.meta.url) : dir;
  if (typeof url === "string") return url;
  return url.protocol === "file:" ? decodeURIComponent(url.pathname) : null;
}

/**
 * Whether a path may name a file of the page. serveStatic logs why it could not open a file
 * other than a missing one (a NUL byte, a name too long), so a client could fill the log; no
 * file of the page has such a name.
 */
function servableName(path: string): boolean {
  let decoded: string;
  try {
    decoded = decodeURIComponent(path);
  } catch {
    return false;
  }
  // deno-lint-ignore no-control-regex
  if (/[\x00-\x1f\x7f]/.test(decoded)) return false;
  return decoded.split("/").every((part) => part.length <= 255);
}

/**
 * Builds the app around an engine.
 *
 * @param engine the model server (`Engine` from engine/engine.ts)
 * @param options auth, CORS, limits and shutdown; see {@linkcode ServerOptions}
 * @returns a Hono app; serve it with `listen(app.fetch, ...)` (routes/listen.ts) or `Deno.serve`
 *
 * @example
 * ```ts
 * const app = createApp(await Engine.load("models/tinyllama"), { apiKeys: ["key-a", "key-b"] });
 * listen(app.fetch, { hostname: "127.0.0.1", port: 8080 });
 * ```
 */
export function createApp(engine: EngineLike, options: ServerOptions = {}): Hono {
  const ctx: ServerContext = {
    engine,
    metrics: createMetrics(engine),
    maxBodyBytes: options.maxBodyBytes ?? 1 << 20,
    bodyTimeoutMs: options.bodyTimeoutMs ?? 30_000,
    corsOrigins: options.corsOrigins ?? [],
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

  // DNS rebinding: a page whose host name now resolves to this server still sends its own name.
  if (options.allowedHosts && !options.allowedHosts.includes("*")) {
    app.use("*", hostGuard(options.allowedHosts));
  }

  const origins = ctx.corsOrigins;
  if (origins.length > 0) {
    app.use("*", cors({ origin: origins.includes("*") ? "*" : origins, maxAge: 600 }));
  }

  const keys = [...(options.apiKeys ?? []), ...(options.apiKey ? [options.apiKey] : [])];
  const body = bodyReader({ maxBytes: ctx.maxBodyBytes, timeoutMs: ctx.bodyTimeoutMs });
  // The API, and llama.cpp's unprefixed tokenizer paths, which answer as /v1/tokenize does.
  for (const path of ["/v1/*", ...TOKENIZER_PATHS]) {
    if (keys.length > 0) app.use(path, auth(keys, WS_PATH));
    app.use(path, jsonOnly);
    app.use(path, body);
  }

  app.route("/v1/completions", completionsRoutes(ctx));
  app.route("/v1/chat/completions", chatRoutes(ctx));
  app.route(WS_PATH, wsRoutes(ctx));
  app.route("/v1/sessions", sessionsRoutes(engine));
  app.route("/v1/speculation", speculationRoutes(engine));
  app.route("/v1/models", modelsRoutes(ctx));
  app.route("/v1/responses", responsesRoutes(ctx));
  app.route("/v1", tokenizeRoutes(engine)); // /v1/tokenize, /v1/detokenize
  app.route("/", tokenizeRoutes(engine, "")); // /tokenize, /detokenize
  app.route("/health", healthRoutes(ctx));
  app.route("/metrics", metricsRoutes(ctx.metrics));

  const root = staticRoot(options.staticDir);
  if (root !== null) {
    app.get("/*", async (c, next) => {
      if (!servableName(c.req.path)) return c.notFound();
      await next();
    }, serveStatic({ root }));
  }
  return app;
}
