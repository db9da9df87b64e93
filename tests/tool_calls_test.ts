/**
 * Tool calls without a GPU: the constrained call scanner and the `auto` parser give the same
 * calls and content however the text is split into tokens (so streamed responses add up to
 * whole ones); the forms `auto` recognises and what it leaves as text; the call schema of
 * routes/tools.ts compiles, with `$ref`s moved and refusals named at the request's place; chat
 * templates with and without tool support (strata's preamble), and continuing a final message.
 */
import assert from "node:assert/strict";
import type { ChatMessage } from "../api/types.ts";
import { matches } from "../engine/grammar/dfa.ts";
import { characterAutomaton } from "../engine/grammar/grammar.ts";
import { GrammarError } from "../engine/grammar/errors.ts";
import { validate } from "../engine/grammar/validate.ts";
import { loadModelFolder } from "../engine/model/folder.ts";
import { TextTokenizer } from "../engine/model/tokenizer.ts";
import {
  AutoCalls,
  CallScanner,
  readOutput,
  splitToolCalls,
  type ToolOutput,
} from "../routes/tool_calls.ts";
import { parseTools } from "../routes/tools.ts";
import { QWEN25_TEMPLATE } from "./chat_templates.ts";
import { rng } from "./util.ts";

/** Feeds `text` in random pieces and adds up what comes out, as a stream's client does. */
function streamed(out: ToolOutput, text: string, seed: number) {
  const r = rng(seed);
  const calls: { id?: string; name?: string; arguments: string }[] = [];
  let content = "";
  const take = (p: ReturnType<ToolOutput["push"]>) => {
    content += p.content;
    for (const d of p.calls) {
      const c = calls[d.index] ??= { arguments: "" };
      if (d.id) c.id = d.id;
      if (d.function.name) c.name = d.function.name;
      c.arguments += d.function.arguments;
    }
  };
  for (let i = 0; i < text.length;) {
    const n = 1 + r.int(4);
    take(out.push(text.slice(i, i + n)));
    i += n;
  }
  take(out.end());
  return { content, calls: calls.map(({ name, arguments: a }) => ({ name, arguments: a })) };
}

const NAMES = ["get_weather", "add"];

Deno.test("CallScanner: the calls of constrained output, however it is split", () => {
  const cases: [string, boolean, { name: string; arguments: string }[]][] = [
    ['{"name": "add", "arguments": {"a": 1, "b": [2, {"c": "}]{"}]}}', false, [
      { name: "add", arguments: '{"a": 1, "b": [2, {"c": "}]{"}]}' },
    ]],
    ['{\n"name":"get_weather","arguments": {"city": "Pa\\"ris\\\\"}\n}', false, [
      { name: "get_weather", arguments: '{"city": "Pa\\"ris\\\\"}' },
    ]],
    [
      '[{"name": "add", "arguments": {}}, \n{"name": "get_weather", "arguments": {"x": "]"}}]',
      true,
      [
        { name: "add", arguments: "{}" },
        { name: "get_weather", arguments: '{"x": "]"}' },
      ],
    ],
    ['{"name": "add", "arguments": 12.5e3}', false, [{ name: "add", arguments: "12.5e3" }]],
    ['{"name": "add", "arguments": "a}b"}', false, [{ name: "add", arguments: '"a}b"' }]],
  ];
  for (const [text, array, want] of cases) {
    const whole = readOutput(new CallScanner(array), text);
    assert.equal(whole.content, null, text);
    assert.deepEqual(
      whole.calls.map((c) => ({ name: c.function.name, arguments: c.function.arguments })),
      want,
      text,
    );
    assert.ok(whole.calls.every((c) => /^call_[0-9a-f]{24}$/.test(c.id) && c.type === "function"));
    for (let seed = 0; seed < 20; seed++) {
      const s = streamed(new CallScanner(array), text, seed);
      assert.deepEqual(s, { content: "", calls: want }, `${text} split by seed ${seed}`);
    }
  }
});

Deno.test("auto: the forms recognised, the text around them, and what stays text", () => {
  const call = (name: string, args: unknown) => ({ name, arguments: JSON.stringify(args) });
  const cases: [string, string | null, { name: string; arguments: string }[] | null][] = [
    ['  {"name": "add", "arguments": {"a": 1}}\n', null, [call("add", { a: 1 })]],
    ['{"name": "add", "parameters": {"a": 1}}', null, [call("add", { a: 1 })]],
    ['{"name": "add", "arguments": "{\\"a\\": 2}"}', null, [call("add", { a: 2 })]],
    [
      '[{"name": "add", "arguments": {}}, {"name": "get_weather", "arguments": {"c": "x"}}]',
      null,
      [call("add", {}), call("get_weather", { c: "x" })],
    ],
    [
      'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"c": "Oslo"}}\n</tool_call>' +
      '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>',
      "Let me look.",
      [call("get_weather", { c: "Oslo" }), call("add", { a: 1 })],
    ],
    ['[TOOL_CALLS] [{"name": "add", "arguments": {"a": 3}}]', null, [call("add", { a: 3 })]],
    // not calls: text
    ['{"name": "subtract", "arguments": {}}', '{"name": "subtract", "arguments": {}}', null],
    ['{"answer": 42}', '{"answer": 42}', null],
    ["The weather is fine.", "The weather is fine.", null],
    [
      "I use <tool_call>{broken</tool_call> tags",
      "I use <tool_call>{broken</tool_call> tags",
      null,
    ],
    ['{"name": "add", "arguments": [1]}', '{"name": "add", "arguments": [1]}', null],
  ];
  for (const [text, content, calls] of cases) {
    const found = splitToolCalls(text, NAMES);
    if (calls === null) assert.equal(found, null, text);
    else assert.deepEqual(found, { content, calls }, text);
    const whole = readOutput(new AutoCalls(NAMES), text);
    assert.equal(whole.content, content, text);
    const got = whole.calls.map((c) => ({
      name: c.function.name,
      arguments: c.function.arguments,
    }));
    assert.deepEqual(got, calls ?? [], text);
    for (let seed = 0; seed < 20; seed++) {
      const s = streamed(new AutoCalls(NAMES), text, seed);
      assert.deepEqual(s, { content: content ?? "", calls: calls ?? [] }, `${text} / ${seed}`);
    }
  }
});

Deno.test("auto: text streams on at once unless it may become a call", () => {
  const out = new AutoCalls(NAMES);
  assert.equal(out.push("  ").content, "");
  assert.equal(out.push("Hello").content, "  Hello");
  assert.equal(out.push(" there <tool").content, " there");
  assert.equal(out.push("s> and more ").content, " <tools> and more");
  const held = new AutoCalls(NAMES);
  assert.equal(held.push(' {"name": "add"').content, "");
  assert.equal(held.push(", but not a call").content, "");
  assert.deepEqual(held.end(), { content: ' {"name": "add", but not a call', calls: [] });
});

Deno.test("tool call schemas: one call, any of several, an array; $refs moved; refusals placed", () => {
  const weather = {
    type: "object",
    properties: { city: { $ref: "#/$defs/city" }, days: { type: "integer" } },
    required: ["city", "days"],
    additionalProperties: false,
    $defs: { city: { type: "string", enum: ["Oslo", "Lima"] } },
  };
  const tools = [
    { type: "function", function: { name: "get_weather", parameters: weather, strict: true } },
    { type: "function", function: { name: "now" } },
  ];
  const accepts = (choice: unknown, parallel: boolean | undefined, value: unknown) => {
    const t = parseTools({ tools, tool_choice: choice, parallel_tool_calls: parallel })!;
    assert.equal(t.mode, "constrained");
    const dfa = characterAutomaton(t.spec!.spec, { path: t.spec!.path });
    return matches(dfa, new TextEncoder().encode(JSON.stringify(value)));
  };
  const oslo = { name: "get_weather", arguments: { city: "Oslo", days: 2 } };
  const named = { type: "function", function: { name: "get_weather" } };
  assert.ok(accepts(named, undefined, oslo));
  assert.ok(!accepts(named, undefined, { ...oslo, arguments: { city: "Rome", days: 2 } }));
  assert.ok(!accepts(named, undefined, { name: "now", arguments: {} }));
  assert.ok(accepts("required", false, { name: "now", arguments: {} }));
  assert.ok(!accepts("required", false, { name: "now", arguments: { x: 1 } }));
  assert.ok(accepts("required", undefined, [oslo, { name: "now", arguments: {} }]));
  assert.ok(!accepts("required", undefined, []));
  // A refusal inside a tool's schema is named from the place routes/constraint.ts maps back to
  // the request: by dotted path, or by the moved pointer inside a $ref's target.
  const param = (n: number) => ({
    type: "function",
    function: {
      name: `f${n}`,
      parameters: n === 0
        ? { type: "object", properties: { m: { type: "string", format: "hostname" } } }
        : {
          $defs: { n: { type: "integer", minimum: 1 } },
          properties: { n: { $ref: "#/$defs/n" } },
        },
    },
  });
  for (const parallel of [false, true]) {
    for (const n of [0, 1]) {
      const t = parseTools({
        tools: [...tools, param(n)],
        tool_choice: "required",
        parallel_tool_calls: parallel,
      })!;
      const place = t.spec!.places.find((p) => p.request === "tools[2].function.parameters")!;
      assert.throws(
        () => characterAutomaton(t.spec!.spec, { path: t.spec!.path }),
        (e: unknown) => {
          assert.ok(e instanceof GrammarError);
          const at = n === 0
            ? `${place.dotted}.properties.m.format`
            : `${place.pointer}/$defs/n.minimum`;
          assert.ok(e.message.startsWith(`${at}: `), `${e.message} (expected ${at})`);
          return true;
        },
      );
    }
  }
});

/**
 * A get_weather tool (with `description`, when given), and a conversation that called it for Oslo
 * and got `result` back.
 */
function weatherCall(result: string, description?: string) {
  const tools = [{
    type: "function" as const,
    function: {
      name: "get_weather",
      ...(description === undefined ? {} : { description }),
      parameters: { type: "object", properties: { city: { type: "string" } } },
    },
  }];
  const history: ChatMessage[] = [
    { role: "user", content: "Weather in Oslo?" },
    {
      role: "assistant",
      content: "",
      tool_calls: [{
        id: "call_1",
        type: "function",
        function: { name: "get_weather", arguments: '{"city": "Oslo"}' },
      }],
    },
    { role: "tool", content: result, tool_call_id: "call_1", name: "get_weather" },
  ];
  return { tools, history };
}

Deno.test("chat templates: strata's preamble without tool support, the template's own with it", async () => {
  const folder = await loadModelFolder(
    new URL("../models/strata-default", import.meta.url).pathname,
  );
  const plain = TextTokenizer.load(folder);
  assert.equal(plain.templateKnowsTools, false);
  const { tools, history } = weatherCall("4 C, snow");
  const text = plain.applyChatTemplate(history, {
    tools,
    toolChoice: "required",
    parallelToolCalls: false,
  });
  assert.match(text, /^<s><\|im_start\|>system\nFunctions you can call/);
  assert.ok(text.includes(JSON.stringify(tools[0].function)), text);
  assert.ok(text.includes("In this reply, call one function."), text);
  assert.ok(!text.includes("JSON array"), text);
  assert.ok(
    text.includes(
      '<|im_start|>assistant\n{"name":"get_weather","arguments":{"city":"Oslo"}}<|im_end|>',
    ),
    text,
  );
  assert.ok(
    text.includes(
      "<|im_start|>user\nResult of the function get_weather (call call_1):\n4 C, snow<|im_end|>",
    ),
    text,
  );
  assert.ok(text.endsWith("<|im_start|>assistant\n"));
  // A template that takes tools gets them, and arguments as objects, as transformers passes them.
  const native = new TextTokenizer(folder.tokenizerJson, {
    ...folder.tokenizerConfig,
    chat_template: "{% if tools is not none %}{% for t in tools %}[{{ t.function.name }}]" +
      "{% endfor %}{% endif %}" +
      "{% for m in messages %}<{{ m.role }}>{{ m.content }}" +
      "{% if m.tool_calls %}{% for c in m.tool_calls %}{{ c.function.name }}:" +
      "{{ c.function.arguments.city }}{% endfor %}{% endif %}" +
      "{% if m.tool_call_id %}({{ m.tool_call_id }} {{ m.name }}){% endif %}{% endfor %}" +
      "{% if add_generation_prompt %}<assistant>{% endif %}",
  });
  assert.equal(native.templateKnowsTools, true);
  assert.equal(
    native.applyChatTemplate(history, { tools }),
    "[get_weather]<user>Weather in Oslo?<assistant>get_weather:Oslo<tool>4 C, snow(call_1 get_weather)<assistant>",
  );
  // Without tools, `tools` is none, as transformers passes it (a guarded section stays out).
  assert.equal(native.applyChatTemplate(history.slice(0, 1)), "<user>Weather in Oslo?<assistant>");
  // Continuing a final message: the text ends with it, open; a trimming template too.
  const prefill: ChatMessage[] = [{ role: "user", content: "Hi" }, {
    role: "assistant",
    content: " Once upon a",
  }];
  assert.equal(
    plain.applyChatTemplate(prefill, { continueFinalMessage: true }),
    "<s><|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n Once upon a",
  );
  const trimming = new TextTokenizer(folder.tokenizerJson, {
    ...folder.tokenizerConfig,
    chat_template: "{% for m in messages %}[{{ m.content | trim }}]{% endfor %}",
  });
  assert.equal(
    trimming.applyChatTemplate(prefill, { continueFinalMessage: true }),
    "[Hi][ Once upon a",
  );
  const dropping = new TextTokenizer(folder.tokenizerJson, {
    ...folder.tokenizerConfig,
    chat_template:
      "{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% endif %}{% endfor %}",
  });
  assert.throws(
    () => dropping.applyChatTemplate(prefill, { continueFinalMessage: true }),
    /does not write the final message's content/,
  );
  // A tool result's schema is checked against what the model sent: validate is the grammar's.
  assert.deepEqual(validate(tools[0].function.parameters, { city: "Oslo" }), []);
});

Deno.test("chat templates: Qwen2.5's renders tools, calls and results as transformers does", async () => {
  const folder = await loadModelFolder(
    new URL("../models/strata-default", import.meta.url).pathname,
  );
  const qwen = new TextTokenizer(folder.tokenizerJson, {
    ...folder.tokenizerConfig,
    chat_template: QWEN25_TEMPLATE,
  });
  const { tools, history } = weatherCall("4 C", "Weather");
  const system = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful " +
    "assistant.";
  assert.equal(
    qwen.applyChatTemplate(history, { tools }),
    system + "\n\n# Tools\n\nYou may call one or more functions to assist with the user " +
      "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n" +
      '<tools>\n{"type": "function", "function": {"name": "get_weather", "description": ' +
      '"Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}' +
      "\n</tools>\n\nFor each function call, return a json object with function name and " +
      "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n" +
      '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' +
      "<|im_start|>user\nWeather in Oslo?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n" +
      '{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>\n' +
      "<|im_start|>user\n<tool_response>\n4 C\n</tool_response><|im_end|>\n" +
      "<|im_start|>assistant\n",
  );
  assert.equal(
    qwen.applyChatTemplate(history.slice(0, 1)),
    `${system}<|im_end|>\n<|im_start|>user\nWeather in Oslo?<|im_end|>\n<|im_start|>assistant\n`,
  );
});
