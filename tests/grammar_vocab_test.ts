/**
 * engine/grammar/vocab.ts: every token's bytes are what the tokenizer's decoder emits (the
 * default model's ByteLevel tokenizer, a random one, a SentencePiece-style one), the trie holds
 * exactly the vocabulary, and the GPU image of the bytes has the documented layout.
 */
import assert from "node:assert/strict";
import { loadModelFolder } from "../engine/model/folder.ts";
import { TextTokenizer } from "../engine/model/tokenizer.ts";
import {
  byteTrie,
  tokenBytes,
  tokenBytesImage,
  type Vocabulary,
  vocabularyFromBytes,
  vocabularyOf,
} from "../engine/grammar/vocab.ts";
import { GrammarError } from "../engine/grammar/errors.ts";
import { rng } from "../scripts/rng.ts";
import { randomTokenizer } from "./grammar_walk.ts";

const folder = await loadModelFolder(new URL("../models/strata-default", import.meta.url).pathname);
const defaultTok = TextTokenizer.load(folder);
const utf8 = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });

/** Concatenated bytes of `ids`. */
function bytesOf(vocab: Vocabulary, ids: number[]): Uint8Array {
  const parts = ids.map((id) => tokenBytes(vocab, id));
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) out.set(p, at), at += p.length;
  return out;
}

/** Checks single tokens and seeded random sequences decode as their bytes do. */
function checkAgainstDecoder(tok: TextTokenizer, vocab: Vocabulary, seed: number) {
  const usable: number[] = [];
  for (let id = 0; id < vocab.size; id++) {
    const b = tokenBytes(vocab, id);
    if (id >= tok.vocabSize || tok.isSpecial(id)) {
      assert.equal(b.length, 0, `token ${id} (special or padding) must have no bytes`);
      continue;
    }
    assert.ok(b.length > 0, `token ${id} has bytes`);
    usable.push(id);
    assert.equal(utf8.decode(b), tok.decode([id]), `token ${id}`);
  }
  const r = rng(seed);
  for (let n = 0; n < 300; n++) {
    const ids = Array.from({ length: 1 + r.int(12) }, () => usable[r.int(usable.length)]);
    assert.equal(utf8.decode(bytesOf(vocab, ids)), tok.decode(ids), `ids ${ids}`);
  }
}

Deno.test("default model: token bytes are what decode emits; EOS and padding excluded", () => {
  const vocab = vocabularyOf(folder.tokenizerJson, defaultTok, {
    size: folder.config.vocabSize + 3,
  });
  assert.equal(vocab.size, folder.config.vocabSize + 3);
  assert.deepEqual(vocab.eosIds, defaultTok.eosIds);
  checkAgainstDecoder(defaultTok, vocab, 1);
  // the 256 single bytes are there, so any byte string can be spelled
  const singles = new Set<number>();
  for (let id = 0; id < vocab.size; id++) {
    const b = tokenBytes(vocab, id);
    if (b.length === 1) singles.add(b[0]);
  }
  assert.equal(singles.size, 256);
});

Deno.test("random tokenizers (partial UTF-8 tokens, padding rows): bytes match decode", () => {
  for (const seed of [3, 4, 5]) {
    const t = randomTokenizer(seed, 500 + seed * 97);
    const vocab = vocabularyOf(t.tokenizerJson, t.tokenizer, { size: t.modelVocab });
    assert.equal(vocab.size, t.modelVocab);
    checkAgainstDecoder(t.tokenizer, vocab, seed);
  }
});

Deno.test("SentencePiece-style decoders: ▁ is a space, <0xHH> is one byte", () => {
  const pieces = [
    "<unk>",
    "<s>",
    "</s>",
    "<0x0A>",
    "<0x22>",
    "<0xC3>",
    "<0xA9>",
    "▁the",
    "▁",
    "a",
    '{"',
    "é",
  ];
  const vocab: Record<string, number> = {};
  pieces.forEach((p, i) => vocab[p] = i);
  const json = {
    added_tokens: [1, 2].map((id) => ({ id, content: pieces[id], special: true })),
    normalizer: null,
    pre_tokenizer: null,
    post_processor: null,
    decoder: {
      type: "Sequence",
      decoders: [
        { type: "Replace", pattern: { String: "▁" }, content: " " },
        { type: "ByteFallback" },
        { type: "Fuse" },
        { type: "Strip", content: " ", start: 1, stop: 0 },
      ],
    },
    model: { type: "BPE", vocab, merges: [], byte_fallback: true, unk_token: "<unk>" },
  };
  const tok = new TextTokenizer(json, { eos_token: "</s>" });
  const v = vocabularyOf(json, tok, { size: tok.vocabSize });
  const text = (id: number) => utf8.decode(tokenBytes(v, id));
  assert.deepEqual([3, 4, 7, 8, 9, 10, 11].map(text), ["\n", '"', " the", " ", "a", '{"', "é"]);
  assert.deepEqual([...tokenBytes(v, 5)], [0xc3]);
  // a sequence that does not start with a space decodes exactly as its bytes
  for (const ids of [[9, 7, 8, 3], [10, 5, 6, 4], [11, 7, 5, 6]]) {
    assert.equal(utf8.decode(bytesOf(v, ids)), tok.decode(ids), `ids ${ids}`);
  }
  // the decoder's Strip drops the first leading space (docs/grammar.md, Tokenizers)
  assert.equal(tok.decode([7, 9]), "thea");
  assert.throws(
    () => vocabularyOf({ ...json, decoder: { type: "WordPiece" } }, tok, { size: 12 }),
    (e) => e instanceof GrammarError && /decoder 'WordPiece'/.test(e.message),
  );
});

Deno.test("byte trie: pre-order, children in byte order, every token at the node it spells", () => {
  const t = randomTokenizer(7, 800);
  const vocab = vocabularyOf(t.tokenizerJson, t.tokenizer, { size: t.modelVocab });
  const trie = byteTrie(vocab);
  assert.equal(byteTrie(vocab), trie, "built once per vocabulary");
  const spell = (n: number): number[] => n === 0 ? [] : [...spell(trie.parent[n]), trie.byte[n]];
  const seen = new Map<number, number[]>(); // token → the bytes of the node it ends at
  const lastChild = new Map<number, number>();
  for (let n = 1; n < trie.nodes; n++) {
    const p = trie.parent[n];
    assert.ok(p < n, "parents come first");
    assert.ok(n < p + trie.size[p], "inside the parent's subtree");
    const before = lastChild.get(p);
    if (before !== undefined) {
      assert.ok(trie.byte[before] < trie.byte[n], "children in byte order, no repeats");
      assert.equal(n, before + trie.size[before], "siblings follow each other's subtrees");
    } else assert.equal(n, p + 1, "the first child follows its parent");
    lastChild.set(p, n);
  }
  for (let n = 0; n < trie.nodes; n++) {
    for (let k = trie.tokenStart[n]; k < trie.tokenStart[n + 1]; k++) {
      seen.set(trie.tokenIds[k], spell(n));
    }
  }
  let longest = 0;
  for (let id = 0; id < vocab.size; id++) {
    const b = tokenBytes(vocab, id);
    const excluded = b.length === 0 || vocab.eosIds.includes(id);
    assert.equal(seen.has(id), !excluded, `token ${id}`);
    if (excluded) continue;
    longest = Math.max(longest, b.length);
    assert.deepEqual(seen.get(id), [...b], `token ${id} ends at the node its bytes spell`);
  }
  assert.equal(trie.depth, longest);
  assert.equal(trie.size[0], trie.nodes);
});

Deno.test("token bytes image: V, offsets, bytes four per word little-endian", () => {
  const enc = new TextEncoder();
  const v = vocabularyFromBytes([enc.encode("ab"), undefined, enc.encode("cde"), enc.encode("é")], [
    1,
  ]);
  const img = tokenBytesImage(v);
  assert.deepEqual([...img.subarray(0, 6)], [4, 0, 2, 2, 5, 7]);
  const bytes = [..."abcde"].map((c) => c.charCodeAt(0)).concat([0xc3, 0xa9]);
  const packed = [0, 1].map((w) =>
    bytes.slice(4 * w, 4 * w + 4).reduce((x, b, i) => x + b * 2 ** (8 * i), 0)
  );
  assert.deepEqual([...img.subarray(6)], packed);
  assert.notEqual(
    v.key,
    vocabularyFromBytes([enc.encode("ab"), undefined, enc.encode("cdf"), enc.encode("é")], [1]).key,
  );
});
