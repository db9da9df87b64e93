/**
 * Request cases and helpers for tests/routes_test.ts: the table of malformed requests with the
 * status, param and code each must get, the error-shape assertion and an SSE parser.
 */
import assert from "node:assert/strict";

/** Asserts the OpenAI error shape, status, param and code; returns the message. */
export async function expectError(
  res: Response,
  status: number,
  param: string | null,
  code?: string,
): Promise<string> {
  const body = await res.json();
  assert.equal(res.status, status, JSON.stringify(body));
  assert.deepEqual(Object.keys(body), ["error"]);
  assert.deepEqual(Object.keys(body.error).sort(), ["code", "message", "param", "type"]);
  assert.equal(typeof body.error.message, "string");
  assert.ok(body.error.message.length > 10, body.error.message);
  assert.equal(body.error.param, param, body.error.message);
  if (code !== undefined) assert.equal(body.error.code, code, body.error.message);
  return body.error.message;
}

/** The `data:` payloads of an SSE body. */
export function sseData(text: string): string[] {
  return text.split("\n\n").filter((e) => e.trim()).map((e) => {
    const lines = e.split("\n");
    assert.ok(lines.every((l) => l.startsWith("data: ")), `not an SSE data event: ${e}`);
    return lines.map((l) => l.slice(6)).join("\n");
  });
}

export const C = "/v1/completions";
export const CHAT = "/v1/chat/completions";
export const LONG = "the quick brown fox jumps over the lazy dog ".repeat(40);
export const MSG = [{ role: "user", content: "Hello" }];

/** [name, path, body, status, param, code?, message must include?] */
export type Bad = [string, string, unknown, number, string | null, string?, string?];
/** Malformed requests for a model whose context is `context` tokens. */
export function badRequests(context: number): Bad[] {
  return [
    ["bad JSON", C, "{", 400, null, "invalid_json", "not valid JSON"],
    ["JSON array", C, "[1, 2]", 400, null, "invalid_json", "JSON object"],
    ["JSON string", C, '"hi"', 400, null, "invalid_json"],
    ["empty body", C, "", 400, null, "invalid_json"],
    ["missing prompt", C, {}, 400, "prompt", undefined, "prompt is required"],
    ["prompt number", C, { prompt: 5 }, 400, "prompt"],
    ["prompt empty list", C, { prompt: [] }, 400, "prompt"],
    ["prompt mixed list", C, { prompt: [1, "a"] }, 400, "prompt"],
    ["prompt empty ids", C, { prompt: [[]] }, 400, "prompt"],
    ["prompt negative id", C, { prompt: [-1] }, 400, "prompt"],
    ["prompt fractional id", C, { prompt: [1.5] }, 400, "prompt"],
    ["prompt ragged", C, { prompt: [[1], ["a"]] }, 400, "prompt"],
    ["prompt id over vocab", C, { prompt: [999999] }, 400, "prompt", undefined, "999999"],
    ["prompt object", C, { prompt: { text: "hi" } }, 400, "prompt"],
    [
      "max_tokens 0",
      C,
      { prompt: "a", max_tokens: 0 },
      400,
      "max_tokens",
      "invalid_value",
      "max_tokens must be an integer >= 1; got 0",
    ],
    [
      "max_tokens negative",
      C,
      { prompt: "a", max_tokens: -5 },
      400,
      "max_tokens",
      undefined,
      "got -5",
    ],
    ["max_tokens fraction", C, { prompt: "a", max_tokens: 1.5 }, 400, "max_tokens"],
    [
      "max_tokens string",
      C,
      { prompt: "a", max_tokens: "10" },
      400,
      "max_tokens",
      undefined,
      'got "10"',
    ],
    ["max_tokens bool", C, { prompt: "a", max_tokens: true }, 400, "max_tokens"],
    [
      "max_tokens huge",
      C,
      { prompt: "a", max_tokens: 1e9 },
      400,
      "prompt",
      "context_length_exceeded",
    ],
    [
      "max_tokens over what the prompt leaves",
      C,
      { prompt: [1, 2, 3], max_tokens: context },
      400,
      "prompt",
      "context_length_exceeded",
      `lower max_tokens to ${context - 3} or less`,
    ],
    [
      "prompt alone over the context, with max_tokens",
      C,
      { prompt: Array.from({ length: context }, () => 1), max_tokens: 1 },
      400,
      "prompt",
      "context_length_exceeded",
      `shorten it to ${context - 1} tokens or fewer`,
    ],
    [
      "temperature negative",
      C,
      { prompt: "a", temperature: -0.1 },
      400,
      "temperature",
      undefined,
      "in [0, 2]",
    ],
    ["temperature too high", C, { prompt: "a", temperature: 2.5 }, 400, "temperature"],
    ["temperature string", C, { prompt: "a", temperature: "hot" }, 400, "temperature"],
    ["top_p zero", C, { prompt: "a", top_p: 0 }, 400, "top_p", undefined, "(0, 1]"],
    ["top_p over one", C, { prompt: "a", top_p: 1.5 }, 400, "top_p"],
    ["top_k negative", C, { prompt: "a", top_k: -1 }, 400, "top_k", undefined, "0 turns it off"],
    ["top_k fraction", C, { prompt: "a", top_k: 2.5 }, 400, "top_k"],
    ["min_p over one", C, { prompt: "a", min_p: 1.5 }, 400, "min_p"],
    ["min_p negative", C, { prompt: "a", min_p: -0.1 }, 400, "min_p"],
    ["presence_penalty", C, { prompt: "a", presence_penalty: 3 }, 400, "presence_penalty"],
    ["frequency_penalty", C, { prompt: "a", frequency_penalty: -3 }, 400, "frequency_penalty"],
    [
      "repetition_penalty zero",
      C,
      { prompt: "a", repetition_penalty: 0 },
      400,
      "repetition_penalty",
      undefined,
      "> 0",
    ],
    [
      "repetition_penalty negative",
      C,
      { prompt: "a", repetition_penalty: -1 },
      400,
      "repetition_penalty",
    ],
    ["seed fraction", C, { prompt: "a", seed: 1.5 }, 400, "seed"],
    ["seed string", C, { prompt: "a", seed: "abc" }, 400, "seed"],
    ["seed huge", C, { prompt: "a", seed: 1e300 }, 400, "seed"],
    ["stop number", C, { prompt: "a", stop: 5 }, 400, "stop"],
    [
      "stop five strings",
      C,
      { prompt: "a", stop: ["a", "b", "c", "d", "e"] },
      400,
      "stop",
      undefined,
      "up to 4",
    ],
    ["stop empty string", C, { prompt: "a", stop: [""] }, 400, "stop"],
    ["stop list of numbers", C, { prompt: "a", stop: [1] }, 400, "stop"],
    ["n zero", C, { prompt: "a", n: 0 }, 400, "n", undefined, "in [1, 16]"],
    ["n 17", C, { prompt: "a", n: 17 }, 400, "n"],
    ["n fraction", C, { prompt: "a", n: 2.5 }, 400, "n"],
    [
      "too many sequences",
      C,
      { prompt: ["a", "b", "c", "d", "e"], n: 16 },
      400,
      "n",
      undefined,
      "80 sequences",
    ],
    ["logprobs 21", C, { prompt: "a", logprobs: 21 }, 400, "logprobs"],
    ["logprobs negative", C, { prompt: "a", logprobs: -1 }, 400, "logprobs"],
    ["logprobs boolean", C, { prompt: "a", logprobs: true }, 400, "logprobs"],
    ["echo string", C, { prompt: "a", echo: "yes" }, 400, "echo"],
    ["echo with logprobs", C, { prompt: "a", echo: true, logprobs: 1 }, 400, "echo"],
    ["stream string", C, { prompt: "a", stream: "true" }, 400, "stream"],
    [
      "stream_options without stream",
      C,
      { prompt: "a", stream_options: { include_usage: true } },
      400,
      "stream_options",
    ],
    [
      "stream_options number",
      C,
      { prompt: "a", stream: true, stream_options: 5 },
      400,
      "stream_options",
    ],
    [
      "include_usage string",
      C,
      { prompt: "a", stream: true, stream_options: { include_usage: "y" } },
      400,
      "include_usage",
    ],
    ["user number", C, { prompt: "a", user: 5 }, 400, "user"],
    ["model number", C, { prompt: "a", model: 5 }, 400, "model"],
    ["unknown model", C, { prompt: "a", model: "gpt-4" }, 404, "model", "model_not_found", "gpt-4"],
    ["session id with space", C, { prompt: "a", session_id: "a b" }, 400, "session_id"],
    ["session with n=2", C, { prompt: "a", session_id: "s1", n: 2 }, 400, "session_id"],
    ["session with two prompts", C, { prompt: ["a", "b"], session_id: "s1" }, 400, "session_id"],
    ["suffix", C, { prompt: "a", suffix: "x" }, 400, "suffix"],
    ["best_of", C, { prompt: "a", best_of: 3 }, 400, "best_of"],
    [
      "a field nobody takes",
      C,
      { prompt: "a", max_tokenz: 3 },
      400,
      "max_tokenz",
      "unknown_parameter",
      "unknown field",
    ],
    [
      "functions, deprecated",
      CHAT,
      { messages: MSG, functions: [] },
      400,
      "functions",
      "unsupported_parameter",
    ],
    ["speculation not a boolean", C, { prompt: "a", speculation: "yes" }, 400, "speculation"],
    [
      "prompt too long",
      C,
      { prompt: LONG },
      400,
      "prompt",
      "context_length_exceeded",
      `${context} tokens`,
    ],
    ["chat missing messages", CHAT, {}, 400, "messages"],
    ["chat empty messages", CHAT, { messages: [] }, 400, "messages"],
    ["chat messages string", CHAT, { messages: "hi" }, 400, "messages"],
    ["chat message number", CHAT, { messages: [5] }, 400, "messages[0]"],
    [
      "chat tool message answering no call",
      CHAT,
      { messages: [{ role: "tool", content: "x", tool_call_id: "call_1" }] },
      400,
      "messages[0].tool_call_id",
      undefined,
      "no earlier assistant message",
    ],
    [
      "chat role function",
      CHAT,
      { messages: [{ role: "function", content: "x" }] },
      400,
      "messages[0].role",
    ],
    ["chat missing content", CHAT, { messages: [{ role: "user" }] }, 400, "messages[0].content"],
    [
      "chat content number",
      CHAT,
      { messages: [MSG[0], { role: "user", content: 5 }] },
      400,
      "messages[1].content",
    ],
    [
      "chat image part",
      CHAT,
      { messages: [{ role: "user", content: [{ type: "image_url" }] }] },
      400,
      "messages[0].content[0]",
    ],
    [
      "chat top_logprobs alone",
      CHAT,
      { messages: MSG, top_logprobs: 3 },
      400,
      "top_logprobs",
      undefined,
      "logprobs: true",
    ],
    [
      "chat top_logprobs 21",
      CHAT,
      { messages: MSG, logprobs: true, top_logprobs: 21 },
      400,
      "top_logprobs",
    ],
    ["chat logprobs string", CHAT, { messages: MSG, logprobs: "yes" }, 400, "logprobs"],
    [
      "chat max_completion_tokens 0",
      CHAT,
      { messages: MSG, max_completion_tokens: 0 },
      400,
      "max_completion_tokens",
    ],
    [
      "chat too long",
      CHAT,
      { messages: [{ role: "user", content: LONG }] },
      400,
      "messages",
      "context_length_exceeded",
    ],
    [
      "chat max_tokens over context",
      CHAT,
      { messages: MSG, max_tokens: context },
      400,
      "messages",
      "context_length_exceeded",
    ],
    [
      "chat unknown model",
      CHAT,
      { messages: MSG, model: "llama-70b" },
      404,
      "model",
      "model_not_found",
    ],
    ["chat temperature", CHAT, { messages: MSG, temperature: 3 }, 400, "temperature"],
    ...parityCases(),
  ];
}

/** A schema of `depth` nested `items`. */
function nested(depth: number): Record<string, unknown> {
  let s: Record<string, unknown> = { type: "string" };
  for (let i = 0; i < depth; i++) s = { type: "array", items: s };
  return s;
}

const TOOL = {
  type: "function",
  function: { name: "get_weather", parameters: { type: "object" } },
};
const CALL = { id: "call_1", type: "function", function: { name: "get_weather", arguments: "{}" } };

/** Malformed structured output, logit_bias, tools and prefill requests (none reaches the GPU). */
function parityCases(): Bad[] {
  return [
    [
      "response_format unknown type",
      CHAT,
      { messages: MSG, response_format: { type: "xml" } },
      400,
      "response_format.type",
      "invalid_value",
      '"xml" is not supported',
    ],
    ["response_format string", C, { prompt: "a", response_format: "json" }, 400, "response_format"],
    [
      "response_format json_schema without a schema",
      CHAT,
      { messages: MSG, response_format: { type: "json_schema", json_schema: { name: "x" } } },
      400,
      "response_format.json_schema.schema",
    ],
    [
      "response_format json_schema without a name",
      CHAT,
      { messages: MSG, response_format: { type: "json_schema", json_schema: { schema: {} } } },
      400,
      "response_format.json_schema.name",
    ],
    [
      "response_format extra field",
      C,
      { prompt: "a", response_format: { type: "json_object", schema: {} } },
      400,
      "response_format.schema",
      "unknown_parameter",
    ],
    [
      "response_format regex without a pattern",
      C,
      { prompt: "a", response_format: { type: "regex" } },
      400,
      "response_format.pattern",
    ],
    [
      "response_format with stop",
      CHAT,
      { messages: MSG, response_format: { type: "json_object" }, stop: "}" },
      400,
      "stop",
      undefined,
      "cut the output",
    ],
    [
      "response_format schema nested too deep",
      C,
      {
        prompt: "a",
        response_format: { type: "json_schema", json_schema: { name: "x", schema: nested(100) } },
      },
      400,
      "response_format.json_schema.schema",
      undefined,
      "nested more than 64 levels",
    ],
    [
      "tool parameters nested too deep",
      CHAT,
      {
        messages: MSG,
        tools: [{ type: "function", function: { name: "f", parameters: nested(100) } }],
      },
      400,
      "tools[0].function.parameters",
    ],
    ["logit_bias list", C, { prompt: "a", logit_bias: [1] }, 400, "logit_bias"],
    [
      "logit_bias key not an id",
      C,
      { prompt: "a", logit_bias: { the: 1 } },
      400,
      "logit_bias",
      undefined,
      "token ids",
    ],
    [
      "logit_bias id over the vocabulary",
      CHAT,
      { messages: MSG, logit_bias: { 999999: 1 } },
      400,
      "logit_bias",
      undefined,
      "999999",
    ],
    [
      "logit_bias value out of range",
      C,
      { prompt: "a", logit_bias: { 5: 101 } },
      400,
      "logit_bias",
      undefined,
      "from -100 to 100",
    ],
    ["logit_bias value a string", C, { prompt: "a", logit_bias: { 5: "1" } }, 400, "logit_bias"],
    ["tools on completions", C, { prompt: "a", tools: [TOOL] }, 400, "tools", "unknown_parameter"],
    ["tools empty", CHAT, { messages: MSG, tools: [] }, 400, "tools"],
    [
      "tools of another type",
      CHAT,
      { messages: MSG, tools: [{ type: "web_search" }] },
      400,
      "tools[0].type",
      undefined,
      '"web_search" is not supported',
    ],
    [
      "tool name with a space",
      CHAT,
      { messages: MSG, tools: [{ type: "function", function: { name: "get weather" } }] },
      400,
      "tools[0].function.name",
    ],
    [
      "tools named twice",
      CHAT,
      { messages: MSG, tools: [TOOL, TOOL] },
      400,
      "tools[1].function.name",
      undefined,
      "used twice",
    ],
    [
      "tool parameters not an object",
      CHAT,
      { messages: MSG, tools: [{ type: "function", function: { name: "f", parameters: "x" } }] },
      400,
      "tools[0].function.parameters",
    ],
    ["tool_choice without tools", CHAT, { messages: MSG, tool_choice: "auto" }, 400, "tool_choice"],
    [
      "parallel_tool_calls without tools",
      CHAT,
      { messages: MSG, parallel_tool_calls: false },
      400,
      "parallel_tool_calls",
    ],
    [
      "tool_choice any",
      CHAT,
      { messages: MSG, tools: [TOOL], tool_choice: "any" },
      400,
      "tool_choice",
    ],
    [
      "tool_choice names another function",
      CHAT,
      {
        messages: MSG,
        tools: [TOOL],
        tool_choice: { type: "function", function: { name: "nope" } },
      },
      400,
      "tool_choice.function.name",
      undefined,
      '"nope"',
    ],
    [
      "tools with response_format",
      CHAT,
      { messages: MSG, tools: [TOOL], response_format: { type: "json_object" } },
      400,
      "response_format",
    ],
    [
      "assistant tool call without an id",
      CHAT,
      { messages: [MSG[0], { role: "assistant", tool_calls: [{ ...CALL, id: "" }] }] },
      400,
      "messages[1].tool_calls[0]",
    ],
    [
      "assistant tool call arguments not text",
      CHAT,
      {
        messages: [MSG[0], {
          role: "assistant",
          tool_calls: [{ ...CALL, function: { name: "f", arguments: {} } }],
        }],
      },
      400,
      "messages[1].tool_calls[0].function.arguments",
    ],
    [
      "tool message without tool_call_id",
      CHAT,
      {
        messages: [MSG[0], { role: "assistant", tool_calls: [CALL] }, {
          role: "tool",
          content: "sunny",
        }],
      },
      400,
      "messages[2].tool_call_id",
      undefined,
      "is required",
    ],
    [
      "a message field nobody takes",
      CHAT,
      { messages: [{ role: "user", content: "hi", tool_call_id: "x" }] },
      400,
      "messages[0].tool_call_id",
      "unknown_parameter",
    ],
    [
      "continue_final_message with add_generation_prompt",
      CHAT,
      {
        messages: [MSG[0], { role: "assistant", content: "Hel" }],
        continue_final_message: true,
        add_generation_prompt: true,
      },
      400,
      "continue_final_message",
      undefined,
      "cannot both be true",
    ],
    [
      "continuing a message with tool_calls",
      CHAT,
      {
        messages: [MSG[0], { role: "assistant", tool_calls: [CALL] }],
        continue_final_message: true,
      },
      400,
      "continue_final_message",
    ],
    [
      "continuing a constrained message",
      CHAT,
      {
        messages: [MSG[0], { role: "assistant", content: '{"a"' }],
        response_format: { type: "json_object" },
      },
      400,
      "continue_final_message",
    ],
  ];
}
