/**
 * `tools`, `tool_choice` and `parallel_tool_calls`, and the constraint of a call: under
 * `required` or a named function the output is constrained to the JSON of the call(s),
 * `{"name": ..., "arguments": {...}}` (an array of them when calls may be parallel), so even a
 * small model's arguments match the function's schema.
 */
import type { ChatTool, ToolChoice } from "../api/types.ts";
import { badRequest } from "./errors.ts";
import { type Body, describe, present } from "./fields.ts";
import { checkSchemaDepth, type SchemaPlace, type SpecAt } from "./constraint.ts";
import { FUNCTION_NAME } from "./messages.ts";

/** Most tools a request may offer (OpenAI's limit). */
export const MAX_TOOLS = 128;

/** How a request's output relates to its tools. */
export type ToolMode =
  /** No tools, or `tool_choice: "none"`: the output is text. */
  | "none"
  /** `auto`: text, or a call the output turns out to be (routes/tool_calls.ts parses it). */
  | "auto"
  /** `required` or a named function: the output is constrained to the call(s). */
  | "constrained";

/** A request's tools, as parsed. */
export interface ToolsRequest {
  tools: ChatTool[];
  choice: ToolChoice;
  parallel: boolean;
  mode: ToolMode;
  /** Constrained output is an array of calls (`required` with parallel calls). */
  array: boolean;
  /** The call's constraint, when constrained. */
  spec?: SpecAt;
}

/**
 * The shape tools come in: chat's `{"type": "function", "function": {name, ...}}`, or the
 * Responses API's flat `{"type": "function", name, ...}`.
 */
export type ToolShape = "chat" | "flat";

const SHAPES: Record<ToolShape, string> = {
  chat: '{"type": "function", "function": {"name": "get_weather", "parameters": {...}}}',
  flat: '{"type": "function", "name": "get_weather", "parameters": {...}}',
};

/** Where a tool's function fields sit: `tools[i].function` or `tools[i]`. */
function functionPath(i: number, shape: ToolShape): string {
  return shape === "chat" ? `tools[${i}].function` : `tools[${i}]`;
}

function tool(t: unknown, i: number, shape: ToolShape): ChatTool {
  const param = `tools[${i}]`;
  const b = t as Body;
  if (typeof b !== "object" || b === null || Array.isArray(b)) {
    throw badRequest(param, `${param} must be a tool like ${SHAPES[shape]}; got ${describe(t)}`);
  }
  if (b.type !== "function") {
    throw badRequest(
      `${param}.type`,
      `${param}.type ${describe(b.type)} is not supported; strata's tools are functions ` +
        '("type": "function")',
    );
  }
  const fields = ["name", "description", "parameters", "strict"];
  const at = functionPath(i, shape);
  if (shape === "chat") {
    const extra = Object.keys(b).find((k) => k !== "type" && k !== "function");
    if (extra !== undefined) {
      throw badRequest(`${param}.${extra}`, `${param} takes type and function, not "${extra}"`);
    }
  }
  const f = (shape === "chat" ? b.function : b) as Body;
  if (typeof f !== "object" || f === null || Array.isArray(f)) {
    throw badRequest(at, `${at} must be an object like ${SHAPES[shape]}`);
  }
  const unknown = Object.keys(f).find((k) =>
    !fields.includes(k) && (shape === "chat" || k !== "type")
  );
  if (unknown !== undefined) {
    throw badRequest(
      `${at}.${unknown}`,
      `${at} takes ${fields.join(", ")}; "${unknown}" is not one of them`,
      "unknown_parameter",
    );
  }
  if (typeof f.name !== "string" || !FUNCTION_NAME.test(f.name)) {
    throw badRequest(
      `${at}.name`,
      `${at}.name must be 1-64 of a-z A-Z 0-9 _ - . :; got ${describe(f.name)}`,
    );
  }
  if (present(f, "description") && typeof f.description !== "string") {
    throw badRequest(`${at}.description`, `${at}.description must be a string`);
  }
  if (
    present(f, "parameters") &&
    (typeof f.parameters !== "object" || Array.isArray(f.parameters))
  ) {
    throw badRequest(
      `${at}.parameters`,
      `${at}.parameters must be a JSON Schema object; got ${describe(f.parameters)}`,
    );
  }
  if (present(f, "parameters")) checkSchemaDepth(f.parameters, `${at}.parameters`);
  if (present(f, "strict") && typeof f.strict !== "boolean") {
    throw badRequest(`${at}.strict`, `${at}.strict must be true or false`);
  }
  const out: ChatTool["function"] = { name: f.name };
  if (present(f, "description")) out.description = f.description as string;
  if (present(f, "parameters")) out.parameters = f.parameters;
  if (present(f, "strict")) out.strict = f.strict as boolean;
  return { type: "function", function: out };
}

function toolChoice(v: unknown, tools: ChatTool[], shape: ToolShape): ToolChoice {
  const param = "tool_choice";
  if (v === "auto" || v === "none" || v === "required") return v;
  const b = v as Body;
  const name = shape === "chat" ? (b?.function as Body | undefined)?.name : b?.name;
  const at = shape === "chat" ? `${param}.function.name` : `${param}.name`;
  if (typeof b === "object" && b !== null && b.type === "function" && typeof name === "string") {
    if (!tools.some((t) => t.function.name === name)) {
      throw badRequest(at, `tool_choice names the function "${name}", which is not in tools`);
    }
    return { name };
  }
  const named = shape === "chat"
    ? '{"type": "function", "function": {"name": "..."}}'
    : '{"type": "function", "name": "..."}';
  throw badRequest(
    param,
    `tool_choice must be "auto", "none", "required" or ${named}; got ${describe(v)}`,
  );
}

/**
 * Parses `tools`, `tool_choice` and `parallel_tool_calls`; null without tools.
 *
 * @throws {ApiError} 400 naming the field (tool_choice or parallel_tool_calls without tools, a
 *   tool of another type, duplicate names, a named function not among the tools)
 */
export function parseTools(body: Body, shape: ToolShape = "chat"): ToolsRequest | null {
  if (!present(body, "tools")) {
    for (const f of ["tool_choice", "parallel_tool_calls"]) {
      if (present(body, f)) throw badRequest(f, `${f} needs tools; send the functions in tools`);
    }
    return null;
  }
  const list = body.tools;
  if (!Array.isArray(list) || list.length === 0 || list.length > MAX_TOOLS) {
    throw badRequest(
      "tools",
      `tools must be a list of 1-${MAX_TOOLS} tools like [${SHAPES[shape]}]; got ${describe(list)}`,
    );
  }
  const tools = list.map((t, i) => tool(t, i, shape));
  const names = new Set<string>();
  tools.forEach((t, i) => {
    if (names.has(t.function.name)) {
      const at = `${functionPath(i, shape)}.name`;
      throw badRequest(at, `${at} "${t.function.name}" is used twice; names must differ`);
    }
    names.add(t.function.name);
  });
  const choice = present(body, "tool_choice") ? toolChoice(body.tool_choice, tools, shape) : "auto";
  const p = body.parallel_tool_calls;
  if (present(body, "parallel_tool_calls") && typeof p !== "boolean") {
    throw badRequest("parallel_tool_calls", `parallel_tool_calls must be true or false`);
  }
  const parallel = p !== false;
  if (choice === "none") return { tools, choice, parallel, mode: "none", array: false };
  if (choice === "auto") return { tools, choice, parallel, mode: "auto", array: false };
  const array = choice === "required" && parallel;
  const chosen = typeof choice === "object"
    ? tools.map((t, i) => ({ t, i })).filter(({ t }) => t.function.name === choice.name)
    : tools.map((t, i) => ({ t, i }));
  const spec = callSpec(chosen, array, shape);
  return { tools, choice, parallel, mode: "constrained", array, spec };
}

/** Keywords whose values are data, not schemas: `$ref` inside them is not a reference. */
const DATA = new Set(["enum", "const", "default", "examples"]);
/** Keywords whose values map names to schemas. */
const MAPS = new Set([
  "properties",
  "$defs",
  "definitions",
  "patternProperties",
  "dependentSchemas",
]);

/** `schema` with its local `$ref`s moved under `prefix` (the schema's pointer in a larger one). */
function movedRefs(schema: unknown, prefix: string, named = false): unknown {
  if (Array.isArray(schema)) return schema.map((s) => movedRefs(s, prefix));
  if (schema === null || typeof schema !== "object") return schema;
  const out: Body = {};
  for (const [k, v] of Object.entries(schema as Body)) {
    if (named) out[k] = movedRefs(v, prefix);
    else if (k === "$ref" && typeof v === "string" && v.startsWith("#")) {
      out[k] = prefix + v.slice(1);
    } else if (DATA.has(k)) out[k] = v;
    else out[k] = movedRefs(v, prefix, MAPS.has(k));
  }
  return out;
}

/** The spec of one call or an array of calls of `chosen` (see the module doc). */
function callSpec(chosen: { t: ChatTool; i: number }[], array: boolean, shape: ToolShape): SpecAt {
  const root = "tools";
  const places: SchemaPlace[] = [];
  const one = (at: { dotted: string; pointer: string }, { t, i }: { t: ChatTool; i: number }) => {
    const dotted = `${at.dotted}.properties.arguments`,
      pointer = `${at.pointer}/properties/arguments`;
    places.push({ dotted, pointer, request: `${functionPath(i, shape)}.parameters` });
    const params = t.function.parameters ??
      { type: "object", properties: {}, additionalProperties: false };
    return {
      type: "object",
      properties: { name: { const: t.function.name }, arguments: movedRefs(params, pointer) },
      required: ["name", "arguments"],
      additionalProperties: false,
    };
  };
  const call = (at: { dotted: string; pointer: string }) =>
    chosen.length === 1 ? one(at, chosen[0]) : {
      anyOf: chosen.map((c, k) =>
        one({ dotted: `${at.dotted}.anyOf[${k}]`, pointer: `${at.pointer}/anyOf/${k}` }, c)
      ),
    };
  const schema = array
    ? { type: "array", items: call({ dotted: `${root}.items`, pointer: "#/items" }), minItems: 1 }
    : call({ dotted: root, pointer: "#" });
  const strict = chosen.every(({ t }) => t.function.strict === true);
  return { spec: { type: "json_schema", schema, strict }, path: root, places };
}
