/**
 * What the OpenAI parity tests share: the real server (routes/listen.ts on a random port) with
 * the default model in a worker thread, as `main.ts serve` runs it, the official client, and the
 * schemas, tools and checks the tests use.
 */
import assert from "node:assert/strict";
import OpenAI from "openai";
import { validate } from "../engine/grammar/validate.ts";
import { WorkerEngine } from "../engine/worker/host.ts";
import { createApp } from "../routes/app.ts";
import { listen } from "../routes/listen.ts";

export const KEY = "sk-parity";
const DEFAULT_MODEL = new URL("../models/strata-default", import.meta.url).pathname;

/** Starts the server; `close` shuts it and the engine down. */
export async function parityServer() {
  const engine = await WorkerEngine.load({ dir: DEFAULT_MODEL }, {
    contextLength: 768,
    maxSlots: 16,
    maxQueued: 64,
  });
  const server = listen(createApp(engine, { apiKey: KEY }).fetch, {
    hostname: "127.0.0.1",
    port: 0,
  });
  const origin = `http://127.0.0.1:${server.addr.port}`;
  const client = new OpenAI({ apiKey: KEY, baseURL: `${origin}/v1`, maxRetries: 0 });
  const close = async () => {
    await server.shutdown();
    await engine.close();
  };
  return { engine, model: engine.modelId, origin, client, close };
}

export const ASK = [{
  role: "user" as const,
  content: "Write a record about a farmer in a small town.",
}];

/** The JSON in `text`, or a failure that shows the text. */
export function parsed(text: string | null | undefined): unknown {
  assert.equal(typeof text, "string");
  try {
    return JSON.parse(text!);
  } catch (e) {
    throw new Error(`not JSON (${(e as Error).message}): ${JSON.stringify(text)}`);
  }
}

/** Asserts that `text` is JSON valid against `schema`. */
export function valid(schema: unknown, text: string | null | undefined): void {
  assert.deepEqual(validate(schema, parsed(text)), [], JSON.stringify(text));
}

/** What the tokenizer routes answer (one of the fields, or an error). */
export interface Answer {
  tokens: number[];
  content: string;
  error: { param: string; message: string };
}

/** POSTs JSON with the key to `origin` (for routes the client has no method for). */
export async function post(
  origin: string,
  path: string,
  body: unknown,
): Promise<{ status: number; json: Answer }> {
  const res = await fetch(`${origin}${path}`, {
    method: "POST",
    headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  return { status: res.status, json: await res.json() };
}

export const SCHEMAS: Record<string, Record<string, unknown>> = {
  person: {
    type: "object",
    properties: {
      name: { type: "string", maxLength: 12 },
      age: { type: "integer" },
      farmer: { type: "boolean" },
    },
    required: ["name", "age", "farmer"],
    additionalProperties: false,
  },
  tagged: {
    type: "object",
    properties: {
      color: { enum: ["red", "green", "blue"] },
      tags: { type: "array", items: { type: "string", maxLength: 8 }, maxItems: 3 },
    },
    required: ["color", "tags"],
  },
  place: {
    type: "object",
    properties: {
      city: { type: "string", maxLength: 10 },
      at: { $ref: "#/$defs/point" },
      note: { type: ["string", "null"], maxLength: 10 },
    },
    required: ["city", "at", "note"],
    additionalProperties: false,
    $defs: {
      point: {
        type: "object",
        properties: { lat: { type: "number" }, lon: { type: "number" } },
        required: ["lat", "lon"],
        additionalProperties: false,
      },
    },
  },
};

export const WEATHER = {
  type: "object",
  properties: { city: { type: "string", maxLength: 8 }, days: { type: "integer" } },
  required: ["city", "days"],
  additionalProperties: false,
};
export const TOOLS: OpenAI.ChatCompletionTool[] = [
  {
    type: "function",
    function: { name: "weather", description: "The forecast", parameters: WEATHER },
  },
  { type: "function", function: { name: "now", description: "The time" } },
];
export const ASK_WEATHER = [{ role: "user" as const, content: "What is the weather in Oslo?" }];

export function checkCalls(
  calls: OpenAI.ChatCompletionMessageToolCall[] | undefined,
  only?: string,
) {
  assert.ok(calls && calls.length >= 1, JSON.stringify(calls));
  for (const c of calls) {
    assert.equal(c.type, "function");
    assert.match(c.id, /^call_/);
    if (c.type !== "function") continue;
    if (only) assert.equal(c.function.name, only);
    if (c.function.name === "now") assert.deepEqual(parsed(c.function.arguments), {});
    else valid(WEATHER, c.function.arguments);
  }
}
