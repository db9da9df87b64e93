/**
 * OpenAI parity end to end, generation-heavy half: the real server with the default model
 * (tests/parity_util.ts), driven by the official `openai` client. Structured output from the small
 * trained model at temperature 0.8 over many seeds, each parsed and validated against its schema
 * (chat, streamed chat, completions with a pattern); tool calls under `required` and a named
 * function, streamed (accumulated by the client's stream helper) and not, with valid arguments;
 * tool messages in history, checked by the prompt the template renders.
 */
import assert from "node:assert/strict";
import type OpenAI from "openai";
import type { ChatMessage } from "../api/types.ts";
import {
  ASK,
  ASK_WEATHER,
  checkCalls,
  parityServer,
  parsed,
  SCHEMAS,
  TOOLS,
  valid,
} from "./parity_util.ts";

const { engine, model: MODEL, client, close } = await parityServer();

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

Deno.test("server shuts down", async () => {
  await close();
});
