/**
 * `POST /v1/responses`: OpenAI's Responses API over the same engine as chat. The response
 * object carries a `message` output item with `output_text` content, `function_call` items for
 * tool calls, and usage in input/output tokens; streamed, it is OpenAI's event sequence
 * (`response.created`, `response.in_progress`, `response.output_item.added`,
 * `response.content_part.added`, `response.output_text.delta` …, `response.output_text.done`,
 * `response.content_part.done`, `response.output_item.done`, the function call events, then
 * `response.completed`, or `response.incomplete` when max_output_tokens cut the text short).
 */
import { Hono } from "hono";
import { streamSSE } from "hono/streaming";
import type { ChatToolCall } from "../api/types.ts";
import { admit, type ServerContext } from "./context.ts";
import { ApiError, toApiError } from "./errors.ts";
import { readJson } from "./fields.ts";
import { collect, type RunResult, startChoices, watchClient } from "./generation.ts";
import { parseResponses, type ResponsesRequest } from "./responses_input.ts";
import { requestTenant } from "./tenants.ts";
import { type CallDelta, readOutput, type ToolOutput, toolOutput } from "./tool_calls.ts";

function hexId(prefix: string): string {
  return `${prefix}_${crypto.randomUUID().replaceAll("-", "")}`;
}

function outputOf(req: ResponsesRequest): ToolOutput {
  const t = req.tools;
  return toolOutput(
    t?.mode ?? "none",
    t?.tools.map((x) => x.function.name) ?? [],
    t?.array ?? false,
  );
}

/** An `output_text` content part. */
function textPart(text: string) {
  return { type: "output_text", text, annotations: [], logprobs: [] };
}

/** A `message` output item. */
function messageItem(id: string, text: string, status: string) {
  return { type: "message", id, status, role: "assistant", content: [textPart(text)] };
}

/** A `function_call` output item. */
function callItem(id: string, call: ChatToolCall, status: string) {
  return {
    type: "function_call",
    id,
    call_id: call.id,
    name: call.function.name,
    arguments: call.function.arguments,
    status,
  };
}

/** Whether the output ended early (max_output_tokens), and so the response is incomplete. */
function incomplete(r: RunResult | undefined, called: boolean): boolean {
  return r?.finishReason === "length" && !called;
}

/** The `/v1/responses` sub-app. */
export function responsesRoutes(ctx: ServerContext): Hono {
  const { engine } = ctx;
  return new Hono().post("/", async (c) => {
    const req = await parseResponses(engine, await readJson(c));
    admit(ctx);
    const abort = new AbortController();
    const [run] = startChoices(ctx, [req.promptIds], 1, () => req.sampling, {
      tenant: requestTenant(c),
      constraint: req.constraint,
      signal: abort.signal,
    });
    const id = hexId("resp");
    const createdAt = Math.floor(Date.now() / 1000);
    const tools = req.tools;
    /** The response object with `status` and `output` (and usage once there is a result). */
    const response = (status: string, output: object[], r?: RunResult, called = false) => ({
      id,
      object: "response",
      created_at: createdAt,
      status,
      error: null,
      incomplete_details: incomplete(r, called) ? { reason: "max_output_tokens" } : null,
      instructions: req.echo.instructions,
      max_output_tokens: req.echo.max_output_tokens,
      model: engine.modelId,
      output,
      parallel_tool_calls: tools?.parallel ?? true,
      previous_response_id: null,
      reasoning: { effort: null, summary: null },
      store: false,
      temperature: req.echo.temperature,
      text: req.echo.text,
      tool_choice: typeof tools?.choice === "object"
        ? { type: "function", name: tools.choice.name }
        : tools?.choice ?? "auto",
      tools: (tools?.tools ?? []).map((t) => ({
        type: "function",
        name: t.function.name,
        description: t.function.description ?? null,
        parameters: t.function.parameters ?? null,
        strict: t.function.strict ?? false,
      })),
      top_p: req.echo.top_p,
      truncation: "disabled",
      usage: r
        ? {
          input_tokens: req.promptIds.length,
          input_tokens_details: { cached_tokens: r.cachedTokens },
          output_tokens: r.completionTokens,
          output_tokens_details: { reasoning_tokens: 0 },
          total_tokens: req.promptIds.length + r.completionTokens,
        }
        : null,
      user: req.echo.user,
      metadata: {},
    });
    const finalStatus = (r: RunResult, called: boolean) =>
      r.finishReason === "cancelled"
        ? "cancelled"
        : incomplete(r, called)
        ? "incomplete"
        : "completed";

    if (!req.stream) {
      const [done] = await collect(c, [run], abort);
      const out = readOutput(outputOf(req), done.events.map((e) => e.text).join(""));
      const called = out.calls.length > 0;
      const status = finalStatus(done.result, called);
      const items: object[] = [];
      if (out.content !== null) {
        items.push(
          messageItem(
            hexId("msg"),
            out.content,
            status === "incomplete" ? "incomplete" : "completed",
          ),
        );
      }
      for (const call of out.calls) items.push(callItem(hexId("fc"), call, "completed"));
      return c.json(response(status, items, done.result, called));
    }

    return streamSSE(c, async (stream) => {
      stream.onAbort(() => abort.abort());
      const unwatch = watchClient(c, abort);
      let seq = 0;
      const emit = (type: string, fields: object) =>
        stream.writeSSE({
          event: type,
          data: JSON.stringify({ type, sequence_number: seq++, ...fields }),
        });
      const items: object[] = [];
      /** The open message item, or the open function call. */
      let text: { id: string; index: number; text: string } | null = null;
      let call: { id: string; index: number; call: ChatToolCall } | null = null;
      let called = false;
      const closeText = async (status: string) => {
        if (!text) return;
        const at = { item_id: text.id, output_index: text.index, content_index: 0 };
        await emit("response.output_text.done", { ...at, text: text.text, logprobs: [] });
        await emit("response.content_part.done", { ...at, part: textPart(text.text) });
        const item = messageItem(text.id, text.text, status);
        items[text.index] = item;
        await emit("response.output_item.done", { output_index: text.index, item });
        text = null;
      };
      const closeCall = async () => {
        if (!call) return;
        const at = { item_id: call.id, output_index: call.index };
        await emit("response.function_call_arguments.done", {
          ...at,
          arguments: call.call.function.arguments,
        });
        const item = callItem(call.id, call.call, "completed");
        items[call.index] = item;
        await emit("response.output_item.done", { output_index: call.index, item });
        call = null;
      };
      const openText = async () => {
        if (text) return text;
        const open = { id: hexId("msg"), index: items.length, text: "" };
        text = open;
        items.push(messageItem(open.id, "", "in_progress"));
        await emit("response.output_item.added", {
          output_index: open.index,
          item: { ...messageItem(open.id, "", "in_progress"), content: [] },
        });
        await emit("response.content_part.added", {
          item_id: open.id,
          output_index: open.index,
          content_index: 0,
          part: textPart(""),
        });
        return open;
      };
      const content = async (delta: string) => {
        if (delta === "") return;
        await closeCall();
        const open = await openText();
        open.text += delta;
        await emit("response.output_text.delta", {
          item_id: open.id,
          output_index: open.index,
          content_index: 0,
          delta,
          logprobs: [],
        });
      };
      const callDelta = async (d: CallDelta) => {
        called = true;
        if (d.id !== undefined) {
          await closeText("completed");
          await closeCall();
          const fresh: ChatToolCall = {
            id: d.id,
            type: "function",
            function: { name: d.function.name ?? "", arguments: "" },
          };
          call = { id: hexId("fc"), index: items.length, call: fresh };
          const item = callItem(call.id, fresh, "in_progress");
          items.push(item);
          await emit("response.output_item.added", { output_index: call.index, item });
        }
        if (!call || d.function.arguments === "") return;
        call.call.function.arguments += d.function.arguments;
        await emit("response.function_call_arguments.delta", {
          item_id: call.id,
          output_index: call.index,
          delta: d.function.arguments,
        });
      };
      const reader = outputOf(req);
      try {
        await emit("response.created", { response: response("in_progress", []) });
        await emit("response.in_progress", { response: response("in_progress", []) });
        const piece = async (p: { content: string; calls: CallDelta[] }) => {
          await content(p.content);
          for (const d of p.calls) await callDelta(d);
        };
        for await (const ev of run.events) await piece(reader.push(ev.text));
        await piece(reader.end());
        const result = await run.result;
        const status = finalStatus(result, called);
        // A text response always has its message item, even an empty one.
        if (!called && items.length === 0) await openText();
        await closeText(status === "incomplete" ? "incomplete" : "completed");
        await closeCall();
        const event = status === "incomplete" ? "response.incomplete" : "response.completed";
        await emit(event, { response: response(status, items, result, called) });
      } catch (e) {
        abort.abort();
        const api = toApiError(e);
        if (api.status >= 500) console.error(e);
        const { message, code, param } = api.body().error;
        await emit("error", { code, message, param });
      } finally {
        unwatch();
      }
    });
  }).all("/", (c) => {
    throw new ApiError(405, `${c.req.method} is not allowed here; use POST /v1/responses`, {
      code: "method_not_allowed",
      headers: { Allow: "POST" },
    });
  });
}
