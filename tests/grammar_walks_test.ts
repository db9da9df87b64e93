/**
 * Constrained decoding end to end on the host: for every case of tests/grammar_schemas.ts, seeded
 * random walks through the token tables (read as the GPU reads them) with the default model's
 * tokenizer, a random one and scripts/test_tokenizer.ts's always end in a complete output within
 * their token budget, and every output decodes (with the real tokenizer) to text that parses and
 * validates.
 */
import assert from "node:assert/strict";
import { loadModelFolder } from "../engine/model/folder.ts";
import { TextTokenizer } from "../engine/model/tokenizer.ts";
import { compileGrammar } from "../engine/grammar/grammar.ts";
import { tokenBytesImage, type Vocabulary, vocabularyOf } from "../engine/grammar/vocab.ts";
import { DEAD } from "../engine/grammar/tables.ts";
import { rng } from "../scripts/rng.ts";
import { buildTokenizer } from "../scripts/test_tokenizer.ts";
import { randomTokenizer, randomWalk, stateWord } from "./grammar_walk.ts";
import { CASES } from "./grammar_schemas.ts";

const folder = await loadModelFolder(new URL("../models/strata-default", import.meta.url).pathname);
const defaultTok = TextTokenizer.load(folder);
const random = randomTokenizer(51, 1500);
const built = buildTokenizer({ merges: 300, bos: true, modelMaxLength: 512 });
const learned = new TextTokenizer(built.tokenizerJson, built.tokenizerConfig);
const TOKENIZERS: { name: string; tok: TextTokenizer; vocab: Vocabulary }[] = [
  {
    name: "strata-default",
    tok: defaultTok,
    vocab: vocabularyOf(folder.tokenizerJson, defaultTok, { size: folder.config.vocabSize }),
  },
  {
    name: "random",
    tok: random.tokenizer,
    vocab: vocabularyOf(random.tokenizerJson, random.tokenizer, { size: random.modelVocab }),
  },
  {
    name: "test_tokenizer (learned merges)",
    tok: learned,
    vocab: vocabularyOf(built.tokenizerJson, learned, { size: built.size + 61 }),
  },
];
const strictUtf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
const SEEDS = 40;

for (const c of CASES) {
  Deno.test(`walks: ${c.name}`, () => {
    for (const { name, tok, vocab } of TOKENIZERS) {
      const tables = compileGrammar(vocab, c.spec);
      const image = tables.image, tokenImage = tokenBytesImage(vocab);
      let eosSeen = 0;
      for (let seed = 0; seed < SEEDS; seed++) {
        const r = rng(1000 * seed + 7);
        const budget = Math.max(1, tables.minTokens) + r.int(seed < 5 ? 3 : 160);
        const walk = randomWalk(image, tokenImage, vocab.eosIds, {
          budget,
          hurry: [0, 0.2, 0.6][seed % 3],
          rng: r,
        });
        const where = `${name}, seed ${seed}, budget ${budget}`;
        assert.equal(
          stateWord(image, walk.state, "dist"),
          0,
          `${where}: ended outside an accepting state`,
        );
        assert.ok(walk.ids.length + (walk.eos ? 1 : 0) <= budget, where);
        if (walk.eos) eosSeen++;
        const text = tok.decode(walk.ids);
        // the bytes are valid UTF-8 and the decoder agrees with them
        const bytes = walk.ids.flatMap((
          id,
        ) => [...vocab.data.subarray(vocab.offsets[id], vocab.offsets[id + 1])]);
        assert.equal(strictUtf8.decode(Uint8Array.from(bytes)), text, where);
        assert.deepEqual(c.check(text), [], where);
      }
      assert.ok(eosSeen > 0, `${name}: some walk ends on EOS`);
    }
  });
}

Deno.test("walks: the finish rows alone reach acceptance in exactly minTokens tokens", () => {
  for (const c of CASES) {
    const { vocab, tok } = TOKENIZERS[0];
    const tables = compileGrammar(vocab, c.spec);
    const walk = randomWalk(tables.image, tokenBytesImage(vocab), vocab.eosIds, {
      budget: 10_000,
      hurry: 1,
      rng: rng(3),
    });
    assert.ok(walk.eos, c.name);
    assert.equal(walk.ids.length, tables.minTokens, c.name);
    assert.deepEqual(c.check(tok.decode(walk.ids)), [], c.name);
    assert.notEqual(tables.minTokens, DEAD);
  }
});
