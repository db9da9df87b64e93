/**
 * Running generations for the routes: start the choices of a request, time and count their
 * tokens, cancel them when the client goes away, and either collect them or stream them as SSE.
 */
import type { Context } from "hono";
import { streamSSE } from "hono/streaming";
import type {
  Constraint,
  GenerateRequest,
  GenerationResult,
  SamplingOptions,
  TokenEvent,
} from "../api/types.ts";
import type { ServerContext } from "./context.ts";
import { ApiError, toApiError } from "./errors.ts";
import { engineSessionId } from "./tenants.ts";

/** Server-side timings of one generation. */
export interface Timings {
  /** From the call to `generate` to the first token, in milliseconds. */
  ttft_ms: number;
  /** Decode rate after the first token (whole-run rate when there is one token). */
  tokens_per_second: number;
  total_ms: number;
}

/** The engine's result plus server timings. */
export interface RunResult extends GenerationResult {
  timings: Timings;
}

/** A generation whose tokens are timed and counted in the metrics. */
export interface Run {
  /** Token events; iterate once. Leaving the loop early cancels the generation. */
  events: AsyncIterable<TokenEvent>;
  result: Promise<RunResult>;
  cancel(): void;
}

/** Starts one generation and wraps it with timing and metrics. */
export function startRun(ctx: ServerContext, request: GenerateRequest): Run {
  const { metrics } = ctx;
  const t0 = performance.now();
  const gen = ctx.engine.generate(request);
  let first = -1, last = -1;
  async function* events(): AsyncGenerator<TokenEvent> {
    let finished = false;
    try {
      for await (const ev of gen) {
        const now = performance.now();
        if (first < 0) {
          first = now;
          metrics.ttft.observe((now - t0) / 1000);
        } else metrics.interToken.observe((now - last) / 1000);
        last = now;
        yield ev;
      }
      finished = true;
    } finally {
      if (!finished) gen.cancel();
    }
  }
  const result = gen.result.then((r) => {
    const end = performance.now();
    metrics.promptTokens.inc({}, r.promptTokens);
    metrics.cachedPromptTokens.inc({}, r.cachedTokens);
    metrics.generationTokens.inc({}, r.completionTokens);
    metrics.generations.inc({ finish_reason: r.finishReason });
    const decodeMs = last - first;
    const tps = r.completionTokens > 1 && decodeMs > 0
      ? (r.completionTokens - 1) / (decodeMs / 1000)
      : r.completionTokens / Math.max((end - t0) / 1000, 1e-9);
    const timings = {
      ttft_ms: round(first < 0 ? end - t0 : first - t0),
      tokens_per_second: round(tps),
      total_ms: round(end - t0),
    };
    return { ...r, timings };
  });
  result.catch(() => {}); // awaited by the caller; never an unhandled rejection
  return { events: events(), result, cancel: () => gen.cancel() };
}

function round(x: number): number {
  return Math.round(x * 100) / 100;
}

/** Who asks, for which session (options of {@linkcode startChoices}, {@linkcode engineRequest}). */
export interface RequestScope {
  /** The client's session id (see routes/tenants.ts for the engine's). */
  sessionId?: string;
  /** The API key's tenant; undefined on a server without keys. */
  tenant?: string;
  /** false: the request opts out of speculative decoding. */
  speculation?: boolean;
  /** The output must match this (`response_format`, a required tool call). */
  constraint?: Constraint;
}

/**
 * The engine request of a client's prompt: the session id in the tenant's namespace, and the
 * tenant, which scopes the prefix cache.
 */
export function engineRequest(
  promptIds: number[],
  sampling: SamplingOptions,
  scope: RequestScope,
): GenerateRequest {
  const { sessionId, tenant } = scope;
  return {
    promptIds,
    sampling,
    ...(sessionId === undefined ? {} : { sessionId: engineSessionId(tenant, sessionId) }),
    ...(tenant === undefined ? {} : { tenant }),
    ...(scope.speculation === false ? { speculation: false } : {}),
    ...(scope.constraint ? { constraint: scope.constraint } : {}),
  };
}

/**
 * Starts `request` and returns its run; an engine refusal that names the session is re-thrown
 * with the client's session id (the engine knows the tenant's).
 */
export function startScoped(ctx: ServerContext, request: GenerateRequest, scope: RequestScope) {
  try {
    return startRun(ctx, request);
  } catch (e) {
    if ((e as { code?: unknown })?.code === "session_busy" && scope.sessionId !== undefined) {
      throw new ApiError(
        409,
        `session "${scope.sessionId}" is already generating; wait for it to finish or cancel it`,
        { param: "session_id", code: "session_busy" },
      );
    }
    throw e;
  }
}

/**
 * Starts `n` choices for each prompt (choice index = promptIndex * n + j); all are cancelled
 * when `signal` aborts. If the engine refuses one, those already started are cancelled and the
 * engine's error is thrown.
 */
export function startChoices(
  ctx: ServerContext,
  prompts: number[][],
  n: number,
  sampling: (j: number) => SamplingOptions,
  options: RequestScope & { signal: AbortSignal },
): Run[] {
  const runs: Run[] = [];
  try {
    for (const promptIds of prompts) {
      for (let j = 0; j < n; j++) {
        const request = {
          ...engineRequest(promptIds, sampling(j), options),
          signal: options.signal,
        };
        runs.push(startScoped(ctx, request, options));
      }
    }
  } catch (e) {
    runs.forEach((r) => r.cancel()); // e.g. the queue filled up part way: start none
    throw e;
  }
  options.signal.addEventListener("abort", () => runs.forEach((r) => r.cancel()), { once: true });
  return runs;
}

/** All tokens and the result of one choice. */
export interface Collected {
  events: TokenEvent[];
  result: RunResult;
}

/**
 * Aborts `abort` when the client disconnects (`c.req.raw.signal`) until the returned function is
 * called. Deno (without `--unstable-no-legacy-abort`) also aborts that signal after a successful
 * response, so callers stop watching once their runs are over.
 */
export function watchClient(c: Context, abort: AbortController): () => void {
  const gone = () => abort.abort();
  const signal = c.req.raw.signal;
  if (signal.aborted) gone();
  signal.addEventListener("abort", gone, { once: true });
  return () => signal.removeEventListener("abort", gone);
}

/**
 * Waits for every run; aborts `abort` (cancelling the runs) if the client disconnects meanwhile,
 * and if one run fails cancels the others and throws its error.
 */
export async function collect(
  c: Context,
  runs: Run[],
  abort: AbortController,
): Promise<Collected[]> {
  const unwatch = watchClient(c, abort);
  try {
    return await Promise.all(runs.map(async (run) => {
      const events: TokenEvent[] = [];
      for await (const ev of run.events) events.push(ev);
      return { events, result: await run.result };
    }));
  } catch (e) {
    abort.abort();
    throw e;
  } finally {
    unwatch();
  }
}

/** `usage` of a response: prompts counted once each, completions summed over choices. */
export function usageOf(prompts: number[][], results: RunResult[]) {
  const prompt = prompts.reduce((s, p) => s + p.length, 0);
  const completion = results.reduce((s, r) => s + r.completionTokens, 0);
  const cached = results.reduce((s, r) => s + r.cachedTokens, 0);
  // Speculation's drafts, in OpenAI's predicted-outputs fields: accepted drafts are tokens a
  // verification step gave beyond its own; the text is the same either way.
  const drafted = results.reduce((s, r) => s + (r.speculation?.drafted ?? 0), 0);
  const accepted = results.reduce((s, r) => s + (r.speculation?.accepted ?? 0), 0);
  return {
    prompt_tokens: prompt,
    completion_tokens: completion,
    total_tokens: prompt + completion,
    prompt_tokens_details: { cached_tokens: cached },
    completion_tokens_details: {
      accepted_prediction_tokens: accepted,
      rejected_prediction_tokens: drafted - accepted,
    },
  };
}

/**
 * What a response says of the session its turn continued, when the request named one: its id
 * and when the turn's snapshot was committed (with `--kv-sync` always, the response waits for
 * it; otherwise null: it lands shortly after, see `GET /v1/sessions/:id`'s `persisted_at_ms`).
 */
export function sessionOf(sessionId: string | undefined, result: RunResult | undefined) {
  if (sessionId === undefined) return {};
  return { session: { id: sessionId, persisted_at_ms: result?.persistedAt ?? null } };
}

/** Chunks to send: one, several in order, or none (null). */
export type Chunks = object | object[] | null;

/** How an endpoint renders its SSE chunks. */
export interface ChunkRenderer {
  /** Before the first token of choice k (chat: the role delta; completions: echo). */
  start(k: number): Chunks;
  token(k: number, ev: TokenEvent): Chunks;
  finish(k: number, result: RunResult): Chunks;
  /** After every choice finished (the usage chunk), or null. */
  usage(results: RunResult[]): object | null;
}

/**
 * Streams the runs as SSE `data: {...}` chunks ending with `data: [DONE]`. Choices stream
 * concurrently; a client disconnect (the SSE stream's abort) aborts `abort`, which cancels them
 * all; an engine failure sends
 * `data: {"error": {...}}` and ends the stream.
 */
export function streamRuns(
  c: Context,
  runs: Run[],
  abort: AbortController,
  render: ChunkRenderer,
): Response {
  return streamSSE(c, async (stream) => {
    stream.onAbort(() => abort.abort());
    const unwatch = watchClient(c, abort);
    const send = async (chunks: Chunks) => {
      for (const chunk of Array.isArray(chunks) ? chunks : chunks ? [chunks] : []) {
        await stream.writeSSE({ data: JSON.stringify(chunk) });
      }
    };
    try {
      const results = await Promise.all(runs.map(async (run, k) => {
        await send(render.start(k));
        for await (const ev of run.events) await send(render.token(k, ev));
        const result = await run.result;
        await send(render.finish(k, result));
        return result;
      }));
      await send(render.usage(results));
      await stream.writeSSE({ data: "[DONE]" });
    } catch (e) {
      abort.abort();
      const api = toApiError(e);
      if (api.status >= 500) console.error(e);
      await send(api.body());
    } finally {
      unwatch();
    }
  });
}
