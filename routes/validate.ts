/**
 * Request parsing shared by /v1/completions, /v1/chat/completions and the WebSocket: every
 * field is checked once here and a bad one becomes a 400 naming the field and what to send.
 */
import type { ChatMessage, Constraint, EngineLike, SamplingOptions } from "../api/types.ts";
import { checkBudget, compileAt, parseLogitBias, parseResponseFormat } from "./constraint.ts";
import { ApiError, badRequest } from "./errors.ts";
import { parseMessages } from "./messages.ts";
import { checkFields } from "./request_fields.ts";
import { parseTools, type ToolsRequest } from "./tools.ts";
import {
  type Body,
  boolField,
  describe,
  intField,
  numberField,
  present,
  sessionField,
  stopField,
} from "./fields.ts";

/** Most sequences (prompts × n) one request may start. */
export const MAX_SEQUENCES = 64;
/** Most alternatives per token for logprobs. */
export const MAX_TOP_LOGPROBS = 20;

/** Sampling and bookkeeping fields common to completions, chat and the WebSocket. */
export interface CommonRequest {
  /** Everything but `maxTokens`, `seed` and `topLogprobs`, which differ per choice or endpoint. */
  sampling: Omit<SamplingOptions, "maxTokens" | "seed" | "topLogprobs">;
  /** Base seed; choice k uses seed + k (mod 2^64) so n > 1 gives different choices. */
  seed?: bigint;
  /** Requested max new tokens, or undefined (chat: up to the context). */
  maxTokens?: number;
  n: number;
  stream: boolean;
  includeUsage: boolean;
  sessionId?: string;
  /** false: no speculative decoding for this request (`"speculation": false`). */
  speculation: boolean;
  /** The output must match this (`response_format`, or a required tool call). */
  constraint?: Constraint;
}

/** A parsed /v1/completions request. */
export interface CompletionRequest extends CommonRequest {
  /** One token-id list per prompt. */
  prompts: number[][];
  maxTokens: number;
  /** Alternatives per token, or null for no logprobs. */
  logprobs: number | null;
  /** With `echo`: the prompt texts to prepend (the strings sent, or decoded ids). */
  echo: string[] | null;
}

/** A parsed /v1/chat/completions (or WebSocket `start`) request. */
export interface ChatRequest extends CommonRequest {
  messages: ChatMessage[];
  promptIds: number[];
  maxTokens: number;
  logprobs: boolean;
  topLogprobs: number;
  /** The request's tools, or null without them. */
  tools: ToolsRequest | null;
}

/** Checks that `model` is absent or names the engine's model (404 `model_not_found`). */
export function checkModel(engine: EngineLike, body: Body): void {
  if (!present(body, "model")) return;
  const model = body.model;
  if (typeof model !== "string") {
    throw badRequest("model", `model must be a string; got ${describe(model)}`);
  }
  if (model !== engine.modelId) {
    throw new ApiError(
      404,
      `the model "${model}" does not exist; this server serves "${engine.modelId}" ` +
        "(see GET /v1/models)",
      { param: "model", code: "model_not_found" },
    );
  }
}

/** Parses the fields shared by all generation requests. */
export function parseCommon(body: Body, sessionHeader?: string): CommonRequest {
  const temperature = numberField(body, "temperature", { min: 0, max: 2 }, 1);
  const topP = numberField(body, "top_p", { min: 0, max: 1, openMin: true }, 1);
  const topK = intField(body, "top_k", 0, Number.MAX_SAFE_INTEGER, 0, " (0 turns it off)");
  const minP = numberField(body, "min_p", { min: 0, max: 1 }, 0);
  const presencePenalty = numberField(body, "presence_penalty", { min: -2, max: 2 }, 0);
  const frequencyPenalty = numberField(body, "frequency_penalty", { min: -2, max: 2 }, 0);
  const repetitionPenalty = numberField(
    body,
    "repetition_penalty",
    { min: 0, max: Infinity, openMin: true },
    1,
  );
  const n = intField(body, "n", 1, 16, 1);
  const maxName = present(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  const maxTokens = present(body, maxName)
    ? intField(body, maxName, 1, Number.MAX_SAFE_INTEGER, 1)
    : undefined;
  let seed: bigint | undefined;
  if (present(body, "seed")) {
    const s = intField(body, "seed", Number.MIN_SAFE_INTEGER, Number.MAX_SAFE_INTEGER, 0);
    seed = BigInt.asUintN(64, BigInt(s));
  }
  const stream = boolField(body, "stream", false);
  let includeUsage = false;
  if (present(body, "stream_options")) {
    const so = body.stream_options;
    if (!stream) {
      throw badRequest("stream_options", "stream_options is only allowed when stream is true");
    }
    if (typeof so !== "object" || Array.isArray(so)) {
      throw badRequest(
        "stream_options",
        `stream_options must be an object like {"include_usage": true}; got ${describe(so)}`,
      );
    }
    includeUsage = boolField(so as Body, "include_usage", false);
  }
  if (present(body, "user") && typeof body.user !== "string") {
    throw badRequest("user", `user must be a string; got ${describe(body.user)}`);
  }
  const sessionId = sessionField(body, sessionHeader);
  if (sessionId !== undefined && n > 1) {
    throw badRequest(
      "session_id",
      `a session continues one conversation, so n must be 1 with session_id; got n=${n}`,
    );
  }
  return {
    sampling: {
      temperature,
      topP,
      topK,
      minP,
      presencePenalty,
      frequencyPenalty,
      repetitionPenalty,
      stop: stopField(body),
    },
    seed,
    maxTokens,
    n,
    stream,
    includeUsage,
    sessionId,
    speculation: boolField(body, "speculation", true),
  };
}

/** The sampling options of choice `k` (its seed offset by k). */
export function samplingFor(
  req: CommonRequest & { maxTokens: number },
  topLogprobs: number,
  k: number,
): SamplingOptions {
  const seed = req.seed === undefined ? undefined : BigInt.asUintN(64, req.seed + BigInt(k));
  return { ...req.sampling, maxTokens: req.maxTokens, seed, topLogprobs };
}

/** Where {@linkcode fitContext}'s prompt and limit sit in the request, for its message. */
export interface ContextPlace {
  /** The prompt's field (`prompt`, `messages`, `input`). */
  param: string;
  /** How the message names the prompt (default `param`, e.g. "prompt 2"). */
  what?: string;
  /** The limit's field (default `max_tokens`). */
  limit?: string;
}

/**
 * Resolves max_tokens against the context: absent means "up to the context" (chat) and an
 * explicit value must fit with the prompt.
 *
 * @throws {ApiError} 400 `context_length_exceeded` naming the prompt's field
 */
export function fitContext(
  engine: EngineLike,
  promptTokens: number,
  maxTokens: number | undefined,
  place: ContextPlace,
): number {
  const { param, what = param, limit = "max_tokens" } = place;
  const ctx = engine.contextLength;
  if (maxTokens === undefined) {
    if (promptTokens < ctx) return ctx - promptTokens;
    throw new ApiError(
      400,
      `${what} is ${promptTokens} tokens, which leaves no room in the model's context of ` +
        `${ctx} tokens; shorten the ${param}`,
      { param, code: "context_length_exceeded" },
    );
  }
  if (promptTokens + maxTokens <= ctx) return maxTokens;
  // Name a value that helps: a max_tokens that fits, or, when none does, a prompt length.
  const fix = promptTokens < ctx
    ? `lower ${limit} to ${ctx - promptTokens} or less, or shorten the ${param}`
    : `the ${param} alone is too long: shorten it to ${ctx - 1} tokens or fewer`;
  throw new ApiError(
    400,
    `${what} is ${promptTokens} tokens and ${limit} is ${maxTokens}: ` +
      `${promptTokens + maxTokens} tokens, over the model's context of ${ctx} tokens; ${fix}`,
    { param, code: "context_length_exceeded" },
  );
}

const TOKEN_IDS = "prompt must be a string, a list of strings, a list of token ids " +
  "(integers >= 0), or a list of such lists, and not empty";

function isIdList(v: unknown): v is number[] {
  return Array.isArray(v) && v.length > 0 &&
    v.every((x) => typeof x === "number" && Number.isInteger(x) && x >= 0 && x < 2 ** 31);
}

/** Tokenizes `prompt` into one id list per prompt (long texts off this thread). */
export async function parsePrompts(engine: EngineLike, body: Body): Promise<number[][]> {
  const p = body.prompt;
  let prompts: number[][] | undefined;
  if (typeof p === "string") prompts = [await engine.tokenize(p)];
  else if (Array.isArray(p) && p.length > 0) {
    if (p.every((x) => typeof x === "string")) {
      prompts = await Promise.all(p.map((s) => engine.tokenize(s)));
    } else if (isIdList(p)) prompts = [p];
    else if (p.every(isIdList)) prompts = p as number[][];
  }
  if (!prompts) throw badRequest("prompt", `${TOKEN_IDS}; got ${describe(p)}`);
  const empty = prompts.findIndex((ids) => ids.length === 0);
  if (empty >= 0) {
    throw badRequest("prompt", `prompt ${empty} encodes to no tokens; send some text`);
  }
  return prompts;
}

/** Parses a /v1/completions body. */
export async function parseCompletion(
  engine: EngineLike,
  body: Body,
  sessionHeader?: string,
): Promise<CompletionRequest> {
  checkFields(body, "/v1/completions");
  checkModel(engine, body);
  if (!present(body, "prompt")) {
    throw badRequest("prompt", 'prompt is required, e.g. "prompt": "Once upon a time"');
  }
  const common = parseCommon(body, sessionHeader);
  const prompts = await parsePrompts(engine, body);
  if (prompts.length * common.n > MAX_SEQUENCES) {
    throw badRequest(
      "n",
      `${prompts.length} prompts × n=${common.n} is ${prompts.length * common.n} sequences, ` +
        `over the limit of ${MAX_SEQUENCES} per request; split the request`,
    );
  }
  if (common.sessionId !== undefined && prompts.length > 1) {
    throw badRequest("session_id", "a session continues one prompt; send one prompt with it");
  }
  let logprobs: number | null = null;
  if (present(body, "logprobs")) {
    logprobs = intField(body, "logprobs", 0, MAX_TOP_LOGPROBS, 0, " (alternatives per token)");
  }
  const echo = boolField(body, "echo", false);
  if (echo && logprobs !== null) {
    throw badRequest(
      "echo",
      "echo with logprobs is not supported (prompt tokens get no logprobs); drop one of them",
    );
  }
  if (present(body, "best_of") && body.best_of !== common.n && body.best_of !== 1) {
    throw badRequest("best_of", "best_of is not supported; use n to get several choices");
  }
  if (present(body, "suffix") && body.suffix !== "") {
    throw badRequest("suffix", "suffix (fill-in-the-middle) is not supported; leave it out");
  }
  const logitBias = parseLogitBias(engine, body);
  if (logitBias) common.sampling.logitBias = logitBias;
  const format = parseResponseFormat(body);
  if (format) checkConstrained(common.sampling.stop, "this response_format");
  const maxTokens = common.maxTokens ?? 16;
  prompts.forEach((ids, i) =>
    fitContext(engine, ids.length, maxTokens, {
      param: "prompt",
      what: prompts.length > 1 ? `prompt ${i}` : "prompt",
    })
  );
  const texts = Array.isArray(body.prompt) ? body.prompt : [body.prompt];
  const echoTexts = echo
    ? await Promise.all(
      prompts.map((ids, i) =>
        typeof texts[i] === "string" ? texts[i] as string : engine.detokenize(ids)
      ),
    )
    : null;
  let constraint: Constraint | undefined;
  if (format) {
    constraint = await compileAt(engine, format);
    checkBudget(constraint, maxTokens, "this response_format");
  }
  return {
    ...common,
    ...(constraint ? { constraint } : {}),
    prompts,
    maxTokens,
    logprobs,
    echo: echoTexts,
  };
}

/**
 * The generation prompt and continuing the last message, as vLLM takes them: a final assistant
 * message is continued unless the request says otherwise; both at once is a 400.
 */
export function chatEnds(body: Body, messages: ChatMessage[]) {
  const last = messages[messages.length - 1];
  const asked = present(body, "add_generation_prompt");
  const agpAsked = boolField(body, "add_generation_prompt", true);
  const cont = boolField(
    body,
    "continue_final_message",
    last.role === "assistant" && !last.tool_calls && !(asked && agpAsked),
  );
  const agp = asked ? agpAsked : !cont;
  if (cont && agp) {
    throw badRequest(
      "continue_final_message",
      "continue_final_message and add_generation_prompt cannot both be true: the first " +
        "continues the last message, the second starts a new assistant turn after it",
    );
  }
  if (cont && last.tool_calls) {
    throw badRequest(
      "continue_final_message",
      "the last message has tool_calls, so it cannot be continued; send its tool results",
    );
  }
  return { continueFinalMessage: cont, addGenerationPrompt: agp };
}

/**
 * Refuses what a constrained output cannot have: stop strings (they would cut it) and a
 * continued message (the constraint covers only the new text).
 */
export function checkConstrained(stop: string[], what: string, continued = false): void {
  if (stop.length > 0) {
    throw badRequest(
      "stop",
      `stop cannot be used with ${what}: a stop string would cut the output short of what it ` +
        "must be; leave stop out (the output ends when it is complete)",
    );
  }
  if (continued) {
    throw badRequest(
      "continue_final_message",
      `a continued message cannot be constrained by ${what}: the constraint covers only new ` +
        "text; send add_generation_prompt: true for a new turn after it, or leave it out",
    );
  }
}

/**
 * Token ids of `messages` through the model's chat template, with the tools and the ends
 * ({@linkcode chatEnds}) as the template takes them; a template that refuses them is a 400 on
 * `field`.
 */
export async function renderChat(
  engine: EngineLike,
  messages: ChatMessage[],
  o: { ends: ReturnType<typeof chatEnds>; tools: ToolsRequest | null; field: "messages" | "input" },
): Promise<number[]> {
  const t = o.tools;
  try {
    return await engine.tokenizeChat(messages, {
      ...o.ends,
      ...(t ? { tools: t.tools, toolChoice: t.choice, parallelToolCalls: t.parallel } : {}),
    });
  } catch (e) {
    throw badRequest(
      o.field,
      `the model's chat template rejected the ${o.field}: ${(e as Error).message}`,
    );
  }
}

/** Parses a /v1/chat/completions body (also the WebSocket `start` message). */
export async function parseChat(
  engine: EngineLike,
  body: Body,
  sessionHeader?: string,
  endpoint: "/v1/chat/completions" | "/v1/chat/ws" = "/v1/chat/completions",
): Promise<ChatRequest> {
  checkFields(body, endpoint);
  checkModel(engine, body);
  const messages = parseMessages(body);
  const common = parseCommon(body, sessionHeader);
  const logprobs = boolField(body, "logprobs", false);
  const topLogprobs = intField(body, "top_logprobs", 0, MAX_TOP_LOGPROBS, 0);
  if (present(body, "top_logprobs") && !logprobs) {
    throw badRequest("top_logprobs", "top_logprobs needs logprobs: true");
  }
  const logitBias = parseLogitBias(engine, body);
  if (logitBias) common.sampling.logitBias = logitBias;
  const tools = parseTools(body);
  const format = parseResponseFormat(body);
  if (format && tools && tools.mode !== "none") {
    throw badRequest(
      "response_format",
      "response_format with tools is not supported: the reply is either a tool call or text; " +
        'leave response_format out, or send tool_choice "none"',
    );
  }
  const ends = chatEnds(body, messages);
  const constrained = tools?.spec ?? format;
  if (constrained) {
    const what = tools?.spec ? "a tool_choice that requires a call" : "this response_format";
    checkConstrained(common.sampling.stop, what, ends.continueFinalMessage);
  }
  const promptIds = await renderChat(engine, messages, { ends, tools, field: "messages" });
  const maxTokens = fitContext(engine, promptIds.length, common.maxTokens, {
    param: "messages",
  });
  let constraint: Constraint | undefined;
  if (constrained) {
    constraint = await compileAt(engine, constrained);
    checkBudget(constraint, maxTokens, tools?.spec ? "the tool call" : "this response_format");
  }
  return {
    ...common,
    ...(constraint ? { constraint } : {}),
    messages,
    promptIds,
    maxTokens,
    logprobs,
    topLogprobs,
    tools,
  };
}
