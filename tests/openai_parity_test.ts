/**
 * OpenAI parity end to end: the real server (routes/listen.ts on a random port) with the default
 * model in a worker thread, as `main.ts serve` runs it, driven by the official `openai` client.
 * Structured output from the small trained model at temperature 0.8 over many seeds, each parsed
 * and validated against its schema; tool calls under `required` and a named function, streamed
 * (accumulated by the client's stream helper) and not, with valid arguments; tool messages in
 * history and an assistant prefill, checked by the prompt the template renders; logit_bias
 * against greedy output; tokenize round trips on both paths; the Responses API, streamed and
 * not; the refusals, each naming its field.
 */
import assert from "node:assert/strict";
import OpenAI from "openai";
import type { ChatMessage } from "../api/types.ts";
import { validate } from "../engine/grammar/validate.ts";
import { WorkerEngine } from "../engine/worker/host.ts";
import { createApp } from "../routes/app.ts";
import { listen } from "../routes/listen.ts";

const KEY = "sk-parity";
const DEFAULT_MODEL = new URL("../models/strata-default", import.meta.url).pathname;
const engine = await WorkerEngine.load({ dir: DEFAULT_MODEL }, {
  contextLength: 768,
  maxSlots: 16,
  maxQueued: 64,
});
const MODEL = engine.modelId;
const server = listen(createApp(engine, { apiKey: KEY }).fetch, { hostname: "127.0.0.1", port: 0 });
const origin = `http://127.0.0.1:${server.addr.port}`;
const client = new OpenAI({ apiKey: KEY, baseURL: `${origin}/v1`, maxRetries: 0 });
const ASK = [{ role: "user" as const, content: "Write a record about a farmer in a small town." }];

/** The JSON in `text`, or a failure that shows the text. */
function parsed(text: string | null | undefined): unknown {
  assert.equal(typeof text, "string");
  try {
    return JSON.parse(text!);
  } catch (e) {
    throw new Error(`not JSON (${(e as Error).message}): ${JSON.stringify(text)}`);
  }
}

function valid(schema: unknown, text: string | null | undefined): void {
  assert.deepEqual(validate(schema, parsed(text)), [], JSON.stringify(text));
}

/** POSTs JSON with the key (for routes the client has no method for). */
/** What the tokenizer routes answer (one of the fields, or an error). */
interface Answer {
  tokens: number[];
  content: string;
  error: { param: string; message: string };
}

async function post(path: string, body: unknown): Promise<{ status: number; json: Answer }> {
  const res = await fetch(`${origin}${path}`, {
    method: "POST",
    headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  return { status: res.status, json: await res.json() };
}

const SCHEMAS: Record<string, Record<string, unknown>> = {
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

Deno.test("response_format: schema-valid JSON from the default model at T=0.8, many seeds", async () => {
  // Every request at once: one batch of 14 sequences, most of them constrained. The budgets
  // leave a few tokens over each schema's shortest output (21, 17 and 34 tokens).
  const budget: Record<string, number> = { person: 28, tagged: 24, place: 40 };
  const jobs = Object.entries(SCHEMAS).map(async ([name, schema], i) => {
    const res = await client.chat.completions.create({
      model: MODEL,
      messages: ASK,
      response_format: { type: "json_schema", json_schema: { name, schema, strict: i === 0 } },
      temperature: 0.8,
      seed: 100 * i,
      n: 3,
      max_tokens: budget[name],
    });
    assert.equal(res.choices.length, 3);
    for (const c of res.choices) valid(schema, c.message.content);
    return new Set(res.choices.map((c) => c.message.content)).size;
  });
  const object = client.chat.completions.create({
    model: MODEL,
    messages: ASK,
    response_format: { type: "json_object" },
    temperature: 0.8,
    seed: 7,
    n: 2,
    max_tokens: 10,
  }).then((res) => {
    for (const c of res.choices) {
      const v = parsed(c.message.content);
      assert.ok(v !== null && typeof v === "object" && !Array.isArray(v), c.message.content!);
    }
  });
  // Streamed, the chunks add up to valid JSON too.
  const streamed = (async () => {
    const stream = await client.chat.completions.create({
      model: MODEL,
      messages: ASK,
      response_format: { type: "json_schema", json_schema: { name: "p", schema: SCHEMAS.person } },
      temperature: 0.8,
      seed: 11,
      n: 2,
      max_tokens: 28,
      stream: true,
    });
    const texts = ["", ""];
    for await (const chunk of stream) {
      for (const c of chunk.choices) texts[c.index] += c.delta.content ?? "";
    }
    for (const t of texts) valid(SCHEMAS.person, t);
  })();
  // A pattern on /v1/completions (strata's regex form).
  const regex = client.completions.create({
    model: MODEL,
    prompt: "Call me at",
    response_format: { type: "regex", pattern: "\\([0-9]{3}\\) [0-9]{3}-[0-9]{4}" },
    temperature: 0.8,
    seed: 3,
    n: 2,
    max_tokens: 12,
  } as OpenAI.CompletionCreateParamsNonStreaming).then((res) => {
    for (const c of res.choices) assert.match(c.text, /^\([0-9]{3}\) [0-9]{3}-[0-9]{4}$/);
  });
  const distinct = await Promise.all([...jobs, object, streamed, regex]);
  // Seeds differ, and so do the records: the constraint shapes the output, it does not fix it.
  assert.ok(distinct.slice(0, 3).every((n) => (n as number) >= 2), JSON.stringify(distinct));
});

const WEATHER = {
  type: "object",
  properties: { city: { type: "string", maxLength: 8 }, days: { type: "integer" } },
  required: ["city", "days"],
  additionalProperties: false,
};
const TOOLS: OpenAI.ChatCompletionTool[] = [
  {
    type: "function",
    function: { name: "weather", description: "The forecast", parameters: WEATHER },
  },
  { type: "function", function: { name: "now", description: "The time" } },
];
const ASK_WEATHER = [{ role: "user" as const, content: "What is the weather in Oslo?" }];

function checkCalls(calls: OpenAI.ChatCompletionMessageToolCall[] | undefined, only?: string) {
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

Deno.test("tools: required and named calls have valid arguments, streamed and not", async () => {
  const base = { model: MODEL, messages: ASK_WEATHER, tools: TOOLS, temperature: 0.8 };
  const named = { type: "function" as const, function: { name: "weather" } };
  // Streamed: OpenAI's chunks (id, type and name first, then the arguments in pieces), which
  // the client's stream helper accumulates into the same message a whole response has.
  // The shortest call of weather takes 32 tokens; of either, 18.
  const body = { ...base, tool_choice: named, seed: 9, max_tokens: 40 };
  const chunks = (async () => {
    const stream = await client.chat.completions.create({ ...body, stream: true });
    const deltas: OpenAI.ChatCompletionChunk.Choice.Delta.ToolCall[] = [];
    let finish: string | null = null;
    for await (const chunk of stream) {
      deltas.push(...(chunk.choices[0]?.delta.tool_calls ?? []));
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    return { deltas, finish };
  })();
  const [required, single, one, streamed, helper] = await Promise.all([
    client.chat.completions.create({
      ...base,
      tool_choice: "required",
      n: 3,
      seed: 1,
      max_tokens: 48,
    }),
    client.chat.completions.create({
      ...base,
      tool_choice: "required",
      parallel_tool_calls: false,
      n: 2,
      seed: 5,
      max_tokens: 24,
    }),
    client.chat.completions.create(body),
    chunks,
    client.chat.completions.stream(body).finalChatCompletion(),
  ]);
  for (const c of required.choices) {
    assert.equal(c.finish_reason, "tool_calls");
    assert.equal(c.message.content, null);
    checkCalls(c.message.tool_calls);
  }
  for (const c of single.choices) {
    assert.equal(c.message.tool_calls?.length, 1);
    checkCalls(c.message.tool_calls);
  }
  for (const c of one.choices) {
    assert.equal(c.message.tool_calls?.length, 1);
    checkCalls(c.message.tool_calls, "weather");
  }
  const { deltas, finish } = streamed;
  assert.equal(finish, "tool_calls");
  assert.deepEqual(deltas[0].function, { name: "weather", arguments: "" });
  assert.match(deltas[0].id!, /^call_/);
  assert.ok(deltas.length > 2, `arguments came in one piece: ${JSON.stringify(deltas)}`);
  assert.ok(deltas.slice(1).every((d) => d.id === undefined && d.index === 0));
  const calls = helper.choices[0].message.tool_calls;
  checkCalls(calls, "weather");
  // The same seed gives the same call, streamed or whole (choice 0 of n uses the seed itself).
  const whole = one.choices[0].message.tool_calls![0];
  const text = (c: OpenAI.ChatCompletionMessageToolCall) =>
    c.type === "function" ? c.function.arguments : "";
  assert.equal(text(calls![0]), text(whole));
  assert.equal(deltas.map((d) => d.function?.arguments ?? "").join(""), text(whole));
});

Deno.test("tools: tool messages in history reach the prompt; auto answers text or a call", async () => {
  const call = {
    id: "call_abc",
    type: "function" as const,
    function: { name: "weather", arguments: '{"city": "Oslo", "days": 1}' },
  };
  const messages: OpenAI.ChatCompletionMessageParam[] = [
    ...ASK_WEATHER,
    // As the client's stream helper returns a message (`parsed: null`: null counts as absent).
    { role: "assistant", content: null, tool_calls: [call], refusal: null, parsed: null } as never,
    { role: "tool", tool_call_id: "call_abc", content: "4 degrees and snow" },
  ];
  const res = await client.chat.completions.create({
    model: MODEL,
    messages,
    tools: TOOLS,
    temperature: 0,
    max_tokens: 6,
  });
  const rendered: ChatMessage[] = [
    ASK_WEATHER[0],
    { role: "assistant", content: "", tool_calls: [call] },
    { role: "tool", content: "4 degrees and snow", tool_call_id: "call_abc", name: "weather" },
  ];
  const want = engine.encodeChat(rendered, {
    tools: TOOLS as never,
    toolChoice: "auto",
    parallelToolCalls: true,
  });
  assert.equal(res.usage?.prompt_tokens, want.length);
  assert.ok(engine.decode(want).includes("4 degrees and snow"));
  const c = res.choices[0];
  if (c.message.tool_calls?.length) {
    assert.equal(c.finish_reason, "tool_calls");
    checkCalls(c.message.tool_calls);
  } else {
    assert.equal(typeof c.message.content, "string");
    assert.notEqual(c.finish_reason, "tool_calls");
  }
  // tool_choice "none": the tools are still shown, and the reply is text.
  const none = await client.chat.completions.create({
    model: MODEL,
    messages,
    tools: TOOLS,
    tool_choice: "none",
    max_tokens: 3,
  });
  assert.equal(none.choices[0].message.tool_calls, undefined);
  assert.ok(none.usage!.prompt_tokens > want.length - 20);
});

Deno.test("prefill: a final assistant message is continued, or a new turn when asked", async () => {
  const messages: ChatMessage[] = [
    { role: "user", content: "Tell me a story." },
    { role: "assistant", content: "Once upon a time, a farmer" },
  ];
  const ask = (extra: Record<string, unknown>) =>
    client.chat.completions.create({
      model: MODEL,
      messages: messages as OpenAI.ChatCompletionMessageParam[],
      temperature: 0,
      max_tokens: 6,
      ...extra,
    });
  const [cont, turn] = await Promise.all([ask({}), ask({ add_generation_prompt: true })]);
  const opened = engine.encodeChat(messages, { continueFinalMessage: true });
  assert.ok(engine.decode(opened).endsWith("assistant\nOnce upon a time, a farmer"));
  assert.equal(cont.usage?.prompt_tokens, opened.length);
  assert.equal(turn.usage?.prompt_tokens, engine.encodeChat(messages).length);
  assert.notEqual(cont.usage?.prompt_tokens, turn.usage?.prompt_tokens);
  // The continuation is the text after the prefill: greedy, the same as a raw completion of
  // the opened prompt.
  const raw = await client.completions.create({
    model: MODEL,
    prompt: opened,
    temperature: 0,
    max_tokens: 6,
  });
  assert.equal(cont.choices[0].message.content, raw.choices[0].text);
});

Deno.test("logit_bias: -100 bans the greedy token, +100 forces one", async () => {
  const body = { model: MODEL, prompt: "The farmer walks to the market and", temperature: 0 };
  const plain = await client.completions.create({ ...body, max_tokens: 6, logprobs: 0 });
  const first = plain.choices[0].logprobs!.tokens![0];
  const ids = (await post("/v1/tokenize", { content: first })).json.tokens.slice(1);
  assert.equal(ids.length, 1, `the first token ${JSON.stringify(first)} encodes as ${ids}`);
  const banned = await client.completions.create({
    ...body,
    max_tokens: 6,
    logprobs: 0,
    logit_bias: { [ids[0]]: -100 },
  });
  assert.notEqual(banned.choices[0].logprobs!.tokens![0], first);
  const forced = await client.chat.completions.create({
    model: MODEL,
    messages: ASK,
    temperature: 0,
    max_tokens: 5,
    logit_bias: { "300": 100 },
  });
  const five = (await post("/v1/detokenize", { tokens: [300, 300, 300, 300, 300] })).json.content;
  assert.equal(forced.choices[0].message.content, five);
  assert.equal(forced.choices[0].finish_reason, "length");
});

Deno.test("tokenize and detokenize: round trips on /v1 and llama.cpp's paths; models/{id}", async () => {
  for (const text of ["Hello world", "naïve café — 🙂 ✓", "  spaced\n\nlines  "]) {
    const a = await post("/v1/tokenize", { content: text });
    const b = await post("/tokenize", { content: text });
    assert.equal(a.status, 200);
    assert.deepEqual(b, a);
    assert.equal(a.json.tokens[0], 0); // the default model's BOS
    for (const path of ["/v1/detokenize", "/detokenize"]) {
      const back = await post(path, { tokens: a.json.tokens });
      assert.deepEqual(back, { status: 200, json: { content: `<s>${text}` } });
      const rest = await post(path, { tokens: a.json.tokens.slice(1) });
      assert.equal(rest.json.content, text);
    }
  }
  const odd = await post("/tokenize", { text: "x" });
  assert.equal(odd.status, 400);
  assert.equal(odd.json.error.param, "text");
  assert.match(odd.json.error.message, /\/tokenize takes "content"/);
  const open = await fetch(`${origin}/tokenize`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: "{}",
  });
  assert.equal(open.status, 401, "the unprefixed paths need the key too");
  await open.body?.cancel();
  assert.equal((await client.models.retrieve(MODEL)).id, MODEL);
  const missing = await client.models.retrieve("gpt-9").catch((e) => e);
  assert.ok(missing instanceof OpenAI.NotFoundError, String(missing));
  assert.equal(missing.code, "model_not_found");
});

/** The client's 400 for `body` on chat completions. */
async function refusal(body: Record<string, unknown>, path = "chat") {
  const req = path === "chat"
    ? client.chat.completions.create({ model: MODEL, messages: ASK, ...body } as never)
    : client.responses.create({ model: MODEL, input: "Hi", ...body } as never);
  const e = await (req as Promise<unknown>).catch((e) => e);
  assert.ok(e instanceof OpenAI.BadRequestError, String(e));
  return e;
}

Deno.test("refusals: unknown formats, unsupported keywords and patterns name their place", async () => {
  const xml = await refusal({ response_format: { type: "xml" } });
  assert.equal(xml.param, "response_format.type");
  assert.match(xml.message, /"xml" is not supported/);
  const unique = await refusal({
    response_format: {
      type: "json_schema",
      json_schema: {
        name: "u",
        schema: { type: "array", items: { type: "string" }, uniqueItems: true },
      },
    },
  });
  assert.equal(unique.param, "response_format.json_schema.schema.uniqueItems");
  assert.match(unique.message, /'uniqueItems' is not supported/);
  const lookahead = await refusal({ response_format: { type: "regex", pattern: "(?=a)b" } });
  assert.equal(lookahead.param, "response_format.pattern");
  const minimum = await refusal({
    tools: [{
      type: "function",
      function: {
        name: "f",
        parameters: { type: "object", properties: { n: { type: "integer", minimum: 0 } } },
      },
    }],
    tool_choice: "required",
  });
  assert.equal(minimum.param, "tools[0].function.parameters.properties.n.minimum");
  assert.match(minimum.message, /'minimum' is not supported/);
  const inRef = await refusal({
    tools: [TOOLS[1], {
      type: "function",
      function: {
        name: "g",
        parameters: {
          properties: { n: { $ref: "#/$defs/n" } },
          $defs: { n: { type: "string", format: "uri" } },
        },
      },
    }],
    tool_choice: { type: "function", function: { name: "g" } },
  });
  assert.equal(inRef.param, "tools[1].function.parameters");
  assert.match(inRef.message, /^400 tools\[1\]\.function\.parameters: #\/\$defs\/n\.format: /);
  const short = await refusal({
    response_format: { type: "json_schema", json_schema: { name: "p", schema: SCHEMAS.person } },
    max_tokens: 3,
  });
  assert.equal(short.param, "max_tokens");
  assert.match(short.message, /takes \d+ tokens/);
  const flat = await refusal({
    text: {
      format: { type: "json_schema", name: "x", schema: { type: "string", pattern: "(?<=a)" } },
    },
  }, "responses");
  assert.equal(flat.param, "text.format.schema.pattern");
  const fields: [string, unknown][] = [["previous_response_id", "resp_1"], ["store", true]];
  for (const [field, value] of fields) {
    const e = await refusal({ [field]: value }, "responses");
    assert.equal(e.param, field);
  }
  const web = await refusal({ tools: [{ type: "web_search" }] }, "responses");
  assert.equal(web.param, "tools[0].type");
});

Deno.test("responses: text, streamed and not, structured output and function calls", async () => {
  const body = {
    model: MODEL,
    instructions: "Answer briefly.",
    input: [{
      role: "user" as const,
      content: [{ type: "input_text" as const, text: "Tell me a story." }],
    }],
    max_output_tokens: 6,
    temperature: 0,
  };
  const tool = { type: "function" as const, name: "weather", parameters: WEATHER, strict: true };
  const events = (async () => {
    const stream = await client.responses.create({ ...body, stream: true });
    const types: string[] = [];
    let deltas = "", done = "";
    for await (const ev of stream) {
      types.push(ev.type);
      if (ev.type === "response.output_text.delta") deltas += ev.delta;
      if (ev.type === "response.output_text.done") done = ev.text;
    }
    return { types, deltas, done };
  })();
  // All at once: one batch.
  const [whole, chat, streamed, final, json, fc] = await Promise.all([
    client.responses.create(body),
    client.chat.completions.create({
      model: MODEL,
      messages: [
        { role: "system", content: "Answer briefly." },
        { role: "user", content: "Tell me a story." },
      ],
      max_tokens: 6,
      temperature: 0,
    }),
    events,
    client.responses.stream(body).finalResponse(),
    client.responses.create({
      model: MODEL,
      input: "Describe a farmer.",
      text: {
        format: { type: "json_schema", name: "person", schema: SCHEMAS.person, strict: true },
      },
      temperature: 0.8,
      max_output_tokens: 28,
    }),
    client.responses.create({
      model: MODEL,
      input: "Weather in Oslo?",
      tools: [tool],
      tool_choice: "required",
      parallel_tool_calls: false,
      temperature: 0.8,
      max_output_tokens: 40,
    }),
  ]);
  assert.equal(whole.object, "response");
  assert.match(whole.id, /^resp_/);
  assert.ok(whole.output_text.length > 0);
  assert.equal(whole.output[0].type, "message");
  assert.equal(whole.usage!.output_tokens, 6);
  assert.equal(whole.status, "incomplete");
  assert.equal(whole.incomplete_details?.reason, "max_output_tokens");
  assert.equal(whole.output_text, chat.choices[0].message.content);
  assert.equal(whole.usage!.input_tokens, chat.usage!.prompt_tokens);
  assert.deepEqual(streamed.types.slice(0, 4), [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
  ]);
  assert.deepEqual(streamed.types.slice(-4), [
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.incomplete",
  ]);
  assert.equal(streamed.deltas, whole.output_text);
  assert.equal(streamed.done, whole.output_text);
  assert.equal(final.output_text, whole.output_text);
  // Complete either way: at EOS, or as the budget closed it (then max_output_tokens was hit).
  valid(SCHEMAS.person, json.output_text);
  assert.ok(json.status === "completed" || json.usage!.output_tokens === 28, json.status);
  const item = fc.output.find((o) => o.type === "function_call");
  assert.ok(item && item.type === "function_call", JSON.stringify(fc.output));
  assert.equal(item.name, "weather");
  valid(WEATHER, item.arguments);

  // The call and its output as input items; streamed, the helper accumulates the next call.
  const helper = await client.responses.stream({
    model: MODEL,
    input: [
      { role: "user", content: "Weather in Oslo?" },
      { type: "function_call", call_id: item.call_id, name: item.name, arguments: item.arguments },
      { type: "function_call_output", call_id: item.call_id, output: "4 degrees" },
      { role: "user", content: "And tomorrow?" },
    ],
    tools: [tool],
    tool_choice: { type: "function", name: "weather" },
    temperature: 0.8,
    max_output_tokens: 40,
  }).finalResponse();
  const again = helper.output.find((o) => o.type === "function_call");
  assert.ok(again && again.type === "function_call", JSON.stringify(helper.output));
  valid(WEATHER, again.arguments);
});

Deno.test("websocket: response_format constrains a conversation; tools are refused by name", async () => {
  const ws = new WebSocket(`${origin.replace("http", "ws")}/v1/chat/ws?api_key=${KEY}`);
  const got: Record<string, unknown>[] = [];
  let wake = () => {};
  ws.onmessage = (e) => {
    got.push(JSON.parse(e.data));
    wake();
  };
  await new Promise((r) => (ws.onopen = r));
  const until = async (type: string) => {
    while (!got.some((m) => m.type === type)) await new Promise<void>((r) => (wake = r));
    return got.splice(got.findIndex((m) => m.type === type), 1)[0];
  };
  ws.send(JSON.stringify({
    type: "start",
    id: "j",
    messages: ASK,
    response_format: { type: "json_schema", json_schema: { name: "t", schema: SCHEMAS.tagged } },
    temperature: 0.8,
    seed: 4,
    max_tokens: 24,
  }));
  await until("done");
  valid(SCHEMAS.tagged, got.filter((m) => m.type === "delta").map((m) => m.text).join(""));
  ws.send(JSON.stringify({ type: "start", id: "t", messages: ASK, tools: TOOLS }));
  const err = await until("error") as { error: { param: string; message: string } };
  assert.equal(err.error.param, "tools");
  assert.match(err.error.message, /POST \/v1\/chat\/completions/);
  const closed = new Promise((r) => (ws.onclose = r));
  ws.close();
  await closed;
});

Deno.test("server shuts down", async () => {
  await server.shutdown();
  await engine.close();
});
