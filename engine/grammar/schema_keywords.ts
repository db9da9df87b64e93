/**
 * The JSON Schema keywords engine/grammar/schema.ts knows: annotations (no effect on validity),
 * the type-specific and general keywords it compiles, and what to suggest for the ones it
 * refuses.
 */

/** Keywords with no effect on validity. */
export const ANNOTATIONS = new Set([
  "title",
  "description",
  "$schema",
  "$id",
  "$comment",
  "examples",
  "default",
  "deprecated",
  "readOnly",
  "writeOnly",
  "$defs",
  "definitions",
]);

/** Type-specific keywords and the type each applies to. */
export const TYPED: Record<string, string> = {
  properties: "object",
  required: "object",
  additionalProperties: "object",
  items: "array",
  prefixItems: "array",
  minItems: "array",
  maxItems: "array",
  minLength: "string",
  maxLength: "string",
  pattern: "string",
  format: "string",
};
/** Keywords of any schema. */
export const GENERAL = new Set(["type", "enum", "const", "anyOf", "$ref"]);
/** The JSON Schema type names. */
export const TYPES = ["object", "array", "string", "number", "integer", "boolean", "null"];
export const PLURAL: Record<string, string> = {
  object: "objects",
  array: "arrays",
  string: "strings",
};

/** What to do instead, for keywords users often reach for. */
export const HINTS: Record<string, string> = {
  patternProperties: "remove it or use additionalProperties",
  oneOf: "use anyOf",
  allOf: "merge the subschemas into one schema",
  not: "remove it",
  if: "remove it, or use anyOf over the cases",
  then: "remove it, or use anyOf over the cases",
  else: "remove it, or use anyOf over the cases",
  minimum: "remove it and check the range after generation",
  maximum: "remove it and check the range after generation",
  exclusiveMinimum: "remove it and check the range after generation",
  exclusiveMaximum: "remove it and check the range after generation",
  multipleOf: "remove it and check the value after generation",
  uniqueItems: "remove it and deduplicate after generation",
  minProperties: "list the properties and name them in required",
  maxProperties: "list the properties and set additionalProperties to false",
  nullable: 'use a type array such as ["string", "null"]',
  contains: "use items or prefixItems",
};
