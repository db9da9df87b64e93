/**
 * engine/grammar/tables.ts against a brute force: for every state the tables reach, the allowed
 * row is exactly the tokens whose bytes the automaton takes to a state that can still finish
 * (EOS exactly in accepting states), the finish row the tokens one step closer, and `dist` /
 * `maxNext` what their names say; no reachable state is a dead end. Also: the header, vocabularies
 * that cannot spell a grammar, and the cache.
 */
import assert from "node:assert/strict";
import { loadModelFolder } from "../engine/model/folder.ts";
import { TextTokenizer } from "../engine/model/tokenizer.ts";
import { compileGrammar, GrammarCache, type GrammarSpec } from "../engine/grammar/grammar.ts";
import {
  DEAD,
  GRAMMAR_MAGIC,
  GRAMMAR_VERSION,
  Header,
  HEADER_WORDS,
  STATE_WORDS,
} from "../engine/grammar/tables.ts";
import { GrammarError } from "../engine/grammar/errors.ts";
import {
  tokenBytesImage,
  type Vocabulary,
  vocabularyFromBytes,
  vocabularyOf,
} from "../engine/grammar/vocab.ts";
import { advanceRef } from "../engine/grammar/sample_ref.ts";
import { randomTokenizer, rowTokens, stateWord } from "./grammar_walk.ts";
import { CASES } from "./grammar_schemas.ts";

const folder = await loadModelFolder(new URL("../models/strata-default", import.meta.url).pathname);
const defaultTok = TextTokenizer.load(folder);
const defaultVocab = vocabularyOf(folder.tokenizerJson, defaultTok, {
  size: folder.config.vocabSize,
});
const random = randomTokenizer(61, 1200);
const randomVocab = vocabularyOf(random.tokenizerJson, random.tokenizer, {
  size: random.modelVocab,
});

/** Brute-force check of every reachable state of `spec`'s tables over `vocab`. */
function checkTables(vocab: Vocabulary, spec: GrammarSpec, label: string) {
  const t = compileGrammar(vocab, spec);
  const img = t.image, tok = tokenBytesImage(vocab);
  assert.equal(img[Header.magic], GRAMMAR_MAGIC);
  assert.equal(img[Header.version], GRAMMAR_VERSION);
  assert.equal(img[Header.words], img.length);
  assert.equal(img[Header.vocab], vocab.size);
  assert.equal(img[Header.rowBlocks], Math.ceil(vocab.size / 1024));
  const S = img[Header.states], C = img[Header.classes];
  const offsets = [
    Header.classOffset,
    Header.transOffset,
    Header.stateOffset,
    Header.rowsOffset,
    Header.blocksOffset,
  ].map((h) => img[h]);
  assert.deepEqual(offsets, [
    HEADER_WORDS,
    HEADER_WORDS + 64,
    HEADER_WORDS + 64 + S * C,
    HEADER_WORDS + 64 + S * C + S * STATE_WORDS,
    HEADER_WORDS + 64 + S * C + S * STATE_WORDS + img[Header.rows] * img[Header.rowBlocks],
  ]);
  assert.equal(img[Header.words], offsets[4] + 32 * img[Header.blocks]);
  const eos = new Set(vocab.eosIds);
  const dist = (s: number) => stateWord(img, s, "dist");
  // breadth-first over the allowed rows from the start: every state met is checked
  const seen = new Set([img[Header.start]]);
  const queue = [img[Header.start]];
  while (queue.length > 0) {
    const s = queue.shift()!;
    const where = `${label}, state ${s}`;
    assert.notEqual(dist(s), DEAD, `${where}: reached but cannot finish`);
    const accepting = dist(s) === 0;
    const allowed = new Set(rowTokens(img, stateWord(img, s, "allowedRow")));
    const finish = new Set(rowTokens(img, stateWord(img, s, "finishRow")));
    assert.ok(allowed.size > 0, `${where}: dead end`);
    const want = new Set<number>(), closer = new Set<number>();
    let maxNext = 0, best = DEAD;
    for (let id = 0; id < vocab.size; id++) {
      if (eos.has(id)) {
        if (accepting) want.add(id), closer.add(id);
        continue;
      }
      if (vocab.offsets[id + 1] === vocab.offsets[id]) continue;
      const next = advanceRef(img, tok, s, id);
      if (next === DEAD || dist(next) === DEAD) continue;
      want.add(id);
      maxNext = Math.max(maxNext, dist(next));
      best = Math.min(best, dist(next));
      if (!accepting && dist(next) === dist(s) - 1) closer.add(id);
      if (!seen.has(next)) seen.add(next), queue.push(next);
    }
    assert.deepEqual(
      [...allowed].sort((a, b) => a - b),
      [...want].sort((a, b) => a - b),
      `${where}: allowed row`,
    );
    assert.deepEqual(
      [...finish].sort((a, b) => a - b),
      [...closer].sort((a, b) => a - b),
      `${where}: finish row`,
    );
    assert.ok(finish.size > 0, `${where}: empty finish row`);
    assert.equal(stateWord(img, s, "maxNext"), maxNext, `${where}: maxNext`);
    if (!accepting) assert.equal(dist(s), best + 1, `${where}: dist`);
  }
  assert.equal(seen.size, t.reachable, `${label}: reachable states`);
  assert.equal(img[Header.minTokens], dist(img[Header.start]));
}

Deno.test("tables = brute force over a random tokenizer, every case", () => {
  for (const c of CASES) checkTables(randomVocab, c.spec, `random, ${c.name}`);
});

Deno.test("tables = brute force over the default model's tokenizer", () => {
  for (const c of [CASES[2], CASES[6], CASES[8], CASES.at(-3)!]) {
    checkTables(defaultVocab, c.spec, `default, ${c.name}`);
  }
});

const enc = new TextEncoder();
const bytes = (...pieces: string[]) => pieces.map((p) => enc.encode(p));

Deno.test("a vocabulary without some bytes: dead paths pruned, impossible grammars refused", () => {
  // ids: 0 '"', 1 'ab', 2 'a', 3 EOS (no bytes), 4 'b"'
  const v = vocabularyFromBytes([...bytes('"', "ab", "a"), undefined, ...bytes('b"')], [3]);
  const spec: GrammarSpec = { type: "json_schema", schema: { enum: ["ab", "ac"] } };
  const t = compileGrammar(v, spec);
  const afterQuote = advanceRef(t.image, tokenBytesImage(v), 0, 0);
  // 'a' would need a 'c' or a 'b"'... 'b"' exists, so 'a' stays; 'ab' then '"' too
  assert.deepEqual(rowTokens(t.image, stateWord(t.image, afterQuote, "allowedRow")), [1, 2]);
  const v2 = vocabularyFromBytes([...bytes('"', "ab", "a"), undefined], [3]);
  const t2 = compileGrammar(v2, spec);
  const q2 = advanceRef(t2.image, tokenBytesImage(v2), 0, 0);
  assert.deepEqual(
    rowTokens(t2.image, stateWord(t2.image, q2, "allowedRow")),
    [1],
    "'a' leads nowhere: pruned",
  );
  assert.throws(
    () => compileGrammar(v2, { type: "json_schema", schema: { const: "c" } }),
    (e) => e instanceof GrammarError && /vocabulary cannot spell a complete output/.test(e.message),
  );
  assert.throws(
    () => compileGrammar(vocabularyFromBytes(bytes('"', "ab"), []), spec),
    (e) => e instanceof GrammarError && /needs a model with an EOS token/.test(e.message),
  );
});

Deno.test("cache: hits return the same tables, LRU eviction by count and bytes, order matters", () => {
  const cache = new GrammarCache({ maxEntries: 2 });
  const spec = (props: string[]): GrammarSpec => ({
    type: "json_schema",
    schema: {
      type: "object",
      properties: Object.fromEntries(props.map((p) => [p, { type: "integer" }])),
      required: props,
    },
  });
  const ab = cache.get(randomVocab, spec(["a", "b"]));
  assert.equal(cache.get(randomVocab, spec(["a", "b"])), ab);
  const ba = cache.get(randomVocab, spec(["b", "a"]));
  assert.notEqual(ba, ab, "property order is the output's order: another entry");
  assert.equal(cache.size, 2);
  cache.get(randomVocab, spec(["a", "b"])); // ab most recent
  cache.get(randomVocab, spec(["c"])); // evicts ba
  assert.equal(cache.size, 2);
  assert.equal(cache.get(randomVocab, spec(["a", "b"])), ab);
  assert.notEqual(
    cache.get(randomVocab, spec(["b", "a"])),
    ba,
    "ba was evicted and compiled again",
  );
  assert.notEqual(
    cache.get(defaultVocab, spec(["a", "b"])),
    ab,
    "another vocabulary: another entry",
  );
  const small = new GrammarCache({ maxBytes: ab.bytes + 1 });
  small.get(randomVocab, spec(["a", "b"]));
  small.get(randomVocab, spec(["c"]));
  assert.equal(small.size, 1);
  assert.ok(small.bytes <= ab.bytes + 1);
  assert.throws(() => cache.get(randomVocab, { type: "regex", pattern: "(?=a)" }), GrammarError);
});
