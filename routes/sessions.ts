/**
 * `GET /v1/sessions/:id`, `DELETE /v1/sessions/:id` and `POST /v1/sessions/:id/replay`: what a
 * session holds, forgetting it, and running its recorded turns again to compare.
 */
import { Hono } from "hono";
import type { EngineLike, ReplayReport, SessionInfo } from "../api/types.ts";
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

/** A replay report as JSON (snake_case, as the API's other objects). */
export function replayJson(id: string, r: ReplayReport) {
  const d = r.divergence;
  return {
    id,
    object: "session.replay",
    turns: r.turns,
    tokens: r.tokens,
    identical: d === null,
    exact_fingerprints: r.exactFingerprints,
    max_fingerprint_distance: r.maxDistance,
    divergence: d && {
      turn: d.turn,
      step: d.step,
      kind: d.kind,
      expected: { token: d.expected.token, fingerprint: d.expected.fingerprint },
      got: { token: d.got.token, fingerprint: d.got.fingerprint },
    },
    skipped: r.skipped,
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
    })
    .post("/:id/replay", async (c) => {
      const id = pathId(c.req.param("id"));
      const text = await c.req.text();
      if (text.trim() !== "") {
        let body: unknown;
        try {
          body = JSON.parse(text);
        } catch {
          throw badRequest(null, "the body of a replay is empty or {}: it takes no fields");
        }
        const keys = body && typeof body === "object" ? Object.keys(body) : ["(body)"];
        if (keys.length) {
          throw badRequest(
            keys[0],
            `replay takes no fields; got '${keys[0]}'`,
            "unknown_parameter",
          );
        }
      }
      const engineId = engineSessionId(requestTenant(c), id);
      if (!engine.session(engineId)) throw notFound(id);
      return c.json(replayJson(id, await engine.replaySession(engineId)));
    });
}
