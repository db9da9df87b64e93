/**
 * `POST /v1/responses` requests: the fields strata takes, `input` (a string, or message items
 * and function call items) as chat messages, and the rest mapped onto what chat does
 * (`text.format` onto the constraint, function `tools` onto chat's tools). A field strata does
 * not implement is refused by name.
 */
import {
  type ChatMessage,
  type Constraint,
  type EngineLike,
  sampling,
  type SamplingOptions,
} from "../api/types.ts";
import { checkBudget, compileAt, parseFormat } from "./constraint.ts";
import { badRequest } from "./errors.ts";
import { type Body, boolField, describe, intField, numberField, present } from "./fields.ts";
import { FUNCTION_NAME, textContent } from "./messages.ts";
import { parseTools, type ToolsRequest } from "./tools.ts";
import { chatEnds, checkConstrained, checkModel, fitContext, renderChat } from "./validate.ts";

/** The fields /v1/responses takes. */
const FIELDS = [
  "model",
  "input",
  "instructions",
  "max_output_tokens",
  "temperature",
  "top_p",
  "stream",
  "text",
  "tools",
  "tool_choice",
  "parallel_tool_calls",
  "store",
  "user",
  "seed",
  "truncation",
];

/** Responses API fields strata does not implement, and what to do instead. */
const NOT_IMPLEMENTED: Record<string, string> = {
  previous_response_id: "strata stores no responses, so it cannot continue one; send the whole " +
    "conversation in input",
  conversation: "strata stores no conversations; send the whole conversation in input",
  background: "background responses need stored responses, which strata does not keep",
  reasoning: "strata's models do not reason in hidden tokens; leave reasoning out",
  include: "strata has no extra output to include; leave include out",
  prompt: "strata keeps no prompt templates; send the text in input",
  metadata: "strata stores no responses, so it keeps no metadata; leave it out",
  max_tool_calls: "leave max_tool_calls out; tool_choice and parallel_tool_calls say how to call",
  top_logprobs: "logprobs are not implemented on /v1/responses; use /v1/chat/completions",
  service_tier: "strata has one service tier; leave service_tier out",
  stream_options: "leave stream_options out",
  prompt_cache_key: "strata caches prompts by content; leave prompt_cache_key out",
  safety_identifier: "leave safety_identifier out",
};

/** A parsed /v1/responses request. */
export interface ResponsesRequest {
  messages: ChatMessage[];
  promptIds: number[];
  sampling: SamplingOptions;
  stream: boolean;
  tools: ToolsRequest | null;
  constraint?: Constraint;
  /** What the response object echoes back. */
  echo: {
    instructions: string | null;
    max_output_tokens: number | null;
    temperature: number;
    top_p: number;
    text: { format: unknown };
    user: string | null;
  };
}

function checkFieldsOf(body: Body): void {
  for (const key of Object.keys(body)) {
    if (FIELDS.includes(key)) continue;
    const why = NOT_IMPLEMENTED[key];
    if (why) throw badRequest(key, `${key}: ${why}`, "unsupported_parameter");
    throw badRequest(
      key,
      `unknown field "${key}" for /v1/responses; see docs/api.md for the fields it takes`,
      "unknown_parameter",
    );
  }
}

function fields(item: Body, allowed: string[], param: string): void {
  const extra = Object.keys(item).find((k) => item[k] !== null && !allowed.includes(k));
  if (extra !== undefined) {
    throw badRequest(
      `${param}.${extra}`,
      `${param} (${describe(item.type ?? "message")}) takes ${allowed.join(", ")}; "${extra}" ` +
        "is not one of them",
      "unknown_parameter",
    );
  }
}

/** A message item's content: a string, or input_text (output_text for assistant) parts. */
function itemContent(item: Body, param: string): string {
  const c = item.content;
  if (typeof c === "string") return c;
  const want = item.role === "assistant" ? "output_text" : "input_text";
  if (!Array.isArray(c)) {
    throw badRequest(`${param}.content`, `${param}.content must be a string or a list of parts`);
  }
  return textContent(
    c.map((part, j) => {
      const p = part as Body;
      if (typeof p !== "object" || p === null || p.type !== want || typeof p.text !== "string") {
        throw badRequest(
          `${param}.content[${j}]`,
          `${param}.content[${j}] must be {"type": "${want}", "text": "..."} (only text is ` +
            `supported); got ${describe(part)}`,
        );
      }
      return { type: "text", text: p.text };
    }),
    `${param}.content`,
  );
}

/** `instructions` and `input` as chat messages (function calls and their outputs included). */
function inputMessages(body: Body): ChatMessage[] {
  const out: ChatMessage[] = [];
  if (present(body, "instructions")) {
    if (typeof body.instructions !== "string") {
      throw badRequest("instructions", "instructions must be a string");
    }
    out.push({ role: "system", content: body.instructions });
  }
  const input = body.input;
  if (typeof input === "string") return [...out, { role: "user", content: input }];
  if (!Array.isArray(input) || input.length === 0) {
    throw badRequest(
      "input",
      'input must be a string or a non-empty list of items like {"role": "user", "content": ' +
        `"Hi"}; got ${describe(input)}`,
    );
  }
  const calls = new Map<string, string>();
  input.forEach((v, i) => {
    const param = `input[${i}]`;
    const item = v as Body;
    if (typeof item !== "object" || item === null || Array.isArray(item)) {
      throw badRequest(param, `${param} must be an object; got ${describe(v)}`);
    }
    const type = item.type ?? "message";
    if (type === "message") {
      fields(item, ["type", "role", "content", "id", "status"], param);
      const role = item.role;
      if (
        typeof role !== "string" || !["user", "system", "developer", "assistant"].includes(role)
      ) {
        throw badRequest(
          `${param}.role`,
          `${param}.role must be "user", "system", "developer" or "assistant"; got ` +
            describe(role),
        );
      }
      out.push({ role: role === "developer" ? "system" : role, content: itemContent(item, param) });
    } else if (type === "function_call") {
      fields(item, ["type", "call_id", "name", "arguments", "id", "status"], param);
      const { call_id: id, name, arguments: args } = item;
      if (typeof id !== "string" || id === "") {
        throw badRequest(`${param}.call_id`, `${param}.call_id must be the call's id`);
      }
      if (typeof name !== "string" || !FUNCTION_NAME.test(name)) {
        throw badRequest(`${param}.name`, `${param}.name must be a function name`);
      }
      if (typeof args !== "string") {
        throw badRequest(`${param}.arguments`, `${param}.arguments must be JSON text, e.g. "{}"`);
      }
      const call = { id, type: "function" as const, function: { name, arguments: args } };
      const last = out[out.length - 1];
      if (last?.role === "assistant") (last.tool_calls ??= []).push(call);
      else out.push({ role: "assistant", content: "", tool_calls: [call] });
      calls.set(id, name);
    } else if (type === "function_call_output") {
      fields(item, ["type", "call_id", "output", "id", "status"], param);
      const id = item.call_id;
      if (typeof id !== "string" || !calls.has(id)) {
        throw badRequest(
          `${param}.call_id`,
          `${param}.call_id ${describe(id)} answers no function_call item before it`,
        );
      }
      const content = typeof item.output === "string"
        ? item.output
        : itemContent({ content: item.output }, `${param}.output`);
      out.push({ role: "tool", content, tool_call_id: id, name: calls.get(id) });
    } else {
      throw badRequest(
        `${param}.type`,
        `${param}.type ${describe(type)} is not supported; send "message", "function_call" ` +
          'or "function_call_output" items',
      );
    }
  });
  return out;
}

/**
 * Parses a /v1/responses body: checks every field, renders the input through the chat
 * template and compiles `text.format` or a required tool call.
 *
 * @throws {ApiError} 400 naming the field
 */
export async function parseResponses(engine: EngineLike, body: Body): Promise<ResponsesRequest> {
  checkFieldsOf(body);
  checkModel(engine, body);
  if (!present(body, "input")) throw badRequest("input", 'input is required, e.g. "input": "Hi"');
  const messages = inputMessages(body);
  const temperature = numberField(body, "temperature", { min: 0, max: 2 }, 1);
  const topP = numberField(body, "top_p", { min: 0, max: 1, openMin: true }, 1);
  const maxOutput = present(body, "max_output_tokens")
    ? intField(body, "max_output_tokens", 1, Number.MAX_SAFE_INTEGER, 1)
    : undefined;
  let seed: bigint | undefined;
  if (present(body, "seed")) {
    const s = intField(body, "seed", Number.MIN_SAFE_INTEGER, Number.MAX_SAFE_INTEGER, 0);
    seed = BigInt.asUintN(64, BigInt(s));
  }
  const stream = boolField(body, "stream", false);
  if (boolField(body, "store", false)) {
    throw badRequest("store", "strata stores no responses; send store: false or leave it out");
  }
  if (present(body, "truncation") && body.truncation !== "disabled") {
    throw badRequest(
      "truncation",
      'truncation must be "disabled": strata never drops input; an input over the context is a 400',
    );
  }
  if (present(body, "user") && typeof body.user !== "string") {
    throw badRequest("user", `user must be a string; got ${describe(body.user)}`);
  }
  const text = present(body, "text") ? body.text as Body : {};
  if (typeof text !== "object" || Array.isArray(text)) {
    throw badRequest("text", 'text must be an object like {"format": {"type": "text"}}');
  }
  const extra = Object.keys(text).find((k) => k !== "format");
  if (extra) throw badRequest(`text.${extra}`, `text takes format; "${extra}" is not supported`);
  const format = parseFormat(text.format, "text.format", "flat");
  const tools = parseTools(body, "flat");
  if (format && tools && tools.mode !== "none") {
    throw badRequest(
      "text.format",
      "text.format with tools is not supported: the reply is either a tool call or text; leave " +
        'text.format out, or send tool_choice "none"',
    );
  }
  const ends = chatEnds({}, messages);
  const constrained = tools?.spec ?? format;
  if (constrained) {
    const what = tools?.spec ? "a tool_choice that requires a call" : "this text.format";
    checkConstrained([], what, ends.continueFinalMessage);
  }
  const promptIds = await renderChat(engine, messages, { ends, tools, field: "input" });
  const maxTokens = fitContext(engine, promptIds.length, maxOutput, {
    param: "input",
    limit: "max_output_tokens",
  });
  let constraint: Constraint | undefined;
  if (constrained) {
    constraint = await compileAt(engine, constrained);
    checkBudget(constraint, maxTokens, tools?.spec ? "the tool call" : "this text.format");
  }
  return {
    messages,
    promptIds,
    sampling: sampling({ maxTokens, temperature, topP, ...(seed === undefined ? {} : { seed }) }),
    stream,
    tools,
    ...(constraint ? { constraint } : {}),
    echo: {
      instructions: typeof body.instructions === "string" ? body.instructions : null,
      max_output_tokens: maxOutput ?? null,
      temperature,
      top_p: topP,
      text: { format: text.format ?? { type: "text" } },
      user: typeof body.user === "string" ? body.user : null,
    },
  };
}
