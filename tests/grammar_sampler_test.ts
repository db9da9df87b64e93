/**
 * engine/grammar/sample_ref.ts, the reference the GPU's constrained sampler will be tested
 * against: with seeded random logits and settings it picks only tokens the (budgeted) mask allows,
 * greedy picks the best allowed one, its logprob is under the raw logits, and whole generations
 * with random logits at temperature 0.8 always end in valid output within max_tokens.
 */
import assert from "node:assert/strict";
import { compileGrammar, type GrammarSpec } from "../engine/grammar/grammar.ts";
import { advanceRef, maskRef, sampleGrammarRef } from "../engine/grammar/sample_ref.ts";
import { DEAD } from "../engine/grammar/tables.ts";
import { tokenBytesImage, vocabularyOf } from "../engine/grammar/vocab.ts";
import { logitsStatsRef, penaliseRef } from "../kernels/reference.ts";
import type { SamplerSettings } from "../kernels/sample.ts";
import { type Rng, rng } from "../scripts/rng.ts";
import { randomTokenizer, randomWalk, stateWord } from "./grammar_walk.ts";
import { CASES } from "./grammar_schemas.ts";

const t = randomTokenizer(71, 900);
const vocab = vocabularyOf(t.tokenizerJson, t.tokenizer, { size: t.modelVocab });
const tokenImage = tokenBytesImage(vocab);
const V = vocab.size;

function randomSettings(r: Rng): SamplerSettings {
  return {
    temperature: [0, 0.5, 0.8, 1.5][r.int(4)],
    topK: [0, 1, 5, 50][r.int(4)],
    topP: [1, 0.9, 0.5][r.int(3)],
    minP: [0, 0.05][r.int(2)],
    repetitionPenalty: [1, 1.3][r.int(2)],
    presencePenalty: [0, 0.5][r.int(2)],
    frequencyPenalty: [0, 0.2][r.int(2)],
  };
}

/** Logits with ties (values on a coarse grid) and a few very large ones. */
function randomLogits(r: Rng): Float64Array {
  const l = Float64Array.from({ length: V }, () => Math.round(r.next() * 40) / 4 - 5);
  for (let k = 0; k < 3; k++) l[r.int(V)] = 30;
  return l;
}

Deno.test("reference sampler: only allowed tokens; greedy is the best allowed; raw logprob", () => {
  const r = rng(5);
  for (const c of [CASES[0], CASES[3], CASES[6]]) {
    const tables = compileGrammar(vocab, c.spec);
    for (let k = 0; k < 60; k++) {
      // a state some walk reaches, and a budget at that point
      const w = randomWalk(tables.image, tokenImage, vocab.eosIds, {
        budget: 1 + r.int(40),
        hurry: 0.3,
        rng: r,
      });
      const state = w.state;
      const remaining = r.next() < 0.5
        ? undefined
        : Math.max(1, stateWord(tables.image, state, "dist") + r.int(4));
      const logits = randomLogits(r);
      const settings = randomSettings(r);
      const counts = Uint32Array.from(
        { length: V },
        () => r.next() < 0.05 ? (r.int(3) | (1 << 31)) >>> 0 : 0,
      );
      const pick = sampleGrammarRef(logits, tables.image, state, {
        ...settings,
        counts,
        seed: BigInt(k),
        position: 10 + k,
        remaining,
      });
      const mask = maskRef(tables.image, state, remaining);
      assert.equal(
        mask[pick.token],
        1,
        `${c.name}: token ${pick.token} not allowed in state ${state}`,
      );
      const { lse } = logitsStatsRef(logits, { rows: 1, vocab: V });
      assert.equal(pick.logprob, logits[pick.token] - lse[0]);
      if (settings.temperature === 0) {
        const pen = penaliseRef(logits, settings, counts);
        let best = -1;
        for (let i = 0; i < V; i++) if (mask[i] && (best < 0 || pen[i] > pen[best])) best = i;
        assert.equal(pick.token, best, `${c.name}: greedy`);
      }
      if (remaining !== undefined && !vocab.eosIds.includes(pick.token)) {
        const next = advanceRef(tables.image, tokenImage, state, pick.token);
        assert.ok(
          stateWord(tables.image, next, "dist") <= remaining - 1,
          "the budget can still finish",
        );
      }
    }
  }
});

/** Generates with random logits until EOS or `maxTokens`; returns the ids before EOS. */
function generate(
  spec: GrammarSpec,
  seed: number,
  maxTokens: number,
): { ids: number[]; eos: boolean } {
  const tables = compileGrammar(vocab, spec);
  const r = rng(seed);
  let state = 0;
  const ids: number[] = [];
  for (let remaining = maxTokens; remaining > 0; remaining--) {
    const logits = randomLogits(r);
    const settings = { ...randomSettings(r), temperature: 0.8, topK: 0, topP: 1, minP: 0 };
    const { token } = sampleGrammarRef(logits, tables.image, state, {
      ...settings,
      seed: BigInt(seed),
      position: ids.length,
      remaining,
    });
    if (vocab.eosIds.includes(token)) return { ids, eos: true };
    state = advanceRef(tables.image, tokenImage, state, token);
    assert.notEqual(state, DEAD);
    ids.push(token);
  }
  assert.equal(stateWord(tables.image, state, "dist"), 0, "complete when the budget runs out");
  return { ids, eos: false };
}

Deno.test("generation with random logits at temperature 0.8: always valid within max_tokens", () => {
  for (const c of CASES) {
    const tables = compileGrammar(vocab, c.spec);
    for (let seed = 0; seed < 6; seed++) {
      const maxTokens = Math.max(1, tables.minTokens) + [0, 5, 40][seed % 3];
      const { ids } = generate(c.spec, seed, maxTokens);
      assert.ok(ids.length <= maxTokens);
      assert.deepEqual(c.check(t.tokenizer.decode(ids)), [], `${c.name}, seed ${seed}`);
    }
  }
});
