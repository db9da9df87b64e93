/**
 * Chat `messages`: roles, text content, the assistant's `tool_calls` and `tool` results, each
 * checked with a 400 naming the message and field at fault.
 */
import type { ChatMessage, ChatToolCall } from "../api/types.ts";
import { badRequest } from "./errors.ts";
import { type Body, describe } from "./fields.ts";

const ROLES = ["system", "user", "assistant", "developer", "tool"];

/** The fields a message of each role may carry. */
const MESSAGE_FIELDS: Record<string, string[]> = {
  system: ["role", "content", "name"],
  developer: ["role", "content", "name"],
  user: ["role", "content", "name"],
  assistant: ["role", "content", "name", "tool_calls", "refusal"],
  tool: ["role", "content", "tool_call_id"],
};

/** Text of a content field: a string or a list of text parts (joined by newlines). */
export function textContent(c: unknown, param: string): string {
  if (typeof c === "string") return c;
  if (!Array.isArray(c)) {
    throw badRequest(
      param,
      `${param} must be a string or a list of text parts; got ${describe(c)}`,
    );
  }
  return c.map((part, j) => {
    const p = part as Body;
    if (typeof p !== "object" || p === null || p.type !== "text" || typeof p.text !== "string") {
      throw badRequest(
        `${param}[${j}]`,
        `${param}[${j}] must be {"type": "text", "text": "..."} (only text is supported); ` +
          `got ${describe(part)}`,
      );
    }
    return p.text;
  }).join("\n");
}

/** A name as OpenAI allows for functions: 1-64 of a-z A-Z 0-9 _ - (also `.` and `:`). */
export const FUNCTION_NAME = /^[A-Za-z0-9_.:-]{1,64}$/;

function toolCalls(v: unknown, param: string): ChatToolCall[] {
  if (!Array.isArray(v) || v.length === 0) {
    throw badRequest(param, `${param} must be a non-empty list of tool calls; got ${describe(v)}`);
  }
  return v.map((call, j) => {
    const at = `${param}[${j}]`;
    const c = call as Body;
    const f = c?.function as Body | undefined;
    const shape = `{"id": "call_1", "type": "function", "function": {"name": "f", ` +
      `"arguments": "{}"}}`;
    if (
      typeof c !== "object" || c === null || typeof c.id !== "string" || c.id === "" ||
      c.type !== "function" || typeof f !== "object" || f === null
    ) {
      throw badRequest(at, `${at} must be a function call like ${shape}; got ${describe(call)}`);
    }
    if (typeof f.name !== "string" || !FUNCTION_NAME.test(f.name)) {
      throw badRequest(
        `${at}.function.name`,
        `${at}.function.name must be a function name; got ${describe(f.name)}`,
      );
    }
    if (typeof f.arguments !== "string") {
      throw badRequest(
        `${at}.function.arguments`,
        `${at}.function.arguments must be the arguments as JSON text, e.g. "{}"; ` +
          `got ${describe(f.arguments)}`,
      );
    }
    return { id: c.id, type: "function", function: { name: f.name, arguments: f.arguments } };
  });
}

/** One message (`param` is `messages[i]`); `calls` maps earlier tool call ids to their names. */
function message(m: unknown, param: string, calls: Map<string, string>): ChatMessage {
  if (typeof m !== "object" || m === null || Array.isArray(m)) {
    throw badRequest(param, `${param} must be an object; got ${describe(m)}`);
  }
  const b = m as Body;
  const role = b.role;
  if (typeof role !== "string" || !ROLES.includes(role)) {
    throw badRequest(
      `${param}.role`,
      `${param}.role must be "system", "user", "assistant" or "tool"; got ${describe(role)}`,
    );
  }
  // null counts as absent (an SDK's message objects carry `parsed: null`, `audio: null`).
  const extra = Object.keys(b).find((k) => b[k] !== null && !MESSAGE_FIELDS[role].includes(k));
  if (extra !== undefined) {
    throw badRequest(
      `${param}.${extra}`,
      `${param}: a ${role} message takes ${MESSAGE_FIELDS[role].join(", ")}; "${extra}" is not ` +
        "one of them",
      "unknown_parameter",
    );
  }
  const absent = b.content === null || b.content === undefined;
  const content = absent && role === "assistant" ? "" : textContent(b.content, `${param}.content`);
  const out: ChatMessage = { role: role === "developer" ? "system" : role, content };
  if (b.name !== undefined && b.name !== null) {
    if (typeof b.name !== "string" || b.name === "") {
      throw badRequest(`${param}.name`, `${param}.name must be a non-empty string`);
    }
    out.name = b.name;
  }
  if (b.refusal !== undefined && b.refusal !== null) {
    throw badRequest(
      `${param}.refusal`,
      `${param}.refusal must be null (strata's models do not refuse in that field); put the ` +
        "text in content",
    );
  }
  if (b.tool_calls !== undefined && b.tool_calls !== null) {
    out.tool_calls = toolCalls(b.tool_calls, `${param}.tool_calls`);
    for (const c of out.tool_calls) calls.set(c.id, c.function.name);
  }
  if (role === "tool") {
    const id = b.tool_call_id;
    if (typeof id !== "string" || !calls.has(id)) {
      throw badRequest(
        `${param}.tool_call_id`,
        typeof id === "string"
          ? `${param}.tool_call_id is "${id}", which no earlier assistant message's tool_calls ` +
            "has; a tool message answers one of those calls"
          : `${param}.tool_call_id is required: the id of the call this message answers`,
      );
    }
    out.tool_call_id = id;
    out.name = calls.get(id);
  }
  return out;
}

/**
 * Checks `messages` ("developer" becomes "system"; a tool message gets the name of the function
 * whose call it answers).
 *
 * @throws {ApiError} 400 naming the message and field
 */
export function parseMessages(body: Body): ChatMessage[] {
  const list = body.messages;
  if (!Array.isArray(list) || list.length === 0) {
    throw badRequest(
      "messages",
      'messages must be a non-empty list like [{"role": "user", "content": "Hi"}]; ' +
        `got ${describe(list)}`,
    );
  }
  const calls = new Map<string, string>();
  return list.map((m, i) => message(m, `messages[${i}]`, calls));
}
