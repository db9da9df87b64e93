/** `POST /v1/chat/completions`: OpenAI chat completions, streaming or not. */
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
import { type OutputPiece, readOutput, type ToolOutput, toolOutput } from "./tool_calls.ts";
import { type ChatRequest, parseChat, samplingFor } from "./validate.ts";

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

/** The reader of a choice's output for the request's tools (plain text without them). */
function outputOf(req: ChatRequest): ToolOutput {
  const t = req.tools;
  return toolOutput(
    t?.mode ?? "none",
    t?.tools.map((x) => x.function.name) ?? [],
    t?.array ?? false,
  );
}

/** A choice's finish reason: "tool_calls" when it called a tool (and was not cancelled). */
function finishOf(result: RunResult, called: boolean): string {
  return called && result.finishReason !== "cancelled" ? "tool_calls" : result.finishReason;
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
      constraint: req.constraint,
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
        choices: done.map(({ events, result }, k) => {
          const out = readOutput(outputOf(req), events.map((e) => e.text).join(""));
          const calls = out.calls.length > 0 ? { tool_calls: out.calls } : {};
          return {
            index: k,
            message: { role: "assistant", content: out.content, refusal: null, ...calls },
            logprobs: req.logprobs
              ? { content: events.map((e) => chatLogprob(engine, e)), refusal: null }
              : null,
            finish_reason: finishOf(result, out.calls.length > 0),
          };
        }),
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
    const outputs = runs.map(() => outputOf(req));
    const called = runs.map(() => false);
    /** The chunks of one piece of output; `lp` rides on the first (or alone with logprobs). */
    const chunks = (k: number, piece: OutputPiece, lp: unknown) => {
      const out: object[] = [];
      if (piece.content !== "" || (lp !== null && piece.calls.length === 0)) {
        out.push(chunk(k, { content: piece.content }, lp, null));
        lp = null;
      }
      for (const d of piece.calls) {
        called[k] = true;
        out.push(chunk(k, { tool_calls: [d] }, lp, null));
        lp = null;
      }
      return out;
    };
    const constrained = req.tools?.mode === "constrained";
    return streamRuns(c, runs, abort, {
      start: (k) => chunk(k, { role: "assistant", content: constrained ? null : "" }, null, null),
      token: (k, ev) => {
        const lp = req.logprobs ? { content: [chatLogprob(engine, ev)], refusal: null } : null;
        return chunks(k, outputs[k].push(ev.text), lp);
      },
      finish: (k, r) => [
        ...chunks(k, outputs[k].end(), null),
        { ...chunk(k, {}, null, finishOf(r, called[k])), ...sessionOf(req.sessionId, r) },
      ],
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
