/**
 * What the grammar compiler refuses, and that each refusal names the keyword or construct, where
 * it is, and what to do instead.
 */
import assert from "node:assert/strict";
import { characterAutomaton, type GrammarSpec } from "../engine/grammar/grammar.ts";
import { GrammarError } from "../engine/grammar/errors.ts";

const S = "response_format.json_schema.schema";

/** Asserts that compiling `spec` throws a GrammarError with exactly `message` (and `keyword`). */
function refuses(spec: GrammarSpec, message: string, keyword?: string) {
  assert.throws(() => characterAutomaton(spec), (e) => {
    assert.ok(e instanceof GrammarError, String(e));
    assert.equal(e.message, message);
    if (keyword !== undefined) assert.equal(e.keyword, keyword);
    return true;
  });
}
const schema = (s: unknown, strict = false): GrammarSpec => ({
  type: "json_schema",
  schema: s,
  strict,
});

Deno.test("unsupported keywords are refused by name, with their place and a way out", () => {
  refuses(
    schema({ type: "object", patternProperties: { "^x": {} } }),
    `${S}.patternProperties: 'patternProperties' is not supported; remove it or use additionalProperties`,
    "patternProperties",
  );
  refuses(
    schema({ type: "object", properties: { tags: { type: "array", uniqueItems: true } } }),
    `${S}.properties.tags.uniqueItems: 'uniqueItems' is not supported; remove it and deduplicate after generation`,
    "uniqueItems",
  );
  refuses(
    schema({ oneOf: [{ type: "string" }] }),
    `${S}.oneOf: 'oneOf' is not supported; use anyOf`,
    "oneOf",
  );
  refuses(
    schema({ type: "integer", minimum: 0 }),
    `${S}.minimum: 'minimum' is not supported; remove it and check the range after generation`,
  );
  refuses(
    schema({ anyOf: [{ type: "string" }, { allOf: [] }] }),
    `${S}.anyOf[1].allOf: 'allOf' is not supported; merge the subschemas into one schema`,
  );
  refuses(
    schema({ type: "string", nullable: true }),
    `${S}.nullable: 'nullable' is not supported; use a type array such as ["string", "null"]`,
  );
  refuses(
    schema({ properties: { "a b": { type: "string", frobnicate: 1 } } }),
    `${S}.properties["a b"].frobnicate: 'frobnicate' is not supported; remove it`,
  );
  refuses(
    schema({ type: "string", format: "hostname" }),
    `${S}.format: format "hostname" is not supported; use one of date, time, date-time, uuid, email, ipv4, or a pattern`,
    "format",
  );
  refuses(
    schema({ type: "string", minItems: 1 }),
    `${S}.minItems: 'minItems' applies to arrays, but the type is string; remove it`,
  );
  refuses(
    schema({ anyOf: [{ type: "string" }], type: "string" }),
    `${S}.type: 'type' beside 'anyOf' is not supported; move it into the anyOf branches`,
  );
});

Deno.test("recursive and non-local $refs are refused naming the $ref", () => {
  refuses(
    schema({
      $defs: { node: { type: "object", properties: { next: { $ref: "#/$defs/node" } } } },
      $ref: "#/$defs/node",
    }),
    "#/$defs/node.properties.next.$ref: recursive $ref '#/$defs/node' is not supported; write the nesting out to a fixed depth",
    "$ref",
  );
  refuses(
    schema({ type: "object", properties: { self: { $ref: "#" } } }),
    `${S}.properties.self.$ref: recursive $ref '#' is not supported; write the nesting out to a fixed depth`,
  );
  refuses(
    schema({ $ref: "https://example.com/s.json" }),
    `${S}.$ref: only local references ('#/$defs/name') are supported`,
  );
  refuses(
    schema({ $ref: "#/$defs/missing" }),
    `${S}.$ref: $ref '#/$defs/missing' points at nothing`,
  );
  refuses(schema({ $ref: "#/%E0%A4%A" }), `${S}.$ref: $ref '#/%E0%A4%A' points at nothing`);
  refuses(
    schema({ $defs: { a: { type: "string" } }, $ref: "#/$defs/a", minLength: 2 }),
    `${S}.minLength: 'minLength' beside '$ref' is not supported; move it into the referenced schema`,
  );
  // a reference used twice, not recursively, is fine
  characterAutomaton(schema({
    $defs: { p: { type: "integer" } },
    type: "object",
    properties: { a: { $ref: "#/$defs/p" }, b: { $ref: "#/$defs/p" } },
  }));
});

Deno.test("strict mode: additionalProperties false and every property required", () => {
  refuses(
    schema({ type: "object", properties: { a: { type: "string" } }, required: ["a"] }, true),
    `${S}.additionalProperties: strict mode needs 'additionalProperties': false on every object; add it, or set strict to false`,
    "additionalProperties",
  );
  refuses(
    schema({
      type: "object",
      properties: { a: { type: "string" }, b: { type: "string" } },
      required: ["a"],
      additionalProperties: false,
    }, true),
    `${S}.required: strict mode needs every property in 'required' (missing: b); make optional fields nullable with a type array such as ["string", "null"], or set strict to false`,
    "required",
  );
  characterAutomaton(
    schema({ type: "object", properties: { a: { type: "string" } }, required: [] }),
  );
});

Deno.test("contradictions and malformed schemas say what is wrong", () => {
  refuses(
    schema({ type: "string", minLength: 5, maxLength: 2 }),
    `${S}: minLength 5 is above maxLength 2`,
  );
  refuses(
    schema({ type: "array", minItems: 3, maxItems: 1 }),
    `${S}: minItems 3 is above maxItems 1`,
  );
  refuses(
    schema({ type: "array", prefixItems: [{}], items: false, minItems: 2 }),
    `${S}: minItems 2 needs more items than prefixItems gives (1); add items`,
  );
  refuses(
    schema({ type: "object", properties: {}, required: ["x"] }),
    `${S}.required: required names x, not in properties; add them to properties`,
  );
  refuses(
    schema({ type: "string", enum: [1, 2] }),
    `${S}: no enum/const value satisfies the rest of the schema`,
  );
  refuses(schema({ enum: [] }), `${S}.enum: enum must be a non-empty array`);
  refuses(
    schema({ type: "text" }),
    `${S}.type: type must be one of object, array, string, number, integer, boolean, null or an array of them`,
  );
  refuses(schema(false), `${S}: the schema false admits no value; remove it`);
  refuses(
    schema({ type: "string", maxLength: -1 }),
    `${S}.maxLength: maxLength must be a non-negative integer`,
  );
  refuses(
    schema({ type: "string", pattern: "a", maxLength: 3 }),
    `${S}.pattern: pattern with minLength or maxLength is not supported; put a {m,n} bound in the pattern`,
  );
});

Deno.test("regex constructs outside the subset are refused by name", () => {
  const regex = (pattern: string): GrammarSpec => ({ type: "regex", pattern });
  refuses(
    regex("a(?=b)"),
    'pattern: pattern "a(?=b)" at offset 1: lookahead and lookbehind are not supported',
    "lookaround",
  );
  refuses(
    regex("(a)\\1"),
    'pattern: pattern "(a)\\\\1" at offset 3: backreferences are not supported',
    "backreference",
  );
  refuses(
    regex("\\bword"),
    'pattern: pattern "\\\\bword" at offset 0: word boundaries (\\b) are not supported',
    "\\b",
  );
  refuses(
    regex("\\p{L}"),
    'pattern: pattern "\\\\p{L}" at offset 0: Unicode property escapes (\\p{…}) are not supported',
  );
  refuses(
    regex("a|^b"),
    "pattern: pattern \"a|^b\" at offset 2: '^' is supported only at the start and end of the whole pattern; wrap alternatives in a group, e.g. ^(a|b)$",
  );
  refuses(
    regex("(?i)a"),
    'pattern: pattern "(?i)a" at offset 0: inline flags and other (?…) groups are not supported',
  );
  refuses(regex("a{2,1}"), 'pattern: pattern "a{2,1}" at offset 1: quantifier {2,1} has max < min');
  refuses(
    regex("a{1001}"),
    'pattern: pattern "a{1001}" at offset 1: repetition bounds above 1000 are not supported; use * or +',
  );
  refuses(regex("(ab"), "pattern: pattern \"(ab\" at offset 3: missing ')'");
  refuses(
    regex("[]"),
    'pattern: pattern "[]" at offset 0: an empty class [] matches nothing; remove it',
  );
  refuses(regex("*a"), "pattern: pattern \"*a\" at offset 0: nothing to repeat before '*'");
  refuses(
    schema({ type: "string", pattern: "x(?!y)" }),
    `${S}.pattern: pattern "x(?!y)" at offset 1: lookahead and lookbehind are not supported`,
  );
});

Deno.test("grammars too large to compile are refused with what to shrink", () => {
  assert.throws(
    () => characterAutomaton({ type: "regex", pattern: "(a|b)*a(a|b){16}" }, { maxStates: 5000 }),
    (e) =>
      e instanceof GrammarError &&
      /grammar is too large \(more than 5000 automaton states/.test(e.message),
  );
  refuses(
    { type: "regex", pattern: "[^\\s\\S]" },
    "pattern: the grammar matches no text at all; check its constraints",
  );
});
