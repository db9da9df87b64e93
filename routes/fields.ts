/**
 * Reading one request field: the JSON body itself, then integers, numbers, booleans, stop
 * strings and session ids, each failing with a 400 that names the field and the accepted range.
 */
import type { Context } from "hono";
import { ApiError, badRequest } from "./errors.ts";

/** A parsed JSON object body. */
export type Body = Record<string, unknown>;

/** A value as it appears in error messages (JSON, at most 60 characters). */
export function describe(v: unknown): string {
  const s = v === undefined ? "undefined" : JSON.stringify(v) ?? String(v);
  return s.length > 60 ? `${s.slice(0, 57)}...` : s;
}

/** The field is there and not null. */
export function present(body: Body, name: string): boolean {
  return body[name] !== undefined && body[name] !== null;
}

/**
 * Parses JSON text into an object body.
 *
 * @throws {ApiError} 400 `invalid_json` when it is not JSON or not an object
 */
export function parseJsonObject(text: string): Body {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (e) {
    throw new ApiError(
      400,
      `the body is not valid JSON (${(e as Error).message}); send a JSON object`,
      { code: "invalid_json" },
    );
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new ApiError(400, `the body must be a JSON object; got ${describe(value)}`, {
      code: "invalid_json",
    });
  }
  return value as Body;
}

/** Reads the request body as a JSON object (size is limited by the app's body-limit middleware). */
export async function readJson(c: Context): Promise<Body> {
  return parseJsonObject(await c.req.text());
}

/** An integer field in [min, max], or `fallback` when absent. */
export function intField(
  body: Body,
  name: string,
  min: number,
  max: number,
  fallback: number,
  hint = "",
): number {
  if (!present(body, name)) return fallback;
  const v = body[name];
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < min || v > max) {
    const range = max === Number.MAX_SAFE_INTEGER ? `>= ${min}` : `in [${min}, ${max}]`;
    throw badRequest(name, `${name} must be an integer ${range}${hint}; got ${describe(v)}`);
  }
  return v;
}

/** A finite number field in [min, max] (exclusive min when `openMin`), or `fallback`. */
export function numberField(
  body: Body,
  name: string,
  range: { min: number; max: number; openMin?: boolean },
  fallback: number,
): number {
  if (!present(body, name)) return fallback;
  const v = body[name];
  const { min, max, openMin } = range;
  const low = typeof v === "number" && (openMin ? v > min : v >= min);
  if (typeof v !== "number" || !Number.isFinite(v) || !low || v > max) {
    const text = max === Infinity
      ? `${openMin ? ">" : ">="} ${min}`
      : `in ${openMin ? "(" : "["}${min}, ${max}]`;
    throw badRequest(name, `${name} must be a number ${text}; got ${describe(v)}`);
  }
  return v;
}

/** A boolean field, or `fallback`. */
export function boolField(body: Body, name: string, fallback: boolean): boolean {
  if (!present(body, name)) return fallback;
  const v = body[name];
  if (typeof v !== "boolean") {
    throw badRequest(name, `${name} must be true or false; got ${describe(v)}`);
  }
  return v;
}

/** What a session id may be: no `/`, so no client id can name another tenant's (routes/tenants.ts). */
export const SESSION_ID = /^[A-Za-z0-9_.:-]{1,128}$/;

/** `session_id` from the body, else the `X-Session-Id` header value; undefined when neither. */
export function sessionField(body: Body, header: string | undefined): string | undefined {
  const fromBody = present(body, "session_id");
  const v = fromBody ? body.session_id : header;
  if (v === undefined || v === "") return undefined;
  if (typeof v !== "string" || !SESSION_ID.test(v)) {
    throw badRequest(
      fromBody ? "session_id" : "X-Session-Id",
      `session_id must be 1-128 characters of A-Z a-z 0-9 _ . : -; got ${describe(v)}`,
    );
  }
  return v;
}

/** `stop`: a string or up to 4 non-empty strings; [] when absent. */
export function stopField(body: Body): string[] {
  if (!present(body, "stop")) return [];
  const v = body.stop;
  const list = typeof v === "string" ? [v] : v;
  const ok = Array.isArray(list) && list.length <= 4 &&
    list.every((s) => typeof s === "string" && s.length > 0);
  if (!ok) {
    throw badRequest(
      "stop",
      `stop must be a non-empty string or a list of up to 4 non-empty strings; got ${describe(v)}`,
    );
  }
  return list as string[];
}
