/**
 * API keys and tenants. Each key is a tenant: a request's key picks its tenant, and the tenant
 * scopes what the request can reach. Its session ids live in a namespace of their own (the
 * engine sees `<tenant>/<id>`, which no client id can spell, since ids have no `/`), and the
 * engine shares prefix-cache blocks only between requests of the same tenant
 * (`GenerateRequest.tenant`), so `cached_tokens` says nothing of other tenants' prompts.
 *
 * A server without keys has one tenant, unnamed: its session ids reach the engine unchanged.
 */
import type { Context, MiddlewareHandler } from "hono";
import { ApiError } from "./errors.ts";

declare module "hono" {
  interface ContextVariableMap {
    /** The request's tenant (from its API key); unset on a server without keys. */
    tenant?: string;
  }
}

async function sha256(text: string): Promise<Uint8Array> {
  return new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(text)));
}

function hex(bytes: Uint8Array): string {
  return [...bytes].map((b) => b.toString(16).padStart(2, "0")).join("");
}

/** A key's tenant name: a digest, so the name (kept in the session store) reveals no key. */
export async function tenantOf(key: string): Promise<string> {
  return `t${hex(await sha256(`strata tenant|${key}`)).slice(0, 16)}`;
}

/**
 * The tenant whose key is `given`, or undefined. Compares the SHA-256 digests of `given` and
 * of every key, byte by byte and all of them, so timing tells neither a key nor which matched.
 */
async function match(
  given: string,
  keys: Promise<{ digest: Uint8Array; tenant: string }[]>,
): Promise<string | undefined> {
  const [a, all] = await Promise.all([sha256(given), keys]);
  let found: string | undefined;
  for (const { digest, tenant } of all) {
    let diff = 0;
    for (let i = 0; i < a.length; i++) diff |= a[i] ^ digest[i];
    if (diff === 0) found = tenant;
  }
  return found;
}

/**
 * Middleware for `/v1/*` when the server has keys: 401 `invalid_api_key` without one of them,
 * else the request's tenant is set (`c.get("tenant")`). Browsers cannot set headers on a
 * WebSocket, so the upgrade at `wsPath` may carry the key as `?api_key=`.
 */
export function auth(keys: string[], wsPath: string): MiddlewareHandler {
  const known = Promise.all(
    [...new Set(keys)].map(async (k) => ({ digest: await sha256(k), tenant: await tenantOf(k) })),
  );
  return async (c, next) => {
    const header = c.req.header("authorization");
    const bearer = header?.match(/^Bearer\s+(.+)$/i)?.[1];
    const given = bearer ?? (c.req.path === wsPath ? c.req.query("api_key") : undefined);
    const tenant = given === undefined ? undefined : await match(given.trim(), known);
    if (tenant === undefined) {
      throw new ApiError(
        401,
        given === undefined
          ? "missing API key; send the header Authorization: Bearer <key>"
          : "incorrect API key; send one of the server's keys as Authorization: Bearer <key>",
        {
          type: "invalid_request_error",
          code: "invalid_api_key",
          headers: { "WWW-Authenticate": 'Bearer realm="strata"' },
        },
      );
    }
    c.set("tenant", tenant);
    await next();
  };
}

/** The engine's id of the tenant's session `id`. */
export function engineSessionId(tenant: string | undefined, id: string): string {
  return tenant === undefined ? id : `${tenant}/${id}`;
}

/** The request's tenant (undefined on a server without keys). */
export function requestTenant(c: Context): string | undefined {
  return c.get("tenant");
}
