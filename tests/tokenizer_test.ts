/** Tokenizer: round trips, streaming detokenization, chat templates. */
import assert from "node:assert/strict";
import { loadModelFolder } from "../engine/model/folder.ts";
import { TextTokenizer } from "../engine/model/tokenizer.ts";
import { makeTestModel } from "../scripts/make_test_model.ts";
import { buildTokenizer } from "../scripts/test_tokenizer.ts";

const dir = await Deno.makeTempDir({ prefix: "strata_tokenizer_" });
globalThis.addEventListener("unload", () => Deno.removeSync(dir, { recursive: true }));
await makeTestModel(dir, { arch: "qwen2" });
const folder = await loadModelFolder(dir);
const tok = TextTokenizer.load(folder);
const special = buildTokenizer({ merges: 200, bos: true, modelMaxLength: 512 }).special;

const TEXTS = [
  "The quick brown fox jumps over the lazy dog.",
  "  leading spaces,\ttabs\nand newlines\n\n",
  "héllo — 世界 🙂",
  "naïve café: 1,234.5 € / ¥ — ok?! 👩‍👩‍👧 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
];

/** Streams `ids` through a fresh decoder; returns every piece pushed and the flush. */
function stream(t: TextTokenizer, ids: number[], skipSpecialTokens = false): string[] {
  const d = t.createDetokenizer({ skipSpecialTokens });
  return [...ids.map((id) => d.push(id)), d.flush()];
}

Deno.test("test tokenizer: ids, specials, sizes", () => {
  assert.equal(tok.vocabSize, special["<|im_end|>"] + 1);
  assert.ok(folder.config.vocabSize >= tok.vocabSize);
  assert.equal(tok.bosId, special["<s>"]);
  assert.deepEqual(tok.eosIds, [special["</s>"], special["<|im_end|>"]]);
  assert.equal(tok.bosToken, "<s>");
  assert.equal(tok.eosToken, "</s>");
  assert.ok(tok.isSpecial(special["<|im_start|>"]));
  assert.ok(!tok.isSpecial(65));
  // merges were learned: common words are single tokens
  assert.ok(tok.encode(" the", { addSpecialTokens: false }).length === 1);
  assert.equal(tok.tokenText(special["</s>"]), "</s>");
  assert.equal(tok.tokenText(tok.encode("A", { addSpecialTokens: false })[0]), "A");
  assert.equal(tok.tokenText(folder.config.vocabSize - 1), ""); // a pad row
  assert.equal(tok.decode([]), "");
});

Deno.test("encode/decode round trip: ASCII and multi-byte", () => {
  for (const text of TEXTS) {
    const ids = tok.encode(text);
    assert.equal(ids[0], special["<s>"], "BOS added by default");
    assert.deepEqual(tok.encode(text, { addSpecialTokens: false }), ids.slice(1));
    assert.equal(tok.decode(ids, { skipSpecialTokens: true }), text);
    assert.equal(tok.decode(ids), "<s>" + text);
  }
  // special tokens in text are recognised as single tokens
  const ids = tok.encode("<|im_start|>user\nhi<|im_end|>", { addSpecialTokens: false });
  assert.equal(ids[0], special["<|im_start|>"]);
  assert.equal(ids.at(-1), special["<|im_end|>"]);
});

Deno.test("incremental decoder: no U+FFFD mid-stream, concatenates to the full decode", () => {
  for (const text of TEXTS) {
    const ids = tok.encode(text);
    for (const skip of [false, true]) {
      const pieces = stream(tok, ids, skip);
      for (const p of pieces.slice(0, -1)) assert.ok(!p.includes("\uFFFD"), JSON.stringify(p));
      assert.equal(pieces.join(""), tok.decode(ids, { skipSpecialTokens: skip }));
    }
  }
  // text streams out as it comes, not all at flush()
  const ascii = stream(tok, tok.encode(TEXTS[0]));
  assert.equal(ascii.at(-1), "");
  assert.ok(ascii.filter((p) => p !== "").length >= ascii.length - 2);
  // byte by byte: a 4-byte emoji split into 4 byte tokens is held back until complete
  const emojiIds = tok.encode("🙂", { addSpecialTokens: false });
  assert.equal(emojiIds.length, 4, "the test text has no emoji, so 🙂 stays 4 byte tokens");
  const ids = [
    ...tok.encode("a", { addSpecialTokens: false }),
    ...emojiIds,
    ...tok.encode("b", { addSpecialTokens: false }),
  ];
  const pieces = stream(tok, ids);
  assert.equal(pieces.join(""), "a🙂b");
  assert.ok(pieces.every((p) => !p.includes("\uFFFD")));
  assert.ok(pieces.includes("🙂"), `pieces: ${JSON.stringify(pieces)}`);
  // an incomplete character at the very end comes out of flush() as U+FFFD
  const d = tok.createDetokenizer();
  assert.equal(d.push(emojiIds[0]), "");
  assert.equal(d.flush(), tok.decode([emojiIds[0]]));
});

Deno.test("chat template renders and encodes with the template's BOS only", () => {
  const messages = [
    { role: "system", content: "Be brief." },
    { role: "user", content: "Hi there" },
  ];
  const text = tok.applyChatTemplate(messages);
  assert.equal(
    text,
    "<s><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n" +
      "<|im_start|>assistant\n",
  );
  assert.ok(
    !tok.applyChatTemplate(messages, { addGenerationPrompt: false }).endsWith("assistant\n"),
  );
  const ids = tok.encodeChat(messages);
  assert.equal(ids[0], special["<s>"]);
  assert.notEqual(ids[1], special["<s>"]);
  assert.equal(ids[1], special["<|im_start|>"]);
  assert.equal(tok.decode(ids), text);
});

Deno.test("chat template: missing template and raise_exception give clear errors", () => {
  const none = new TextTokenizer(folder.tokenizerJson, {
    ...folder.tokenizerConfig,
    chat_template: undefined,
  });
  assert.throws(() => none.applyChatTemplate([{ role: "user", content: "x" }]), /no chat template/);
  const strict = new TextTokenizer(folder.tokenizerJson, {
    ...folder.tokenizerConfig,
    chat_template: "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first message " +
      "must be from the user') }}{% endif %}{{ bos_token }}{{ messages[0]['content'] }}",
  });
  assert.equal(strict.applyChatTemplate([{ role: "user", content: "x" }]), "<s>x");
  assert.throws(
    () => strict.applyChatTemplate([{ role: "system", content: "x" }]),
    /chat template error: first message must be from the user/,
  );
  const listed = new TextTokenizer(folder.tokenizerJson, {
    ...folder.tokenizerConfig,
    chat_template: [{ name: "tool_use", template: "T" }, { name: "default", template: "D" }],
  });
  assert.equal(listed.applyChatTemplate([]), "D");
});

/**
 * A Llama-2 style tokenizer (SentencePiece BPE with byte fallback, Metaspace-like normalizer,
 * Strip decoder): multi-byte characters not in the vocab become `<0xNN>` byte tokens.
 */
function llama2Style(): TextTokenizer {
  const vocab: Record<string, number> = { "<unk>": 0, "<s>": 1, "</s>": 2 };
  for (let b = 0; b < 256; b++) {
    vocab[`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`] = 3 + b;
  }
  let next = 259;
  for (const piece of ["▁", ..."abcdefghijklmnopqrstuvwxyzé", "▁h", "▁w", "or", "ld", "▁wor"]) {
    vocab[piece] = next++;
  }
  const added = [0, 1, 2].map((id) => ({
    id,
    content: ["<unk>", "<s>", "</s>"][id],
    single_word: false,
    lstrip: false,
    rstrip: false,
    normalized: false,
    special: true,
  }));
  const json = {
    version: "1.0",
    added_tokens: added,
    normalizer: {
      type: "Sequence",
      normalizers: [
        { type: "Prepend", prepend: "▁" },
        { type: "Replace", pattern: { String: " " }, content: "▁" },
      ],
    },
    pre_tokenizer: null,
    post_processor: {
      type: "TemplateProcessing",
      single: [{ SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
      pair: [],
      special_tokens: { "<s>": { id: "<s>", ids: [1], tokens: ["<s>"] } },
    },
    decoder: {
      type: "Sequence",
      decoders: [
        { type: "Replace", pattern: { String: "▁" }, content: " " },
        { type: "ByteFallback" },
        { type: "Fuse" },
        { type: "Strip", content: " ", start: 1, stop: 0 },
      ],
    },
    model: {
      type: "BPE",
      dropout: null,
      unk_token: "<unk>",
      fuse_unk: true,
      byte_fallback: true,
      vocab,
      merges: ["▁ h", "▁ w", "o r", "l d", "▁w or"],
    },
  };
  return new TextTokenizer(json, {
    bos_token: "<s>",
    eos_token: "</s>",
    clean_up_tokenization_spaces: false,
  });
}

Deno.test("Llama-2 style byte-fallback tokenizer: streaming keeps spaces and whole characters", () => {
  const t = llama2Style();
  assert.deepEqual(t.eosIds, [2]);
  assert.equal(t.bosId, 1);
  for (const text of ["hello world", "héllo — 世界 🙂 world", "a  b"]) {
    const ids = t.encode(text);
    assert.equal(ids[0], 1);
    assert.equal(t.decode(ids, { skipSpecialTokens: true }), text);
    assert.ok(ids.some((id) => id >= 3 && id < 259) || !/[^a-zé ]/.test(text));
    const pieces = stream(t, ids, true);
    for (const p of pieces) assert.ok(!p.includes("\uFFFD"), JSON.stringify(pieces));
    assert.equal(pieces.join(""), text);
  }
});
