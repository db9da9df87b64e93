/**
 * `GET /v1/speculation` (speculative decoding's state) and `PUT /v1/speculation`
 * `{"mode": "off" | "auto"}`: the manual switch, beside `--speculate` and STRATA_SPECULATE.
 */
import { Hono } from "hono";
import type { EngineLike } from "../api/types.ts";
import { badRequest } from "./errors.ts";
import { readJson } from "./fields.ts";
import { speculationJson } from "./health.ts";

/** The `/v1/speculation` sub-app. */
export function speculationRoutes(engine: EngineLike): Hono {
  return new Hono()
    .get("/", (c) => c.json(speculationJson(engine.speculationStats())))
    .put("/", async (c) => {
      const body = await readJson(c);
      const extra = Object.keys(body).find((k) => k !== "mode");
      if (extra !== undefined) {
        throw badRequest(
          extra,
          `unknown field "${extra}"; send {"mode": "off"} or {"mode": "auto"}`,
          "unknown_parameter",
        );
      }
      if (body.mode !== "off" && body.mode !== "auto") {
        throw badRequest("mode", `mode must be "off" or "auto"; got ${JSON.stringify(body.mode)}`);
      }
      await engine.setSpeculation(body.mode);
      return c.json(speculationJson(engine.speculationStats()));
    });
}
