/** `GET /v1/sessions/:id` and `DELETE /v1/sessions/:id`: what a session holds, and forgetting it. */
import { Hono } from "hono";
import type { EngineLike, SessionInfo } from "../api/types.ts";
import { ApiError, badRequest } from "./errors.ts";
import { describe, SESSION_ID } from "./fields.ts";
import { engineSessionId, requestTenant } from "./tenants.ts";

function notFound(id: string): ApiError {
  return new ApiError(
    404,
    `no session "${id}"; sessions start when a request sends session_id (or X-Session-Id)`,
    { param: "id", code: "session_not_found" },
  );
}

/**
 * A session as JSON (times in milliseconds since the epoch, as the engine keeps them), under
 * the client's id `id` (the engine's is in the tenant's namespace).
 */
export function sessionJson(id: string, info: SessionInfo) {
  return {
    id,
    object: "session",
    tokens: info.tokens,
    created_at_ms: info.createdAt,
    updated_at_ms: info.updatedAt,
    persisted_at_ms: info.persistedAt ?? null,
  };
}

/** The session id of the path, checked as `session_id` is (so no id names another tenant's). */
function pathId(id: string): string {
  if (!SESSION_ID.test(id)) {
    throw badRequest(
      "id",
      `a session id is 1-128 characters of A-Z a-z 0-9 _ . : -; got ${describe(id)}`,
    );
  }
  return id;
}

/** The `/v1/sessions` sub-app: a tenant sees and deletes only its own sessions. */
export function sessionsRoutes(engine: EngineLike): Hono {
  return new Hono()
    .get("/:id", (c) => {
      const id = pathId(c.req.param("id"));
      const info = engine.session(engineSessionId(requestTenant(c), id));
      if (!info) throw notFound(id);
      return c.json(sessionJson(id, info));
    })
    .delete("/:id", async (c) => {
      const id = pathId(c.req.param("id"));
      let deleted: boolean;
      try {
        deleted = await engine.deleteSession(engineSessionId(requestTenant(c), id));
      } catch (e) {
        if ((e as { code?: unknown })?.code !== "session_busy") throw e;
        throw new ApiError(
          409,
          `session "${id}" is generating; delete it once its turn has finished`,
          { param: "id", code: "session_busy" },
        );
      }
      if (!deleted) throw notFound(id);
      return c.json({ id, object: "session.deleted", deleted: true });
    });
}
