/**
 * A JSON Schema validator for the subset engine/grammar/schema.ts compiles (2020-12 semantics:
 * type-specific keywords apply only to values of that type; `$ref` applies beside its siblings).
 * The compiler uses it to keep only the `enum` / `const` values the rest of a schema allows; tests
 * use it to check generated text. It is written independently of the automata: formats are
 * checked with JavaScript's RegExp and a calendar, patterns with RegExp's `u` mode.
 */
import { FORMATS } from "./formats.ts";

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
type Schema = boolean | Record<string, unknown>;

const FORMAT_RE: Record<string, RegExp> = Object.fromEntries(
  Object.entries(FORMATS).map(([name, src]) => [name, new RegExp(`^(?:${src})$`, "u")]),
);

/** Whether `y-m-d` is a real calendar day. */
function realDate(text: string): boolean {
  const [y, m, d] = text.slice(0, 10).split("-").map(Number);
  const t = new Date(Date.UTC(2000, m - 1, d));
  t.setUTCFullYear(y);
  return t.getUTCFullYear() === y && t.getUTCMonth() === m - 1 && t.getUTCDate() === d;
}

/** Whether `value` is valid for the supported `format`. */
export function formatValid(format: string, value: string): boolean {
  const re = FORMAT_RE[format];
  if (re === undefined) return false;
  if (!re.test(value)) return false;
  return format === "date" || format === "date-time" ? realDate(value) : true;
}

/** JSON equality (object key order does not matter). */
export function jsonEqual(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== typeof b || a === null || b === null || typeof a !== "object") return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  if (Array.isArray(a)) {
    const bb = b as unknown[];
    return a.length === bb.length && a.every((x, i) => jsonEqual(x, bb[i]));
  }
  const ao = a as Record<string, unknown>, bo = b as Record<string, unknown>;
  const ak = Object.keys(ao), bk = Object.keys(bo);
  return ak.length === bk.length && ak.every((k) => k in bo && jsonEqual(ao[k], bo[k]));
}

/** The JSON type names `value` has ("integer" values are also "number"). */
function typesOf(value: unknown): string[] {
  if (value === null) return ["null"];
  if (Array.isArray(value)) return ["array"];
  if (typeof value === "number") {
    return Number.isInteger(value) ? ["integer", "number"] : ["number"];
  }
  return [typeof value];
}

/** The schema a local `$ref` points at (`#`, `#/$defs/x`, any JSON pointer into `root`). */
export function resolvePointer(root: unknown, ref: string): unknown {
  if (!ref.startsWith("#")) return undefined;
  let at: unknown = root;
  let pointer: string;
  try {
    pointer = decodeURIComponent(ref.slice(1));
  } catch {
    return undefined; // a malformed %-escape points at nothing
  }
  if (pointer === "") return at;
  for (const raw of pointer.split("/").slice(1)) {
    const key = raw.replaceAll("~1", "/").replaceAll("~0", "~");
    if (at === null || typeof at !== "object" || !(key in (at as object))) return undefined;
    at = (at as Record<string, unknown>)[key];
  }
  return at;
}

/**
 * The ways `value` breaks `schema`, as `path: reason` lines; empty when it is valid.
 *
 * @param root the document `$ref`s resolve in (default: `schema` itself)
 * @example validate({ type: "integer" }, 1.5) // ["$: 1.5 is not of type integer"]
 */
export function validate(schema: unknown, value: unknown, root: unknown = schema): string[] {
  const out: string[] = [];
  check(schema as Schema, value as Json, root, "$", out);
  return out;
}

function check(schema: Schema, v: Json, root: unknown, at: string, out: string[]): void {
  if (schema === true) return;
  if (schema === false) {
    out.push(`${at}: no value is allowed here`);
    return;
  }
  const s = schema;
  const fail = (why: string) => out.push(`${at}: ${why}`);
  if (typeof s.$ref === "string") {
    const target = resolvePointer(root, s.$ref);
    if (target === undefined) fail(`unresolved $ref ${s.$ref}`);
    else check(target as Schema, v, root, at, out);
  }
  if (s.type !== undefined) {
    const want = Array.isArray(s.type) ? s.type as string[] : [s.type as string];
    if (!typesOf(v).some((t) => want.includes(t))) {
      fail(`${JSON.stringify(v)} is not of type ${want.join(" or ")}`);
    }
  }
  if (Array.isArray(s.enum) && !s.enum.some((e) => jsonEqual(e, v))) {
    fail("not one of the enum values");
  }
  if ("const" in s && !jsonEqual(s.const, v)) {
    fail(`not the const value ${JSON.stringify(s.const)}`);
  }
  if (Array.isArray(s.anyOf)) {
    const ok = s.anyOf.some((b) => validate(b, v, root).length === 0);
    if (!ok) fail("matches no anyOf branch");
  }
  if (typeof v === "string") checkString(s, v, fail);
  else if (Array.isArray(v)) checkArray(s, v, root, at, out);
  else if (v !== null && typeof v === "object") checkObject(s, v, root, at, out);
}

function checkString(s: Record<string, unknown>, v: string, fail: (why: string) => void): void {
  const length = [...v].length;
  if (typeof s.minLength === "number" && length < s.minLength) fail(`shorter than ${s.minLength}`);
  if (typeof s.maxLength === "number" && length > s.maxLength) fail(`longer than ${s.maxLength}`);
  if (typeof s.pattern === "string" && !new RegExp(s.pattern, "u").test(v)) {
    fail(`does not match ${s.pattern}`);
  }
  if (typeof s.format === "string" && !formatValid(s.format, v)) fail(`not a valid ${s.format}`);
}

function checkArray(
  s: Record<string, unknown>,
  v: Json[],
  root: unknown,
  at: string,
  out: string[],
) {
  if (typeof s.minItems === "number" && v.length < s.minItems) {
    out.push(`${at}: fewer than ${s.minItems} items`);
  }
  if (typeof s.maxItems === "number" && v.length > s.maxItems) {
    out.push(`${at}: more than ${s.maxItems} items`);
  }
  const prefix = Array.isArray(s.prefixItems) ? s.prefixItems as Schema[] : [];
  v.forEach((item, i) => {
    const sub = i < prefix.length ? prefix[i] : s.items as Schema | undefined;
    if (sub !== undefined) check(sub, item, root, `${at}[${i}]`, out);
  });
}

function checkObject(
  s: Record<string, unknown>,
  v: { [key: string]: Json },
  root: unknown,
  at: string,
  out: string[],
) {
  const props = (s.properties ?? {}) as Record<string, Schema>;
  for (const name of (s.required ?? []) as string[]) {
    if (!(name in v)) out.push(`${at}: missing required property ${JSON.stringify(name)}`);
  }
  for (const [name, value] of Object.entries(v)) {
    const where = `${at}.${name}`;
    if (Object.hasOwn(props, name)) check(props[name], value, root, where, out);
    else if (s.additionalProperties !== undefined) {
      check(s.additionalProperties as Schema, value, root, where, out);
    }
  }
}
