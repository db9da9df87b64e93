/**
 * `response_format` and `logit_bias`: reading them, and compiling a constraint so that a schema
 * the engine refuses is a 400 whose `param` is the refused keyword's place in the request (the
 * engine's compiler names places in the spec it was given: a tool's schema sits inside the
 * call's schema routes/tools.ts builds around it).
 */
import {
  type Constraint,
  type ConstraintSpec,
  type EngineLike,
  MAX_LOGIT_BIAS,
} from "../api/types.ts";
import { ApiError, badRequest } from "./errors.ts";
import { type Body, describe } from "./fields.ts";

/** Where a schema sits in the spec compiled and in the request (see {@linkcode compileAt}). */
export interface SchemaPlace {
  /** Its dotted path in the compiled spec, as the compiler's messages name places. */
  dotted: string;
  /** Its JSON pointer in the compiled spec (`$ref` targets are named by pointer), if a schema. */
  pointer?: string;
  /** Its place in the request, e.g. `tools[2].function.parameters`. */
  request: string;
}

/** A constraint to compile and the places of the request's schemas inside it. */
export interface SpecAt {
  spec: ConstraintSpec;
  /** The `path` the compiler names places from (the spec's root). */
  path: string;
  places: SchemaPlace[];
}

const FORMAT_TYPES = '"text", "json_object", "json_schema" or "regex" (strata\'s)';

function onlyFields(v: Body, fields: string[], param: string): void {
  const extra = Object.keys(v).find((k) => !fields.includes(k));
  if (extra !== undefined) {
    throw badRequest(
      `${param}.${extra}`,
      `${param} takes ${fields.join(", ")}; "${extra}" is not one of them`,
      "unknown_parameter",
    );
  }
}

function object(v: unknown, param: string, example: string): Body {
  if (typeof v !== "object" || v === null || Array.isArray(v)) {
    throw badRequest(param, `${param} must be an object like ${example}; got ${describe(v)}`);
  }
  return v as Body;
}

/** Most nested arrays and objects a schema may have (the compiler walks schemas recursively). */
export const MAX_SCHEMA_DEPTH = 64;

/**
 * Refuses a schema nested deeper than {@linkcode MAX_SCHEMA_DEPTH} (counted without recursion).
 *
 * @throws {ApiError} 400 on `param`
 */
export function checkSchemaDepth(schema: unknown, param: string): void {
  const stack: [unknown, number][] = [[schema, 1]];
  while (stack.length > 0) {
    const [v, depth] = stack.pop()!;
    if (v === null || typeof v !== "object") continue;
    if (depth > MAX_SCHEMA_DEPTH) {
      throw badRequest(
        param,
        `${param} is nested more than ${MAX_SCHEMA_DEPTH} levels deep; flatten it`,
      );
    }
    for (const x of Object.values(v)) stack.push([x, depth + 1]);
  }
}

/** A json_schema's fields (chat's `json_schema` object, or the Responses API's `text.format`). */
export function schemaFields(js: Body, param: string, fields: string[]): SpecAt {
  onlyFields(js, fields, param);
  if (typeof js.name !== "string" || !/^[A-Za-z0-9_-]{1,64}$/.test(js.name)) {
    throw badRequest(
      `${param}.name`,
      `${param}.name is required: 1-64 of a-z A-Z 0-9 _ -; got ${describe(js.name)}`,
    );
  }
  if (js.description !== undefined && typeof js.description !== "string") {
    throw badRequest(`${param}.description`, `${param}.description must be a string`);
  }
  if (js.strict !== undefined && js.strict !== null && typeof js.strict !== "boolean") {
    throw badRequest(`${param}.strict`, `${param}.strict must be true or false`);
  }
  const schema = object(js.schema, `${param}.schema`, '{"type": "object", "properties": {...}}');
  const path = `${param}.schema`;
  checkSchemaDepth(schema, path);
  return {
    spec: { type: "json_schema", schema, strict: js.strict === true },
    path,
    places: [{ dotted: path, pointer: "#", request: path }],
  };
}

/**
 * An output format: chat's and completions' `response_format` (`json_schema` nested under
 * `"json_schema"`), or the Responses API's `text.format` (`shape` "flat": its fields beside
 * `type`). Null for text.
 *
 * @param param where it sits in the request
 * @throws {ApiError} 400 naming an unknown type or field
 */
export function parseFormat(v: unknown, param: string, shape: "chat" | "flat"): SpecAt | null {
  if (v === undefined || v === null) return null;
  const rf = object(v, param, '{"type": "json_object"}');
  const type = rf.type;
  if (type === "text") {
    onlyFields(rf, ["type"], param);
    return null;
  }
  if (type === "json_object") {
    onlyFields(rf, ["type"], param);
    return { spec: { type: "json_object" }, path: param, places: [] };
  }
  if (type === "json_schema") {
    const fields = ["name", "description", "schema", "strict"];
    if (shape === "flat") return schemaFields(rf, param, ["type", ...fields]);
    onlyFields(rf, ["type", "json_schema"], param);
    const js = object(rf.json_schema, `${param}.json_schema`, '{"name": "x", "schema": {...}}');
    return schemaFields(js, `${param}.json_schema`, fields);
  }
  if (type === "regex") {
    onlyFields(rf, ["type", "pattern"], param);
    if (typeof rf.pattern !== "string" || rf.pattern === "") {
      throw badRequest(
        `${param}.pattern`,
        `${param}.pattern must be a regular expression the whole output matches, e.g. ` +
          `"[0-9]{3}-[0-9]{4}"; got ${describe(rf.pattern)}`,
      );
    }
    const path = `${param}.pattern`;
    const places = [{ dotted: path, request: path }];
    return { spec: { type: "regex", pattern: rf.pattern }, path, places };
  }
  throw badRequest(
    `${param}.type`,
    `${param}.type ${describe(type)} is not supported; use ${FORMAT_TYPES}`,
  );
}

/** `response_format` of chat and completions (see {@linkcode parseFormat}). */
export function parseResponseFormat(body: Body): SpecAt | null {
  return parseFormat(body.response_format, "response_format", "chat");
}

/** Whether `text` starts with `prefix` followed by a path boundary. */
function startsAt(text: string, prefix: string): boolean {
  if (!text.startsWith(prefix)) return false;
  const next = text[prefix.length];
  return next === undefined || ".[:/ ".includes(next);
}

/** The engine's refusal of `at`, naming the request's places (see the module doc). */
function retarget(e: Error & { param?: string }, at: SpecAt): ApiError {
  const msg = e.message;
  const byLength = [...at.places].sort((a, b) => b.dotted.length - a.dotted.length);
  const place = byLength.find((p) => startsAt(msg, p.dotted));
  if (place) {
    const text = place.request + msg.slice(place.dotted.length);
    const colon = text.indexOf(": ");
    return badRequest(colon > 0 ? text.slice(0, colon) : place.request, text);
  }
  // Inside a $ref's target the compiler names places by the pointer it followed.
  const ptr = at.places.filter((p) => p.pointer !== undefined)
    .sort((a, b) => b.pointer!.length - a.pointer!.length)
    .find((p) => startsAt(msg, p.pointer!));
  if (ptr) {
    return badRequest(ptr.request, `${ptr.request}: #${msg.slice(ptr.pointer!.length)}`);
  }
  if (startsAt(msg, at.path)) return badRequest(at.path, msg);
  return badRequest(at.places[0]?.request ?? e.param ?? at.path, msg);
}

/**
 * Compiles `at.spec` for the engine's vocabulary.
 *
 * @throws {ApiError} 400 naming the refused keyword's place in the request
 */
export async function compileAt(engine: EngineLike, at: SpecAt): Promise<Constraint> {
  try {
    return await engine.compileConstraint(at.spec, at.path);
  } catch (e) {
    if ((e as { code?: unknown })?.code === "invalid_request") throw retarget(e as Error, at);
    throw e;
  }
}

/**
 * Refuses a constrained request whose max_tokens cannot finish the constrained text (the engine
 * would too, in words about response_format; `what` names the text here).
 *
 * @throws {ApiError} 400 on `max_tokens`
 */
export function checkBudget(c: Constraint, maxTokens: number, what: string): void {
  if (maxTokens >= c.minTokens) return;
  throw badRequest(
    "max_tokens",
    `max_tokens ${maxTokens} cannot finish ${what}: the shortest output that matches it takes ` +
      `${c.minTokens} tokens; raise max_tokens`,
  );
}

/**
 * `logit_bias`: OpenAI's map of token ids (as strings) to biases in [-100, 100], checked against
 * the tokenizer; undefined when absent or empty.
 *
 * @throws {ApiError} 400 on `logit_bias` naming the bad key or value
 */
export function parseLogitBias(
  engine: EngineLike,
  body: Body,
): [number, number][] | undefined {
  const v = body.logit_bias;
  if (v === undefined || v === null) return undefined;
  const map = object(v, "logit_bias", '{"1234": -100}');
  const entries = Object.entries(map);
  if (entries.length > MAX_LOGIT_BIAS) {
    throw badRequest(
      "logit_bias",
      `logit_bias has ${entries.length} entries; at most ${MAX_LOGIT_BIAS}`,
    );
  }
  const pairs: [number, number][] = [];
  for (const [key, bias] of entries) {
    const id = /^(0|[1-9][0-9]{0,9})$/.test(key) ? Number(key) : NaN;
    if (!Number.isSafeInteger(id)) {
      throw badRequest(
        "logit_bias",
        `logit_bias keys are token ids (decimal integers, as /v1/tokenize gives them); got ` +
          describe(key),
      );
    }
    if (!engine.knowsToken(id)) {
      throw badRequest(
        "logit_bias",
        `logit_bias: token id ${id} is not in the vocabulary of "${engine.modelId}"`,
      );
    }
    if (typeof bias !== "number" || !Number.isFinite(bias) || bias < -100 || bias > 100) {
      throw badRequest(
        "logit_bias",
        `logit_bias["${key}"] must be a number from -100 to 100; got ${describe(bias)}`,
      );
    }
    pairs.push([id, bias]);
  }
  return pairs.length > 0 ? pairs : undefined;
}
