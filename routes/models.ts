/** `GET /v1/models` and `GET /v1/models/:id`: the one model this server serves. */
import { Hono } from "hono";
import type { ServerContext } from "./context.ts";
import { ApiError } from "./errors.ts";

/** The `/v1/models` sub-app. */
export function modelsRoutes(ctx: ServerContext): Hono {
  const model = () => ({
    id: ctx.engine.modelId,
    object: "model",
    created: ctx.startedAt,
    owned_by: "strata",
    context_length: ctx.engine.contextLength,
  });
  return new Hono()
    .get("/", (c) => c.json({ object: "list", data: [model()] }))
    // `{.+}`: model ids such as "org/name" contain a slash.
    .get("/:id{.+}", (c) => {
      const id = c.req.param("id");
      if (id !== ctx.engine.modelId) {
        throw new ApiError(
          404,
          `the model "${id}" does not exist; this server serves "${ctx.engine.modelId}"`,
          { param: "model", code: "model_not_found" },
        );
      }
      return c.json(model());
    });
}
