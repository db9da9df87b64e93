/**
 * The schemas, regexes and checks the grammar walk tests share: each case with the JSON it must
 * produce checked by our validator (engine/grammar/validate.ts) or by RegExp.
 */
import type { GrammarSpec } from "../engine/grammar/grammar.ts";
import { validate } from "../engine/grammar/validate.ts";

/** A grammar and how to check a complete output of it. */
export interface Case {
  name: string;
  spec: GrammarSpec;
  /** Problems with `text` (empty: valid). */
  check: (text: string) => string[];
}

/** Containers nested in `v` (a scalar is 0). */
export function depth(v: unknown): number {
  if (v === null || typeof v !== "object") return 0;
  return 1 + Math.max(0, ...Object.values(v as object).map(depth));
}

function parse(text: string): { value?: unknown; error?: string } {
  try {
    return { value: JSON.parse(text) };
  } catch (e) {
    return { error: `JSON.parse: ${(e as Error).message}: ${JSON.stringify(text)}` };
  }
}

function schemaCase(
  name: string,
  schema: unknown,
  strict = false,
  more: (value: unknown) => string[] = () => [],
): Case {
  return {
    name,
    spec: { type: "json_schema", schema, strict },
    check: (text) => {
      const { value, error } = parse(text);
      if (error) return [error];
      const problems = [...validate(schema, value), ...more(value)];
      return problems.map((e) => `${e} in ${JSON.stringify(text)}`);
    },
  };
}

function regexCase(pattern: string): Case {
  const re = new RegExp(`^(?:${pattern})$`, "u");
  return {
    name: `regex ${pattern}`,
    spec: { type: "regex", pattern },
    check: (text) => re.test(text) ? [] : [`${JSON.stringify(text)} does not match`],
  };
}

/** json_object: any object, at most 5 nested containers. */
export const JSON_OBJECT: Case = {
  name: "json_object",
  spec: { type: "json_object" },
  check: (text) => {
    const { value, error } = parse(text);
    if (error) return [error];
    if (value === null || typeof value !== "object" || Array.isArray(value)) {
      return ["not an object"];
    }
    return depth(value) <= 5 ? [] : [`nested ${depth(value)} deep`];
  },
};

/** Every case of the walk tests. */
export const CASES: Case[] = [
  schemaCase("nested objects, optional properties", {
    type: "object",
    properties: {
      name: { type: "string" },
      age: { type: "integer" },
      address: {
        type: "object",
        properties: {
          city: { type: "string" },
          zip: { type: ["string", "null"] },
          geo: { type: "array", items: { type: "number" }, minItems: 2, maxItems: 2 },
        },
        required: ["city"],
      },
      nickname: { type: "string", maxLength: 5 },
    },
    required: ["name", "address"],
  }),
  schemaCase("arrays of objects", {
    type: "array",
    items: {
      type: "object",
      properties: { id: { type: "integer" }, ok: { type: "boolean" }, note: { type: "null" } },
      required: ["id", "ok", "note"],
      additionalProperties: false,
    },
    minItems: 1,
    maxItems: 3,
  }, true),
  schemaCase("enums with escapes and unicode, mixed-type enums", {
    type: "object",
    properties: {
      mood: {
        enum: ['say "hi"', "back\\slash", "naïve café", "😀 emoji", "tab\there", "line\u2028sep"],
      },
      mixed: { enum: [null, true, 1.5, -2e-7, "x", { k: [1, "two"] }, []] },
      typed: { type: "string", enum: ["a", 1, "b"] },
    },
    required: ["mood", "mixed", "typed"],
    additionalProperties: false,
  }, true),
  schemaCase("anyOf of types and objects, const", {
    anyOf: [
      { type: "number" },
      { type: "string", minLength: 1, maxLength: 3 },
      {
        type: "object",
        properties: { kind: { const: "circle" }, r: { type: "number" } },
        required: ["kind", "r"],
        additionalProperties: false,
      },
      {
        type: "object",
        properties: { kind: { const: "square" }, side: { type: "integer" } },
        required: ["kind", "side"],
        additionalProperties: false,
      },
      { type: "null" },
    ],
  }),
  schemaCase("numbers with signs and exponents", {
    type: "array",
    prefixItems: [{ type: "number" }, { type: "integer" }, { type: ["number", "null"] }],
    items: false,
    minItems: 2,
  }),
  schemaCase("strings: escapes, unicode, lengths, patterns", {
    type: "object",
    properties: {
      any: { type: "string" },
      short: { type: "string", minLength: 2, maxLength: 4 },
      greek: { type: "string", pattern: "^[α-ω]+\\d*$" },
      quoted: { type: "string", pattern: '^"[a-z]{1,3}"\\\\?$' },
      code: { type: "string", pattern: "[A-Z]{2}\\d" },
    },
    required: ["any", "short", "greek", "quoted", "code"],
  }),
  schemaCase("formats", {
    type: "object",
    properties: Object.fromEntries(
      ["date", "time", "date-time", "uuid", "email", "ipv4"].map((
        f,
      ) => [f, { type: "string", format: f }]),
    ),
    required: ["date", "time", "date-time", "uuid", "email", "ipv4"],
    additionalProperties: false,
  }, true),
  schemaCase(
    "$defs and $ref, maps, free values",
    {
      $defs: {
        point: {
          type: "object",
          properties: { x: { type: "integer" }, y: { type: "integer" } },
          required: ["x", "y"],
        },
        label: { type: "string", enum: ["start", "end"] },
      },
      type: "object",
      properties: {
        from: { $ref: "#/$defs/point" },
        to: { $ref: "#/$defs/point" },
        tag: { $ref: "#/$defs/label" },
        counts: { type: "object", additionalProperties: { type: "integer" } },
        extra: {},
      },
      required: ["from", "to", "counts"],
    },
    false,
    (v) => {
      const extra = (v as { extra?: unknown }).extra;
      return depth(extra) <= 3 ? [] : [`extra nested ${depth(extra)} deep`];
    },
  ),
  JSON_OBJECT,
  regexCase("[a-z]+@[a-z]+\\.(com|org)"),
  regexCase("\\d{3}-\\d{4}( x\\d{1,4})?"),
  regexCase("(ab|cd)*e?"),
  regexCase("[äöü世]{2,4}[^a-z\\n]*"),
  regexCase(".{0,6}"),
];
