/**
 * engine/worker/tokenizers.ts: long texts, chats and id lists tokenized in workers give exactly
 * what the tokenizer gives on this thread; errors come back with their message; closing fails
 * what is still waiting.
 */
import assert from "node:assert/strict";
import { loadModelFolder } from "../engine/model/folder.ts";
import { TextTokenizer } from "../engine/model/tokenizer.ts";
import { INLINE_CHARS, INLINE_IDS, Tokenizers } from "../engine/worker/tokenizers.ts";

const folder = await loadModelFolder(new URL("../models/strata-default", import.meta.url).pathname);
const source = {
  tokenizerJson: folder.tokenizerJson,
  tokenizerConfig: folder.tokenizerConfig,
  config: folder.config,
};

Deno.test("tokenizers: workers give what this thread gives, short or long", async () => {
  const tok = TextTokenizer.load(folder);
  const t = new Tokenizers(tok, source);
  try {
    const long = "It was the best of times, it was the worst of times — 🙂 ".repeat(200);
    assert.ok(long.length > INLINE_CHARS);
    for (const text of ["Hello there", long]) {
      assert.deepEqual(await t.encode(text), tok.encode(text));
    }
    const chat = [{ role: "system", content: long }, { role: "user", content: "Summarise it." }];
    assert.deepEqual(await t.encodeChat(chat), tok.encodeChat(chat));
    // Tools, tool messages and a continued last message travel to the worker too.
    const call = { id: "c1", type: "function" as const, function: { name: "f", arguments: "{}" } };
    const tooled = [
      ...chat,
      { role: "assistant", content: "", tool_calls: [call] },
      { role: "tool", content: "done", tool_call_id: "c1", name: "f" },
      { role: "assistant", content: "So" },
    ];
    const options = {
      tools: [{ type: "function" as const, function: { name: "f", description: long } }],
      toolChoice: "required" as const,
      continueFinalMessage: true,
    };
    const want = tok.encodeChat(tooled, options);
    assert.deepEqual(await t.encodeChat(tooled, options), want);
    assert.ok(
      tok.decode(want).endsWith(
        "Result of the function f (call c1):\ndone<|im_end|>\n<|im_start|>assistant\nSo",
      ),
    );
    const ids = tok.encode(long);
    assert.ok(ids.length > INLINE_IDS);
    assert.equal(await t.decode(ids), tok.decode(ids));
    // Many at once are shared out and all answered.
    const many = await Promise.all(Array.from({ length: 6 }, (_, i) => t.encode(long + i)));
    many.forEach((got, i) => assert.deepEqual(got, tok.encode(long + i)));
  } finally {
    t.close();
  }
});

Deno.test("tokenizers: a worker's error comes back; close fails what waits", async () => {
  // A chat template that raises, as a model's may for messages it does not take.
  const raising = {
    ...source,
    tokenizerConfig: { ...source.tokenizerConfig, chat_template: "{{ raise_exception('no') }}" },
  };
  const tok = TextTokenizer.load(raising);
  const t = new Tokenizers(tok, raising);
  const long = "x".repeat(INLINE_CHARS + 1);
  const chat = [{ role: "user", content: long }];
  assert.throws(() => tok.encodeChat(chat), /chat template error: no/);
  await assert.rejects(t.encodeChat(chat), /chat template error: no/);
  const waiting = t.encode(long);
  t.close();
  await assert.rejects(waiting, /the tokenizer was closed/);
  await assert.rejects(t.encode(long), /the tokenizer was closed/);
});
