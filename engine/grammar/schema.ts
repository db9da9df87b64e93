/**
 * JSON Schema → byte automaton. The supported subset is OpenAI's `strict` subset and a little
 * more (docs/grammar.md lists it); every other keyword is refused by name, never ignored.
 * Annotations (title, description, default, examples, …) have no effect on validity and pass.
 */
import { GrammarError } from "./errors.ts";
import { FORMATS } from "./formats.ts";
import {
  jsonBoolean,
  jsonClass,
  jsonInteger,
  jsonNull,
  jsonNumber,
  jsonString,
} from "./json_lex.ts";
import {
  anyObject,
  anyValue,
  boundedArray,
  DEFAULT_LAYOUT,
  fixedObject,
  type Layout,
  mapObject,
  type PropertyFrag,
} from "./json_values.ts";
import { alt, type Frag, literal, seq, star } from "./nfa.ts";
import { ANY_CHAR, parseRegex, regexFrag } from "./regex.ts";
import { resolvePointer, validate } from "./validate.ts";
import { ANNOTATIONS, GENERAL, HINTS, PLURAL, TYPED, TYPES } from "./schema_keywords.ts";

/** Options for {@linkcode schemaFrag}. */
export interface SchemaOptions {
  /**
   * OpenAI's strict mode: every object must say `additionalProperties: false` and list every
   * property in `required`. Output is constrained the same way either way.
   */
  strict?: boolean;
  /** Where errors point (default `schema`). */
  path?: string;
  /** Nested containers allowed in an unconstrained value (`{}`, `true`, a bare object). */
  anyDepth?: number;
  layout?: Layout;
}

/**
 * Nested containers in an unconstrained value inside a schema (`{}`, `true`, an object without
 * properties, an array without items), its own included: each such value costs automaton states
 * exponential in this (the DFA remembers which brackets are open).
 */
export const ANY_DEPTH = 3;

/** Nested containers in json_object output, the outer object included (compiled once per model). */
export const JSON_OBJECT_DEPTH = 5;

/**
 * The automaton piece for values valid under `schema`.
 *
 * @throws GrammarError naming the first unsupported keyword, recursive `$ref`, or contradiction
 * @example schemaFrag({ type: "object", properties: { a: { type: "integer" } }, required: ["a"] })
 */
export function schemaFrag(schema: unknown, options: SchemaOptions = {}): Frag {
  return new SchemaCompiler(schema, options).node(schema, options.path ?? "schema");
}

/** Any JSON object (json_object mode), at most `depth` nested containers, itself included. */
export function jsonObjectFrag(depth = JSON_OBJECT_DEPTH, layout = DEFAULT_LAYOUT): Frag {
  return anyObject(depth, layout);
}

function member(path: string, key: string | number): string {
  if (typeof key === "number") return `${path}[${key}]`;
  return /^[A-Za-z_$][\w$]*$/.test(key) ? `${path}.${key}` : `${path}[${JSON.stringify(key)}]`;
}

type Obj = Record<string, unknown>;

class SchemaCompiler {
  readonly #root: unknown;
  #strict: boolean;
  readonly #depth: number;
  readonly #layout: Layout;
  /** `$ref`s being expanded (a repeat is recursion). */
  readonly #refs: string[] = ["#"];

  constructor(root: unknown, o: SchemaOptions) {
    this.#root = root;
    this.#strict = o.strict ?? false;
    this.#depth = o.anyDepth ?? ANY_DEPTH;
    this.#layout = o.layout ?? DEFAULT_LAYOUT;
  }

  node(schema: unknown, path: string): Frag {
    if (schema === true) return anyValue(this.#depth, this.#layout);
    if (schema === false) {
      throw new GrammarError(path, "the schema false admits no value; remove it");
    }
    if (schema === null || typeof schema !== "object" || Array.isArray(schema)) {
      throw new GrammarError(path, "a schema must be an object or a boolean");
    }
    const s = schema as Obj;
    for (const key of Object.keys(s)) {
      if (ANNOTATIONS.has(key) || GENERAL.has(key) || key in TYPED) continue;
      const hint = HINTS[key] ?? "remove it";
      throw new GrammarError(member(path, key), `'${key}' is not supported; ${hint}`, key);
    }
    if (s.$ref !== undefined) return this.#ref(s, path);
    if (s.enum !== undefined || "const" in s) return this.#values(s, path);
    if (s.anyOf !== undefined) return this.#anyOf(s, path);
    const types = this.#types(s, path);
    if (types.length === 0) return anyValue(this.#depth, this.#layout);
    return alt(...types.map((t) => this.#typed(t, s, path)));
  }

  #onlyBeside(s: Obj, keyword: string, path: string): void {
    for (const key of Object.keys(s)) {
      if (key === keyword || ANNOTATIONS.has(key)) continue;
      throw new GrammarError(
        member(path, key),
        `'${key}' beside '${keyword}' is not supported; move it into the ${
          keyword === "anyOf" ? "anyOf branches" : "referenced schema"
        }`,
        key,
      );
    }
  }

  #ref(s: Obj, path: string): Frag {
    this.#onlyBeside(s, "$ref", path);
    const ref = s.$ref;
    const at = member(path, "$ref");
    if (typeof ref !== "string" || !ref.startsWith("#")) {
      throw new GrammarError(at, "only local references ('#/$defs/name') are supported", "$ref");
    }
    if (this.#refs.includes(ref)) {
      throw new GrammarError(
        at,
        `recursive $ref '${ref}' is not supported; write the nesting out to a fixed depth`,
        "$ref",
      );
    }
    const target = resolvePointer(this.#root, ref);
    if (target === undefined) throw new GrammarError(at, `$ref '${ref}' points at nothing`, "$ref");
    this.#refs.push(ref);
    try {
      return this.node(target, ref);
    } finally {
      this.#refs.pop();
    }
  }

  /** enum / const: exactly the listed values that the rest of the schema allows. */
  #values(s: Obj, path: string): Frag {
    if (s.enum !== undefined && (!Array.isArray(s.enum) || s.enum.length === 0)) {
      throw new GrammarError(member(path, "enum"), "enum must be a non-empty array");
    }
    // The rest of the schema must compile too (so its keywords are checked), strict or not.
    const rest = Object.fromEntries(
      Object.entries(s).filter(([k]) => k !== "enum" && k !== "const"),
    );
    const strict = this.#strict;
    this.#strict = false;
    try {
      this.node(rest, path);
    } finally {
      this.#strict = strict;
    }
    const listed = "const" in s ? [s.const] : s.enum as unknown[];
    const kept = listed.filter((v) => validate(s, v, this.#root).length === 0);
    if (kept.length === 0) {
      throw new GrammarError(path, "no enum/const value satisfies the rest of the schema");
    }
    return alt(...kept.map((v) => literal(JSON.stringify(v))));
  }

  #anyOf(s: Obj, path: string): Frag {
    this.#onlyBeside(s, "anyOf", path);
    const at = member(path, "anyOf");
    if (!Array.isArray(s.anyOf) || s.anyOf.length === 0) {
      throw new GrammarError(at, "anyOf must be a non-empty array of schemas");
    }
    return alt(...s.anyOf.map((b, i) => this.node(b, member(at, i))));
  }

  /** The types to generate: `type`, or those the keywords imply; [] means any value. */
  #types(s: Obj, path: string): string[] {
    const used = Object.keys(s).filter((k) => k in TYPED);
    if (s.type === undefined) return [...new Set(used.map((k) => TYPED[k]))];
    const at = member(path, "type");
    const list = Array.isArray(s.type) ? s.type : [s.type];
    if (list.length === 0 || list.some((t) => typeof t !== "string" || !TYPES.includes(t))) {
      throw new GrammarError(at, `type must be one of ${TYPES.join(", ")} or an array of them`);
    }
    for (const k of used) {
      if (!list.includes(TYPED[k])) {
        throw new GrammarError(
          member(path, k),
          `'${k}' applies to ${PLURAL[TYPED[k]]}, but the type is ${list.join(" or ")}; remove it`,
          k,
        );
      }
    }
    // integer is inside number
    return list.includes("number") ? list.filter((t) => t !== "integer") : list;
  }

  #typed(type: string, s: Obj, path: string): Frag {
    switch (type) {
      case "null":
        return jsonNull;
      case "boolean":
        return jsonBoolean;
      case "integer":
        return jsonInteger;
      case "number":
        return jsonNumber;
      case "string":
        return this.#string(s, path);
      case "array":
        return this.#array(s, path);
      default:
        return this.#object(s, path);
    }
  }

  #count(s: Obj, key: string, path: string): number | undefined {
    const v = s[key];
    if (v === undefined) return undefined;
    if (typeof v !== "number" || !Number.isInteger(v) || v < 0) {
      throw new GrammarError(member(path, key), `${key} must be a non-negative integer`);
    }
    if (v > 10_000) {
      throw new GrammarError(
        member(path, key),
        `${key} above 10000 is not supported; lower it`,
        key,
      );
    }
    return v;
  }

  #string(s: Obj, path: string): Frag {
    const min = this.#count(s, "minLength", path), max = this.#count(s, "maxLength", path);
    if (min !== undefined && max !== undefined && min > max) {
      throw new GrammarError(path, `minLength ${min} is above maxLength ${max}`);
    }
    const lengths = min !== undefined || max !== undefined;
    if (s.format !== undefined) {
      const at = member(path, "format");
      const src = typeof s.format === "string" ? FORMATS[s.format] : undefined;
      if (src === undefined) {
        throw new GrammarError(
          at,
          `format ${JSON.stringify(s.format)} is not supported; use one of ` +
            `${Object.keys(FORMATS).join(", ")}, or a pattern`,
          "format",
        );
      }
      if (lengths || s.pattern !== undefined) {
        throw new GrammarError(
          at,
          "format with pattern, minLength or maxLength is not supported; keep only format",
        );
      }
      return this.#pattern(`^${src}$`, at);
    }
    if (s.pattern !== undefined) {
      const at = member(path, "pattern");
      if (typeof s.pattern !== "string") throw new GrammarError(at, "pattern must be a string");
      if (lengths) {
        throw new GrammarError(
          at,
          "pattern with minLength or maxLength is not supported; put a {m,n} bound in the pattern",
        );
      }
      return this.#pattern(s.pattern, at);
    }
    return jsonString(min ?? 0, max);
  }

  /** A string whose decoded value matches `pattern` (unanchored, as JSON Schema says). */
  #pattern(pattern: string, path: string): Frag {
    const { node, anchoredStart, anchoredEnd } = parseRegex(pattern, path);
    const any = star(jsonClass(ANY_CHAR));
    const parts = [literal('"')];
    if (!anchoredStart) parts.push(any);
    parts.push(regexFrag(node, jsonClass));
    if (!anchoredEnd) parts.push(any);
    parts.push(literal('"'));
    return seq(...parts);
  }

  #array(s: Obj, path: string): Frag {
    const minItems = this.#count(s, "minItems", path) ?? 0;
    const maxItems = this.#count(s, "maxItems", path);
    if (maxItems !== undefined && minItems > maxItems) {
      throw new GrammarError(path, `minItems ${minItems} is above maxItems ${maxItems}`);
    }
    const at = member(path, "prefixItems");
    if (s.prefixItems !== undefined && !Array.isArray(s.prefixItems)) {
      throw new GrammarError(at, "prefixItems must be an array of schemas");
    }
    const prefix = ((s.prefixItems ?? []) as unknown[]).map((p, i) => this.node(p, member(at, i)));
    let rest: Frag | undefined;
    if (s.items === false) rest = undefined;
    else if (s.items !== undefined) rest = this.node(s.items, member(path, "items"));
    else if (prefix.length === 0) rest = anyValue(this.#depth, this.#layout);
    if (rest === undefined && minItems > prefix.length) {
      throw new GrammarError(
        path,
        `minItems ${minItems} needs more items than prefixItems gives (${prefix.length}); add items`,
      );
    }
    return boundedArray({ prefix, rest, minItems, maxItems }, this.#layout);
  }

  #object(s: Obj, path: string): Frag {
    const extra = s.additionalProperties;
    if (this.#strict && extra !== false) {
      throw new GrammarError(
        member(path, "additionalProperties"),
        "strict mode needs 'additionalProperties': false on every object; add it, or set strict " +
          "to false",
        "additionalProperties",
      );
    }
    const propsAt = member(path, "properties");
    const props = s.properties ?? {};
    if (props === null || typeof props !== "object" || Array.isArray(props)) {
      throw new GrammarError(propsAt, "properties must be an object of schemas");
    }
    const names = Object.keys(props);
    const required = s.required ?? [];
    const reqAt = member(path, "required");
    if (!Array.isArray(required) || required.some((r) => typeof r !== "string")) {
      throw new GrammarError(reqAt, "required must be an array of property names");
    }
    const unknown = required.filter((r) => !names.includes(r));
    if (unknown.length > 0) {
      throw new GrammarError(
        reqAt,
        `required names ${unknown.join(", ")}, not in properties; add them to properties`,
      );
    }
    const optional = names.filter((n) => !required.includes(n));
    if (this.#strict && optional.length > 0) {
      throw new GrammarError(
        reqAt,
        `strict mode needs every property in 'required' (missing: ${optional.join(", ")}); make ` +
          'optional fields nullable with a type array such as ["string", "null"], or set strict to false',
        "required",
      );
    }
    const extraAt = member(path, "additionalProperties");
    const extraFrag = typeof extra === "object" && extra !== null
      ? this.node(extra, extraAt)
      : undefined;
    if (extra !== undefined && typeof extra !== "boolean" && extraFrag === undefined) {
      throw new GrammarError(extraAt, "additionalProperties must be a boolean or a schema");
    }
    if (names.length === 0 && extra !== false) {
      // No listed property: a map (additionalProperties a schema) or any object.
      if (extraFrag !== undefined) return mapObject(extraFrag, this.#layout);
      return anyObject(this.#depth, this.#layout);
    }
    // Listed properties only, in schema order; extra properties are never generated.
    const list: PropertyFrag[] = names.map((name) => ({
      name,
      value: this.node((props as Obj)[name], member(propsAt, name)),
      required: required.includes(name),
    }));
    return fixedObject(list, this.#layout);
  }
}
