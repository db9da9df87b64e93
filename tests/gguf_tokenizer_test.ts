/**
 * Tokenizers through GGUF: a Hugging Face tokenizer written as llama.cpp's converter writes it
 * (scripts/gguf_vocab.ts), read back and rebuilt (engine/model/gguf_tokenizer.ts), must encode
 * and decode like the original on texts with unicode, spaces and special tokens, decode every
 * token alike, and render the chat template alike. For the default model's byte-level BPE, the
 * random test tokenizer (with and without BOS), its variants under each pre-tokenizer strata
 * maps, and SentencePiece-style tokenizers (with and without the space prefix).
 */
import assert from "node:assert/strict";
import { loadModelFolder } from "../engine/model/folder.ts";
import { parseGgufHeader } from "../engine/model/gguf_format.ts";
import { BPE_PRE, ggufTokenizer } from "../engine/model/gguf_tokenizer.ts";
import { TextTokenizer } from "../engine/model/tokenizer.ts";
import { encodeGguf } from "../scripts/gguf_writer.ts";
import { tokenizerEntries } from "../scripts/gguf_vocab.ts";
import { buildTokenizer } from "../scripts/test_tokenizer.ts";
import { buildSpmTokenizer } from "./gguf_spm_fixture.ts";

type Json = Record<string, unknown>;

const TEXTS = [
  "The quick brown fox jumps over the lazy dog.",
  "  leading spaces,\ttabs\nand newlines\n\n",
  "héllo — 世界 🙂",
  "naïve café: 1,234.5 € / ¥ — ok?! 👩‍👩‍👧 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
  "<s>hello</s> and <|im_start|>user\nhi<|im_end|>\n",
  "",
  " ",
  "trailing space ",
  "looks like a byte <0x41> or a filler [PAD500] or Ġthe ▁the",
  "digits 12345678 and can't won't I'LL",
];

/** What a tokenizer source gives: its files and the ids from config.json. */
interface Source {
  tokenizerJson: Json;
  tokenizerConfig: Json;
  vocabSize: number;
  bosId?: number;
  eosIds: number[];
}

/** The tokenizer as a GGUF file would give it back. */
function throughGguf(src: Source): TextTokenizer {
  const config = { vocabSize: src.vocabSize, bosId: src.bosId, eosIds: src.eosIds };
  const entries = tokenizerEntries({
    tokenizerJson: src.tokenizerJson,
    tokenizerConfig: src.tokenizerConfig,
    config: config as never,
  });
  const bytes = encodeGguf({
    metadata: [
      { key: "general.architecture", type: "string", value: "llama" },
      { key: "llama.context_length", type: "u32", value: 256 },
      ...entries,
    ],
    tensors: [],
  });
  const tok = ggufTokenizer(parseGgufHeader(bytes, bytes.byteLength, "tokenizer.gguf"));
  assert.equal(tok.vocabSize, src.vocabSize);
  return new TextTokenizer(tok.tokenizerJson, tok.tokenizerConfig, {
    eosIds: tok.eosIds,
    ...(tok.bosId !== undefined ? { bosId: tok.bosId } : {}),
  });
}

/** Asserts `got` tokenizes, detokenizes and templates as `want`. */
function assertSame(label: string, want: TextTokenizer, got: TextTokenizer): void {
  assert.equal(got.vocabSize, want.vocabSize, `${label}: vocab size`);
  assert.equal(got.bosId, want.bosId, `${label}: BOS`);
  assert.deepEqual(got.eosIds, want.eosIds, `${label}: EOS`);
  for (const text of TEXTS) {
    const ids = want.encode(text);
    assert.deepEqual(got.encode(text), ids, `${label}: encode ${JSON.stringify(text)}`);
    const bare = want.encode(text, { addSpecialTokens: false });
    assert.deepEqual(got.encode(text, { addSpecialTokens: false }), bare, `${label}: bare`);
    assert.equal(got.decode(ids), want.decode(ids), `${label}: decode ${JSON.stringify(text)}`);
    const skip = { skipSpecialTokens: true };
    assert.equal(got.decode(ids, skip), want.decode(ids, skip), `${label}: decode, no specials`);
  }
  for (let id = 0; id < want.vocabSize; id++) {
    assert.equal(got.tokenText(id), want.tokenText(id), `${label}: token ${id}`);
    assert.equal(got.isSpecial(id), want.isSpecial(id), `${label}: special ${id}`);
  }
  if (typeof want.tokenizerConfig.chat_template === "string") {
    const chat = [{ role: "user", content: "Hi there" }, { role: "assistant", content: "Hello!" }];
    assert.equal(got.applyChatTemplate(chat), want.applyChatTemplate(chat), `${label}: template`);
  }
}

function tokenizerOf(src: Source): TextTokenizer {
  return new TextTokenizer(src.tokenizerJson, src.tokenizerConfig, {
    eosIds: src.eosIds,
    ...(src.bosId !== undefined ? { bosId: src.bosId } : {}),
  });
}

Deno.test("the default model's byte-level BPE tokenizer survives GGUF (gpt2, pre gpt-2)", async () => {
  const folder = await loadModelFolder("models/strata-default");
  const src: Source = {
    tokenizerJson: folder.tokenizerJson,
    tokenizerConfig: folder.tokenizerConfig,
    vocabSize: folder.config.vocabSize,
    bosId: folder.config.bosId,
    eosIds: folder.config.eosIds,
  };
  assertSame("strata-default", TextTokenizer.load(folder), throughGguf(src));
});

/** The random test tokenizer (make_test_model's), its model vocab padded past its tokens. */
function testSource(bos: boolean, pre?: string): Source {
  const t = buildTokenizer({ merges: 200, bos, modelMaxLength: 256 });
  const tokenizerJson = structuredClone(t.tokenizerJson) as Json;
  if (pre) {
    tokenizerJson.pre_tokenizer = BPE_PRE[pre].pre;
    tokenizerJson.normalizer = BPE_PRE[pre].normalizer ?? null;
    // Llama 3's tokenizer.json takes words found whole in the vocabulary, as llama.cpp does.
    if (pre === "llama-bpe") (tokenizerJson.model as Json).ignore_merges = true;
  }
  return {
    tokenizerJson,
    tokenizerConfig: t.tokenizerConfig,
    vocabSize: Math.ceil(t.size / 64) * 64,
    bosId: t.special["<s>"],
    eosIds: [t.special["</s>"], t.special["<|im_end|>"]],
  };
}

for (const bos of [true, false]) {
  Deno.test(`the random test tokenizer (BOS ${bos}) survives GGUF, [PAD] fillers left out`, () => {
    const src = testSource(bos);
    assertSame(`test bos=${bos}`, tokenizerOf(src), throughGguf(src));
  });
}

for (const pre of Object.keys(BPE_PRE).filter((p) => p !== "gpt-2")) {
  Deno.test(`a byte-level BPE with the ${pre} pre-tokenizer survives GGUF`, () => {
    const src = testSource(true, pre);
    const want = tokenizerOf(src);
    assertSame(pre, want, throughGguf(src));
    // The variant does split differently from gpt-2 (else this would prove nothing).
    const years = "The year 2024 had 366 days; 60 minutes";
    assert.notDeepEqual(want.encode(years), tokenizerOf(testSource(true)).encode(years));
  });
}

for (const prefix of [true, false]) {
  Deno.test(`a SentencePiece BPE (space prefix ${prefix}) survives GGUF: scores rebuild the merges`, () => {
    const spm = buildSpmTokenizer(300);
    const tokenizerJson = structuredClone(spm.tokenizerJson) as Json;
    if (!prefix) {
      tokenizerJson.normalizer = { type: "Replace", pattern: { String: " " }, content: "\u2581" };
      const decoder = tokenizerJson.decoder as { decoders: unknown[] };
      decoder.decoders = decoder.decoders.slice(0, 3);
    }
    const src: Source = {
      tokenizerJson,
      tokenizerConfig: spm.tokenizerConfig,
      vocabSize: spm.size + 5,
      bosId: 1,
      eosIds: [2],
    };
    const want = tokenizerOf(src), got = throughGguf(src);
    assertSame(`spm prefix=${prefix}`, want, got);
    // Words of the training text are whole pieces ("▁the"); with the prefix, " the" is "▁▁the".
    assert.equal(want.encode(" the", { addSpecialTokens: false }).length, prefix ? 2 : 1);
    // Characters outside the vocabulary fall back to their UTF-8 bytes.
    assert.deepEqual(got.encode("世", { addSpecialTokens: false }).slice(-3), [
      3 + 0xe4,
      3 + 0xb8,
      3 + 0x96,
    ]);
  });
}
