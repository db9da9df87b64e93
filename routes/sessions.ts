/** `GET /v1/sessions/:id` and `DELETE /v1/sessions/:id`: what a session holds, and forgetting it. */
import { Hono } from "hono";
import type { EngineLike, SessionInfo } from "../api/types.ts";
import { ApiError } from "./errors.ts";

function notFound(id: string): ApiError {
  return new ApiError(
    404,
    `no session "${id}"; sessions start when a request sends session_id (or X-Session-Id)`,
    { param: "id", code: "session_not_found" },
  );
}

/** A session as JSON (times in milliseconds since the epoch, as the engine keeps them). */
export function sessionJson(info: SessionInfo) {
  return {
    id: info.id,
    object: "session",
    tokens: info.tokens,
    created_at_ms: info.createdAt,
    updated_at_ms: info.updatedAt,
    persisted_at_ms: info.persistedAt ?? null,
  };
}

/** The `/v1/sessions` sub-app. */
export function sessionsRoutes(engine: EngineLike): Hono {
  return new Hono()
    .get("/:id", (c) => {
      const id = c.req.param("id");
      const info = engine.session(id);
      if (!info) throw notFound(id);
      return c.json(sessionJson(info));
    })
    .delete("/:id", async (c) => {
      const id = c.req.param("id");
      if (!(await engine.deleteSession(id))) throw notFound(id);
      return c.json({ id, object: "session.deleted", deleted: true });
    });
}
