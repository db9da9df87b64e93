/**
 * Which fields a generation request may carry. A field we accept does what it says; OpenAI
 * fields strata does not implement are refused with a 400 that names them and says what to do
 * instead, and so is any other field (a typo must not be silently ignored).
 */
import { badRequest } from "./errors.ts";
import type { Body } from "./fields.ts";

/** Fields both generation endpoints (and the WebSocket's `start`) take. */
const COMMON = [
  "model",
  "max_tokens",
  "max_completion_tokens",
  "temperature",
  "top_p",
  "top_k",
  "min_p",
  "presence_penalty",
  "frequency_penalty",
  "repetition_penalty",
  "n",
  "seed",
  "stream",
  "stream_options",
  "stop",
  "user",
  "logprobs",
  "session_id",
  "speculation",
  "response_format",
  "logit_bias",
];

/** Chat fields besides the common ones (the WebSocket's `start` takes them too). */
const CHAT = ["messages", "top_logprobs", "continue_final_message", "add_generation_prompt"];

/** The fields each endpoint takes. */
export const REQUEST_FIELDS = {
  "/v1/completions": [...COMMON, "prompt", "echo", "best_of", "suffix"],
  "/v1/chat/completions": [...COMMON, ...CHAT, "tools", "tool_choice", "parallel_tool_calls"],
  "/v1/chat/ws": [...COMMON, ...CHAT, "type", "id"],
} as const;

/** Fields the chat endpoint takes that the WebSocket does not, and why. */
const NOT_OVER_WS = "the WebSocket streams text only; use POST /v1/chat/completions for tools";

/** OpenAI fields strata does not implement, and what to do instead. */
const NOT_IMPLEMENTED: Record<string, string> = {
  functions: "functions (deprecated by OpenAI) are not implemented; send them as tools",
  function_call: "function_call (deprecated by OpenAI) is not implemented; use tool_choice",
  prediction: "predicted outputs are not taken; strata drafts from the text itself (speculation)",
  audio: "audio output is not supported; leave audio out",
  modalities: "strata generates text only; leave modalities out",
  store: "strata stores no completions; leave store out (sessions keep a conversation's KV)",
  metadata: "strata stores no completions, so it keeps no metadata; leave it out",
  service_tier: "strata has one service tier; leave service_tier out",
  reasoning_effort: "strata's models do not reason in hidden tokens; leave reasoning_effort out",
  web_search_options: "strata does not search the web; leave web_search_options out",
};

/**
 * Refuses a field `endpoint` does not take: 400 `unsupported_parameter` for an OpenAI field
 * strata does not implement, `unknown_parameter` for any other.
 */
export function checkFields(body: Body, endpoint: keyof typeof REQUEST_FIELDS): void {
  const known: readonly string[] = REQUEST_FIELDS[endpoint];
  for (const key of Object.keys(body)) {
    if (known.includes(key)) continue;
    const why = NOT_IMPLEMENTED[key] ??
      (endpoint === "/v1/chat/ws" && REQUEST_FIELDS["/v1/chat/completions"].includes(key as never)
        ? NOT_OVER_WS
        : undefined);
    if (why) throw badRequest(key, `${key}: ${why}`, "unsupported_parameter");
    throw badRequest(
      key,
      `unknown field "${key}" for ${endpoint}; see docs/api.md for the fields it takes`,
      "unknown_parameter",
    );
  }
}
