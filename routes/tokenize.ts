/**
 * `POST /v1/tokenize` and `POST /v1/detokenize`: the served model's tokenizer over HTTP, as
 * llama.cpp's server offers it at `/tokenize` and `/detokenize` (which answer the same: the app
 * gives them the API key and the body limit of the `/v1` routes).
 *
 *   POST /v1/tokenize   {"content": "Hello"}     → {"tokens": [1, 15043]}
 *   POST /v1/detokenize {"tokens": [1, 15043]}   → {"content": "<s> Hello"}
 *
 * (Token ids and text as a Llama tokenizer gives them; a BOS appears when the tokenizer's config
 * adds one.)
 */
import { Hono } from "hono";
import type { EngineLike } from "../api/types.ts";
import { ApiError, badRequest } from "./errors.ts";
import { type Body, boolField, describe, present, readJson } from "./fields.ts";
import { checkModel } from "./validate.ts";

/** The fields each route takes; any other is refused, so a misspelt option is not ignored. */
const FIELDS = {
  "/tokenize": ["content", "add_special_tokens", "model"],
  "/detokenize": ["tokens", "model"],
} as const;

/**
 * Refuses fields `route` does not take with a 400 naming the first of them.
 *
 * @throws {ApiError} 400 `unknown_parameter`, `param` the field
 */
function onlyKnownFields(body: Body, route: keyof typeof FIELDS, base: string): void {
  const known: readonly string[] = FIELDS[route];
  const unknown = Object.keys(body).find((k) => !known.includes(k));
  if (unknown === undefined) return;
  throw badRequest(
    unknown,
    `unknown field "${unknown}"; ${base}${route} takes ${known.map((k) => `"${k}"`).join(", ")}`,
    "unknown_parameter",
  );
}

/**
 * The `tokenize` and `detokenize` sub-app; mount it at `base` (`/v1`, or `/` for llama.cpp's
 * paths, which answer the same).
 */
export function tokenizeRoutes(engine: EngineLike, base: "/v1" | "" = "/v1"): Hono {
  const postOnly = (path: string) => (c: { req: { method: string } }) => {
    throw new ApiError(405, `${c.req.method} is not allowed here; use POST ${path}`, {
      code: "method_not_allowed",
      headers: { Allow: "POST" },
    });
  };
  return new Hono()
    .post("/tokenize", async (c) => {
      const body = await readJson(c);
      onlyKnownFields(body, "/tokenize", base);
      checkModel(engine, body);
      // encode() adds what the tokenizer's config says (a BOS, say): add_special_tokens: true,
      // so that value is accepted and false, which it cannot do, is refused.
      if (!boolField(body, "add_special_tokens", true)) {
        throw badRequest(
          "add_special_tokens",
          "add_special_tokens: false is not supported; the tokens always include the special " +
            "tokens the model's tokenizer adds (such as its BOS): leave the field out and drop " +
            "them from the result",
        );
      }
      const content = body.content;
      if (typeof content !== "string") {
        throw badRequest(
          "content",
          present(body, "content")
            ? `content must be a string; got ${describe(content)}`
            : 'content is required: the text to tokenize, e.g. {"content": "Hello"}',
        );
      }
      return c.json({ tokens: await engine.tokenize(content) });
    })
    .all("/tokenize", postOnly(`${base}/tokenize`))
    .post("/detokenize", async (c) => {
      const body = await readJson(c);
      onlyKnownFields(body, "/detokenize", base);
      checkModel(engine, body);
      const tokens = body.tokens;
      if (!Array.isArray(tokens)) {
        throw badRequest(
          "tokens",
          "tokens must be a list of token ids (integers >= 0), e.g. " +
            `{"tokens": [1, 15043]}; got ${describe(tokens)}`,
        );
      }
      tokens.forEach((id, i) => {
        if (typeof id !== "number" || !Number.isSafeInteger(id) || id < 0) {
          throw badRequest(
            "tokens",
            `tokens[${i}] must be a token id (an integer >= 0); got ${describe(id)}`,
          );
        }
        if (!engine.knowsToken(id)) {
          throw badRequest(
            "tokens",
            `tokens[${i}] is ${id}, which is not in the vocabulary of "${engine.modelId}"; ` +
              `send ids that ${base}/tokenize returns`,
          );
        }
      });
      return c.json({ content: await engine.detokenize(tokens) });
    })
    .all("/detokenize", postOnly(`${base}/detokenize`));
}
