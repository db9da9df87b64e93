/**
 * What keeps a web page from driving the server through a visitor's browser: the Host
 * allow-list (DNS rebinding: a page of evil.example whose name now resolves to 127.0.0.1 sends
 * `Host: evil.example`), JSON bodies only (a `text/plain` POST is a "simple" request that a page
 * may send anywhere without asking the server first; `application/json` needs a CORS preflight),
 * and the WebSocket's `Origin` (browsers do not preflight WebSockets). Plus the WebSocket
 * handshake checks that turn a malformed handshake into a 400 instead of Deno's TypeError.
 */
import type { Context, MiddlewareHandler } from "hono";
import { ApiError } from "./errors.ts";

/** Host names a server bound to a loopback address answers to by default. */
export const LOOPBACK_HOSTS = ["localhost", "127.0.0.1", "[::1]"];

/** Whether `hostname` (a listen address) is a loopback one. */
export function isLoopback(hostname: string): boolean {
  const h = hostname.toLowerCase().replace(/^\[|\]$/g, "");
  return h === "localhost" || h === "::1" || /^127\.\d+\.\d+\.\d+$/.test(h);
}

/** The host name of a `Host` header or origin authority, lower case, without its port. */
export function hostName(authority: string): string {
  const a = authority.trim().toLowerCase();
  if (a.startsWith("[")) return a.slice(0, a.indexOf("]") + 1); // [::1]:8000
  return a.replace(/:\d*$/, "");
}

/**
 * Refuses requests whose `Host` is not in `allowed` (421 `host_not_allowed`); `["*"]` allows
 * any. A request without `Host` (HTTP/1.0, or not from a browser) passes: browsers always send
 * it.
 */
export function hostGuard(allowed: string[]): MiddlewareHandler {
  const names = new Set(allowed.map(hostName));
  return async (c, next) => {
    const host = c.req.header("host");
    if (host !== undefined && !names.has("*") && !names.has(hostName(host))) {
      throw new ApiError(
        421,
        `this server does not answer to the host ${JSON.stringify(host.slice(0, 100))}; ` +
          `connect through ${allowed.join(", ")}, or start it with --allowed-hosts naming ` +
          "this host",
        { code: "host_not_allowed" },
      );
    }
    await next();
  };
}

/** The media type of a `Content-Type` value, lower case, without its parameters. */
function mediaType(value: string): string {
  return value.split(";")[0].trim().toLowerCase();
}

/** Refuses a POST whose body is not `application/json` (415 `unsupported_media_type`). */
export const jsonOnly: MiddlewareHandler = async (c, next) => {
  if (c.req.method === "POST") {
    const type = c.req.header("content-type");
    if (type === undefined || mediaType(type) !== "application/json") {
      throw new ApiError(
        415,
        `send the body as JSON with the header Content-Type: application/json; got ` +
          (type === undefined ? "no Content-Type" : JSON.stringify(type.slice(0, 100))),
        { code: "unsupported_media_type" },
      );
    }
  }
  await next();
};

/**
 * Whether a WebSocket's `Origin` may connect: no `Origin` (not a browser), an origin on the
 * CORS allow-list (`*` allows any), or the server's own origin (the chat page it serves), i.e.
 * an origin whose host is the request's `Host`.
 */
export function originAllowed(c: Context, corsOrigins: string[]): boolean {
  const origin = c.req.header("origin");
  if (origin === undefined) return true;
  if (corsOrigins.includes("*") || corsOrigins.includes(origin)) return true;
  const host = c.req.header("host");
  try {
    return host !== undefined && new URL(origin).host === host.toLowerCase();
  } catch {
    return false; // "null" (sandboxed pages, file://) or garbage
  }
}

function handshakeError(message: string): ApiError {
  return new ApiError(400, message, { code: "invalid_handshake" });
}

/**
 * Checks a WebSocket upgrade before Deno sees it: origin (403 `origin_not_allowed`) and the
 * handshake headers RFC 6455 requires (400 `invalid_handshake`), which `Deno.upgradeWebSocket`
 * would otherwise reject with a TypeError. A plain GET (no `Upgrade: websocket`) passes on to
 * the route's 426.
 */
export function wsGuard(corsOrigins: string[]): MiddlewareHandler {
  return async (c, next) => {
    const upgrade = c.req.header("upgrade");
    if (upgrade === undefined || upgrade.toLowerCase() !== "websocket") return await next();
    if (!originAllowed(c, corsOrigins)) {
      throw new ApiError(
        403,
        `WebSocket connections from the origin ${
          JSON.stringify(c.req.header("origin")!.slice(0, 100))
        } are not allowed; add it to the server's --cors origins`,
        { code: "origin_not_allowed" },
      );
    }
    const tokens = (c.req.header("connection") ?? "").toLowerCase().split(",").map((t) => t.trim());
    if (!tokens.includes("upgrade")) {
      throw handshakeError(
        "a WebSocket handshake needs the header Connection: Upgrade; got " +
          JSON.stringify(c.req.header("connection") ?? null),
      );
    }
    if (c.req.header("sec-websocket-version") !== "13") {
      throw handshakeError("a WebSocket handshake needs Sec-WebSocket-Version: 13");
    }
    const key = c.req.header("sec-websocket-key") ?? "";
    if (!/^[A-Za-z0-9+/]{22}==$/.test(key.trim())) {
      throw handshakeError(
        "a WebSocket handshake needs Sec-WebSocket-Key: 16 random bytes in base64",
      );
    }
    await next();
  };
}
