/** `POST /v1/chat/completions`: OpenAI chat completions, streaming or not. */
import { Hono } from "hono";
import type { EngineLike, TokenEvent } from "../api/types.ts";
import { admit, type ServerContext } from "./context.ts";
import { ApiError } from "./errors.ts";
import { collect, sessionOf, startChoices, streamRuns, usageOf } from "./generation.ts";
import { readJson } from "./fields.ts";
import { requestTenant } from "./tenants.ts";
import { parseChat, samplingFor } from "./validate.ts";

/** One entry of chat `logprobs.content`. */
export interface ChatLogprob {
  token: string;
  logprob: number;
  bytes: number[];
  top_logprobs: { token: string; logprob: number; bytes: number[] }[];
}

const utf8 = new TextEncoder();

/** Renders one token in the chat logprobs shape (token text from `engine.decode([id])`). */
export function chatLogprob(engine: EngineLike, ev: TokenEvent): ChatLogprob {
  const token = engine.decode([ev.id]);
  return {
    token,
    logprob: ev.logprob,
    bytes: [...utf8.encode(token)],
    top_logprobs: (ev.top ?? []).map((t) => ({
      token: t.text,
      logprob: t.logprob,
      bytes: [...utf8.encode(t.text)],
    })),
  };
}

/** The `/v1/chat/completions` sub-app. */
export function chatRoutes(ctx: ServerContext): Hono {
  const { engine } = ctx;
  return new Hono().post("/", async (c) => {
    const req = await parseChat(engine, await readJson(c), c.req.header("x-session-id"));
    admit(ctx);
    const abort = new AbortController();
    const top = req.logprobs ? req.topLogprobs : 0;
    const prompts = [req.promptIds];
    const runs = startChoices(ctx, prompts, req.n, (j) => samplingFor(req, top, j), {
      sessionId: req.sessionId,
      speculation: req.speculation,
      tenant: requestTenant(c),
      signal: abort.signal,
    });
    const id = `chatcmpl-${crypto.randomUUID().replaceAll("-", "")}`;
    const created = Math.floor(Date.now() / 1000);
    const head = (object: string) => ({
      id,
      object,
      created,
      model: engine.modelId,
      system_fingerprint: ctx.fingerprint,
    });

    if (!req.stream) {
      const done = await collect(c, runs, abort);
      return c.json({
        ...head("chat.completion"),
        choices: done.map(({ events, result }, k) => ({
          index: k,
          message: {
            role: "assistant",
            content: events.map((e) => e.text).join(""),
            refusal: null,
          },
          logprobs: req.logprobs
            ? { content: events.map((e) => chatLogprob(engine, e)), refusal: null }
            : null,
          finish_reason: result.finishReason,
        })),
        usage: usageOf(prompts, done.map((d) => d.result)),
        ...sessionOf(req.sessionId, done[0]?.result),
      });
    }

    const usage = req.includeUsage ? { usage: null } : {};
    const chunk = (k: number, delta: object, logprobs: unknown, finish: string | null) => ({
      ...head("chat.completion.chunk"),
      choices: [{ index: k, delta, logprobs, finish_reason: finish }],
      ...usage,
    });
    return streamRuns(c, runs, abort, {
      start: (k) => chunk(k, { role: "assistant", content: "" }, null, null),
      token: (k, ev) => {
        if (ev.text === "" && !req.logprobs) return null;
        const lp = req.logprobs ? { content: [chatLogprob(engine, ev)], refusal: null } : null;
        return chunk(k, { content: ev.text }, lp, null);
      },
      finish: (k, r) => ({ ...chunk(k, {}, null, r.finishReason), ...sessionOf(req.sessionId, r) }),
      usage: (results) =>
        req.includeUsage
          ? { ...head("chat.completion.chunk"), choices: [], usage: usageOf(prompts, results) }
          : null,
    });
  }).all("/", (c) => {
    throw new ApiError(
      405,
      `${c.req.method} is not allowed here; use POST /v1/chat/completions`,
      { code: "method_not_allowed", headers: { Allow: "POST" } },
    );
  });
}
