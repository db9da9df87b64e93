/** `POST /v1/completions`: OpenAI's legacy text completions, streaming or not. */
import { Hono } from "hono";
import type { EngineLike, TokenEvent } from "../api/types.ts";
import { admit, type ServerContext } from "./context.ts";
import { ApiError } from "./errors.ts";
import {
  collect,
  type RunResult,
  sessionOf,
  startChoices,
  streamRuns,
  usageOf,
} from "./generation.ts";
import { readJson } from "./fields.ts";
import { requestTenant } from "./tenants.ts";
import { parseCompletion, samplingFor } from "./validate.ts";

/** Completion-style logprobs of some tokens (`text_offset` counts UTF-16 units of the text). */
export interface CompletionLogprobs {
  tokens: string[];
  token_logprobs: number[];
  top_logprobs: Record<string, number>[];
  text_offset: number[];
}

/** Renders tokens as completion logprobs, the first starting at `offset` in the choice text. */
export function completionLogprobs(
  engine: EngineLike,
  events: TokenEvent[],
  offset: number,
): CompletionLogprobs {
  const out: CompletionLogprobs = {
    tokens: [],
    token_logprobs: [],
    top_logprobs: [],
    text_offset: [],
  };
  for (const ev of events) {
    out.tokens.push(engine.decode([ev.id]));
    out.token_logprobs.push(ev.logprob);
    out.top_logprobs.push(Object.fromEntries((ev.top ?? []).map((t) => [t.text, t.logprob])));
    out.text_offset.push(offset);
    offset += ev.text.length;
  }
  return out;
}

/** The `/v1/completions` sub-app. */
export function completionsRoutes(ctx: ServerContext): Hono {
  const { engine } = ctx;
  return new Hono().post("/", async (c) => {
    const req = await parseCompletion(engine, await readJson(c), c.req.header("x-session-id"));
    admit(ctx);
    const abort = new AbortController();
    const topLogprobs = req.logprobs ?? 0;
    const runs = startChoices(ctx, req.prompts, req.n, (j) => samplingFor(req, topLogprobs, j), {
      sessionId: req.sessionId,
      speculation: req.speculation,
      tenant: requestTenant(c),
      constraint: req.constraint,
      signal: abort.signal,
    });
    const head = {
      id: `cmpl-${crypto.randomUUID().replaceAll("-", "")}`,
      object: "text_completion",
      created: Math.floor(Date.now() / 1000),
      model: engine.modelId,
      system_fingerprint: ctx.fingerprint,
    };
    const echoOf = (k: number) => req.echo?.[Math.floor(k / req.n)] ?? "";

    if (!req.stream) {
      const done = await collect(c, runs, abort);
      return c.json({
        ...head,
        choices: done.map(({ events, result }, k) => {
          const echo = echoOf(k);
          return {
            index: k,
            text: echo + events.map((e) => e.text).join(""),
            logprobs: req.logprobs === null
              ? null
              : completionLogprobs(engine, events, echo.length),
            finish_reason: result.finishReason,
          };
        }),
        usage: usageOf(req.prompts, done.map((d) => d.result)),
        ...sessionOf(req.sessionId, done[0]?.result),
      });
    }

    const offsets = runs.map((_, k) => echoOf(k).length);
    const usage = req.includeUsage ? { usage: null } : {};
    const chunk = (k: number, text: string, logprobs: unknown, finish: string | null) => ({
      ...head,
      choices: [{ index: k, text, logprobs, finish_reason: finish }],
      ...usage,
    });
    return streamRuns(c, runs, abort, {
      start: (k) => (req.echo ? chunk(k, echoOf(k), null, null) : null),
      token: (k, ev) => {
        if (ev.text === "" && req.logprobs === null) return null;
        const lp = req.logprobs === null ? null : completionLogprobs(engine, [ev], offsets[k]);
        offsets[k] += ev.text.length;
        return chunk(k, ev.text, lp, null);
      },
      finish: (k, r: RunResult) => ({
        ...chunk(k, "", null, r.finishReason),
        ...sessionOf(req.sessionId, r),
      }),
      usage: (results) =>
        req.includeUsage ? { ...head, choices: [], usage: usageOf(req.prompts, results) } : null,
    });
  }).all("/", (c) => {
    throw new ApiError(405, `${c.req.method} is not allowed here; use POST /v1/completions`, {
      code: "method_not_allowed",
      headers: { Allow: "POST" },
    });
  });
}
