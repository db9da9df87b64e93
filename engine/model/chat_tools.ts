/**
 * Tools and tool messages in a chat template.
 *
 * A template that knows tools (its source uses the `tools` variable, as Hugging Face tool-use
 * templates do: Llama 3.1, Qwen2.5, Mistral, Hermes) gets them as transformers passes them:
 * `tools` as a list of `{"type": "function", "function": {name, description, parameters}}`,
 * assistant messages with `tool_calls` whose `function.arguments` is an object (parsed from the
 * JSON text the API carries), `tool` messages with `tool_call_id` and the called function's
 * `name`.
 *
 * A template that does not (the default model's, TinyLlama's) would drop the tools, or the tool
 * messages, without a word, so strata presents them in plain text: a system message (the first
 * one, extended, or a new one in front) lists the functions as JSON and says how to call one
 * (the JSON shape routes/tool_calls.ts parses back), assistant `tool_calls` become that JSON
 * after the message's content, and `tool` messages become user messages that say whose result
 * they carry. docs/api.md ("Tools") shows the text.
 */
import type { ChatMessage, ChatRenderOptions, ChatTool, ToolChoice } from "../../api/types.ts";

/** What the template renders: its `messages`, and `tools` when it takes them. */
export interface TemplateChat {
  messages: Record<string, unknown>[];
  /** For a template that takes tools: the list, or null without (as transformers passes None). */
  tools?: unknown[] | null;
}

/** Whether a chat template takes tools (mentions the `tools` variable). */
export function templateKnowsTools(source: string): boolean {
  return /\btools\b/.test(source);
}

/**
 * The template's input for `messages` and `options`: as transformers passes them when the
 * template knows tools, else with the tools and tool messages written out (see the module doc).
 */
export function templateChat(
  messages: ChatMessage[],
  options: ChatRenderOptions,
  knowsTools: boolean,
): TemplateChat {
  const tools = options.tools ?? [];
  if (knowsTools) {
    // `tools is not none` guards templates' tool sections: an undefined one passes it.
    return { messages: messages.map(nativeMessage), tools: tools.length > 0 ? tools : null };
  }
  const out: Record<string, unknown>[] = messages.map(plainMessage);
  if (tools.length > 0) {
    const preamble = toolPreamble(tools, options.toolChoice ?? "auto", options.parallelToolCalls);
    if (out[0]?.role === "system") {
      const first = out[0].content as string;
      out[0] = { ...out[0], content: first === "" ? preamble : `${first}\n\n${preamble}` };
    } else out.unshift({ role: "system", content: preamble });
  }
  return { messages: out };
}

/** A message as transformers passes it to a tool-use template. */
function nativeMessage(m: ChatMessage): Record<string, unknown> {
  const out: Record<string, unknown> = { role: m.role, content: m.content };
  if (m.name !== undefined) out.name = m.name;
  if (m.tool_call_id !== undefined) out.tool_call_id = m.tool_call_id;
  if (m.tool_calls?.length) {
    out.tool_calls = m.tool_calls.map((c) => ({
      id: c.id,
      type: c.type,
      function: { name: c.function.name, arguments: argumentsValue(c.function.arguments) },
    }));
  }
  return out;
}

/** A message for a template without tool support. */
function plainMessage(m: ChatMessage): Record<string, unknown> {
  if (m.role === "tool") {
    const who = m.name === undefined ? "a function" : `the function ${m.name}`;
    const call = m.tool_call_id === undefined ? "" : ` (call ${m.tool_call_id})`;
    return { role: "user", content: `Result of ${who}${call}:\n${m.content}` };
  }
  const out: Record<string, unknown> = { role: m.role, content: m.content };
  if (m.name !== undefined) out.name = m.name;
  if (m.tool_calls?.length) {
    const calls = m.tool_calls.map((c) => ({
      name: c.function.name,
      arguments: argumentsValue(c.function.arguments),
    }));
    const json = JSON.stringify(calls.length === 1 ? calls[0] : calls);
    out.content = m.content === "" ? json : `${m.content}\n${json}`;
  }
  return out;
}

/** A call's arguments as the object they encode (the text itself when it is not one). */
function argumentsValue(text: string): unknown {
  try {
    const v = JSON.parse(text);
    return v !== null && typeof v === "object" && !Array.isArray(v) ? v : text;
  } catch {
    return text;
  }
}

/**
 * The system text that presents `tools` to a template without tool support.
 *
 * @example
 * toolPreamble([{ type: "function", function: { name: "now" } }], "auto");
 * // "Functions you can call (name, description, JSON Schema of the arguments):\n{"name":"now"}...
 */
export function toolPreamble(tools: ChatTool[], choice: ToolChoice, parallel = true): string {
  const lines = [
    "Functions you can call (name, description, JSON Schema of the arguments):",
    ...tools.map((t) => JSON.stringify(t.function)),
    'To call one, reply with only {"name": "<name>", "arguments": {<arguments>}}' +
    (parallel ? "; to call several, a JSON array of those." : ".") +
    ' Results come back in messages starting "Result of".',
  ];
  if (choice === "none") lines.push("Do not call a function in this reply: answer in text.");
  else if (choice === "required") {
    lines.push(`In this reply, call ${parallel ? "at least one function" : "one function"}.`);
  } else if (typeof choice === "object") {
    lines.push(`In this reply, call the function ${choice.name}.`);
  } else lines.push("Call a function only when it helps; otherwise answer in text.");
  return lines.join("\n");
}
