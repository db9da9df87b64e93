/**
 * OpenAI parity end to end, the rest: the real server with the default model
 * (tests/parity_util.ts) and the official `openai` client. An assistant prefill, checked by the
 * prompt the template renders; logit_bias against greedy output; tokenize round trips on both
 * paths and models/{id}; the refusals, each naming its field; the Responses API, streamed and
 * not, with structured output and function calls; response_format over the WebSocket.
 */
import assert from "node:assert/strict";
import OpenAI from "openai";
import type { ChatMessage } from "../api/types.ts";
import {
  ASK,
  KEY,
  parityServer,
  post as postTo,
  SCHEMAS,
  TOOLS,
  valid,
  WEATHER,
} from "./parity_util.ts";

const { engine, model: MODEL, origin, client, close } = await parityServer();
const post = (path: string, body: unknown) => postTo(origin, path, body);

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
  await close();
});
